"""The invariant checker (``agent.policy.invariants``): each invariant broken once and a near-miss twin.

Records are written directly where the real pipeline could not break the rule (the guards stand
in its way — that is the point of a second net); the clean path is the real pipeline: a real cycle
that stops an idle instance records the facts it was dispatched on and keeps every invariant, and
every scenario of ``tests/scenarios/`` keeps them too (``tests/test_replay_cases.py``).
"""

from datetime import UTC, datetime, timedelta

import pytest

from agent.models import Approval, Run, SideEffect, Step
from agent.policy.invariants import INVARIANTS, check_all, check_run
from agent.runtime.approvals import do_decide
from fleet.clock import VirtualClock, use_clock
from tests.rails_support import rails_world, verdict

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 6, 9, 16, 0, tzinfo=UTC)
IDLE = {"state": "ok", "queued": 0, "backlog": 0, "running": 0, "workers_expected": 2, "workers_live": 2,
        "workers_dead": 0, "backlog_unknown": False}


def _run(number: int, status: str = "done") -> Run:
    return Run.objects.create(number=number, trigger="test", planner="script", status=status, started_at=T0,
                              ended_at=T0 if status != "running" else None)


def _call(run: Run, seq: int, tool: str, args: dict, *, outcome: str = "executed", actor: str = "agent", turn: int = 1,
          at_call: dict | None = None, facts: dict | None = None, key: str = "", minute: float = 0) -> Step:
    f = dict(facts or {})
    if at_call is not None:
        f["at_call"] = at_call
    return Step.objects.create(run=run, seq=seq, turn=turn, kind="call", actor=actor, tool=tool, args=args, outcome=outcome,
                               idempotency_key=key or f"k-{run.number}-{seq}", facts=f,
                               created_at=T0 + timedelta(minutes=minute))


def _at(*, demand=None, policy="auto", target=None, capacity=2) -> dict:
    return {"demand": dict(IDLE if demand is None else demand), "policy": policy, "capacity": capacity,
            "retire_window_min": 15.0, "retire_budget_pct": 50.0,
            "target": target}


def _target(ident="v-1", *, live=True, owned=0, terminal=False) -> dict:
    return {"id": ident, "status": "running", "terminal": terminal, "worker_live": live, "owned_tasks": owned, "capacity": True}


def _approved(step: Step, alice=None) -> Approval:
    a = Approval.objects.create(run=step.run, step=step, tool=step.tool, args=step.args, idempotency_key=step.idempotency_key,
                                created_at=step.created_at, expires_at=step.created_at + timedelta(hours=1))
    if alice is not None:
        with use_clock(VirtualClock(step.created_at)):
            do_decide(a, "approve", f"user:{alice.username}", user=alice)
    else:  # the row says approved, but no operator decided it
        Approval.objects.filter(pk=a.pk).update(status="executed", decided_at=step.created_at)
    a.refresh_from_db()
    return a


def _names(violations) -> list[str]:
    return sorted(v["invariant"] for v in violations)


STOP = {"instance_id": "v-1", "reason": "idle"}
LAUNCH = {"gpu_name": "RTX 4090", "launch_priority": "P1", "reason": "work waits"}


def test_every_violation_has_its_shape_and_a_known_name():
    run = _run(1)
    _call(run, 1, "stop_instance", STOP, at_call=_at(demand={**IDLE, "queued": 3}, target=_target()))
    [v] = check_run(run)
    assert set(v) == {"invariant", "cycle", "run", "call", "detail"}
    assert v["invariant"] in INVARIANTS and v["cycle"] == 1 and v["run"] == 1 and v["call"] == 1
    assert "3 tasks queued" in v["detail"] and "stop_instance v-1" in v["detail"]


def test_stop_of_a_live_worker_owning_tasks():
    run = _run(1)
    _call(run, 1, "stop_instance", STOP, at_call=_at(target=_target(owned=2)))
    assert _names(check_run(run)) == ["owned_tasks"]


def test_near_miss_stop_of_a_live_worker_owning_nothing():
    run = _run(1)
    _call(run, 1, "stop_instance", STOP, at_call=_at(target=_target(owned=0)))
    assert check_run(run) == []


def test_refused_stop_of_an_owner_is_no_violation():
    run = _run(1)
    _call(run, 1, "stop_instance", STOP, outcome="refused", at_call=_at(target=_target(owned=2)))
    assert check_run(run) == []


@pytest.mark.parametrize("demand, why", [
    ({**IDLE, "queued": 3}, "3 tasks queued"),
    ({**IDLE, "backlog": 4}, "4 in the backlog"),
    ({**IDLE, "state": "unknown"}, "demand was unknown"),
    ({**IDLE, "workers_dead": 1}, "1 expected worker(s) dead"),
    ({**IDLE, "workers_live": None}, "missing workers_live"),
    ({**IDLE, "backlog_unknown": True}, "backlog could not be read"),
])
def test_scale_down_while_work_waits_or_demand_is_not_ok(demand, why):
    run = _run(1)
    _call(run, 1, "destroy_instance", STOP, at_call=_at(demand=demand, policy="auto", target=_target(live=False)))
    [v] = check_run(run)
    assert v["invariant"] == "scale_down_while_needed" and why in v["detail"]


def test_near_miss_terminal_instance_is_replaced_not_scaled_down():
    run = _run(1)
    _call(run, 1, "destroy_instance", STOP, at_call=_at(demand={**IDLE, "queued": 3, "workers_dead": 1},
                                                         target=_target(live=False, terminal=True)))
    assert check_run(run) == []


def test_without_a_call_record_the_run_observation_is_read():
    """A step written before the call record existed: the run's observation before it decides."""
    run = _run(1)
    Step.objects.create(run=run, seq=1, kind="observe", actor="system", created_at=T0,
                        observation='{"demand": {"state": "stale", "queued": null}}')
    _call(run, 2, "stop_instance", STOP)
    twin = _run(2)
    Step.objects.create(run=twin, seq=1, kind="observe", actor="system", created_at=T0,
                        observation='{"demand": {"state": "ok", "queued": 0, "running": 0, "workers_expected": 1, '
                                    '"workers_live": 1, "workers_dead": 0, "backlog": 0}}')
    _call(twin, 2, "stop_instance", STOP)
    assert _names(check_run(run)) == ["scale_down_while_needed"]
    assert check_run(twin) == []


def test_side_effect_ran_by_itself_where_the_policy_said_approval():
    run = _run(1)
    _call(run, 1, "stop_instance", STOP, at_call=_at(policy="approval", target=_target()))
    twin = _run(2)
    _call(twin, 1, "stop_instance", STOP, at_call=_at(policy="auto", target=_target()))
    assert _names(check_run(run)) == ["approval_bypassed"]
    assert check_run(twin) == []


def test_approved_call_without_an_operators_decision(alice):
    run = _run(1)
    s = _call(run, 1, "stop_instance", STOP, outcome="approved_executed", at_call=_at(policy="approval", target=_target()))
    _approved(s)
    twin = _run(2)
    s2 = _call(twin, 1, "stop_instance", STOP, outcome="approved_executed", at_call=_at(policy="approval", target=_target()))
    _approved(s2, alice)
    [v] = check_run(run)
    assert v["invariant"] == "approval_bypassed" and "no operator approved" in v["detail"]
    assert check_run(twin) == []


def test_dead_owner_stopped_without_approval_is_a_forced_approval_bypassed(alice):
    run = _run(1)
    _call(run, 1, "stop_instance", STOP, at_call=_at(target=_target(live=False, owned=1)))
    twin = _run(2)
    s = _call(twin, 1, "stop_instance", STOP, outcome="approved_executed", at_call=_at(target=_target(live=False, owned=1)))
    _approved(s, alice)
    [v] = check_run(run)
    assert v["invariant"] == "approval_bypassed" and "forced approval" in v["detail"]
    assert check_run(twin) == []


def test_launch_beyond_the_need_without_an_operator(alice):
    beyond = {"need": {"workers": 1, "capacity": 1, "within": False}}
    run = _run(1)
    _call(run, 1, "launch_instance", LAUNCH, facts=beyond, at_call=_at(policy="auto"))
    twin = _run(2)
    s = _call(twin, 1, "launch_instance", LAUNCH, outcome="approved_executed", facts=beyond, at_call=_at(policy="auto"))
    _approved(s, alice)
    within = _run(3)
    _call(within, 1, "launch_instance", LAUNCH, facts={"need": {"workers": 2, "capacity": 1, "within": True}},
          at_call=_at(policy="auto"))
    assert _names(check_run(run)) == ["launch_beyond_need"]
    assert check_run(twin) == [] and check_run(within) == []


def test_identical_copy_beyond_the_need(alice):
    run = _run(1)
    first = _call(run, 1, "launch_instance", LAUNCH, outcome="approved_executed",
                  facts={"need": {"workers": 1, "capacity": 0, "within": True}}, at_call=_at())
    copy = _call(run, 2, "launch_instance", LAUNCH, outcome="approved_executed",
                 facts={"need": {"workers": 1, "capacity": 1, "within": False}}, at_call=_at())
    for s in (first, copy):
        _approved(s, alice)
    twin = _run(2)
    first = _call(twin, 1, "launch_instance", LAUNCH, outcome="approved_executed",
                  facts={"need": {"workers": 1, "capacity": 0, "within": True}}, at_call=_at())
    other = _call(twin, 2, "launch_instance", {**LAUNCH, "gpu_name": "RTX 3090"}, outcome="approved_executed",
                  facts={"need": {"workers": 1, "capacity": 1, "within": False}}, at_call=_at())
    for s in (first, other):
        _approved(s, alice)
    [v] = check_run(run)
    assert v["invariant"] == "identical_copy_beyond_need" and v["call"] == 2
    assert check_run(twin) == []


def test_disruption_budget_spent_within_the_window():
    retires = {"retires_capacity": True}
    run = _run(1)
    _call(run, 1, "stop_instance", STOP, facts=retires, at_call=_at(capacity=2, target=_target("v-1")))
    _call(run, 2, "stop_instance", {**STOP, "instance_id": "v-2"}, facts=retires, minute=5,
          at_call=_at(capacity=1, target=_target("v-2")))
    [v] = check_run(run)
    assert v["invariant"] == "disruption_budget" and v["call"] == 2 and "budget was 1" in v["detail"]


def test_near_miss_second_retirement_after_the_window():
    retires = {"retires_capacity": True}
    run = _run(1)
    _call(run, 1, "stop_instance", STOP, facts=retires, at_call=_at(capacity=2, target=_target("v-1")))
    _call(run, 2, "stop_instance", {**STOP, "instance_id": "v-2"}, facts=retires, minute=20,
          at_call=_at(capacity=1, target=_target("v-2")))
    assert check_run(run) == []


def test_one_effect_per_idempotency_key():
    a, b = _run(1), _run(2)
    _call(a, 1, "stop_instance", STOP, key="same-key", at_call=_at(target=_target()))
    _call(b, 1, "stop_instance", STOP, key="same-key", at_call=_at(target=_target()))
    [v] = check_all()
    assert v["invariant"] == "idempotency" and v["run"] == 2 and "ran 2 times" in v["detail"]


def test_near_miss_same_key_refused_duplicate():
    a, b = _run(1), _run(2)
    _call(a, 1, "stop_instance", STOP, key="same-key", at_call=_at(target=_target()))
    _call(b, 1, "stop_instance", STOP, key="same-key", outcome="refused", at_call=_at(target=_target()))
    SideEffect.objects.create(key="same-key", tool="stop_instance", args=STOP, instance_ref="v-1", status="done", claimed_at=T0)
    assert check_all() == []


def test_two_runs_at_once():
    a, b = _run(1), _run(2)
    Step.objects.create(run=a, seq=1, kind="observe", actor="system", created_at=T0, observation="{}")
    Step.objects.create(run=b, seq=1, kind="observe", actor="system", created_at=T0, observation="{}")
    Step.objects.create(run=a, seq=2, kind="text", actor="agent", created_at=T0, text="done")
    [v] = check_all()
    assert v["invariant"] == "one_run_at_a_time" and "run 2 wrote steps while run 1 held the lock" in v["detail"]


def test_near_miss_a_chat_message_queued_while_a_run_holds_the_lock():
    a, b = _run(1), _run(2, status="queued")
    Step.objects.create(run=a, seq=1, kind="observe", actor="system", created_at=T0, observation="{}")
    Step.objects.create(run=b, seq=0, kind="message", actor="user:alice", created_at=T0, text="how many workers?")
    Step.objects.create(run=a, seq=2, kind="text", actor="agent", created_at=T0, text="done")
    assert check_all() == []


def test_operators_own_action_is_not_judged():
    run = _run(1)
    _call(run, 1, "stop_instance", STOP, actor="user:alice", at_call=_at(demand={**IDLE, "queued": 9}, target=_target(owned=3)))
    assert check_run(run) == []


def test_real_cycle_records_what_a_stop_was_dispatched_on():
    with rails_world(diagnosed=["v-1"], policy={"stop_instance": "auto"}, limits={"retire_budget_pct": 100}) as w:
        run = w.cycle([{"tool": "stop_instance", "args": STOP}, verdict(True, True)])
    step = run.steps.get(kind="call", tool="stop_instance")
    assert step.outcome == "executed"
    at = step.facts["at_call"]
    assert at["demand"]["state"] == "ok" and at["demand"]["queued"] == 0 and at["policy"] == "auto"
    assert at["target"] == {"id": "v-1", "status": "running", "terminal": False, "worker_live": True, "owned_tasks": 0,
                            "capacity": True}
    assert check_all() == []


def test_real_cycle_approval_policy_recorded_at_dispatch(alice):
    from agent.planners.script import ScriptPlanner
    from agent.runtime.loop import resume_run

    with rails_world(diagnosed=["v-1"], limits={"retire_budget_pct": 100}) as w:
        run = w.cycle([{"tool": "stop_instance", "args": STOP}, verdict(True, True)])
        do_decide(Approval.objects.get(run=run), "approve", "user:alice", user=alice)
        resume_run(run, planner=ScriptPlanner([verdict(True, True)]))
    step = run.steps.get(kind="call", tool="stop_instance")
    assert step.outcome == "approved_executed" and step.facts["at_call"]["policy"] == "approval"
    assert check_all() == []
    # the same record with the operator's decision taken away is a bypass
    from fleet.models import AuditLog

    AuditLog.objects.filter(verb="approve_call").delete()
    assert _names(check_all()) == ["approval_bypassed"]
