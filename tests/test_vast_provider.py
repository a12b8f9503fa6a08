"""The vast.ai provider against a local server speaking vast's REST shapes, through the real
``vastai`` package: every page of the v1 list, bad answers as errors (never "no instances"),
429 backoff, create/start/stop/reboot/destroy, offers and their filters, status mapping."""

import logging

import pytest

from fleet.providers import get_provider
from fleet.providers.base import ProviderError
from fleet.providers.vastai import Pacer, VastProvider, map_status, status_class
from tests import vast_support
from tests.vast_support import KEY

vast = vast_support.vast
pytestmark = pytest.mark.django_db


def test_warden_provider_vastai_selects_it(vast):
    assert isinstance(get_provider(), VastProvider)


def test_the_list_walks_every_page_and_keeps_only_instances_labelled_ours(vast):
    for i in range(57):
        vast.add(f"warden-{i:040x}")
    vast.add("my-notebook")  # the operator's own, not ours
    vast.add("")

    listed = VastProvider().list_instances()

    assert len(listed) == 57 and all(p.label.startswith("warden-") for p in listed)
    pages = [q for m, p, q, _ in vast.requests if p == "/api/v1/instances/"]
    assert len(pages) == 3  # 59 rows, 25 a page
    assert "after_token" not in pages[0] and "after_token=tok-" in pages[1] and "after_token=tok-" in pages[2]


@pytest.mark.parametrize(("answer", "code"), [("empty", "empty_body"), ("html", "html_body"), ("malformed", "malformed"),
                                             ("410", "http_410"), ("500", "http_500")])
def test_a_bad_list_answer_is_an_error_never_no_instances(vast, answer, code):
    vast.add("warden-a")
    vast.fault("list", answer)

    with pytest.raises(ProviderError) as err:
        VastProvider().list_instances()

    assert err.value.code == code
    assert VastProvider().list_instances()[0].label == "warden-a"  # the next answer is good again


def test_a_bad_second_page_fails_the_whole_list(vast):
    for i in range(30):
        vast.add(f"warden-{i}")
    vast.fault("list_next", "html")  # page one is good; page two is an HTML error page

    with pytest.raises(ProviderError) as err:
        VastProvider().list_instances()

    assert err.value.code == "html_body"  # not the 25 rows of page one
    assert vast.count("GET", "/api/v1/instances/") == 2


def test_a_429_with_a_text_body_is_retried_with_backoff_then_answers(vast):
    vast.add("warden-a")
    vast.fault("list", "429", times=2)

    listed = VastProvider().list_instances()

    assert [p.label for p in listed] == ["warden-a"]
    assert vast.count("GET", "/api/v1/instances/") == 3


def test_429_past_the_attempts_is_a_transient_error_not_sent(vast):
    vast.fault("state", "429", times=10)
    vast.add("warden-a")
    iid = next(iter(vast.instances))

    with pytest.raises(ProviderError) as err:
        VastProvider().stop(str(iid))

    assert (err.value.code, err.value.kind, err.value.not_sent) == ("http_429", "transient", True)
    assert vast.count("PUT", f"/api/v0/instances/{iid}/") == 4  # RETRY_429 attempts in all
    assert "API requests too frequent" in str(err.value)


def test_start_stop_reboot_change_the_instance(vast):
    row = vast.add("warden-a")
    p = VastProvider()

    p.stop(str(row["id"]))
    assert (row["actual_status"], row["intended_status"]) == ("stopped", "stopped")
    [seen] = p.list_instances()
    assert (seen.status, seen.intended_status) == ("stopped", "stopped")
    p.resume(str(row["id"]))
    assert row["actual_status"] == "running"
    p.reboot(str(row["id"]))
    assert vast.count("PUT", f"/api/v0/instances/reboot/{row['id']}/") == 1


def test_destroy_answered_no_such_instance_counts_as_done(vast):
    row = vast.add("warden-a")
    p = VastProvider()
    p.destroy(str(row["id"]))
    assert row["id"] not in vast.instances

    p.destroy(str(row["id"]))  # already gone: 404 no_such_instance is done, not an error

    assert vast.count("DELETE", f"/api/v0/instances/{row['id']}/") == 2


def test_stop_of_an_unknown_instance_is_an_error(vast):
    with pytest.raises(ProviderError) as err:
        VastProvider().stop("123")
    assert err.value.code == "no_such_instance"


def test_launch_creates_from_the_cheapest_matching_offer_with_the_configured_image_disk_env_and_our_label(vast):
    pi = VastProvider().launch(gpu_name="RTX 4090", label="warden-" + "ab" * 20)

    [create] = [r for r in vast.requests if r[0] == "PUT" and r[1].startswith("/api/v0/asks/")]
    assert create[1] == "/api/v0/asks/5002/"  # 0.38 $/hr beats 0.42
    row = vast.instances[int(pi.external_id)]
    assert row["image_uuid"] == "warden/curio-worker:test" and row["disk_space"] == 40.0
    assert row["extra_env"] == [["CURIO_LAYERS", "/data"], ["CURIO_NODE_NAME", "warden-" + "ab" * 20]]
    assert pi.label == row["label"] == "warden-" + "ab" * 20
    assert (pi.status, pi.gpu_name, pi.dph, pi.extra["machine_id"]) == ("running", "RTX 4090", 0.38, "702")
    assert (pi.ssh_host, pi.ssh_port) == vast.ssh


def test_a_label_without_our_prefix_gets_it(vast):
    pi = VastProvider().launch(offer_id="5001", label="run-7")
    assert pi.label == "warden-run-7"
    assert [p.external_id for p in VastProvider().find_by_label("run-7")] == [pi.external_id]


def test_a_create_error_that_names_a_new_contract_adopts_that_instance(vast):
    vast.fault("create", "new_contract_error")

    pi = VastProvider().launch(offer_id="5001", label="warden-x")

    assert int(pi.external_id) in vast.instances  # it exists and bills: adopted, not lost
    assert pi.status == "stopped" and pi.extra["adopted_from_error"] is True
    assert "invalid_price" in pi.status_msg and "adopted" in pi.status_msg


def test_a_create_error_without_a_contract_is_an_error(vast):
    with pytest.raises(ProviderError) as err:
        VastProvider().launch(offer_id="9999", label="warden-x")
    assert err.value.code == "invalid_args" and not vast.instances


def test_launch_without_an_image_names_the_setting(vast, settings):
    settings.VAST = {**settings.VAST, "IMAGE": ""}
    with pytest.raises(ProviderError, match="WARDEN_VAST_IMAGE"):
        VastProvider().launch(gpu_name="RTX 4090")


def test_show_one_instance(vast):
    row = vast.add("warden-a", status="loading")
    assert VastProvider().show(str(row["id"])).status == "loading"
    with pytest.raises(ProviderError) as err:
        VastProvider().show("424242")
    assert err.value.code == "not_found"


def test_offers_filter_on_gpu_price_ram_reliability_cuda_and_disk(vast):
    p = VastProvider()
    assert [o["id"] for o in p.search_offers()] == [5002, 5001, 5003]  # the default filter drops the 3090 (cuda 11.8)
    assert [o["id"] for o in p.search_offers(gpu_name="RTX_4090")] == [5002, 5001]
    assert [o["id"] for o in p.search_offers(max_dph=0.40)] == [5002]
    assert [o["id"] for o in p.search_offers(min_gpu_ram_gb=40)] == [5003]
    assert [o["id"] for o in p.search_offers(min_reliability=0.993)] == [5001, 5003]
    assert [o["id"] for o in p.search_offers(min_cuda=12.5)] == [5003]
    assert [o["id"] for o in p.search_offers(min_disk_gb=150)] == [5001, 5003]
    offer = p.search_offers(gpu_name="H100 SXM")[0]
    assert offer == {"id": 5003, "gpu_name": "H100 SXM", "num_gpus": 1, "dph": 2.1, "gpu_ram_gb": 81.559,
                     "reliability": 0.999, "cuda": 12.6, "disk_gb": 500.0, "machine_id": "703", "host_id": "93",
                     "geolocation": "Quebec, CA", "verified": True}
    body = vast.searches[-1]
    assert body["verified"] == {"eq": True} and body["rentable"] == {"eq": True} and body["order"] == [["dph_total", "asc"]]


def test_a_failed_machine_is_left_out_of_later_offers(vast):
    from django.utils import timezone

    from fleet.models import FailedMachine

    now = timezone.now()
    FailedMachine.objects.create(provider="vastai", machine_id="702", reason="exited", first_failed_at=now,
                                 last_failed_at=now)

    offers = VastProvider().search_offers(gpu_name="RTX 4090")

    assert [o["id"] for o in offers] == [5001]
    assert vast.searches[-1]["machine_id"] == {"notin": [702]}


def test_a_default_filter_naming_an_unknown_field_is_refused_with_the_setting_named(vast, settings):
    settings.VAST = {**settings.VAST, "OFFER_QUERY": "num_gpus=1 relability>0.9"}
    with pytest.raises(ProviderError, match="WARDEN_VAST_OFFER_QUERY.*relability") as err:
        VastProvider().search_offers()
    assert err.value.code == "config" and not vast.searches


def test_the_daily_search_quota_is_not_retried(vast):
    from fleet.providers.vastai import http_error

    class Resp:
        status_code = 429
        text = '{"success": false, "error": "search_quota_exceeded"}'

        def json(self):
            return {"success": False, "error": "search_quota_exceeded"}

    err = http_error("search", Resp())
    assert (err.code, err.kind) == ("search_quota", "permanent")


# --- the key is a reference --------------------------------------------------------------------
def test_the_key_travels_only_in_the_authorization_header_and_never_in_urls_errors_or_logs(vast, caplog):
    caplog.set_level(logging.DEBUG)
    p = VastProvider()
    vast.add("warden-a")
    p.list_instances()
    p.search_offers()
    vast.fault("list", "html")
    with pytest.raises(ProviderError) as err:
        p.list_instances()
    vast.fault("state", "500")
    with pytest.raises(ProviderError) as err2:
        p.stop(str(next(iter(vast.instances))))

    assert vast.requests and all(h.get("Authorization") == f"Bearer {KEY}" for _, _, _, h in vast.requests)
    assert all(KEY not in path and KEY not in query for _, path, query, _ in vast.requests)
    for text in (str(err.value), str(err2.value), caplog.text, repr(p.__dict__)):
        assert KEY not in text


def test_a_missing_key_names_the_reference_not_a_value(vast, settings, monkeypatch):
    monkeypatch.delenv(vast_support.KEY_ENV)
    with pytest.raises(ProviderError) as err:
        VastProvider().list_instances()
    assert err.value.code == "config" and vast_support.KEY_ENV in str(err.value)
    assert not vast.requests


def test_a_key_file_reference_is_read_at_use(vast, settings, monkeypatch, tmp_path):
    monkeypatch.delenv(vast_support.KEY_ENV)
    key_file = tmp_path / "vast_key"
    key_file.write_text(KEY + "\n")
    settings.VAST = {**settings.VAST, "API_KEY_FILE": str(key_file)}
    vast.add("warden-a")
    assert len(VastProvider().list_instances()) == 1


def test_a_wrong_key_is_an_auth_error_never_retried(vast, monkeypatch):
    monkeypatch.setenv(vast_support.KEY_ENV, "0" * 64)
    with pytest.raises(ProviderError) as err:
        VastProvider().list_instances()
    assert (err.value.code, err.value.kind) == ("auth", "permanent")
    assert vast.count("GET", "/api/v1/instances/") == 1
    assert "0" * 64 not in str(err.value)


# --- pacing ------------------------------------------------------------------------------------
def test_requests_to_one_endpoint_are_spaced_and_other_endpoints_are_not_held_up():
    pacer = Pacer()
    assert pacer.wait("GET /a", 0.2) == 0
    assert pacer.wait("GET /a", 0.2) > 0.1
    assert pacer.wait("GET /b", 0.2) == 0


# --- statuses (vast.ai's instance docs) ---------------------------------------------------------------
@pytest.mark.parametrize(("row", "status", "intended"), [
    ({"actual_status": None}, "created", "running"),
    ({"actual_status": "loading", "status_msg": "Pulling image warden/curio-worker"}, "loading", "running"),
    ({"actual_status": "loading", "status_msg": "Error response from daemon: manifest for x:1 not found"}, "error", "running"),
    ({"actual_status": "created", "status_msg": "Error: OCI runtime create failed: runc create failed"}, "error", "running"),
    ({"actual_status": "created", "status_msg": "nvidia-container-cli: initialization error: nvml error: driver not loaded"},
     "error", "running"),
    ({"actual_status": "running", "status_msg": "success, running warden/curio-worker"}, "running", "running"),
    ({"actual_status": "exited", "status_msg": ""}, "exited", "running"),
    ({"actual_status": "offline"}, "offline", "running"),
    ({"actual_status": "unknown"}, "unknown", "running"),
    ({"actual_status": "frozen"}, "frozen", "running"),
    ({"actual_status": "restarting"}, "rebooting", "running"),
    ({"actual_status": "stopped", "intended_status": "stopped", "cur_state": "stopped", "next_state": "stopped"},
     "stopped", "stopped"),
    ({"actual_status": "hibernating"}, "created", "running"),
])
def test_vast_statuses_map_to_ours(row, status, intended):
    got, got_intended, msg, facts = map_status(row)
    assert (got, got_intended) == (status, intended)
    if row.get("actual_status") == "hibernating":
        assert "not recognised" in msg


def test_status_message_classes():
    assert status_class("Error response from daemon: pull access denied for x, repository does not exist") == "pull"
    assert status_class("Failed to initialize NVML: Driver/library version mismatch") == "nvml"
    assert status_class("OCI runtime create failed: runc create failed: unable to start container") == "start"
    assert status_class("success, running nvidia/cuda_12.4-devel/ssh") == ""


def test_an_interrupted_instance_says_so():
    _, _, _, facts = map_status({"actual_status": "stopped", "intended_status": "stopped", "cur_state": "stopped",
                                 "next_state": "stopped"})
    assert facts["interrupted"] is True


def test_the_deprecated_v0_list_answers_410_and_warden_never_asks_it(vast):
    from vastai.api.client import VastClient

    from fleet.providers.vastai import http_error

    legacy = VastClient(api_key=KEY, server_url=vast.url, retry=1).get("/instances/", query_args={"owner": "me"})
    err = http_error("list", legacy)
    assert (legacy.status_code, err.code, err.kind) == (410, "http_410", "permanent")
    assert "deprecated" in str(err)
    vast.requests.clear()
    vast.add("warden-a")
    VastProvider().list_instances()
    assert [p for m, p, _, _ in vast.requests if m == "GET"] == ["/api/v1/instances/"]


def test_a_listed_instance_carries_its_disk_price_per_hour(vast):
    """Stopped vast instances still pay for their disk: storage_cost ($/GB/month) × disk_space / 730 h."""
    vast.add("warden-disk")

    (listed,) = VastProvider().list_instances()

    assert listed.storage_dph == pytest.approx(0.15 * 40.0 / 730.0)


@pytest.mark.parametrize("row", [{}, {"storage_cost": "n/a", "disk_space": 40}, {"storage_cost": float("nan"), "disk_space": 40},
                                 {"storage_cost": 0.2}, {"storage_cost": -1, "disk_space": 40}])
def test_a_missing_or_bad_disk_price_counts_as_zero(row):
    from fleet.providers.vastai import storage_dph

    assert storage_dph(row) == 0.0
