"""Property tests of the context builder over random histories (hypothesis): whatever the
history, budget and calibration factor, the built context never exceeds the budget, a call and
its result are never separated (``check_pairs``), and what is kept is the newest history."""

import math

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.memory.context import CALIBRATION, assemble, build_context, check_pairs, message_tokens
from agent.models import Run, Step
from tests.rails_support import NOW

pytestmark = pytest.mark.django_db

text = st.integers(min_value=0, max_value=6000).map(lambda n: "x" * n)
event = st.one_of(
    st.tuples(st.just("message"), text),
    st.tuples(st.just("observe"), text),
    st.tuples(st.just("answer"), text),
    st.tuples(st.just("monitor"), text),
    st.tuples(st.just("batch"), st.lists(st.tuples(text, st.integers(0, 3000)), min_size=1, max_size=4)),
)
history = st.lists(st.lists(event, max_size=12), min_size=1, max_size=4)  # runs of events
budget = st.integers(min_value=1000, max_value=12_000)  # the system prompt fits at any factor
factor = st.floats(min_value=0.5, max_value=2.5)


def store(runs: list[list[tuple]]) -> int:
    """Write the history as Step rows; returns the number of agent call steps."""
    calls = 0
    for number, events in enumerate(runs, start=1):
        answers = [e for e in events if e[0] == "answer"]
        final = ("done " + answers[-1][1]) if answers else ""
        run = Run.objects.create(number=number, trigger="test", planner="script", status="done", started_at=NOW,
                                 final_answer=final)
        seq = 0
        for turn, (kind, payload) in enumerate(events):
            seq += 1
            common = dict(run=run, seq=seq, created_at=NOW, turn=turn)
            if kind == "message":
                Step.objects.create(kind="message", actor="user:alice", text="q " + payload, **common)
            elif kind == "observe":
                Step.objects.create(kind="observe", actor="system", observation="{" + payload + "}", **common)
            elif kind == "answer":
                Step.objects.create(kind="text", actor="agent", text="done " + payload, **common)
            elif kind == "monitor":
                Step.objects.create(kind="call", actor="monitor", tool="destroy_instance", args={"instance_id": "v-1"},
                                    outcome="executed", observation="ok: true\n" + payload, **common)
            else:
                for pos, (obs, arg_len) in enumerate(payload):
                    if pos:
                        seq += 1
                    Step.objects.create(**{**common, "seq": seq}, kind="call", actor="agent", tool="search_offers",
                                        position=pos, batch=len(payload) > 1, args={"n": pos},
                                        raw_arguments='{"pad": "' + "a" * arg_len + '"}', outcome="executed",
                                        observation="ok: true\n" + obs)
                    calls += 1
    return calls


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(runs=history, budget_tokens=budget, f=factor)
def test_random_histories_keep_pairs_and_the_budget(runs, budget_tokens, f):
    with transaction.atomic():
        try:
            calls = store(runs)
            CALIBRATION.factor = f
            ctx = build_context(budget_tokens=budget_tokens)
            check_pairs(ctx.messages)
            assert ctx.tokens <= budget_tokens
            assert math.ceil(sum(message_tokens(m) for m in ctx.messages) * f) <= budget_tokens
            assert ctx.messages[0]["role"] == "system"
            kept_calls = sum(len(m.get("tool_calls") or ()) for m in ctx.messages)
            assert kept_calls <= calls
            if kept_calls < calls:  # something was left out: the summary says so
                assert ctx.messages[1]["content"].startswith("[runtime] ")
            newest_event = next((r[-1] for r in reversed(runs) if r), None)
            if newest_event and newest_event[0] == "batch" and not ctx.over_budget:
                # the newest unit is always kept (cut to fit, else over_budget says it could not be)
                newest = Step.objects.filter(kind="call", actor="agent").order_by("-run__number", "-seq").first()
                assert any(m.get("tool_call_id") == f"call_r{newest.run.number}_s{newest.seq}" for m in ctx.messages)
        finally:
            CALIBRATION.reset()
            transaction.set_rollback(True)


def _units(spec):
    units = []
    for i, (kind, sizes) in enumerate(spec):
        if kind == "call":
            ids = [f"c{i}_{j}" for j in range(len(sizes))]
            units.append([{"role": "assistant", "content": None, "tool_calls": [
                {"id": c, "type": "function", "function": {"name": "t", "arguments": "{}"}} for c in ids], "_line": f"u{i}"}]
                + [{"role": "tool", "tool_call_id": c, "content": "r" * n} for c, n in zip(ids, sizes, strict=True)])
        else:
            units.append([{"role": "user", "content": "m" * sizes[0], "_line": f"u{i}"}])
    return units


unit_spec = st.lists(st.tuples(st.sampled_from(["call", "message"]),
                               st.lists(st.integers(0, 20_000), min_size=1, max_size=5)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(spec=unit_spec, budget_tokens=budget, f=factor)
def test_assembly_never_exceeds_the_budget_nor_splits_a_unit(spec, budget_tokens, f):
    units = _units(spec)
    ctx = assemble(units, budget_tokens=budget_tokens, factor=f)
    check_pairs(ctx.messages)
    assert ctx.tokens <= budget_tokens
    assert math.ceil(sum(message_tokens(m) for m in ctx.messages) * f) <= budget_tokens
    # what is kept is a newest suffix of whole units (contents may be cut, never split)
    ids = [c["id"] for m in ctx.messages for c in m.get("tool_calls") or ()]
    all_ids = [c["id"] for u in units for m in u for c in m.get("tool_calls") or ()]
    assert ids == all_ids[len(all_ids) - len(ids):]
