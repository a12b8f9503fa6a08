"""One slow launch must not starve a queue in silence (docs/contract.md "starvation").

With tasks queued and no live worker, a launch pending longer than ``starve_min`` (default 30)
raises ``stuck_provisioning`` once and stops counting for ``launch_pending``; it still counts
toward the instance cap until it is destroyed.
"""

import pytest

from agent.models import SessionState
from agent.planners.rules import RulesPlanner
from agent.runtime.loop import run_cycle
from fleet.models import Alert
from tests.rails_support import calls, fleet_entry, rails_world, verdict

pytestmark = pytest.mark.django_db

STARVED = {"state": "ok", "active": False, "queued": 10, "running": 0, "idle_min": None}
OFFERS = [{"id": f"o-{i}", "gpu_name": "RTX 4090", "dph": 0.4} for i in range(3)]
LAUNCH = {"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "launch_priority": "P0", "reason": "queue"}}


def loading(age_min):
    return [fleet_entry("v-1", status="loading", live=False, age_min=age_min)]


def test_a_launch_pending_past_starve_min_stops_blocking_and_alerts_once():
    with rails_world(loading(40), STARVED, offers=OFFERS) as w:
        run = w.cycle([LAUNCH, verdict()])
        w.clock.advance(60)
        w.cycle([verdict()])
    assert calls(run)[0].outcome == "executed"
    [alert] = Alert.objects.filter(kind="stuck_provisioning")
    assert "v-1" in alert.message and "10 tasks queued" in alert.message
    assert w.provider_calls("launch_instance") == 1


def test_near_miss_a_younger_pending_launch_still_blocks():
    with rails_world(loading(20), STARVED, offers=OFFERS) as w:
        run = w.cycle([LAUNCH, verdict()])
    assert (calls(run)[0].outcome, calls(run)[0].reason_code) == ("refused", "launch_pending")
    assert not Alert.objects.filter(kind="stuck_provisioning").exists()


def test_starve_min_is_an_objective():
    with rails_world(loading(20), STARVED, offers=OFFERS, limits={"starve_min": 15}) as w:
        run = w.cycle([LAUNCH, verdict()])
    assert calls(run)[0].outcome == "executed"


def test_with_a_live_worker_a_slow_launch_is_not_starving():
    busy = {**STARVED, "running": 1}
    with rails_world([fleet_entry("v-0"), *loading(40)], busy, offers=OFFERS) as w:
        run = w.cycle([LAUNCH, verdict()])
    assert calls(run)[0].reason_code == "launch_pending"


def test_it_still_counts_toward_the_instance_cap():
    with rails_world(loading(40), STARVED, offers=OFFERS, limits={"max_instances": 1}) as w:
        run = w.cycle([LAUNCH, verdict()])
    assert (calls(run)[0].outcome, calls(run)[0].reason_code) == ("refused", "instance_cap")


def test_the_rules_planner_launches_past_a_starving_launch():
    with rails_world(loading(40), STARVED, offers=OFFERS) as w:
        SessionState.objects.filter(pk=1).update(target_proofs_hr=100)  # one worker wanted
        run = run_cycle("heartbeat", planner=RulesPlanner())
    launches = [s for s in calls(run) if s.tool == "launch_instance"]
    assert [s.outcome for s in launches] == ["executed"]  # P0 with nothing live: auto
    assert w.provider_calls("launch_instance") == 1
