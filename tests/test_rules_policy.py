"""The built-in rules planner: launches for the queue, retires idle workers, resumes before renting,
and does not ask again what an operator just rejected."""

import pytest

from agent.models import Approval
from agent.planners.rules import RulesPlanner
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run, run_cycle
from fleet.models import Diagnosis, Instance
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

IDLE = {"state": "ok", "active": False, "queued": 0, "running": 0, "workers_expected": 1, "workers_live": 1, "idle_min": 60}
QUEUED = {"state": "ok", "active": False, "queued": 9, "running": 0, "workers_expected": 0, "workers_live": 0, "idle_min": None}


def calls(run):
    return [(s.tool, (s.args or {}).get("instance_id"), s.outcome) for s in run.steps.filter(kind="call").order_by("seq")]


def test_it_diagnoses_an_idle_worker_then_parks_its_stop():
    with scenario_world([entry("v-1")], IDLE):
        run = run_cycle("heartbeat", planner=RulesPlanner())
    assert calls(run) == [("diagnose_instance", "v-1", "executed"), ("stop_instance", "v-1", "parked")]
    assert Diagnosis.objects.filter(instance__external_id="v-1").exists()


def test_a_rejected_stop_is_not_proposed_again_within_the_dwell():
    with scenario_world([entry("v-1")], IDLE):
        first = run_cycle("heartbeat", planner=RulesPlanner())
        do_decide(Approval.objects.get(run=first), "reject", "user:alice", comment="keep it warm")
        resume_run(first, planner=RulesPlanner())
        second = run_cycle("heartbeat", planner=RulesPlanner())
    assert ("stop_instance", "v-1", "parked") not in calls(second)
    assert Approval.objects.filter(status="waiting").count() == 0


def test_it_never_retires_when_demand_counts_are_unknown():
    with scenario_world([entry("v-1")], {"state": "ok", "idle_min": 60}, policy={"stop_instance": "auto"}):
        run = run_cycle("heartbeat", planner=RulesPlanner())
    assert not [c for c in calls(run) if c[0] in ("stop_instance", "destroy_instance")]


def test_it_resumes_a_stopped_instance_before_launching_a_new_one():
    with scenario_world([entry("v-1", status="stopped", live=False)], QUEUED, objectives={"target_proofs_hr": 100},
                        policy={"launch_instance": "auto"}) as provider:
        run = run_cycle("heartbeat", planner=RulesPlanner())
    assert calls(run)[0] == ("resume_instance", "v-1", "executed")
    assert "launch_instance" not in [c for c, _ in provider.calls]
    assert Instance.objects.get(external_id="v-1").intended_status == "running"


def test_approving_one_of_several_identical_launches_runs_it():
    from agent.planners.script import ScriptPlanner

    launch = {"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "launch_priority": "P1", "reason": "queue"}}
    script = ScriptPlanner([{"parallel": [launch, launch, launch]}])
    with scenario_world([], QUEUED) as provider:
        provider.offers = [{"id": f"o-{i}", "gpu_name": "RTX 4090", "dph": 0.4} for i in range(3)]
        run = run_cycle("operator", planner=script)
        first = Approval.objects.filter(run=run).order_by("pk").first()
        do_decide(first, "approve", "user:alice")
        resume_run(run, planner=script)
    first.refresh_from_db()
    assert first.status == "executed", first.outcome_detail
    assert [c for c, _ in provider.calls].count("launch_instance") == 1
    assert Approval.objects.filter(run=run, status="waiting").count() == 2
