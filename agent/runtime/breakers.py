"""Circuit breakers: proposals are scored before anything runs; each breaker halts the run.

Definitions are the reason codes of docs/contract.md (the catalogue of ways an agent loop runs away:
steps, repeats, text-only turns, time and tokens; and the rule that a tool failing three times in a
row gives way to its fallback or a halt):

- ``max_steps``: the run already took ``max_steps`` planner turns (a batch is one turn);
- ``same_error``: the last N errors were the same (error class and message, not the call's
  arguments); errors are calls with outcome ``error`` and ``invalid_args`` refusals only;
- ``identical_args``: the same tool with the same canonical arguments already ran in an earlier
  turn, and nothing that changes the world happened after it (no other successful side effect,
  no new diagnosis, no operator decision); refused calls never count as having run; calls of one
  batch are not compared with each other. A call *refused* in an earlier turn (by a guard, the
  caps, ``duplicate``…) and proposed again with the same canonical arguments while nothing changed
  is ``identical_args`` too: the refusal is the answer, and asking again only spends turns (a
  small model repeated one refused batch until ``max_steps``). Refusals with their own breaker or
  no arguments to compare (``invalid_args`` → ``same_error``, ``unknown_tool``,
  ``forged_observation``, ``batch_too_large``) are not counted;
- ``text_only_spiral``: N consecutive text-only turns;
- ``forbidden_tool``: a known tool whose policy is ``forbidden``;
- ``forged_observation``: the planner tried to author a tool result;
- ``wall_clock``: the run's time (on ``fleet.clock``) ran out;
- ``token_budget``: the tokens the run *added* passed ``token_budget`` (60,000 by default).
  Counting every turn's whole prompt would count the same history again each turn, so a real
  model run with a 20,000-token context would halt on its third turn. The count is
  ``Run.budget_tokens``: the first request's prompt in full, then for each later request of the
  run only the messages that were not in the previous request (tool results, observations, the
  model's last message, a changed summary: the planner's estimate, calibrated from the API's
  usage, never more than the reported prompt), plus every completion, plus the model's side calls
  (running summary, memory consolidation) in full. A runaway still stops: every turn adds at least
  its completion and its calls' results, which the count never forgets even when the context
  drops them to fit its own budget. A resumed run's first request counts in full again (the
  planner does not know what was sent before the park). Tokens and cost shown on the runs list
  are the API's whole usage (``Run.tokens_in/out``, ``Run.cost_usd``).
- ``three_strikes``: a tool failed three times in this run and has no fallback.

The state is rebuilt from the run's persisted steps, so a resumed run keeps its counts.
"""

import re
from collections import Counter
from dataclasses import dataclass, field

from agent.models import Run, Step
from agent.policy.tool_specs import TOOLS, canonical_json
from fleet.clock import clock

RAN = {"executed", "approved_executed", "error"}
SUCCESS = {"executed", "approved_executed"}
#: refusals a repeat of is not ``identical_args`` (they have their own breaker, or nothing to compare)
NOT_REPEATS = {"invalid_args", "unknown_tool", "forged_observation", "batch_too_large", "identical_args"}


@dataclass
class Halt:
    """A breaker's reason code and detail."""

    code: str
    detail: str


@dataclass
class BreakerState:
    """Counts a run's breakers read. Built by :meth:`load` from the run's steps."""

    limits: object
    turns: int = 0
    errors: list = field(default_factory=list)
    text_streak: int = 0
    failures: Counter = field(default_factory=Counter)
    ran: list = field(default_factory=list)  # (seq, turn, tool, canon)
    refused: list = field(default_factory=list)  # (seq, turn, tool, canon, reason code)
    changes: list = field(default_factory=list)  # (seq, turn) of world-changing events
    started: float = 0.0
    tokens: int = 0

    @classmethod
    def load(cls, run: Run, limits) -> "BreakerState":
        """Rebuild from ``run``'s steps; the wall clock starts now (active time only)."""
        st = cls(limits=limits, started=clock.monotonic(), tokens=run.budget_tokens)
        turns = set()
        for s in run.steps.filter(kind__in=["call", "text"], actor="agent").order_by("seq"):
            if s.turn is not None:
                turns.add(s.turn)
            if s.kind == "text":
                st.text_streak += 1
                continue
            st.record_call(s)
        st.turns = len(turns)
        # operator decisions change the world
        for a in run.approvals.exclude(decided_at=None).select_related("step"):
            st.changes.append((a.step.seq, a.step.turn))
        return st

    # -- recording ---------------------------------------------------------------------------
    def record_call(self, s: Step) -> None:
        """Account one finished call step (any outcome)."""
        self.text_streak = 0
        if s.outcome in RAN:
            self.ran.append((s.seq, s.turn, s.tool, canonical_json(s.args)))
        if s.outcome == "refused" and s.reason_code not in NOT_REPEATS and s.args is not None:
            self.refused.append((s.seq, s.turn, s.tool, canonical_json(s.args), s.reason_code))
        if s.outcome in SUCCESS:
            spec = TOOLS.get(s.tool)
            if spec is not None and (spec.side_effect or spec.changes_world):
                self.changes.append((s.seq, s.turn))
        if s.outcome == "error" or (s.outcome == "refused" and s.reason_code == "invalid_args"):
            self.errors.append((s.error_kind or s.reason_code, _error_message(s)))
        if s.outcome == "error":
            self.failures[s.tool] += 1

    def record_text(self) -> None:
        self.text_streak += 1

    def record_decision(self, seq: int, turn: int | None) -> None:
        self.changes.append((seq, turn))

    # -- scoring -----------------------------------------------------------------------------
    def before_turn(self, run: Run) -> Halt | None:
        """Caps checked before the planner is asked for another turn."""
        lim = self.limits
        if self.turns >= lim.max_steps:
            return Halt("max_steps", f"the run took {self.turns} turns; the cap is {lim.max_steps}")
        elapsed = clock.monotonic() - self.started
        if elapsed > lim.wall_clock_s:
            return Halt("wall_clock", f"the run ran {elapsed:.0f}s; the budget is {lim.wall_clock_s}s")
        used = run.budget_tokens
        if used > lim.token_budget:
            return Halt("token_budget", f"the run added {used} tokens (new prompt tokens and completions); "
                                        f"the budget is {lim.token_budget}")
        return None

    def identical(self, tool: str, args: dict, turn: int) -> Halt | None:
        """``identical_args`` for one proposed call of turn ``turn``."""
        canon = canonical_json(args)
        for seq, t, rtool, rcanon in self.ran:
            if t is None or t >= turn or rtool != tool or rcanon != canon:
                continue
            if any(cseq > seq and cseq != seq for cseq, _ in self.changes):
                continue
            return Halt("identical_args", f"{tool} with the same arguments already ran in turn {t} and nothing changed since")
        for seq, t, rtool, rcanon, code in self.refused:
            if t is None or t >= turn or rtool != tool or rcanon != canon:
                continue
            if any(cseq > seq for cseq, _ in self.changes):
                continue
            return Halt("identical_args", f"{tool} with the same arguments was refused ({code}) in turn {t} "
                                          "and nothing changed since")
        return None

    def after_text(self) -> Halt | None:
        if self.text_streak >= self.limits.text_only_spiral:
            return Halt("text_only_spiral", f"{self.text_streak} consecutive turns without a tool call")
        return None

    def after_error(self, tool: str, has_fallback: bool) -> Halt | None:
        """Checked after each error: ``same_error`` then ``three_strikes``."""
        n = self.limits.same_error
        if len(self.errors) >= n and len(set(self.errors[-n:])) == 1:
            kind, msg = self.errors[-1]
            return Halt("same_error", f"the last {n} errors were the same: {msg[:200]}")
        if self.failures[tool] >= self.limits.three_strikes and not has_fallback:
            return Halt("three_strikes", f"{tool} failed {self.failures[tool]} times in this run and has no fallback")
        return None


def _error_message(s: Step) -> str:
    """An error's message without the call's arguments (so different ids compare equal)."""
    msg = s.detail or ""
    if s.args:
        for v in s.args.values():
            if isinstance(v, str) and v:
                msg = re.sub(rf"(?<![\w-]){re.escape(v)}(?![\w-])", "…", msg)
    return msg
