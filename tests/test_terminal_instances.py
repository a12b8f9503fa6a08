"""What "terminal" means (docs/contract.md "terminal instances"), through real cycles.

One definition (``fleet.lifecycle.is_terminal``) serves the monitor, the guards and the rules
planner: a live worker is never terminal; ``error`` is; ``exited`` only when we wanted it running
(one we stopped is resumed); ``unknown``/``offline`` only after ``offline_grace_min`` with the worker
dead; stuck provisioning past ``provisioning_limit_min``; a failed/host diagnosis only on evidence
from the machine itself. Every number is an objective an operator can set.
"""

import pytest

from agent.models import Approval, SessionState, Step
from agent.planners.rules import RulesPlanner
from fleet.models import Instance
from tests.rails_support import calls, fleet_entry, rails_world, verdict

pytestmark = pytest.mark.django_db

#: 8 tasks queued, both workers heartbeating and owning tasks
BUSY = {"state": "ok", "active": True, "queued": 8, "running": 3, "idle_min": None}
DEAD = {"state": "ok", "active": True, "queued": 8, "running": 0, "idle_min": None}
GPU_LOST = {"reachable": True, "commands": {"nvidia-smi": {"rc": 15, "out": "Unable to determine the device handle for GPU 0000:01:00.0: GPU is lost"}}}


def monitor_calls(run):
    return list(run.steps.filter(kind="call", actor="monitor").order_by("seq"))


def test_transient_provider_statuses_never_kill_busy_workers():
    """Vast says v-801 unknown and v-802 offline minutes ago; Curio sees both
    workers heartbeating with 2 and 1 tasks; 8 queued. Nothing is stopped or destroyed."""
    fleet = [fleet_entry("v-801", status="unknown", live=True, owned_tasks=2, age_min=5),
             fleet_entry("v-802", status="offline", live=True, owned_tasks=1, age_min=5)]
    with rails_world(fleet, BUSY) as w:
        run = w.cycle([verdict()])
        w.clock.advance(60 * 60)  # an hour later, still heartbeating: still not terminal
        later = w.cycle([verdict()])
    assert monitor_calls(run) == [] and monitor_calls(later) == []
    assert w.provider_calls("destroy_instance") == 0 and w.provider_calls("stop_instance") == 0
    assert Instance.objects.filter(killed_at__isnull=True).count() == 2


@pytest.mark.parametrize("status", ["unknown", "offline"])
def test_unknown_or_offline_is_terminal_only_after_the_grace_with_the_worker_dead(status):
    with rails_world([fleet_entry("v-1", status=status, live=False, age_min=20)], DEAD) as w:
        first = w.cycle([verdict()])
        assert monitor_calls(first) == []  # 20 min < 30 min grace: it often comes back
        w.clock.advance(11 * 60)
        second = w.cycle([verdict()])
    [step] = monitor_calls(second)
    assert (step.tool, step.outcome) == ("destroy_instance", "executed")
    assert f"provider status {status} for 31 min (grace 30 min)" in step.call_reason


def test_the_offline_grace_is_an_objective():
    with rails_world([fleet_entry("v-1", status="offline", live=False, age_min=10)], DEAD) as w:
        state = SessionState.get()
        state.objectives = {"offline_grace_min": 5}
        state.save()
        run = w.cycle([verdict()])
    [step] = monitor_calls(run)
    assert step.outcome == "executed" and "grace 5 min" in step.call_reason


def test_error_is_terminal_but_not_while_its_worker_heartbeats():
    with rails_world([fleet_entry("v-1", status="error", live=True), fleet_entry("v-2", status="error", live=False)],
                     DEAD) as w:
        run = w.cycle([verdict()])
    [step] = monitor_calls(run)
    assert step.args["instance_id"] == "v-2" and step.outcome == "executed"
    assert Instance.objects.get(external_id="v-1").killed_at is None


def test_an_instance_we_stopped_is_resumed_not_destroyed_whatever_the_provider_shows():
    stopped = {**fleet_entry("v-1", status="exited", live=False), "intended_status": "stopped"}
    with rails_world([stopped], DEAD, limits={"max_instances": 4}) as w:
        SessionState.objects.filter(pk=1).update(target_proofs_hr=100)  # one worker's worth
        Instance.objects.filter(external_id="v-1").update(intended_status="stopped")
        w.provider.instances["v-1"]["intended_status"] = "stopped"
        run = w.cycle([verdict()])
        assert monitor_calls(run) == []  # exited because we stopped it: not terminal
        from agent.runtime.loop import run_cycle

        rules = run_cycle("heartbeat", planner=RulesPlanner())
    resumed = [s for s in calls(rules) if s.tool == "resume_instance"]
    assert [s.args["instance_id"] for s in resumed] == ["v-1"] and resumed[0].outcome == "executed"
    assert not Step.objects.filter(tool="destroy_instance").exists()
    assert w.provider_calls("launch_instance") == 0


def test_stuck_provisioning_past_the_limit_which_is_an_objective():
    with rails_world([fleet_entry("v-1", status="loading", live=False, age_min=50)], DEAD,
                     limits={"provisioning_limit_min": 45}) as w:
        run = w.cycle([verdict()])
    [step] = monitor_calls(run)
    assert step.outcome == "executed" and "stuck loading past 45 min" in step.call_reason


DIAG = {"tool": "diagnose_instance", "args": {"instance_id": "v-1"}}
DESTROY = {"tool": "destroy_instance", "args": {"instance_id": "v-1", "reason": "replace"}}


def test_a_host_failure_counts_only_on_evidence_from_the_machine():
    """A diagnosis that only restates the provider's status (``unknown`` → "failed, host") does not
    make the instance terminal: the destroy is a scale-down, refused while tasks are queued."""
    restating = fleet_entry("v-1", status="unknown", live=False, age_min=10)
    with rails_world([restating], DEAD, policy={"destroy_instance": "auto"}) as w:
        run = w.cycle([DIAG, DESTROY, verdict()])
    diag, destroy = calls(run)
    assert "provider reports unknown" in diag.observation
    assert (destroy.outcome, destroy.reason_code) == ("refused", "demand_guard")
    assert w.provider_calls("destroy_instance") == 0


def test_a_gpu_lost_on_the_machine_is_terminal_and_replaced():
    with rails_world([fleet_entry("v-1", status="running", live=False, ssh=GPU_LOST)], DEAD,
                     policy={"destroy_instance": "auto"}) as w:
        run = w.cycle([DIAG, DESTROY, verdict()])
    diag, destroy = calls(run)
    assert "GPU lost" in diag.observation
    assert destroy.outcome == "executed"  # a replacement: no demand_guard with 8 queued
    assert not Approval.objects.exists()


def test_the_monitor_and_the_guards_share_one_definition():
    import fleet.monitor
    from agent.planners import rules
    from agent.policy import guards
    from fleet import lifecycle

    assert guards.eligibility is lifecycle.eligibility is rules.eligibility is fleet.monitor.eligibility

    assert "TERMINAL_STATUSES" not in vars(fleet.monitor)  # no second list of statuses
