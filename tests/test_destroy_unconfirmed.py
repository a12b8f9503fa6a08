"""An instance whose destroy was asked for but still runs is neither capacity nor forgotten
(docs/contract.md ``destroy_unconfirmed``, ``target_gone``).

Still listed 15 minutes after its destroy: the ``destroy_unconfirmed`` alert fires, the monitor
sends the destroy again (never refused ``target_gone``), and the ``rules`` planner does not count
it as capacity: work queued gets a replacement.
"""

from datetime import timedelta

import pytest

from agent.models import SessionState
from agent.planners.rules import RulesPlanner
from agent.runtime.loop import run_cycle
from fleet.clock import clock
from fleet.models import Alert, Instance
from tests.rails_support import calls, fleet_entry, rails_world

pytestmark = pytest.mark.django_db

QUEUED = {"state": "ok", "active": True, "queued": 6, "running": 0, "idle_min": None}
OFFERS = [{"id": "o-1", "gpu_name": "RTX 4090", "dph": 0.4}]


def test_a_destroy_still_running_after_15_min_alerts_is_sent_again_and_replaced():
    with rails_world([fleet_entry("v-1", live=False)], QUEUED, offers=OFFERS) as w:
        SessionState.objects.filter(pk=1).update(target_proofs_hr=100)  # one worker wanted
        Instance.objects.filter(external_id="v-1").update(destroy_requested_at=clock.now() - timedelta(minutes=16),
                                                          intended_status="destroyed")
        run = run_cycle("heartbeat", planner=RulesPlanner())
    [monitor] = run.steps.filter(kind="call", actor="monitor")
    assert (monitor.tool, monitor.outcome) == ("destroy_instance", "executed"), monitor.detail
    assert "unconfirmed" in monitor.call_reason
    assert Alert.objects.filter(kind="destroy_unconfirmed", message__contains="v-1").count() == 1
    assert w.provider_calls("destroy_instance") == 1
    launches = [s for s in calls(run) if s.tool == "launch_instance"]
    assert [s.outcome for s in launches] == ["executed"]  # not counted as capacity


def test_a_confirmed_destroy_listed_again_is_reopened_and_sent_again():
    """The row was marked killed by a re-list that raced the provider; the provider lists it again:
    the destroy is unconfirmed after all, and the re-sent destroy is not refused target_gone."""
    with rails_world([fleet_entry("v-1", live=False)], QUEUED) as w:
        Instance.objects.filter(external_id="v-1").update(destroy_requested_at=clock.now() - timedelta(minutes=20),
                                                          killed_at=clock.now() - timedelta(minutes=19),
                                                          killed_by="monitor", intended_status="destroyed")
        run = run_cycle("heartbeat", planner=RulesPlanner())
    [monitor] = run.steps.filter(kind="call", actor="monitor")
    assert (monitor.tool, monitor.outcome) == ("destroy_instance", "executed"), monitor.detail
    assert Alert.objects.filter(kind="destroy_unconfirmed").count() == 1
    assert w.provider_calls("destroy_instance") == 1
    assert Instance.objects.get(external_id="v-1").killed_at is not None  # confirmed this time


def test_near_miss_a_stop_of_a_row_marked_gone_is_target_gone():
    with rails_world([fleet_entry("v-1", live=False)], QUEUED, policy={"stop_instance": "auto"}) as w:
        Instance.objects.filter(external_id="v-1").update(killed_at=clock.now(), killed_by="provider",
                                                          kill_reason="vanished")
        run = w.cycle([{"tool": "stop_instance", "args": {"instance_id": "v-1", "reason": "x"}}])
    assert (calls(run)[0].outcome, calls(run)[0].reason_code) == ("refused", "target_gone")
    assert w.provider_calls("stop_instance") == 0
