"""The observe cycle: run numbering, the run lock, queued chat runs, parking and resuming."""

from datetime import timedelta

import pytest

from agent.actions.runs import do_post_message
from agent.actions.session import do_reset_session
from agent.models import Approval, Run, SessionState, SideEffect
from agent.planners.script import ScriptPlanner
from agent.runtime.approvals import DecisionError, do_decide
from agent.runtime.loop import acquire_lock, release_lock, resume_run, run_cycle
from fleet.clock import VirtualClock, use_clock
from fleet.models import Alert
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

IDLE = {"state": "ok", "active": False, "queued": 0, "running": 0, "workers_expected": 1, "workers_live": 1, "idle_min": 60}


def test_it_numbers_runs_from_the_anchor_across_a_reset():
    with scenario_world([entry("v-1")], IDLE):
        first = run_cycle("operator", planner=ScriptPlanner([]))
        do_reset_session("user:alice")
        second = run_cycle("operator", planner=ScriptPlanner([]))
    assert (first.number, second.number) == (1, 2)
    assert second.epoch == first.epoch + 1
    assert SessionState.get().next_run_id == 3


def test_it_skips_a_cycle_while_another_run_holds_the_lock():
    token = acquire_lock()
    with scenario_world([entry("v-1")], IDLE):
        assert run_cycle("heartbeat", planner=ScriptPlanner([])) is None
        release_lock(token)
        assert run_cycle("heartbeat", planner=ScriptPlanner([])) is not None


def test_it_takes_over_an_expired_lock():
    clock = VirtualClock(SessionState.get().updated_at)
    with use_clock(clock):
        assert acquire_lock(ttl_s=60) is not None
        assert acquire_lock(ttl_s=60) is None
        clock.advance(61)
        assert acquire_lock(ttl_s=60) is not None


def test_it_runs_a_queued_chat_message():
    step = do_post_message("how is the fleet?", "user:alice")
    with scenario_world([entry("v-1")], IDLE):
        run = run_cycle("chat", planner=ScriptPlanner([{"text": 'ok <verdict>{"action": false, "state_changed": false}</verdict>'}]))
    assert run.pk == step.run_id
    run.refresh_from_db()
    assert run.status == "done"
    assert run.included_in_prompt is False  # a no-op run is skipped in the prompt


def test_a_parked_run_releases_the_lock_and_resumes_after_approval():
    script = ScriptPlanner([
        {"tool": "diagnose_instance", "args": {"instance_id": "v-1"}},
        {"tool": "stop_instance", "args": {"instance_id": "v-1", "reason": "idle"}},
        {"text": 'done <verdict>{"action": true, "state_changed": true}</verdict>'},
    ])
    with scenario_world([entry("v-1")], IDLE, policy={"stop_instance": "approval"}) as provider:
        run = run_cycle("operator", planner=script)
        assert run.status == "parked"
        token = acquire_lock()
        assert token is not None  # the parked run does not hold the lock
        release_lock(token)
        approval = Approval.objects.get(run=run)
        do_decide(approval, "approve", "user:alice")
        with pytest.raises(DecisionError):
            do_decide(approval, "approve", "user:bob")  # a double click decides once
        resume_run(run, planner=script)
        resume_run(run, planner=script)  # a replayed resume executes nothing more
    run.refresh_from_db()
    stop = run.steps.get(tool="stop_instance")
    assert stop.outcome == "approved_executed"
    assert run.status == "done"
    assert [c for c, _ in provider.calls].count("stop_instance") == 1
    assert SideEffect.objects.filter(tool="stop_instance").count() == 1


def test_a_rejection_goes_back_as_rejected_not_success():
    script = ScriptPlanner([
        {"tool": "diagnose_instance", "args": {"instance_id": "v-1"}},
        {"tool": "stop_instance", "args": {"instance_id": "v-1", "reason": "idle"}},
    ])
    with scenario_world([entry("v-1")], IDLE, policy={"stop_instance": "approval"}) as provider:
        run = run_cycle("operator", planner=script)
        approval = Approval.objects.get(run=run)
        with pytest.raises(DecisionError):
            do_decide(approval, "reject", "user:alice", comment="")  # a rejection needs a reason
        do_decide(approval, "reject", "user:alice", comment="keep it for the night batch")
        resume_run(run, planner=script)
    stop = Run.objects.get(pk=run.pk).steps.get(tool="stop_instance")
    assert stop.outcome == "rejected"
    assert stop.observation.startswith("ok: false")
    assert "keep it for the night batch" in stop.observation
    assert "stop_instance" not in [c for c, _ in provider.calls]


def test_an_approval_granted_on_stale_facts_executes_nothing():
    script = ScriptPlanner([
        {"tool": "diagnose_instance", "args": {"instance_id": "v-1"}},
        {"tool": "stop_instance", "args": {"instance_id": "v-1", "reason": "idle"}},
    ])
    clock = VirtualClock(SessionState.get().updated_at)
    with use_clock(clock), scenario_world([entry("v-1")], IDLE, policy={"stop_instance": "approval"}) as provider:
        run = run_cycle("operator", planner=script)
        approval = Approval.objects.get(run=run)
        clock.advance(timedelta(minutes=20).total_seconds())  # the diagnosis goes stale
        do_decide(approval, "approve", "user:alice")
        resume_run(run, planner=script)
    stop, again = Run.objects.get(pk=run.pk).steps.filter(tool="stop_instance").order_by("seq")
    assert (stop.outcome, stop.reason_code) == ("refused", "diagnosis_required")
    void = Approval.objects.get(pk=approval.pk)
    assert void.status == "void" and "diagnosed again and asked again" in void.outcome_detail
    assert "stop_instance" not in [c for c, _ in provider.calls]
    # diagnosed again and asked again: the same call waits for the operator, with the fresh verdict
    rediag = Run.objects.get(pk=run.pk).steps.filter(tool="diagnose_instance").order_by("-seq").first()
    assert rediag.seq < again.seq and rediag.outcome == "executed"
    assert again.outcome == "parked" and again.approval.status == "waiting" and "fresh diagnosis" in again.call_reason
    assert Run.objects.get(pk=run.pk).status == "parked"
    alert = Alert.objects.get(kind="approval_refused")
    assert f"approval {approval.pk}" in alert.message and "diagnosis_required" in alert.message
