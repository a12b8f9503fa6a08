"""The rules planner does not propose again what already waits for an operator (once the
re-proposals were refused ``duplicate``, noise in every later run), and a ``duplicate`` refusal
names the call and the approval it repeats."""

import pytest

from agent.models import Approval, Step
from agent.planners.base import Proposal
from agent.planners.rules import RulesPlanner, not_waiting
from agent.policy.guards import duplicate
from agent.runtime.loop import run_cycle
from tests.console_support import IDLE, park_stops
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def test_a_second_cycle_proposes_nothing_that_already_waits():
    with scenario_world([entry("v-1"), entry("v-2")], IDLE):
        first = run_cycle("heartbeat", planner=RulesPlanner())
        stops = set(Approval.objects.filter(run=first, tool="stop_instance").values_list("args__instance_id", flat=True))
        assert stops == {"v-1", "v-2"}, list(first.steps.values_list("tool", "outcome", "reason_code"))
        second = run_cycle("heartbeat", planner=RulesPlanner())
    calls = list(Step.objects.filter(run=second, kind="call").values_list("tool", "reason_code"))
    assert ("stop_instance", "duplicate") not in calls and not any(t == "stop_instance" for t, _ in calls), calls
    assert Approval.objects.filter(status="waiting").count() == 2


def test_waiting_launches_count_as_capacity_on_its_way():
    with scenario_world([entry("v-1")], IDLE):
        run, _ = park_stops("v-1")  # one stop waits for v-1
        stop = Approval.objects.get()
        step = Step.objects.create(run=run, seq=99, kind="call", tool="launch_instance", created_at=stop.created_at)
        Approval.objects.create(run=run, step=step, tool="launch_instance", args={"launch_priority": "P1"},
                                idempotency_key="k-launch", created_at=stop.created_at, expires_at=stop.expires_at)
    calls = [Proposal("stop_instance", {"instance_id": "v-1"}), Proposal("stop_instance", {"instance_id": "v-2"}),
             Proposal("launch_instance", {"launch_priority": "P1"}), Proposal("launch_instance", {"launch_priority": "P1"})]
    kept = not_waiting(calls)
    assert [(p.tool, p.args.get("instance_id")) for p in kept] == [("stop_instance", "v-2"), ("launch_instance", None)]


def test_a_duplicate_refusal_names_the_call_and_its_approval():
    with scenario_world([entry("v-1"), entry("v-2")], IDLE):
        run, _ = park_stops("v-1", "v-2")
        a1 = Approval.objects.get(args__instance_id="v-1")
        a2 = Approval.objects.get(args__instance_id="v-2")
        r1 = duplicate("stop_instance", dict(a1.args), "another-key-1")
        r2 = duplicate("stop_instance", dict(a2.args), "another-key-2")
    assert r1.code == r2.code == "duplicate"
    assert f"stop_instance of v-1 already waits for approval {a1.pk} (parked by run #{run.number})" in r1.detail
    assert f"stop_instance of v-2 already waits for approval {a2.pk}" in r2.detail
