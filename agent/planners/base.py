"""What a planner proposes: one turn at a time, either text or tool calls (a batch when several).

Planners never execute anything and never author observations: a ``forged`` proposal (the
planner writing a tool result) is refused by the runtime and halts the run.
"""

import json
import math
from dataclasses import dataclass, field

OPEN, CLOSE = "<verdict>", "</verdict>"


def verdict_blocks(text: str) -> list[tuple[int, int, str]]:
    """Every ``<verdict>…</verdict>`` block of ``text``, left to right, as ``(start, end, body)``.

    Found with ``str.find`` (linear): a regex ``<verdict>(.*?)</verdict>`` rescans the rest of
    the text from every unclosed ``<verdict>``, which is quadratic in model output.
    """
    blocks, pos = [], 0
    text = text or ""
    while (start := text.find(OPEN, pos)) >= 0:
        stop = text.find(CLOSE, start + len(OPEN))
        if stop < 0:
            break
        blocks.append((start, stop + len(CLOSE), text[start + len(OPEN):stop]))
        pos = stop + len(CLOSE)
    return blocks


def without_verdicts(text: str, sep: str = "", strip: bool = False) -> str:
    """``text`` with its verdict blocks removed, the pieces joined by ``sep``; ``strip`` also drops
    the whitespace around each block (what a reader sees)."""
    text = text or ""
    parts, pos = [], 0
    for start, end, _ in verdict_blocks(text):
        parts.append(text[pos:start])
        pos = end
    parts.append(text[pos:])
    if strip:
        parts = [p.rstrip() if i == 0 else p.lstrip() if i == len(parts) - 1 else p.strip() for i, p in enumerate(parts)]
    return sep.join(parts)


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


def parse_verdict(text: str) -> tuple[bool, bool] | None:
    """``(action, state_changed)`` from a ``<verdict>{...}</verdict>`` block, or ``None``.

    Both fields must be JSON booleans: ``"yes"``, ``1`` or a missing field is malformed and gives
    ``None`` (unknown), never a guess. Use :func:`has_verdict_block` to tell a
    malformed verdict from a missing one.
    """
    blocks = verdict_blocks(text)
    if not blocks:
        return None
    try:
        data = json.loads(blocks[0][2])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    action, changed = data.get("action"), data.get("state_changed")
    if not isinstance(action, bool) or not isinstance(changed, bool):
        return None
    return action, changed


def has_verdict_block(text: str) -> bool:
    """Whether ``text`` carries a ``<verdict>…</verdict>`` block at all (well-formed or not)."""
    return bool(verdict_blocks(text))


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
