"""What a planner proposes: one turn at a time, either text or tool calls (a batch when several).

Planners never execute anything and never author observations: a ``forged`` proposal (the
planner writing a tool result) is refused by the runtime and halts the run.
"""

import json
import math
from dataclasses import dataclass, field


@dataclass
class Proposal:
    """One proposed call. ``args`` parsed, or ``raw_arguments`` exactly as the planner sent it."""

    tool: str
    args: dict | None = None
    raw_arguments: str | None = None
    forged: bool = False
    forged_text: str = ""
    call_id: str = ""  # the model's tool-call id; never used as the idempotency key

    def raw(self) -> str:
        if self.raw_arguments is not None:
            return self.raw_arguments
        return json.dumps(self.args if self.args is not None else {}, sort_keys=True)


@dataclass
class Turn:
    """A planner turn: ``calls`` (empty for a text-only turn) and ``text``; tokens used.

    ``tokens_fresh``: of ``tokens_in`` (the whole prompt, as the API reported it), the tokens new
    since the planner's previous request in this run — what ``token_budget`` counts
    (``agent.runtime.breakers``); ``None`` means all of ``tokens_in`` is new.
    """

    calls: list[Proposal] = field(default_factory=list)
    text: str = ""
    batch: bool = False
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_fresh: int | None = None

    def budget_tokens(self) -> int:
        """The tokens this turn adds to the run's ``token_budget`` count: new prompt tokens plus the completion."""
        if self.tokens_fresh is None:
            fresh = self.tokens_in
        else:  # an estimate: never more than the reported prompt (when the API reported one)
            fresh = min(self.tokens_fresh, self.tokens_in) if self.tokens_in else self.tokens_fresh
        return fresh + self.tokens_out

    def estimate_tokens(self) -> None:
        """Fill ``tokens_out`` from a conservative chars-per-token estimate (4 chars/token)."""
        if not self.tokens_out:
            size = len(self.text) + sum(len(p.tool) + len(p.raw()) for p in self.calls)
            self.tokens_out = math.ceil(size / 4)


class Planner:
    """Base planner. ``next_turn(ctx)`` returns a :class:`Turn`, or ``None`` when it has nothing more.

    ``ctx`` is the loop's :class:`agent.runtime.loop.TurnContext`: run, turn index, world, the results of
    the previous turn, and the operator's message.
    """

    name = "base"

    def next_turn(self, ctx) -> Turn | None:  # pragma: no cover — interface
        raise NotImplementedError

    def exhausted(self, ctx) -> bool:
        """True when the planner knows it has no further turn (asking costs nothing)."""
        return False
