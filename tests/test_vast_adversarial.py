"""Faults an operator, a flaky cloud or an attacker bring to the vast.ai provider, against the
local vast server through the real ``vastai`` package: a list that briefly shows nothing, bad
numbers in an instance row, ids that are not vast's, a 5xx on destroy."""

import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from fleet.models import Instance
from fleet.providers.base import ProviderError
from fleet.providers.vastai import VastProvider, to_instance
from fleet.sync import sync_instances
from tests import vast_support
from tests.vast_support import KEY

vast = vast_support.vast
pytestmark = pytest.mark.django_db
HOUR_AGO = time.time() - 3600


def _row_for(server_row):
    now = timezone.now()
    return Instance.objects.create(provider="vastai", external_id=str(server_row["id"]), label=server_row["label"],
                                   status="running", status_since=now, created_at=now - timedelta(hours=1))


def test_a_list_that_briefly_shows_nothing_is_an_error_never_all_vanished(vast):
    rows = [_row_for(vast.add(f"warden-{i:040x}", start_date=HOUR_AGO)) for i in range(3)]
    vast.fault("list", "blank")  # 200, well formed, no instances: while all three still run and bill

    with pytest.raises(ProviderError) as err:
        sync_instances()

    assert err.value.code == "list_inconsistent"
    assert Instance.objects.filter(pk__in=[r.pk for r in rows], killed_at__isnull=True).count() == 3
    sync_instances()  # the next, honest answer
    assert Instance.objects.filter(pk__in=[r.pk for r in rows], killed_at__isnull=True).count() == 3


def test_an_instance_really_gone_is_still_marked_vanished(vast):
    gone = _row_for({"id": 4242, "label": "warden-gone"})  # vast shows no such instance either
    kept = _row_for(vast.add("warden-kept", start_date=HOUR_AGO))

    sync_instances()

    gone.refresh_from_db(), kept.refresh_from_db()
    assert gone.kill_reason == "vanished" and kept.killed_at is None


@pytest.mark.parametrize("dph", [float("nan"), float("inf"), -3.0, "NaN", "-0.5", "-inf"])
def test_a_bad_price_in_an_instance_row_is_malformed_never_a_cost(dph):
    # NaN compares false with every cap (the budget guard would pass it); a negative price offsets real spend
    with pytest.raises(ProviderError) as err:
        to_instance({"id": 7, "label": "warden-x", "actual_status": "running", "dph_total": dph})
    assert err.value.code == "malformed" and "dph_total" in str(err.value)


def test_a_bad_price_in_the_list_is_a_provider_error_and_changes_no_row(vast):
    row = _row_for(vast.add("warden-nan", start_date=HOUR_AGO))
    vast.instances[int(row.external_id)]["dph_total"] = float("nan")  # the server sends a bare NaN token

    with pytest.raises(ProviderError):
        sync_instances()

    row.refresh_from_db()
    assert row.killed_at is None and row.dph == 0.0


def test_a_string_id_is_malformed_not_another_instance():
    with pytest.raises(ProviderError) as err:
        to_instance({"id": "7", "label": "warden-x"})
    assert err.value.code == "malformed"


def test_a_5xx_on_destroy_is_an_unknown_outcome_never_done(vast):
    row = vast.add("warden-doomed")
    vast.fault("destroy", "500")

    with pytest.raises(ProviderError) as err:
        VastProvider().destroy(str(row["id"]))

    assert err.value.outcome_unknown and row["id"] in vast.instances


@pytest.mark.parametrize("where", ["list", "destroy"])
def test_a_key_echoed_where_an_error_snippet_is_cut_leaves_no_part_of_it(vast, where, caplog):
    # redacting after the cut: a 64-hex key cut to 37 characters is no longer key-shaped, and 37 of its
    # 64 characters would reach the alert, the logs and the model's context
    row = vast.add("warden-echo")
    vast.fault(where, "echo_key_late", times=10)

    with pytest.raises(ProviderError) as err:
        VastProvider().destroy(str(row["id"])) if where == "destroy" else VastProvider().list_instances()

    text = str(err.value) + caplog.text
    assert "header=" in str(err.value)  # the snippet reached the key's place
    assert not any(KEY[i:i + 12] in text for i in range(0, 64 - 12))


def test_a_list_that_repeats_a_page_under_fresh_tokens_is_an_error_not_duplicates_or_a_hang(vast):
    for i in range(30):
        vast.add(f"warden-{i:040x}")
    vast.fault("list_next", "repeat", times=1000)  # every next page is page one, each under a new token

    with pytest.raises(ProviderError) as err:
        VastProvider().list_instances()

    assert err.value.code == "malformed" and "repeat" in str(err.value)
    assert vast.count("GET", "/api/v1/instances/") == 2  # found at the first repeat, not after 400 pages


@pytest.mark.parametrize("bad", [{"nested": 1}, [1, 2], None, "12", True])
def test_an_instance_row_with_an_unhashable_or_odd_id_is_malformed_never_a_crash(vast, bad):
    row = vast.add("warden-odd")
    row["id"] = bad  # the server sends it as it is

    with pytest.raises(ProviderError) as err:
        VastProvider().list_instances()

    assert err.value.code == "malformed"


@pytest.mark.parametrize(("field", "value"), [("actual_status", {"state": "running"}), ("actual_status", ["running"]),
                                              ("actual_status", 3), ("ssh_port", 10 ** 30), ("ssh_port", -22),
                                              ("ssh_port", float("inf")), ("start_date", "yesterday"),
                                              ("status_msg", {"error": "x"}), ("label_extra", None)])
def test_odd_fields_in_our_instance_row_sync_without_a_crash(vast, field, value):
    row = vast.add("warden-odd-fields", start_date=HOUR_AGO)
    row[field] = value

    [inst] = sync_instances()

    assert inst.external_id == str(row["id"])
    assert inst.ssh_port is None or 0 < inst.ssh_port < 65536
    if field == "actual_status":
        assert inst.status == "created" and "not recognised" in inst.status_msg


@pytest.mark.parametrize("call", ["destroy", "stop", "show"])
def test_an_id_that_is_not_vasts_is_refused_never_counted_as_destroyed(vast, call):
    # e.g. an owned host's name routed to the rented provider once it left the hosts file
    with pytest.raises(ProviderError) as err:
        getattr(VastProvider(), call)("rig-1")

    assert err.value.code == "invalid_id" and not err.value.outcome_unknown
    assert vast.requests == []  # nothing was sent


def test_beside_owned_hosts_a_blank_vast_list_is_still_an_error(vast, tmp_path, monkeypatch):
    from fleet.providers.ssh import SSHProvider, WithOwnedHosts

    hosts = tmp_path / "hosts.toml"
    hosts.write_text("")  # owned hosts configured, none listed yet
    monkeypatch.setitem(settings.WARDEN, "SSH_HOSTS_FILE", str(hosts))
    row = _row_for(vast.add("warden-beside", start_date=HOUR_AGO))
    retired = Instance.objects.create(provider="ssh", external_id="rig-9", status="running", status_since=timezone.now(),
                                      created_at=timezone.now() - timedelta(hours=1))  # gone from the hosts file
    fleet = WithOwnedHosts(VastProvider(), SSHProvider())
    vast.fault("list", "blank")

    with pytest.raises(ProviderError) as err:
        sync_instances(fleet)
    assert err.value.code == "list_inconsistent"

    sync_instances(fleet)
    row.refresh_from_db(), retired.refresh_from_db()
    assert row.killed_at is None and retired.kill_reason == "vanished"  # the owned host's list is its truth


def test_an_instance_relabelled_by_hand_leaves_the_fleet_without_freezing_the_reconcile(vast):
    mine = _row_for(vast.add("warden-relabel-me", start_date=HOUR_AGO))
    other = _row_for(vast.add("warden-other", start_date=HOUR_AGO))
    vast.instances[int(mine.external_id)]["label"] = "alice-debugging"  # the operator took it over in vast's console
    vast.instances[int(other.external_id)]["actual_status"] = "stopped"

    sync_instances()

    mine.refresh_from_db(), other.refresh_from_db()
    assert mine.killed_at is not None and "relabelled 'alice-debugging'" in mine.kill_reason
    assert other.status == "stopped"  # the rest of the fleet still reconciles
