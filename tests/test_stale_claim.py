"""A side effect claimed but never finished is settled against the provider (docs/contract.md
``stale_claim``): found there, adopted; not found, closed with the
``stale_claim`` alert naming it, never re-run, and an approval behind it back to ``waiting``.
Settled claims block nothing.

The "rented" cloud stands in for an external provider. A dead worker is a real process that was
started and killed, so its identity (host, pid, start time) is really dead.
"""

import subprocess
import sys
from datetime import timedelta

import pytest

from agent.models import Approval, SessionState, SideEffect, Step
from agent.planners.script import ScriptPlanner
from agent.policy.claims import launch_label, worker_alive, worker_identity
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run, run_cycle
from agent.runtime.monitor_runner import monitor_tick
from fleet import demo
from fleet.clock import clock
from fleet.models import Alert, Instance
from fleet.providers.base import ProviderInstance
from tests import rented_cloud

vclock, cloud = rented_cloud.vclock, rented_cloud.cloud

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])

LAUNCH = {"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "launch_priority": "P0", "reason": "40 tasks queued"}}
REBOOT = {"tool": "reboot_instance", "args": {"instance_id": "v-1", "reason": "its worker is dead"}}


def dead_worker() -> str:
    """The identity of a real process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    import psutil

    started = psutil.Process(proc.pid).create_time()
    proc.kill()
    proc.wait()
    ident = worker_identity().split("|")[0] + f"|{proc.pid}|{started:.2f}"
    assert worker_alive(ident) is False
    return ident


def claim(key: str, tool: str, *, instance: str = "", age: timedelta, worker: str = "") -> SideEffect:
    return SideEffect.objects.create(key=key, tool=tool, args={"instance_id": instance} if instance else {},
                                     instance_ref=instance, label=launch_label(key) if tool == "launch_instance" else "",
                                     worker=worker, claimed_at=clock.now() - age, actor="agent")


def _policy(**policy):
    state = SessionState.get()
    state.overrides = {"policy": policy}
    state.save()


def _calls(number):
    return {s.tool: s for s in Step.objects.filter(kind="call", actor="agent", run__number=number)}


def test_claims_two_days_old_are_settled_alerted_and_block_nothing(cloud):
    """A launch and a reboot claimed two days ago by a worker killed mid-call; 40 tasks
    queued; the only worker dead. Before: every launch refused launch_pending, the reboot in_flight."""
    _policy(**{"launch_instance:P0": "auto", "reboot_instance": "auto"})
    cloud.add("v-1", "running", age_min=3000)
    gone = dead_worker()
    old_launch = claim("k-launch", "launch_instance", age=timedelta(days=2), worker=gone)
    old_reboot = claim("k-reboot", "reboot_instance", instance="v-1", age=timedelta(days=2), worker=gone)
    demo.enqueue(40)

    run = run_cycle("test", planner=ScriptPlanner([LAUNCH, REBOOT]))

    for c in (old_launch, old_reboot):
        c.refresh_from_db()
        assert (c.status, c.code) == ("failed", "stale_claim")
        assert "never re-run" in c.result
    alerts = sorted(a.message for a in Alert.objects.filter(kind="stale_claim"))
    assert len(alerts) == 2
    assert any("launch_instance" in m and launch_label("k-launch") in m for m in alerts)
    assert any("reboot_instance v-1" in m for m in alerts)
    calls = _calls(run.number)
    assert calls["launch_instance"].outcome == "executed"  # not launch_pending
    assert calls["reboot_instance"].outcome == "executed"  # not in_flight
    assert cloud.sent("launch") == 1 and cloud.sent("reboot") == 1  # the old ones were never re-run


def test_a_claim_whose_worker_died_is_settled_at_once_and_a_live_one_is_left_alone(cloud):
    _policy(reboot_instance="auto")
    cloud.add("v-1", "running", age_min=300)
    cloud.add("v-2", "running", age_min=300)
    dead = claim("k-dead", "reboot_instance", instance="v-1", age=timedelta(minutes=1), worker=dead_worker())
    live = claim("k-live", "reboot_instance", instance="v-2", age=timedelta(minutes=1), worker=worker_identity())

    monitor_tick()

    dead.refresh_from_db()
    live.refresh_from_db()
    assert (dead.status, dead.code) == ("failed", "stale_claim")
    assert live.status == "claimed"  # its worker is alive and it is young: it may still be running
    run = run_cycle("test", planner=ScriptPlanner([REBOOT, {"tool": "reboot_instance",
                                                            "args": {"instance_id": "v-2", "reason": "again"}}]))
    steps = list(Step.objects.filter(run=run, kind="call").order_by("seq"))
    assert [(s.args["instance_id"], s.outcome, s.reason_code) for s in steps] == [
        ("v-1", "executed", ""), ("v-2", "refused", "in_flight")]


def test_a_stale_launch_found_at_the_provider_is_adopted_and_its_approval_executed(cloud):
    _policy()
    run = run_cycle("test", planner=ScriptPlanner([{**LAUNCH, "args": {**LAUNCH["args"], "launch_priority": "P1"}}]))
    approval = Approval.objects.get(run=run)
    do_decide(approval, "approve", "user:alice")
    old = claim(approval.idempotency_key, "launch_instance", age=timedelta(minutes=45))
    # the worker died after the create went out: the cloud has the machine, we have no row
    cloud.listed["r-9"] = ProviderInstance("r-9", "running", gpu_name="RTX 4090", dph=0.5, label=old.label,
                                           worker_name="r-9", started_at=clock.now())

    resume_run(run, planner=ScriptPlanner([]))

    old.refresh_from_db()
    assert old.status == "done"
    assert Instance.objects.get(external_id="r-9").label == old.label
    approval.refresh_from_db()
    assert approval.status == "executed" and "adopted" in approval.outcome_detail
    assert approval.step.outcome == "approved_executed"
    assert not Alert.objects.filter(kind="stale_claim").exists()
    assert cloud.sent("launch") == 0  # adopted, never sent again


def test_an_approval_behind_a_claim_that_never_ran_waits_again_and_runs_once_when_approved(cloud, client, alice):
    """Never voided as ``duplicate`` for a call that did not run; never re-run silently."""
    _policy()
    demo.enqueue(10)  # the launch is still needed when it is approved again
    run = run_cycle("test", planner=ScriptPlanner([{**LAUNCH, "args": {**LAUNCH["args"], "launch_priority": "P1"}}]))
    approval = Approval.objects.get(run=run)
    do_decide(approval, "approve", "user:alice")
    claim(approval.idempotency_key, "launch_instance", age=timedelta(minutes=2), worker=dead_worker())

    # the redelivered resume task after the restart: observe settles the claim first
    resume_run(run, planner=ScriptPlanner([]))

    approval.refresh_from_db()
    assert approval.status == "waiting" and approval.decided_by is None
    assert approval.outcome_detail.startswith("stale_claim") and "never ran" in approval.outcome_detail
    assert approval.expires_at > clock.now()
    approval.step.refresh_from_db()
    assert approval.step.outcome == "parked" and "stale_claim" in approval.step.detail
    assert run.__class__.objects.get(pk=run.pk).status == "parked"
    assert cloud.sent("launch") == 0  # not re-run by the runtime
    [alert] = Alert.objects.filter(kind="stale_claim")
    assert "launch_instance" in alert.message
    client.force_login(alice)
    card = client.get("/approvals/").content.decode()
    assert "back for a decision: stale_claim" in card and "never ran" in card  # the operator sees why

    do_decide(approval, "approve", "user:alice")  # the operator decides again, seeing why
    resume_run(run, planner=ScriptPlanner([]))

    approval.refresh_from_db()
    assert approval.status == "executed"
    assert cloud.sent("launch") == 1
    assert sorted(SideEffect.objects.filter(key=approval.idempotency_key).values_list("status", "code")) == [
        ("done", ""), ("failed", "stale_claim")]


def test_an_unreadable_provider_settles_nothing(cloud):
    from fleet.providers.base import ProviderError

    old = claim("k-old", "launch_instance", age=timedelta(days=2))
    cloud.fail = ProviderError("rented: HTTP 500", kind="transient", code="http_500")
    monitor_tick()
    old.refresh_from_db()
    assert old.status == "claimed"  # not decided blind: still counts as pending
    assert not Alert.objects.filter(kind="stale_claim").exists()


class _Killed(BaseException):
    """What a SIGKILL looks like from inside: nothing after this line runs (no except clause catches it)."""


def test_a_call_whose_worker_died_mid_call_ends_stale_claim_in_its_run(cloud):
    from fleet import demo

    demo.enqueue(3)  # work waits and nothing is live: the P0 launch is within the need and runs by itself
    _policy(**{"launch_instance:P0": "auto"})
    gone = dead_worker()

    def dies_mid_call(**kwargs):
        SideEffect.objects.filter(status="claimed").update(worker=gone)  # the claim names the process that died
        raise _Killed()

    cloud.launch = dies_mid_call
    with pytest.raises(_Killed):
        run_cycle("test", planner=ScriptPlanner([LAUNCH]))
    [step] = Step.objects.filter(kind="call", tool="launch_instance")
    assert step.outcome == "" and step.idempotency_key  # in flight, and the trace says which call

    monitor_tick()

    step.refresh_from_db()
    assert (step.outcome, step.reason_code) == ("error", "stale_claim") and "never ran" in step.detail
    assert SideEffect.objects.get(key=step.idempotency_key).code == "stale_claim"
