"""Unit tests of ``agent.runtime.breakers`` over persisted steps: each breaker trips, and its near miss doesn't.

The state is rebuilt with ``BreakerState.load(run, limits)`` from Step rows, as a resumed run
would; ``forbidden_tool`` and ``forged_observation`` are pipeline stages (test_pipeline_stages.py).
A few loop-level checks at the end run the breakers inside a real cycle.
"""

from itertools import count

import pytest

from agent.models import Approval, Run, Step
from agent.policy.table import effective_limits
from agent.runtime.breakers import BreakerState
from fleet.clock import VirtualClock, use_clock
from tests.rails_support import NOW, calls, extra_tool, rails_world, verdict

pytestmark = pytest.mark.django_db

_numbers = count(1000)


@pytest.fixture
def vclock():
    with use_clock(VirtualClock(NOW)) as clk:
        yield clk


def new_run(**fields) -> Run:
    return Run.objects.create(number=next(_numbers), trigger="test", planner="script", started_at=NOW, **fields)


class Trace:
    """Writes a run's steps the way the pipeline would persist them."""

    def __init__(self, run: Run):
        self.run, self.seq = run, 0

    def step(self, **fields) -> Step:
        self.seq += 1
        fields.setdefault("actor", "agent")
        return Step.objects.create(run=self.run, seq=self.seq, created_at=NOW, **fields)

    def call(self, turn, tool, args, outcome="executed", **fields) -> Step:
        return self.step(kind="call", turn=turn, tool=tool, args=args, outcome=outcome, **fields)

    def error(self, turn, tool, args, detail, kind="permanent") -> Step:
        return self.call(turn, tool, args, "error", detail=detail, error_kind=kind, ok=False)

    def text(self, turn, text="let me think") -> Step:
        return self.step(kind="text", turn=turn, text=text, outcome="text")


def limits(**over):
    return effective_limits().model_copy(update=over)


# --- max_steps ----------------------------------------------------------------------------------
def test_max_steps_trips_at_the_cap(vclock):
    run = new_run()
    t = Trace(run)
    for turn in range(12):
        t.call(turn, "list_instances", {"status": f"s{turn}"})
    halt = BreakerState.load(run, limits()).before_turn(run)
    assert halt is not None and halt.code == "max_steps"


def test_near_miss_max_steps_one_turn_below_the_cap(vclock):
    run = new_run()
    t = Trace(run)
    for turn in range(11):
        t.call(turn, "list_instances", {"status": f"s{turn}"})
    assert BreakerState.load(run, limits()).before_turn(run) is None


def test_a_batch_is_one_turn_for_max_steps(vclock):
    run = new_run()
    t = Trace(run)
    for pos in range(20):
        t.call(0, "diagnose_instance", {"instance_id": f"v-{pos}"}, position=pos, batch=True)
    st = BreakerState.load(run, limits())
    assert st.turns == 1 and st.before_turn(run) is None


# --- same_error ---------------------------------------------------------------------------------
def test_same_error_trips_on_two_identical_errors_whatever_the_arguments(vclock):
    run = new_run()
    t = Trace(run)
    t.error(0, "diagnose_instance", {"instance_id": "v-1"}, "permanent error (not_found): no instance 'v-1'")
    st = BreakerState.load(run, limits())
    s = t.error(1, "diagnose_instance", {"instance_id": "v-2"}, "permanent error (not_found): no instance 'v-2'")
    st.record_call(s)
    halt = st.after_error("diagnose_instance", False)
    assert halt is not None and halt.code == "same_error"


def test_invalid_args_count_toward_same_error(vclock):
    run = new_run()
    t = Trace(run)
    why = "the argument string is not valid JSON (Unterminated string); send one JSON object"
    t.call(0, "launch_instance", None, "refused", reason_code="invalid_args", detail=why)
    t.call(1, "launch_instance", None, "refused", reason_code="invalid_args", detail=why)
    st = BreakerState.load(run, limits())
    assert st.after_error("launch_instance", False).code == "same_error"


def test_near_miss_same_error_different_messages(vclock):
    run = new_run()
    t = Trace(run)
    t.error(0, "search_offers", {}, "transient error (http_429): too many requests", kind="transient")
    t.error(1, "search_offers", {"gpu_name": "A100"}, "transient error (http_500): internal", kind="transient")
    assert BreakerState.load(run, limits()).after_error("search_offers", False) is None


def test_near_miss_guard_refusals_never_count_as_errors(vclock):
    run = new_run()
    t = Trace(run)
    for turn in range(3):
        t.call(turn, "stop_instance", {"instance_id": f"v-{turn}"}, "refused", reason_code="demand_guard",
               detail="5 tasks queued; 1 workers expected, 1 live")
    st = BreakerState.load(run, limits())
    assert st.errors == [] and st.after_error("stop_instance", False) is None


# --- identical_args -----------------------------------------------------------------------------
def test_identical_args_trips_when_nothing_changed_since(vclock):
    run = new_run()
    t = Trace(run)
    t.call(0, "search_offers", {"gpu_name": "RTX 4090", "limit": 5})
    st = BreakerState.load(run, limits())
    # key order differs; still the same canonical arguments
    halt = st.identical("search_offers", {"limit": 5, "gpu_name": "RTX 4090"}, 1)
    assert halt is not None and halt.code == "identical_args"


def test_identical_args_ignores_reason(vclock):
    run = new_run()
    t = Trace(run)
    t.call(0, "reboot_instance", {"instance_id": "v-1", "reason": "hung"}, "error", detail="x", error_kind="transient")
    st = BreakerState.load(run, limits())
    assert st.identical("reboot_instance", {"instance_id": "v-1", "reason": "still hung"}, 1).code == "identical_args"


def test_near_miss_identical_args_after_a_world_change(vclock):
    run = new_run()
    t = Trace(run)
    t.call(0, "list_instances", {})
    t.call(1, "diagnose_instance", {"instance_id": "v-1"})  # a new diagnosis changes the world
    assert BreakerState.load(run, limits()).identical("list_instances", {}, 2) is None


def test_near_miss_identical_args_after_an_operator_decision(vclock):
    run = new_run()
    t = Trace(run)
    t.call(0, "list_instances", {})
    parked = t.call(1, "stop_instance", {"instance_id": "v-1"}, "rejected", reason_code="rejected")
    Approval.objects.create(run=run, step=parked, tool="stop_instance", args={"instance_id": "v-1"},
                            idempotency_key="k-1", status="rejected", created_at=NOW, expires_at=NOW, decided_at=NOW)
    assert BreakerState.load(run, limits()).identical("list_instances", {}, 2) is None


def test_a_refused_call_repeated_while_nothing_changed_is_identical_args(vclock):
    """A refused call did not run, but its refusal is the answer: proposing it again with the same
    arguments while nothing changed only spends turns (a small model repeated one refused batch
    until max_steps)."""
    run = new_run()
    t = Trace(run)
    t.call(0, "stop_instance", {"instance_id": "v-1", "reason": "idle"}, "refused", reason_code="diagnosis_required")
    halt = BreakerState.load(run, limits()).identical("stop_instance", {"instance_id": "v-1", "reason": "idle"}, 1)
    assert halt.code == "identical_args" and "was refused (diagnosis_required)" in halt.detail


def test_near_miss_a_refused_call_after_a_world_change_is_scored_afresh(vclock):
    run = new_run()
    t = Trace(run)
    t.call(0, "stop_instance", {"instance_id": "v-1", "reason": "idle"}, "refused", reason_code="diagnosis_required")
    t.call(1, "diagnose_instance", {"instance_id": "v-1"})  # what the refusal asked for: the world changed
    assert BreakerState.load(run, limits()).identical("stop_instance", {"instance_id": "v-1", "reason": "idle"}, 2) is None


def test_near_miss_a_repeated_invalid_args_refusal_is_left_to_same_error(vclock):
    run = new_run()
    t = Trace(run)
    t.call(0, "stop_instance", {"instance_id": "v-1"}, "refused", reason_code="invalid_args", detail="reason: Field required")
    assert BreakerState.load(run, limits()).identical("stop_instance", {"instance_id": "v-1"}, 1) is None


def test_near_miss_calls_of_the_same_batch_are_not_compared(vclock):
    run = new_run()
    t = Trace(run)
    t.call(0, "list_instances", {}, position=0, batch=True)
    assert BreakerState.load(run, limits()).identical("list_instances", {}, 0) is None


def test_near_miss_different_arguments(vclock):
    run = new_run()
    t = Trace(run)
    t.call(0, "search_offers", {"gpu_name": "RTX 4090"})
    assert BreakerState.load(run, limits()).identical("search_offers", {"gpu_name": "A100"}, 1) is None


# --- text_only_spiral ---------------------------------------------------------------------------
def test_text_only_spiral_trips_at_five_text_turns(vclock):
    run = new_run()
    t = Trace(run)
    for turn in range(4):
        t.text(turn)
    st = BreakerState.load(run, limits())
    assert st.after_text() is None  # near miss: four
    st.record_text()
    assert st.after_text().code == "text_only_spiral"


def test_near_miss_a_tool_call_resets_the_text_streak(vclock):
    run = new_run()
    t = Trace(run)
    for turn in range(3):
        t.text(turn)
    t.call(3, "list_instances", {})
    t.text(4)
    st = BreakerState.load(run, limits())
    assert st.text_streak == 1 and st.after_text() is None


# --- wall_clock and token_budget ----------------------------------------------------------------
def test_wall_clock_trips_past_the_budget_on_the_virtual_clock(vclock):
    run = new_run()
    st = BreakerState.load(run, limits(wall_clock_s=300))
    vclock.advance(299)
    assert st.before_turn(run) is None  # near miss
    vclock.advance(2)
    assert st.before_turn(run).code == "wall_clock"


def test_token_budget_trips_past_the_budget(vclock):
    # the count is what the run added (Run.budget_tokens), not the API's whole usage
    run = new_run(tokens_in=500_000, tokens_out=10_000, budget_tokens=60_000)
    st = BreakerState.load(run, limits(token_budget=60_000))
    assert st.before_turn(run) is None  # near miss: exactly at the budget
    run.budget_tokens += 1
    assert st.before_turn(run).code == "token_budget"


# --- three_strikes ------------------------------------------------------------------------------
def test_three_strikes_without_a_fallback(vclock):
    run = new_run()
    t = Trace(run)
    t.error(0, "search_offers", {"gpu_name": "A"}, "transient error (http_429): slow down", kind="transient")
    t.error(1, "search_offers", {"gpu_name": "B"}, "permanent error (http_410): gone")
    st = BreakerState.load(run, limits(same_error=99))
    assert st.after_error("search_offers", False) is None  # near miss: two strikes
    st.record_call(t.error(2, "search_offers", {"gpu_name": "C"}, "semantic error (empty_body): empty", kind="semantic"))
    assert st.after_error("search_offers", False).code == "three_strikes"


def test_near_miss_three_strikes_with_a_fallback_does_not_halt(vclock):
    run = new_run()
    t = Trace(run)
    for turn, msg in enumerate(["a", "b", "c"]):
        t.error(turn, "list_instances", {}, f"transient error ({msg})", kind="transient")
    st = BreakerState.load(run, limits(same_error=99))
    assert st.failures["list_instances"] == 3
    assert st.after_error("list_instances", True) is None


# --- inside a real cycle ------------------------------------------------------------------------
def test_loop_three_strikes_runs_the_declared_fallback():
    faults = [{"call": "list_instances", "times": 9, "error": "http_410"}]
    steps = [{"tool": "list_instances", "args": {"status": s}} for s in ("running", "loading", "exited")]
    with rails_world(faults=faults, limits={"same_error": 99}) as w:
        # the observe phase's own read fails once (permanent: no retry), then the three calls fail
        run = w.cycle([*steps, verdict()])
    tools = [(s.tool, s.outcome) for s in calls(run)]
    assert tools == [("list_instances", "error")] * 3 + [("list_instances_fallback", "executed")]
    assert '"stale": true' in calls(run)[-1].observation
    assert run.halt_reason == ""


def test_loop_three_strikes_without_fallback_ends_with_a_dead_end_report():
    def broken(ctx, args):
        raise RuntimeError(f"probe {args.get('n')} failed")

    from agent.runtime.tools import _Args

    class ProbeArgs(_Args):
        n: int

    with extra_tool("probe", broken, schema=ProbeArgs), rails_world(limits={"same_error": 99}) as w:
        run = w.cycle([{"tool": "probe", "args": {"n": i}} for i in range(5)])
    assert [s.outcome for s in calls(run)] == ["error"] * 3
    assert (run.status, run.halt_reason) == ("halted", "three_strikes")
    assert "probe failed 3 times" in run.final_report


def test_loop_same_error_halts_on_repeated_broken_arguments():
    bad = {"tool": "launch_instance", "raw_arguments": '{"gpu_name": "RTX 4090", "launch_prio'}
    with rails_world() as w:
        run = w.cycle([bad, bad, verdict()])
    assert (run.status, run.halt_reason) == ("halted", "same_error")
    assert len(calls(run)) == 2
