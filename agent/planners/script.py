"""The ``script`` planner: plays a fixed list of turns (scenario replay, tests).

Each step is a replay file's step (docs/replay.md): ``{"tool", "args"}`` or ``{"tool", "raw_arguments"}``,
``{"parallel": [...]}``, ``{"text": ...}`` or ``{"tool_result": ...}`` (a forged observation).
The turn to play is the run's turn index, so a parked run resumes where it stopped.
"""

from agent.planners.base import Planner, Proposal, Turn


def _proposal(step: dict) -> Proposal:
    if "tool_result" in step:
        return Proposal(tool=step.get("tool", ""), forged=True, forged_text=str(step["tool_result"]))
    return Proposal(tool=step["tool"], args=step.get("args"), raw_arguments=step.get("raw_arguments"))


class ScriptPlanner(Planner):
    """Plays ``steps`` in order; ``None`` when they run out."""

    name = "script"

    def __init__(self, steps: list[dict]):
        self.steps = list(steps)

    def exhausted(self, ctx) -> bool:
        return ctx.turn_index >= len(self.steps)

    def next_turn(self, ctx) -> Turn | None:
        if ctx.turn_index >= len(self.steps):
            return None
        step = self.steps[ctx.turn_index]
        if "parallel" in step:
            turn = Turn(calls=[_proposal(s) for s in step["parallel"]], batch=True)
        elif "text" in step:
            turn = Turn(text=step["text"])
        else:
            turn = Turn(calls=[_proposal(step)])
        usage = step.get("usage") or {}
        turn.tokens_in = int(usage.get("prompt_tokens", 0))
        turn.tokens_out = int(usage.get("completion_tokens", 0))
        turn.estimate_tokens()
        return turn
