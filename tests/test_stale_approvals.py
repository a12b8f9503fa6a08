"""A stale approval spends nothing (docs/contract.md ``no_longer_needed``, ``target_gone``).

At dispatch the ``rules`` planner's own sizing runs again on the current demand, fleet and
objectives: a launch or resume no longer needed is refused ``no_longer_needed`` (approved calls
dispatch in approval order, each counting those dispatched before it). An approval whose instance
is gone is void (``target_gone``) at once, in the observe phase, not when clicked. The approval
card shows the situation when parked and now.
"""

import re

import pytest

from agent.models import Approval, SessionState
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run
from tests.rails_support import calls, fleet_entry, rails_world, verdict

pytestmark = pytest.mark.django_db

QUEUED = {"state": "ok", "active": True, "queued": 11, "running": 1, "idle_min": None}
EMPTY = {"state": "ok", "active": False, "queued": 0, "running": 0, "idle_min": 5}
OFFERS = [{"id": f"o-{i}", "gpu_name": "RTX 4090", "dph": 0.4} for i in range(4)]
LAUNCH = {"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "launch_priority": "P1", "reason": "11 queued"}}


def target(proofs_hr: float) -> None:
    SessionState.objects.filter(pk=1).update(target_proofs_hr=proofs_hr)


def test_a_launch_approved_after_the_queue_emptied_is_no_longer_needed():
    with rails_world([fleet_entry("v-1")], QUEUED, offers=OFFERS) as w:
        target(360)  # two workers wanted at 180 proofs/hr each: one more than runs
        run = w.cycle([LAUNCH])
        approval = Approval.objects.get()
        assert approval.situation["queued"] == 11 and approval.situation["demand"] == "ok"
        w.demand.demand = EMPTY  # by the time the operator looks, the queue is empty
        w.clock.advance(600)
        do_decide(approval, "approve", "user:alice")
        resume_run(run)
    step = calls(run)[0]
    assert (step.outcome, step.reason_code) == ("refused", "no_longer_needed")
    assert Approval.objects.get().status == "void"
    assert w.provider_calls("launch_instance") == 0


def test_approved_launches_count_those_dispatched_before_them():
    with rails_world([fleet_entry("v-1")], QUEUED, offers=OFFERS) as w:
        target(540)  # three workers wanted, one runs: two launches parked
        run = w.cycle([{"parallel": [LAUNCH, LAUNCH]}])
        first, second = Approval.objects.order_by("pk")
        target(360)  # the operator lowered the target meanwhile: one launch is enough now
        do_decide(second, "approve", "user:alice")  # approval order, not step order
        w.clock.advance(5)
        do_decide(first, "approve", "user:alice")
        resume_run(run)
    first.refresh_from_db()
    second.refresh_from_db()
    assert second.status == "executed", (second.outcome_detail, first.outcome_detail)
    assert first.status == "void" and first.outcome_detail.startswith("no_longer_needed")
    assert w.provider_calls("launch_instance") == 1


def test_near_miss_a_launch_still_needed_runs():
    with rails_world([fleet_entry("v-1")], QUEUED, offers=OFFERS) as w:
        target(360)
        run = w.cycle([LAUNCH])
        do_decide(Approval.objects.get(), "approve", "user:alice")
        resume_run(run)
    assert calls(run)[0].outcome == "approved_executed"
    assert w.provider_calls("launch_instance") == 1


def test_an_approval_whose_instance_is_gone_is_void_at_once():
    diag = {"tool": "diagnose_instance", "args": {"instance_id": "v-2"}}
    stop = {"tool": "stop_instance", "args": {"instance_id": "v-2", "reason": "idle"}}
    calm = {**EMPTY, "idle_min": 60}
    with rails_world([fleet_entry("v-1"), fleet_entry("v-2")], calm) as w:
        run = w.cycle([diag, stop])
        approval = Approval.objects.get()
        assert approval.status == "waiting"
        # v-2 crashes; the monitor destroys it in the next cycle, before anyone clicks
        w.provider.instances["v-2"]["status"] = "error"
        w.demand.fleet[1]["worker"]["live"] = False
        w.clock.advance(120)
        w.cycle([verdict()])
    approval.refresh_from_db()
    run.refresh_from_db()
    assert approval.status == "void" and approval.outcome_detail.startswith("target_gone")
    step = calls(run)[1]
    assert (step.outcome, step.reason_code) == ("refused", "target_gone")
    assert run.status == "done"  # nothing left waiting: the parked run is closed
    assert w.provider_calls("stop_instance") == 0


def test_the_card_shows_the_situation_then_and_now(client, alice):
    with rails_world([fleet_entry("v-1")], QUEUED, offers=OFFERS) as w:
        target(360)
        w.cycle([LAUNCH])
        w.demand.demand = EMPTY
        w.clock.advance(60)
        w.cycle([verdict()])  # a later observation: the queue is empty now
        client.force_login(alice)
        page = client.get("/approvals/").content.decode()
    # each line of the card, not words any page holds ("now" is in the header's every page)
    then = re.search(r'<div class="then"><dt>when parked</dt><dd>(.*?)</dd>', page, re.S)
    now = re.search(r'<div class="now"><dt[^>]*>now.*?</dt><dd>(.*?)</dd>', page, re.S)
    assert then and "11 queued" in then.group(1), page
    assert now and "0 queued" in now.group(1), page


def test_a_resume_approved_after_the_queue_emptied_is_no_longer_needed():
    stopped = fleet_entry("v-2", status="stopped", live=False)
    resume = {"tool": "resume_instance", "args": {"instance_id": "v-2", "reason": "11 queued"}}
    with rails_world([fleet_entry("v-1"), stopped], QUEUED, policy={"resume_instance": "approval"}) as w:
        target(360)
        run = w.cycle([resume])
        w.demand.demand = EMPTY
        do_decide(Approval.objects.get(), "approve", "user:alice")
        resume_run(run)
    assert (calls(run)[0].outcome, calls(run)[0].reason_code) == ("refused", "no_longer_needed")
    assert w.provider_calls("resume_instance") == 0
