"""An instance stopped longer than ``stopped_destroy_h`` (default 24 h) still pays for its disk
(vast.ai bills a stopped instance's disk): the rules planner diagnoses it and proposes destroying it, which parks for an
operator (destroy_instance's policy); approved, it is destroyed. Never while work waits (it is
resumed then), never before the limit, and not again while a rejection stands."""

import pytest

from agent.models import Approval
from agent.planners.rules import RulesPlanner
from agent.policy.limits import DEFAULT_LIMITS
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run, run_cycle
from fleet.models import Instance
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

IDLE = {"state": "ok", "active": False, "queued": 0, "running": 0, "workers_expected": 0, "workers_live": 0,
        "workers_dead": 0, "idle_min": 600}
QUEUED = {"state": "ok", "active": False, "queued": 3, "running": 0, "workers_expected": 0, "workers_live": 0,
          "idle_min": None}


def calls(run):
    return [(s.tool, (s.args or {}).get("instance_id"), s.outcome) for s in run.steps.filter(kind="call").order_by("seq")]


def stopped(hours: float):
    return scenario_world([entry("v-1", status="stopped", live=False)], IDLE, age_min=hours * 60)


def test_the_default_limit_is_a_day():
    assert DEFAULT_LIMITS["stopped_destroy_h"] == 24


def test_a_long_stopped_instance_is_diagnosed_then_its_destroy_waits_for_approval_and_runs_once_approved():
    with stopped(30) as provider:
        run = run_cycle("heartbeat", planner=RulesPlanner())
        assert calls(run) == [("diagnose_instance", "v-1", "executed"), ("destroy_instance", "v-1", "parked")]
        approval = Approval.objects.get(run=run, tool="destroy_instance")
        assert "past the 24 h limit" in approval.args["reason"]

        again = run_cycle("heartbeat", planner=RulesPlanner())  # waiting: not asked twice
        assert not [c for c in calls(again) if c[0] == "destroy_instance"]

        do_decide(approval, "approve", "user:alice")
        resume_run(run, planner=RulesPlanner())
    assert ("destroy_instance", {"external_id": "v-1"}) in provider.calls
    assert Instance.objects.get(external_id="v-1").killed_at is not None


def test_not_before_the_limit():
    with stopped(20):
        run = run_cycle("heartbeat", planner=RulesPlanner())
    assert not [c for c in calls(run) if c[0] == "destroy_instance"]


def test_the_limit_is_a_setting():
    with scenario_world([entry("v-1", status="stopped", live=False)], IDLE, age_min=3 * 60,
                        objectives={"stopped_destroy_h": 2}):
        run = run_cycle("heartbeat", planner=RulesPlanner())
    assert ("destroy_instance", "v-1", "parked") in calls(run)


def test_never_while_work_waits_it_is_resumed_instead():
    with scenario_world([entry("v-1", status="stopped", live=False)], QUEUED, age_min=48 * 60,
                        objectives={"target_proofs_hr": 100}):
        run = run_cycle("heartbeat", planner=RulesPlanner())
    assert [c[0] for c in calls(run)] == ["resume_instance"]


def test_a_rejection_stands():
    with stopped(30):
        first = run_cycle("heartbeat", planner=RulesPlanner())
        do_decide(Approval.objects.get(run=first, tool="destroy_instance"), "reject", "user:alice", comment="keep the disk")
        resume_run(first, planner=RulesPlanner())
        second = run_cycle("heartbeat", planner=RulesPlanner())
    assert not [c for c in calls(second) if c[0] == "destroy_instance"]
    assert not Approval.objects.filter(status="waiting").exists()


def test_work_that_arrives_while_the_destroy_waits_for_approval_refuses_it_and_the_instance_is_resumed():
    from fleet import demand as demand_mod
    from fleet.demand.scenario import ScenarioDemandSource

    fleet = [entry("v-1", status="stopped", live=False)]
    with scenario_world(fleet, IDLE, age_min=30 * 60, objectives={"target_proofs_hr": 100}) as provider:
        run = run_cycle("heartbeat", planner=RulesPlanner())
        approval = Approval.objects.get(run=run, tool="destroy_instance", status="waiting")
        demand_mod.set_override(ScenarioDemandSource(QUEUED, fleet))  # 3 tasks queued while it waits

        again = run_cycle("heartbeat", planner=RulesPlanner())
        assert ("resume_instance", "v-1", "executed") in calls(again)  # the waiting destroy does not hold it back

        do_decide(approval, "approve", "user:alice")  # an operator approves the day-old proposal
        run = resume_run(run, planner=RulesPlanner())
    assert ("destroy_instance", {"external_id": "v-1"}) not in provider.calls
    assert Instance.objects.get(external_id="v-1").killed_at is None
    step = run.steps.get(kind="call", tool="destroy_instance", outcome__in=("refused", "approved_executed", "error"))
    assert step.outcome == "refused" and step.reason_code == "demand_guard", (step.outcome, step.reason_code, step.detail)
