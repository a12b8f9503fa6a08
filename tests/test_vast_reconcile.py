"""Reconcile, provider list ↔ database, on every monitor tick, against the local vast server:
an instance labelled ours with no row is adopted (audited) or destroyed (WARDEN_ORPHANS); a row
vast no longer lists is marked vanished after WARDEN_VANISH_GRACE_MIN; a bad list answer raises a
provider_error alert and changes no row; a machine that failed is left out of later offers."""

import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from agent.runtime.monitor_runner import monitor_tick
from fleet.harmony import HarmonyMachine, HarmonyMachineDetails
from fleet.models import Alert, AuditLog, FailedMachine, Instance
from fleet.providers.vastai import VastProvider
from fleet.sync import sync_instances
from tests import vast_support
from tests.fleet_support import clear_harmony

vast = vast_support.vast
pytestmark = pytest.mark.django_db(databases=["default", "harmony"])
HOUR_AGO = time.time() - 3600


@pytest.fixture
def fleet(vast, settings):
    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "local", "TASK_NAMES": ["PoRep"], "HEARTBEAT_S": 5,
                       "STARTUP_GRACE_S": 60, "DWELL_MIN": 0, "HOLD_OFF_MIN": 0}
    clear_harmony()
    yield vast
    clear_harmony()


def heartbeat(name):
    m = HarmonyMachine.objects.create(last_contact=timezone.now(), host_and_port=f"{name}:12300", unschedulable=False)
    HarmonyMachineDetails.objects.create(machine=m, tasks="PoRep", machine_name=name)


def test_an_instance_labelled_ours_with_no_row_is_adopted_and_audited(fleet):
    ours = fleet.add("warden-" + "c" * 40, start_date=HOUR_AGO)
    fleet.add("jupyter-by-hand")

    monitor_tick()

    row = Instance.objects.get(provider="vastai")
    assert (row.external_id, row.label, row.status) == (str(ours["id"]), ours["label"], "running")
    assert row.adopted_at is not None and row.machine_id == "701"
    audit = AuditLog.objects.get(verb="adopt_instance")
    assert audit.target == str(ours["id"]) and "WARDEN_ORPHANS=adopt" in audit.reason
    assert len(fleet.instances) == 2  # adopt keeps it; the one not ours is never touched


def test_with_orphans_destroy_the_monitor_diagnoses_and_destroys_it(fleet, settings, sshd_for_vast):
    settings.WARDEN = {**settings.WARDEN, "ORPHANS": "destroy"}
    orphan = fleet.add("warden-" + "d" * 40, start_date=HOUR_AGO)
    mine = fleet.add("jupyter-by-hand")
    heartbeat(orphan["label"])  # a live, idle worker: nothing but the orphan policy wants it gone

    run = monitor_tick()

    assert run is not None
    assert orphan["id"] not in fleet.instances and mine["id"] in fleet.instances
    row = Instance.objects.get(external_id=str(orphan["id"]))
    assert row.killed_at is not None and row.killed_by == "monitor"
    verbs = list(AuditLog.objects.order_by("at").values_list("verb", flat=True))
    assert verbs.index("adopt_instance") < verbs.index("destroy_instance")
    assert row.diagnoses.exists()


def test_our_own_launch_adopted_by_a_sync_is_not_an_orphan(fleet, settings):
    from agent.models import SideEffect

    settings.WARDEN = {**settings.WARDEN, "ORPHANS": "destroy"}
    label = "warden-" + "e" * 40
    SideEffect.objects.create(key="e" * 40, tool="launch_instance", args={}, status="claimed", label=label,
                              claimed_at=timezone.now(), actor="agent", worker="test")
    fleet.add(label, start_date=HOUR_AGO)
    heartbeat(label)

    monitor_tick()

    assert len(fleet.instances) == 1
    assert not AuditLog.objects.filter(verb="destroy_instance").exists()


def test_a_row_vast_no_longer_lists_is_vanished_after_the_grace(fleet, settings):
    now = timezone.now()
    for ext, age in (("30000900", 20), ("30000901", 5)):
        Instance.objects.create(provider="vastai", external_id=ext, status="running", status_since=now,
                                created_at=now - timedelta(minutes=age))
    settings.WARDEN = {**settings.WARDEN, "VANISH_GRACE_MIN": 10}

    sync_instances()

    assert Instance.objects.get(external_id="30000900").kill_reason == "vanished"
    assert Instance.objects.get(external_id="30000901").killed_at is None
    settings.WARDEN = {**settings.WARDEN, "VANISH_GRACE_MIN": 3}
    sync_instances()
    assert Instance.objects.get(external_id="30000901").kill_reason == "vanished"


@pytest.mark.parametrize("answer", ["empty", "html", "malformed", "410"])
def test_a_bad_list_is_a_provider_error_alert_and_no_row_is_marked_vanished(fleet, answer):
    row = fleet.add("warden-" + "f" * 40, start_date=HOUR_AGO)
    monitor_tick()
    fleet.fault("list", answer, times=5)  # past the observe retries

    monitor_tick()

    alert = Alert.objects.get(kind="provider_error")
    assert alert.state == "firing" and "vast list" in alert.message
    inst = Instance.objects.get(external_id=str(row["id"]))
    assert inst.killed_at is None
    fleet.faults["list"] = []
    monitor_tick()
    assert Alert.objects.get(kind="provider_error").state == "resolved"


def test_a_failed_instance_marks_its_machine_and_later_offers_leave_it_out(fleet):
    row = fleet.add("warden-" + "1" * 40, status="loading", start_date=HOUR_AGO)
    row["machine_id"] = 702
    sync_instances()
    row.update(actual_status="loading", status_msg="Error response from daemon: pull access denied, repository does not exist")

    sync_instances()

    inst = Instance.objects.get(external_id=str(row["id"]))
    assert inst.status == "error" and inst.status_msg.startswith("image pull failed")
    failed = FailedMachine.objects.get(provider="vastai")
    assert (failed.machine_id, failed.instance_ref) == ("702", inst.external_id)
    assert [o["machine_id"] for o in VastProvider().search_offers(gpu_name="RTX 4090")] == ["701"]


@pytest.fixture
def sshd_for_vast(fleet, monkeypatch, tmp_path_factory):
    """The test sshd; every vast instance's ssh_host/ssh_port point at it."""
    from tests.sshd import HEALTHY_L, SSHServer

    server = SSHServer(tmp_path_factory.mktemp("sshd"))
    server.start()
    server.fake("nvidia-smi", HEALTHY_L)
    monkeypatch.setitem(settings.WARDEN, "SSH_USER", server.user)
    monkeypatch.setitem(settings.WARDEN, "SSH_KEY_FILE", str(server.key_file))
    fleet.ssh = (server.host, server.port)
    try:
        yield server
    finally:
        server.stop()


def test_an_instance_destroyed_as_terminal_leaves_its_machine_out_of_offers(fleet):
    row = fleet.add("warden-" + "2" * 40, status="loading", start_date=HOUR_AGO)
    monitor_tick()
    inst = Instance.objects.get(external_id=str(row["id"]))
    Instance.objects.filter(pk=inst.pk).update(status_since=timezone.now() - timedelta(hours=4))  # loading for 4 h

    monitor_tick()

    assert row["id"] not in fleet.instances  # stuck provisioning: destroyed by the monitor
    failed = FailedMachine.objects.get(provider="vastai", machine_id="701")
    assert failed.reason.startswith("terminal: stuck loading")
    assert "701" not in [o["machine_id"] for o in VastProvider().search_offers()]


def test_our_own_launch_under_a_custom_label_prefix_is_not_an_orphan(fleet, settings):
    from agent.models import SideEffect

    settings.WARDEN = {**settings.WARDEN, "ORPHANS": "destroy"}
    settings.VAST = {**settings.VAST, "LABEL_PREFIX": "acme-"}
    label = "warden-" + "9" * 40  # agent.policy.claims.launch_label; vast carries it as acme-warden-…
    SideEffect.objects.create(key="9" * 40, tool="launch_instance", args={}, status="claimed", label=label,
                              claimed_at=timezone.now(), actor="agent", worker="test")
    fleet.add(VastProvider().vast_label(label), start_date=HOUR_AGO)
    heartbeat("acme-" + label)

    monitor_tick()

    assert len(fleet.instances) == 1
    assert Instance.objects.get(provider="vastai").label.startswith("acme-warden-")
    assert not AuditLog.objects.filter(verb="destroy_instance").exists()
