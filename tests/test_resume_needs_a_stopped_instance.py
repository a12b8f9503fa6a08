"""A resume is for a stopped instance: one that runs or is still provisioning is refused before
anything reaches the provider, by the operator's path and the agent's alike, and it blocks nothing."""

import pytest

from agent.actions import do_operator_instance_action
from agent.loop import run_cycle
from agent.models import AuditLog, SideEffect
from agent.planners.script import ScriptPlanner
from fleet.models import Instance
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

IDLE = {"state": "ok", "active": False, "queued": 0, "running": 0, "workers_expected": 1, "workers_live": 1, "idle_min": 60}
QUEUED = {"state": "ok", "active": False, "queued": 3, "running": 0, "workers_expected": 0, "workers_live": 0, "idle_min": None}


@pytest.mark.parametrize("status", ["running", "loading"])
def test_an_operator_resume_of_a_running_instance_is_refused_and_sends_nothing(status):
    with scenario_world([entry("v-1", status=status)], IDLE) as provider:
        inst = Instance.objects.get(external_id="v-1")
        since = inst.status_since
        with pytest.raises(ValueError, match="nothing to resume"):
            do_operator_instance_action(inst, "resume", actor="user:alice", reason="try")
        assert "resume_instance" not in [c for c, _ in provider.calls]
        assert Instance.objects.get(external_id="v-1").status_since == since
        assert not SideEffect.objects.filter(status="claimed").exists()  # nothing left in flight


def test_the_agent_s_resume_of_a_running_instance_errors_without_a_provider_call():
    script = ScriptPlanner([{"tool": "resume_instance", "args": {"instance_id": "v-1", "reason": "more"}}])
    with scenario_world([entry("v-1")], QUEUED, policy={"resume_instance": "auto"}) as provider:
        run = run_cycle("heartbeat", planner=script)
    (step,) = run.steps.filter(kind="call")
    assert step.outcome == "error" and "nothing to resume" in step.detail
    assert "resume_instance" not in [c for c, _ in provider.calls]


def test_near_miss_a_stopped_instance_is_resumed():
    with scenario_world([entry("v-1", status="stopped", live=False)], QUEUED) as provider:
        do_operator_instance_action(Instance.objects.get(external_id="v-1"), "resume", actor="user:alice", reason="work")
    assert "resume_instance" in [c for c, _ in provider.calls]
    assert AuditLog.objects.filter(verb__startswith="resume").exists()
