"""The model planner's context: budgeted, compacted, observations as data, pairs intact; the
advisory repeat reminder (docs/agent.md) at 3, 5 and 8 identical calls, reset by an operator message."""

from itertools import count

import pytest

from agent.memory.context import (
    CHARS_PER_TOKEN,
    build_context,
    check_pairs,
    estimate_tokens,
    repeat_reminder,
)
from agent.models import Run, SessionState, Step
from tests.rails_support import NOW, calls, rails_world, verdict

pytestmark = pytest.mark.django_db

_numbers = count(5000)
OBS_HEAD = '<observation tool="list_instances" trust="untrusted-data">'


def new_run(**fields) -> Run:
    fields.setdefault("status", "done")
    return Run.objects.create(number=next(_numbers), trigger="test", planner="script", started_at=NOW, **fields)


class Trace:
    def __init__(self, run):
        self.run, self.seq, self.turn = run, 0, 0

    def add(self, **fields) -> Step:
        self.seq += 1
        fields.setdefault("actor", "agent")
        return Step.objects.create(run=self.run, seq=self.seq, created_at=NOW, **fields)

    def call(self, tool="list_instances", args=None, observation="ok: true\n{}", turn=None, **fields) -> Step:
        if turn is None:
            turn, self.turn = self.turn, self.turn + 1
        args = {} if args is None else args
        fields.setdefault("outcome", "executed")
        return self.add(kind="call", turn=turn, tool=tool, args=args, raw_arguments="{}",
                        observation=observation, **fields)


def contents(ctx) -> str:
    return "\n".join(m.get("content") or "" for m in ctx.messages)


# --- shape ---------------------------------------------------------------------------------------
def test_an_empty_session_is_the_system_prompt_alone():
    ctx = build_context()
    assert [m["role"] for m in ctx.messages] == ["system"]
    assert ctx.repeat_count == 0 and ctx.reminder is None


def test_observations_are_wrapped_as_data_and_calls_pair_with_results():
    with rails_world() as w:
        run = w.cycle([{"parallel": [{"tool": "list_instances", "args": {}}, {"tool": "get_demand", "args": {}}]},
                       {"tool": "frobnicate", "args": {}}, verdict(True, False)])
    ctx = build_context(run=run)
    check_pairs(ctx.messages)
    roles = [m["role"] for m in ctx.messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]
    world, batch = ctx.messages[1], ctx.messages[2]
    assert world["content"].startswith('<observation tool="world" trust="untrusted-data">')
    assert [c["function"]["name"] for c in batch["tool_calls"]] == ["list_instances", "get_demand"]
    assert ctx.messages[3]["content"].startswith(OBS_HEAD)
    assert ctx.messages[3]["tool_call_id"] == batch["tool_calls"][0]["id"]
    refused = ctx.messages[6]["content"]
    assert "ok: false — unknown_tool" in refused and refused.startswith('<observation tool="frobnicate"')
    assert ctx.messages[-1]["content"].startswith("Done.")


def test_intermediate_text_is_dropped_and_final_answers_kept():
    with rails_world() as w:
        run = w.cycle([{"text": "Hmm, let me think about the queue first."}, {"tool": "list_instances", "args": {}},
                       {"text": "All good. <verdict>{\"action\": true, \"state_changed\": false}</verdict>"}])
    text = contents(build_context(run=run))
    assert "let me think" not in text
    assert "All good." in text


def test_no_op_runs_are_skipped_but_the_current_run_is_not():
    with rails_world() as w:
        noop = w.cycle([{"tool": "get_demand", "args": {}}, verdict(False, False)])
        acted = w.cycle([{"tool": "search_offers", "args": {}}, verdict(True, False)])
    assert noop.included_in_prompt is False and acted.included_in_prompt is True
    later = build_context()
    names = [c["function"]["name"] for m in later.messages for c in m.get("tool_calls") or ()]
    assert names == ["search_offers"]
    own = build_context(run=noop)
    names = [c["function"]["name"] for m in own.messages for c in m.get("tool_calls") or ()]
    assert names == ["get_demand", "search_offers"]


def test_runs_of_an_earlier_epoch_are_left_out():
    t = Trace(new_run(epoch=1))
    t.call(tool="search_offers")
    state = SessionState.get()
    state.epoch = 2
    state.save()
    Trace(new_run(epoch=2)).call(tool="get_demand")
    names = [c["function"]["name"] for m in build_context().messages for c in m.get("tool_calls") or ()]
    assert names == ["get_demand"]


def test_only_the_newest_world_snapshot_is_kept():
    t = Trace(new_run())
    t.add(kind="observe", actor="system", observation='{"queued": 59}')
    t2 = Trace(new_run())
    t2.add(kind="observe", actor="system", observation='{"queued": 3}')
    text = contents(build_context())
    assert '"queued": 3' in text and '"queued": 59' not in text


# --- compaction ---------------------------------------------------------------------------------
def test_old_long_tool_outputs_become_placeholders():
    t = Trace(new_run())
    long_obs = "ok: true\n" + "x" * 1000
    t.call(args={"status": "old-long"}, observation=long_obs)
    t.call(args={"status": "old-short"}, observation="ok: true\nshort")
    for i in range(6):  # 12 newer messages
        t.call(args={"status": f"n{i}"}, observation=f"ok: true\nnewer {i}")
    t.call(args={"status": "new-long"}, observation=long_obs)
    ctx = build_context()
    tools = [m for m in ctx.messages if m["role"] == "tool"]
    assert "[output elided: " in tools[0]["content"] and "x" * 400 not in tools[0]["content"]
    assert tools[0]["content"].startswith(OBS_HEAD)
    assert "short" in tools[1]["content"]  # near miss: old but short
    assert "x" * 1000 in tools[-1]["content"]  # near miss: long but recent
    assert ctx.elided == 1
    check_pairs(ctx.messages)


def test_the_budget_drops_oldest_units_whole_and_keeps_the_newest():
    t = Trace(new_run())
    t.add(kind="message", actor="user:alice", text="please check the fleet")
    for turn in range(40):
        for pos in range(3):  # batches of three calls: a cut must not split them
            t.call(args={"status": f"t{turn}p{pos}"}, observation="ok: true\n" + "y" * 250, turn=turn, position=pos,
                   batch=True)
    ctx = build_context(budget_tokens=2000)
    assert ctx.tokens <= 2000 and not ctx.over_budget
    assert ctx.omitted > 0
    assert "earlier messages of this session were omitted" in ctx.messages[1]["content"]
    check_pairs(ctx.messages)
    last = [m for m in ctx.messages if m.get("tool_calls")][-1]
    assert [c["function"]["arguments"] for c in last["tool_calls"]] == ["{}"] * 3
    assert ctx.messages[-1]["role"] == "tool"
    n_tools = sum(1 for m in ctx.messages if m["role"] == "tool")
    assert n_tools % 3 == 0
    # the estimate is chars / 4
    assert estimate_tokens("a" * (4 * CHARS_PER_TOKEN)) == 4


def test_near_miss_within_the_budget_nothing_is_omitted():
    t = Trace(new_run())
    for _ in range(5):
        t.call(observation="ok: true\nsmall")
    ctx = build_context()
    assert ctx.omitted == 0 and len([m for m in ctx.messages if m["role"] == "tool"]) == 5


def test_a_single_oversized_result_is_cut_head_and_tail_with_a_marker():
    t = Trace(new_run())
    t.call(observation="ok: true\nHEAD" + "z" * 20_000 + "TAIL")
    ctx = build_context(budget_tokens=1000)
    assert ctx.tokens <= 1000 and ctx.cut == 1 and ctx.omitted == 0
    check_pairs(ctx.messages)
    result = ctx.messages[-1]["content"]
    assert result.startswith(OBS_HEAD) and "HEAD" in result
    assert result.rstrip().endswith("</observation>") and "TAIL" in result
    assert "characters removed" in result
    # near miss: a result within its share of the budget is not cut
    t.call(observation="ok: true\n" + "s" * 500)
    ctx = build_context(budget_tokens=1000)
    assert "s" * 500 in ctx.messages[-1]["content"]


def test_a_batch_whose_arguments_alone_exceed_the_budget_goes_to_the_summary():
    t = Trace(new_run())
    t.call(tool="get_demand", observation="ok: true\nsmall")
    huge = "{" + '"note": "' + "q" * 6000 + '"}'
    for pos in range(3):
        t.add(kind="call", turn=9, position=pos, batch=True, tool="search_offers", args={"n": pos},
              raw_arguments=huge, outcome="refused", reason_code="invalid_args", observation="ok: false")
    ctx = build_context(budget_tokens=1000)
    assert ctx.tokens <= 1000 and ctx.over_budget
    check_pairs(ctx.messages)
    assert "search_offers() → refused invalid_args (×3)" not in ctx.summary  # one unit: one line
    assert "search_offers() → refused invalid_args; search_offers() → refused invalid_args" in ctx.summary


def test_older_history_is_folded_into_an_extractive_running_summary():
    t = Trace(new_run())
    t.add(kind="message", actor="user:alice", text="keep two workers warm tonight")
    for _ in range(30):
        t.call(tool="stop_instance", args={"instance_id": "local-5", "reason": "idle"}, outcome="refused",
               reason_code="demand_present", observation="ok: false — demand_present: 4 queued " + "p" * 300)
    for i in range(10):
        t.call(args={"status": f"n{i}"}, observation="ok: true\n" + "r" * 300)
    ctx = build_context(budget_tokens=2000)
    assert ctx.tokens <= 2000 and ctx.omitted > 0
    summary = ctx.messages[1]["content"]
    assert summary.startswith("[runtime] ") and "earlier messages of this session were omitted" in summary
    assert "- user:alice: keep two workers warm tonight" in summary
    assert "stop_instance(local-5) → refused demand_present (×" in summary  # repeats collapsed
    check_pairs(ctx.messages)
    # a model's summariser, when configured, replaces the extractive one
    ctx = build_context(budget_tokens=2000, summarize=lambda lines: f"MODEL SUMMARY of {len(lines)} units")
    assert "MODEL SUMMARY of " in ctx.messages[1]["content"]


def test_history_beyond_the_window_read_is_counted_by_tool_and_outcome():
    for r in range(12):
        t = Trace(new_run())
        for i in range(8):
            t.call(tool="launch_instance" if r < 6 else "list_instances", args={"i": f"{r}-{i}"},
                   outcome="refused" if r < 6 else "executed", reason_code="cap_reached" if r < 6 else "",
                   observation="ok: true\n" + "w" * 400)
    ctx = build_context(budget_tokens=1000)
    assert ctx.tokens <= 1000
    assert "earlier in the session: launch_instance refused ×48" in ctx.summary
    check_pairs(ctx.messages)


def test_calibration_from_reported_prompt_tokens_keeps_the_budget():
    from agent.memory.context import CALIBRATION, calibrate

    t = Trace(new_run())
    for i in range(40):
        t.call(args={"status": f"c{i}"}, observation="ok: true\n" + "z" * 200)  # not hex: 64+ hex digits are redacted where stored
    try:
        before = build_context(budget_tokens=3000)
        assert before.factor == 1.0 and before.tokens <= 3000
        # the API counted 50% more than estimated: the factor rises at once and fewer messages fit
        assert calibrate(before.tokens, before.tokens * 3 // 2) == pytest.approx(1.5)
        after = build_context(budget_tokens=3000)
        assert after.factor == pytest.approx(1.5) and after.tokens <= 3000
        assert len(after.messages) < len(before.messages)
        # an over-estimate lowers the factor only a tenth of the way (conservative)
        assert calibrate(1000, 500) == pytest.approx(1.5 * 0.95)
        with pytest.raises(ValueError, match="positive token counts"):
            calibrate(0, 10)
    finally:
        CALIBRATION.reset()


def test_a_system_prompt_larger_than_the_budget_is_a_clear_error():
    with pytest.raises(ValueError, match="system prompt alone"):
        build_context(budget_tokens=50, system="s" * 1000)


# --- the advisory repeat reminder --------------------------------------------------------------
def _same_calls(t: Trace, n: int, observation="ok: true\n{\"count\": 0}"):
    for _ in range(n):
        t.call(args={"status": "running"}, observation=observation)


def test_reminder_at_three_five_and_eight_identical_calls():
    t = Trace(new_run())
    seen = {}
    for n in range(1, 10):
        _same_calls(t, 1)
        seen[n] = repeat_reminder()
    assert [n for n, (_, text) in seen.items() if text] == [3, 5, 8]
    assert seen[4] == (4, None)
    assert "3 times in a row" in seen[3][1]
    assert "escalate_human" in seen[8][1]  # detailed at the last threshold
    ctx = build_context()
    assert ctx.repeat_count == 9 and ctx.reminder is None
    assert len(ctx.reminders) == 3  # each placed after the call that reached it
    check_pairs(ctx.messages)


def test_the_reminder_sits_right_after_the_calls_result_and_counts_across_runs():
    _same_calls(Trace(new_run()), 2)
    _same_calls(Trace(new_run()), 1)
    ctx = build_context()
    assert ctx.repeat_count == 3 and ctx.reminder is not None
    assert ctx.messages[-2]["role"] == "tool" and ctx.messages[-1] == {"role": "user", "content": ctx.reminder}
    check_pairs(ctx.messages)


def test_near_miss_same_arguments_but_a_different_result():
    t = Trace(new_run())
    for i in range(3):
        t.call(args={"status": "running"}, observation=f"ok: true\n{{\"count\": {i}}}")
    assert repeat_reminder() == (1, None)


def test_near_miss_different_arguments_same_result():
    t = Trace(new_run())
    t.call(args={"status": "running"})
    t.call(args={"status": "loading"})
    t.call(args={"status": "running"})
    assert repeat_reminder() == (1, None)


def test_key_order_does_not_matter_and_reason_is_not_an_argument():
    t = Trace(new_run())
    t.call(tool="search_offers", args={"gpu_name": "A100", "limit": 5})
    t.call(tool="search_offers", args={"limit": 5, "gpu_name": "A100"})
    t.call(tool="search_offers", args={"limit": 5, "gpu_name": "A100", "reason": "again"})
    count_, text = repeat_reminder()
    assert count_ == 3 and text is not None


def test_an_operator_message_resets_the_count():
    t = Trace(new_run())
    _same_calls(t, 2)
    t.add(kind="message", actor="user:alice", text="the queue is being refilled, look again")
    _same_calls(t, 1)
    assert repeat_reminder() == (1, None)
    _same_calls(t, 2)
    assert repeat_reminder()[0] == 3


def test_near_miss_text_turns_and_monitor_actions_do_not_reset_the_count():
    t = Trace(new_run())
    _same_calls(t, 2)
    t.add(kind="text", turn=99, text="Let me look again.", outcome="text")
    t.add(kind="call", actor="monitor", tool="destroy_instance", args={"instance_id": "v-9"}, outcome="executed")
    _same_calls(t, 1)
    assert repeat_reminder()[0] == 3


def test_the_reminder_is_advisory_the_call_still_runs():
    with rails_world() as w:
        runs = [w.cycle([{"tool": "list_instances", "args": {}}, verdict(True, False)]) for _ in range(4)]
    assert [calls(r)[0].outcome for r in runs] == ["executed"] * 4
    assert all(r.halt_reason == "" for r in runs)
    ctx = build_context()
    assert ctx.repeat_count == 4 and len(ctx.reminders) == 1
