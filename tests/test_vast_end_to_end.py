"""End to end on vast.ai's wire format: the agent, pointed at the local vast server (through the
real ``vastai`` package), the test HarmonyDB and the test sshd, launches, diagnoses, waits for an
operator's approval, stops, destroys and reconciles — with vast's faults on the way: a 429 with a
text body, an HTML and an empty list answer, a create error that names a new contract, and a
destroy answered ``no_such_instance``."""

import time

import pytest
from django.utils import timezone

from agent.models import Approval
from agent.planners.script import ScriptPlanner
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run, run_cycle
from agent.runtime.monitor_runner import monitor_tick
from fleet.harmony import HarmonyMachine, HarmonyMachineDetails, HarmonyTask
from fleet.models import Alert, AuditLog, Diagnosis, Instance
from tests import vast_support
from tests.fleet_support import clear_harmony
from tests.sshd import HEALTHY_L, SSHServer

vast = vast_support.vast
pytestmark = [pytest.mark.django_db(databases=["default", "harmony"]), pytest.mark.timeout(120)]
DONE = {"text": 'done <verdict>{"action": true, "state_changed": true}</verdict>'}


@pytest.fixture
def world(vast, settings, monkeypatch, tmp_path_factory, alice):
    """vast server + sshd (every instance's ssh endpoint) + the local demand source on the test HarmonyDB."""
    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "local", "TASK_NAMES": ["PoRep"], "HEARTBEAT_S": 5,
                       "STARTUP_GRACE_S": 60, "DWELL_MIN": 0, "HOLD_OFF_MIN": 0, "MAX_DPH": 5.0, "MAX_INSTANCES": 4}
    server = SSHServer(tmp_path_factory.mktemp("sshd"))
    server.start()
    server.fake("nvidia-smi", HEALTHY_L)
    monkeypatch.setitem(settings.WARDEN, "SSH_USER", server.user)
    monkeypatch.setitem(settings.WARDEN, "SSH_KEY_FILE", str(server.key_file))
    vast.ssh = (server.host, server.port)
    clear_harmony()
    try:
        yield vast
    finally:
        server.stop()
        clear_harmony()


def queue(n: int) -> None:
    now = timezone.now()
    for _ in range(n):
        HarmonyTask.objects.create(name="PoRep", posted_time=now, update_time=now)


def heartbeat(name: str) -> None:
    m = HarmonyMachine.objects.create(last_contact=timezone.now(), host_and_port=f"{name}:12300", unschedulable=False)
    HarmonyMachineDetails.objects.create(machine=m, tasks="PoRep", machine_name=name)


def cycle_parks(*steps):
    """One agent cycle that parks on an approval; returns ``(run, planner, approval)``."""
    planner = ScriptPlanner([*steps, DONE])
    run = run_cycle("operator", planner=planner)
    run.refresh_from_db()
    assert run.status == "parked", (run.status, run.halt_reason,
                                    list(run.steps.values_list("tool", "outcome", "reason_code", "detail")))
    return run, planner, Approval.objects.get(run=run, status="waiting")


def approve(run, planner, approval, alice):
    do_decide(approval, "approve", "user:alice", user=alice)
    run = resume_run(run, planner=planner)
    steps = list(run.steps.filter(tool=approval.tool).values_list("kind", "outcome", "reason_code", "detail", "observation"))
    step = run.steps.filter(kind="call", tool=approval.tool, outcome__in=("executed", "approved_executed")).first()
    assert step is not None and step.ok, steps
    return step


@pytest.mark.slow  # ~15 s: two SSH diagnoses, six cycles, the observe retries on bad lists
def test_launch_diagnose_approve_stop_destroy_and_reconcile_on_vast(world, alice):
    queue(6)
    world.fault("list", "429")  # the first read of the fleet is rate limited (text body): backed off, then read

    # launch: the agent searches offers and proposes a P1 launch; an operator approves it
    run, planner, approval = cycle_parks(
        {"tool": "search_offers", "args": {"gpu_name": "RTX 4090"}},
        {"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "launch_priority": "P1", "reason": "6 PoRep queued"}},
    )
    assert '"id": 5002' in run.steps.get(tool="search_offers").observation  # the cheapest 4090 first
    approve(run, planner, approval, alice)
    [inst] = Instance.objects.filter(provider="vastai")
    row = world.instances[int(inst.external_id)]
    assert row["label"] == inst.label and inst.label.startswith("warden-")
    assert (inst.status, inst.dph, inst.machine_id) == ("running", 0.38, "702")
    assert (inst.ssh_host, inst.ssh_port) == world.ssh
    assert world.count("GET", "/api/v1/instances/") >= 2  # the 429 answer, then the real read

    # the worker proves the queue away and idles
    heartbeat(inst.worker_name)
    HarmonyTask.objects.all().delete()

    # diagnose over SSH, then a stop that needs an operator
    run, planner, approval = cycle_parks(
        {"tool": "diagnose_instance", "args": {"instance_id": inst.external_id}},
        {"tool": "stop_instance", "args": {"instance_id": inst.external_id, "reason": "queue empty past the dwell"}},
    )
    d = Diagnosis.objects.get(instance=inst)
    assert (d.health, d.source) == ("healthy", "ssh")
    approve(run, planner, approval, alice)
    assert (row["actual_status"], row["intended_status"]) == ("stopped", "stopped")
    inst.refresh_from_db()
    assert (inst.status, inst.intended_status) == ("stopped", "stopped")

    # a monitor tick meets an HTML page, then an empty body: provider_error, nothing vanishes
    world.fault("list", "html", times=3)
    monitor_tick()
    assert Alert.objects.get(kind="provider_error", state="firing")
    world.fault("list", "empty", times=3)
    monitor_tick()
    inst.refresh_from_db()
    assert inst.killed_at is None and inst.status == "stopped"
    world.faults["list"] = []  # vast answers properly again

    # destroy, approved; meanwhile the instance went away at vast: no_such_instance counts as done
    run, planner, approval = cycle_parks(
        {"tool": "destroy_instance", "args": {"instance_id": inst.external_id, "reason": "stopped and not needed"}},
    )
    assert Alert.objects.get(kind="provider_error").state == "resolved"  # that cycle read the fleet again
    del world.instances[int(inst.external_id)]
    approve(run, planner, approval, alice)
    inst.refresh_from_db()
    assert inst.killed_at is not None and inst.status == "destroyed"
    assert world.count("DELETE", f"/api/v0/instances/{inst.external_id}/") == 1

    # reconcile: an instance labelled ours that we have no row for is adopted, and audited
    orphan = world.add("warden-" + "9" * 40, start_date=time.time() - 3600)
    monitor_tick()
    adopted = Instance.objects.get(external_id=str(orphan["id"]))
    assert adopted.adopted_at is not None
    assert AuditLog.objects.filter(verb="adopt_instance", target=adopted.external_id).exists()
    del world.instances[orphan["id"]]  # it is gone at vast, and older than the grace: vanished
    monitor_tick()
    adopted.refresh_from_db()
    assert adopted.kill_reason == "vanished"


def test_a_launch_whose_create_answers_an_error_naming_a_contract_adopts_the_instance(world, alice):
    queue(3)
    world.fault("create", "new_contract_error")

    run, planner, approval = cycle_parks(
        {"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "launch_priority": "P1", "reason": "3 queued"}},
    )
    step = approve(run, planner, approval, alice)

    [inst] = Instance.objects.filter(provider="vastai")
    assert int(inst.external_id) in world.instances  # it exists and bills: recorded, not lost
    assert inst.status == "stopped" and "adopted" in inst.status_msg
    assert inst.external_id in step.observation


def test_the_agent_searches_offers_with_vasts_filters_and_a_provider_without_them_says_so(world):
    planner = ScriptPlanner([
        {"tool": "search_offers", "args": {"min_gpu_ram_gb": 40, "min_cuda": 12.5, "min_disk_gb": 300,
                                           "min_reliability": 0.99}},
        {"text": 'done <verdict>{"action": false, "state_changed": false}</verdict>'},
    ])
    run = run_cycle("operator", planner=planner)

    step = run.steps.get(tool="search_offers")
    assert step.ok and '"id": 5003' in step.observation and '"id": 5002' not in step.observation
    body = world.searches[-1]
    assert (body["gpu_ram"], body["cuda_max_good"], body["disk_space"], body["reliability"]) == (
        {"gte": 40000.0}, {"gte": 12.5}, {"gte": 300.0}, {"gte": 0.99})
    from agent.runtime.tools import ToolError, search_offers
    from fleet.providers import set_override
    from fleet.providers.local import LocalProvider

    set_override(LocalProvider())
    try:
        with pytest.raises(ToolError, match="local provider does not filter offers by min_cuda"):
            search_offers(None, {"min_cuda": 12.0})
    finally:
        set_override(None)


def test_a_create_that_times_out_after_vast_made_the_instance_is_found_by_label_never_launched_twice(world, alice,
                                                                                                   settings):
    queue(3)
    settings.VAST = {**settings.VAST, "TIMEOUT_S": 0.5}
    world.slow_s = 1.5
    world.fault("create", "slow")  # vast makes the instance; its answer comes after we gave up

    run, planner, approval = cycle_parks(
        {"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "launch_priority": "P1", "reason": "3 queued"}},
    )
    do_decide(approval, "approve", "user:alice", user=alice)
    run = resume_run(run, planner=planner)

    assert world.count("PUT", "/api/v0/asks/") == 1  # never re-sent blind
    [made] = world.instances.values()
    [inst] = Instance.objects.filter(provider="vastai", killed_at__isnull=True)
    assert inst.external_id == str(made["id"]) and inst.label == made["label"]
    step = run.steps.get(kind="call", tool="launch_instance", outcome__in=("error", "executed", "approved_executed"))
    assert step.reason_code in ("outcome_unknown", "") and str(made["id"]) in (step.detail + step.observation)
