"""A rejection is remembered (docs/contract.md ``rejected_recently``).

An operator rejects "stop local-5" with "keep it warm". The same stop, proposed again by any
planner, is refused ``rejected_recently`` until ``rejection_hold_min`` (default 60) passes or
demand changes state (ok ↔ unknown/stale, or the queue going from empty to non-empty). The
agent's memory records the rejection.
"""

import pytest

from agent.models import Approval, MemoryFact
from agent.planners.rules import RulesPlanner
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run, run_cycle
from tests.rails_support import calls, fleet_entry, rails_world, verdict

pytestmark = pytest.mark.django_db

CALM = {"state": "ok", "active": False, "queued": 0, "running": 0, "idle_min": 90}
STOP = {"tool": "stop_instance", "args": {"instance_id": "local-5", "reason": "idle"}}
DIAG = {"tool": "diagnose_instance", "args": {"instance_id": "local-5"}}


def fleet():
    return [fleet_entry("local-4"), fleet_entry("local-5")]


def reject_first_stop(w):
    run = w.cycle([DIAG, STOP])
    do_decide(Approval.objects.get(), "reject", "user:alice", "keep it warm")
    resume_run(run)
    return run


def test_the_same_stop_two_minutes_later_is_refused_and_memory_records_why():
    with rails_world(fleet(), CALM) as w:
        reject_first_stop(w)
        w.clock.advance(120)
        again = w.cycle([DIAG, STOP, verdict()])
    step = calls(again)[1]
    assert (step.outcome, step.reason_code) == ("refused", "rejected_recently")
    assert "keep it warm" in step.detail
    fact = MemoryFact.objects.get(category="rejection", key="stop_instance local-5")
    assert "keep it warm" in fact.value and "user:alice" in fact.value
    assert w.provider_calls("stop_instance") == 0


def test_the_rules_planner_does_not_propose_it_again():
    with rails_world(fleet(), CALM) as w:
        reject_first_stop(w)
        w.clock.advance(120)
        run = run_cycle("heartbeat", planner=RulesPlanner())
    assert not [s for s in calls(run) if s.tool == "stop_instance" and s.args["instance_id"] == "local-5"]


def test_it_lapses_after_the_hold():
    with rails_world(fleet(), CALM) as w:
        reject_first_stop(w)
        w.clock.advance(61 * 60)
        again = w.cycle([DIAG, STOP])
    assert calls(again)[1].outcome == "parked"


def test_the_hold_is_an_objective():
    with rails_world(fleet(), CALM, limits={"rejection_hold_min": 5}) as w:
        reject_first_stop(w)
        w.clock.advance(6 * 60)
        again = w.cycle([DIAG, STOP])
    assert calls(again)[1].outcome == "parked"


@pytest.mark.parametrize("between", [
    {"state": "unknown"},  # ok -> unknown
    {**CALM, "queued": 4, "idle_min": None},  # the queue went from empty to non-empty
])
def test_a_change_of_demand_state_lifts_it(between):
    with rails_world(fleet(), CALM) as w:
        reject_first_stop(w)
        w.clock.advance(60)
        w.demand.demand = between
        w.cycle([verdict()])
        w.clock.advance(60)
        w.demand.demand = CALM
        again = w.cycle([DIAG, STOP])
    assert calls(again)[1].outcome == "parked"


def test_it_binds_that_tool_on_that_instance_only():
    other = {"tool": "stop_instance", "args": {"instance_id": "local-4", "reason": "idle"}}
    with rails_world(fleet(), CALM) as w:
        reject_first_stop(w)
        w.clock.advance(120)
        run = w.cycle([{"tool": "diagnose_instance", "args": {"instance_id": "local-4"}}, other])
    assert calls(run)[1].outcome == "parked"


def test_an_operator_acting_by_hand_is_not_bound_by_it():
    from agent.actions.instances import do_operator_instance_action
    from fleet.models import Instance

    with rails_world(fleet(), CALM) as w:
        reject_first_stop(w)
        w.clock.advance(120)
        w.cycle([DIAG, verdict()])  # a fresh diagnosis for the operator's stop
        do_operator_instance_action(Instance.objects.get(external_id="local-5"), "stop", actor="user:alice",
                                    reason="changed my mind")
    assert w.provider_calls("stop_instance") == 1
