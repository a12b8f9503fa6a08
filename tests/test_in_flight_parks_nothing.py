"""``in_flight`` is the guard's answer, not only the claim's (docs/contract.md "Side effects and
claims"): a call on an instance that already has an open claim is refused at scoring, so it
never parks an approval that could only fail later. The unique index on open claims answers a
call that runs at once with the same code, so only a call whose policy parks it shows whether
the guard itself is there: without it, the reboot below would wait in the inbox.
"""

from datetime import timedelta

import pytest

from agent.models import Approval, SideEffect
from agent.planners.rules import RulesPlanner
from agent.runtime.loop import run_cycle
from fleet.clock import clock
from tests.rails_support import calls, fleet_entry, rails_world

pytestmark = pytest.mark.django_db

#: the only worker is dead with work queued: the rules planner diagnoses v-1 and proposes a reboot
DEAD = {"state": "ok", "active": False, "queued": 40, "running": 0, "idle_min": None}


def reboot_with_policy_approval(open_claim: bool):
    """One rules cycle with ``reboot_instance`` needing approval; with ``open_claim`` an earlier
    reboot of v-1 (another run's) is claimed and unfinished. Returns (the reboot steps, approvals)."""
    with rails_world([fleet_entry("v-1", live=False)], DEAD, policy={"reboot_instance": "approval"},
                     limits={"max_instances": 1}) as w:
        if open_claim:
            SideEffect.objects.create(key="other-run-reboot", tool="reboot_instance", args={"instance_id": "v-1"},
                                      instance_ref="v-1", actor="agent", claimed_at=clock.now() - timedelta(minutes=1))
        run = run_cycle("heartbeat", planner=RulesPlanner())
        assert w.provider_calls("reboot_instance") == 0
    run.refresh_from_db()
    return [s for s in calls(run) if s.tool == "reboot_instance"], list(Approval.objects.filter(tool="reboot_instance"))


def test_a_call_on_an_instance_with_an_open_claim_is_refused_in_flight_not_parked():
    steps, approvals = reboot_with_policy_approval(open_claim=True)
    assert [(s.outcome, s.reason_code) for s in steps] == [("refused", "in_flight")]
    assert approvals == []


def test_near_miss_without_the_open_claim_the_same_call_parks_for_an_operator():
    steps, approvals = reboot_with_policy_approval(open_claim=False)
    assert [(s.outcome, s.reason_code) for s in steps] == [("parked", "approval_required")]
    assert [a.status for a in approvals] == ["waiting"]
