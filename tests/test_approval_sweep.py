"""An operator's decision is never lost to a broker outage: approved while Redis is down (a real
redis-server, SIGKILLed), it is stored, the card says what is known, and the monitor's tick (the
sweep, ``agent.runtime.sweep``) dispatches it once Redis is back — never expired, never left approved and
unrun, and its run is never closed ``done`` without it. Dispatch re-checks the guards as always:
a stale diagnosis is diagnosed again and the operator asked again."""

from datetime import timedelta

import pytest

from agent.models import Approval, Run
from agent.planners.script import ScriptPlanner
from agent.tasks import monitor_tick
from console.celery import app
from fleet.clock import VirtualClock, clock, use_clock
from fleet.models import Alert
from tests.console_support import HX, IDLE, park_stops
from tests.redis_server import RedisServer
from tests.scenario_world import entry, scenario_world
from tests.test_chat import broker_at

# autocommit (as in production): the resume is published at once, inside the view's error handling
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


def _approve_while_redis_is_down(client, user, approval, server) -> str:
    """SIGKILL the broker, approve on the card (htmx), return the card's text."""
    server.kill()
    client.force_login(user)
    resp = client.post(f"/approvals/{approval.pk}/decide/", {"decision": "approve"}, headers=HX)
    assert resp.status_code == 200
    return " ".join(resp.content.decode().split())


def _stops(provider) -> list:
    return [args for call, args in provider.calls if call == "stop_instance"]


def test_an_approval_made_while_redis_is_down_is_dispatched_by_the_sweep_once_redis_is_back(
        client, alice, redis_server):
    vclock = VirtualClock(clock.now())
    with use_clock(vclock), scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider, broker_at(app, redis_server.url):
        run, _ = park_stops("v-1")
        approval = Approval.objects.get(run=run)
        card = _approve_while_redis_is_down(client, alice, approval, redis_server)
        assert "approved and stored, but the agent could not be resumed" in card and "Redis unreachable" in card
        assert "nothing was lost" not in card  # not known: the resume was never queued
        assert "sweep dispatches it within a minute of the broker being back" in card
        approval.refresh_from_db()
        assert approval.status == "approved" and approval.outcome_detail.startswith("resume not queued")
        assert _stops(provider) == []

        redis_server.start()  # the broker is back (empty: a Redis restarted without its data)
        vclock.advance(30)  # the next monitor tick, past the sweep's grace
        monitor_tick()  # beat's task, run here
        approval.refresh_from_db()
        assert approval.status == "executed"
        assert len(_stops(provider)) == 1
        run.refresh_from_db()
        assert run.status == "done" and not run.approvals.filter(status="approved").exists()
        alert = Alert.objects.get(kind="approval_stalled")
        assert f"approval {approval.pk} (stop_instance v-1)" in alert.message and "approved by alice" in alert.message
        assert "its resume could not be queued when it was decided (Redis unreachable" in alert.message
        assert "the monitor's sweep dispatched it: executed" in alert.message

        vclock.advance(60)
        monitor_tick()  # a later sweep finds nothing: the stop ran once
        assert len(_stops(provider)) == 1 and Alert.objects.filter(kind="approval_stalled").count() == 1


def test_a_young_decision_is_left_to_its_own_resume_task(alice, redis_server):
    """Near miss: a decision younger than the sweep's grace is not taken from its resume task."""
    from agent.runtime.approvals import do_decide
    from agent.runtime.sweep import GRACE_S

    vclock = VirtualClock(clock.now())
    with use_clock(vclock), scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider:
        run, _ = park_stops("v-1")
        approval = do_decide(Approval.objects.get(run=run), "approve", "user:alice", user=alice)
        vclock.advance(GRACE_S / 2)
        monitor_tick()
        assert Approval.objects.get(pk=approval.pk).status == "approved" and _stops(provider) == []
        assert not Alert.objects.filter(kind="approval_stalled").exists()


def test_siblings_expiring_never_close_the_run_without_the_approved_call_and_a_stale_diagnosis_is_asked_again(
        client, alice, redis_server):
    vclock = VirtualClock(clock.now())
    with use_clock(vclock), scenario_world([entry("v-1"), entry("v-2"), entry("v-3")], IDLE) as provider, \
            broker_at(app, redis_server.url):
        run, _ = park_stops("v-1", "v-2")
        first, sibling = Approval.objects.filter(run=run).order_by("pk")
        _approve_while_redis_is_down(client, alice, first, redis_server)
        # 28 minutes of outage and then some: the sibling expires, the diagnosis goes stale
        vclock.advance(timedelta(minutes=31).total_seconds())
        from agent.runtime.loop import run_cycle

        run_cycle("heartbeat", planner=ScriptPlanner([]))  # expires the sibling
        sibling.refresh_from_db()
        first.refresh_from_db()
        run.refresh_from_db()
        assert sibling.status == "expired"
        assert first.status == "approved"  # an approved call never expires
        assert run.status == "parked"  # and its run is not closed without it

        redis_server.start()
        vclock.advance(30)
        monitor_tick()
        first.refresh_from_db()
        # dispatched: the guards refused it (the diagnosis went stale while it waited) — so it was
        # diagnosed again and the operator asked again; nothing ran on stale facts
        assert first.status == "void" and first.outcome_detail.startswith("diagnosis_required")
        assert _stops(provider) == []
        [again] = Approval.objects.filter(run=run, status="waiting")
        assert again.tool == "stop_instance" and again.args["instance_id"] == "v-1"
        assert "fresh diagnosis" in again.reason
        refused = Alert.objects.get(kind="approval_refused")
        assert f"approval {first.pk}" in refused.message and "diagnosis_required" in refused.message
        assert f"asked again as approval {again.pk}" in refused.message
        stalled = Alert.objects.get(kind="approval_stalled")
        assert "the monitor's sweep dispatched it: void" in stalled.message
        run.refresh_from_db()
        assert run.status == "parked"

        # the operator answers the fresh question (Redis is up now): it runs once
        from agent.runtime.approvals import do_decide
        from agent.runtime.loop import resume_run

        do_decide(again, "approve", "user:alice", user=alice)
        resume_run(Run.objects.get(pk=run.pk), planner=ScriptPlanner([]))
        assert Approval.objects.get(pk=again.pk).status == "executed"
        assert [a["external_id"] for a in _stops(provider)] == ["v-1"]
        run.refresh_from_db()
        assert run.status == "done"


def test_a_run_closed_with_an_approved_call_unrun_is_parked_again_and_dispatched(alice):
    """What an older build left (a run ``done`` while its approved call never ran) is repaired."""
    from agent.runtime.approvals import do_decide

    vclock = VirtualClock(clock.now())
    with use_clock(vclock), scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider:
        run, _ = park_stops("v-1")
        approval = do_decide(Approval.objects.get(run=run), "approve", "user:alice", user=alice)
        Run.objects.filter(pk=run.pk).update(status="done", ended_at=clock.now())
        vclock.advance(30)
        monitor_tick()
        assert Approval.objects.get(pk=approval.pk).status == "executed" and len(_stops(provider)) == 1
        assert Run.objects.get(pk=run.pk).status == "done"
