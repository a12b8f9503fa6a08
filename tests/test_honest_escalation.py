"""A report never says an action happened that was refused.

The only worker is dead with 40 tasks queued; the rules planner diagnoses it and proposes a
reboot, which the guards refuse (a side effect on it is already in flight). The escalation to an
operator says the repair was proposed, never that it is "repairing"; the run's report and the
planner's final answer list the reboot as refused, not done.
"""

from datetime import timedelta

import pytest

from agent.models import SideEffect
from agent.planners.rules import RulesPlanner
from agent.runtime.loop import run_cycle
from fleet.clock import clock
from fleet.models import Alert
from tests.rails_support import calls, fleet_entry, rails_world

pytestmark = pytest.mark.django_db

DEAD = {"state": "ok", "active": False, "queued": 40, "running": 0, "idle_min": None}


def run_with_reboot_in_flight(in_flight: bool):
    with rails_world([fleet_entry("v-1", live=False)], DEAD, policy={"reboot_instance": "auto"},
                     limits={"max_instances": 1}) as w:
        if in_flight:
            SideEffect.objects.create(key="other-run-reboot", tool="reboot_instance", args={"instance_id": "v-1"},
                                      instance_ref="v-1", actor="agent", claimed_at=clock.now() - timedelta(minutes=1))
        run = run_cycle("heartbeat", planner=RulesPlanner())
    run.refresh_from_db()
    return w, run


def test_a_refused_repair_is_never_reported_as_happening():
    w, run = run_with_reboot_in_flight(True)
    reboot = [s for s in calls(run) if s.tool == "reboot_instance"]
    assert [(s.outcome, s.reason_code) for s in reboot] == [("refused", "in_flight")]
    [alert] = Alert.objects.filter(kind="escalation")
    assert "repairing" not in alert.message.lower()
    assert "proposed repair (reboot v-1)" in alert.message
    done_line = next(line for line in run.final_report.splitlines() if line.startswith("Done:"))
    assert "reboot" not in done_line
    assert "reboot_instance(v-1) — in_flight" in run.final_report
    assert "Did:" not in run.final_answer and "No fleet change made" in run.final_answer
    assert w.provider_calls("reboot_instance") == 0


def test_near_miss_a_repair_that_ran_is_reported_done():
    w, run = run_with_reboot_in_flight(False)
    done_line = next(line for line in run.final_report.splitlines() if line.startswith("Done:"))
    assert "reboot_instance(v-1)" in done_line
    assert "Did: reboot_instance(v-1)" in run.final_answer
    assert w.provider_calls("reboot_instance") == 1
