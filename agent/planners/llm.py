"""The ``llm`` planner: a model behind any OpenAI-compatible chat-completions endpoint.

Each turn: the prompt (``agent.prompt``, seed 002's tiers) and the session history
(``agent.context.build_context``, within the token budget) go to the model with the tool schemas
generated from the registry's pydantic argument models (``agent.tools.TOOLS``); the answer
becomes one :class:`Turn`:

- ``tool_calls`` → one call each, the argument string passed untouched as ``raw_arguments`` (the
  pipeline turns broken JSON into ``invalid_args``); several → one batch, scored whole;
- a message with role ``tool`` (or a ``tool_call_id``): the model writing a tool result →
  a forged proposal, refused as ``forged_observation`` (halts the run);
- otherwise a text turn (its ``<verdict>`` block parsed by the loop).

When the model fails :data:`agent.model_client.STRIKES` times (429, 5xx, timeouts), or fails
permanently, the cycle falls back to the ``rules`` planner: a system step in the run says so and
the ``planner_fallback`` alert is raised (SCENARIOS.md alert kinds).
"""

import logging

from agent.model_client import ModelConfig, ModelError, chat
from agent.planners.base import Planner, Proposal, Turn
from fleet.secrets import SecretReferenceError, redact

log = logging.getLogger(__name__)

#: how the run's system step announcing a fallback begins (``agent.report`` repeats it)
FALLBACK_NOTE = "Planner fallback"


def tool_schemas() -> list[dict]:
    """OpenAI ``tools`` entries for every public tool, from its pydantic argument model."""
    from agent.tools import PUBLIC_TOOLS, TOOLS

    out = []
    for name in PUBLIC_TOOLS:
        spec = TOOLS[name]
        params = spec.schema.model_json_schema()
        params.pop("title", None)
        doc = (spec.body.__doc__ or "").strip().split("\n")[0] or name.replace("_", " ")
        out.append({"type": "function", "function": {"name": name, "description": doc, "parameters": params}})
    return out


def turn_from_message(message: dict) -> Turn:
    """The :class:`Turn` a chat-completions ``message`` (a dict as on the wire) proposes."""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    if message.get("role") == "tool" or message.get("tool_call_id"):
        return Turn(calls=[Proposal(tool=str(message.get("name") or ""), forged=True, forged_text=text)])
    calls = []
    for c in message.get("tool_calls") or []:
        fn = (c or {}).get("function") or {}
        raw = fn.get("arguments")
        calls.append(Proposal(tool=str(fn.get("name") or ""), raw_arguments=raw if isinstance(raw, str) else None,
                              args=None if isinstance(raw, str) else (raw if isinstance(raw, dict) else {}),
                              call_id=str(c.get("id") or "")))
    return Turn(calls=calls, text=text, batch=len(calls) > 1)


class LlmPlanner(Planner):
    """Plans with the model ``config`` (default: the settings'); falls back to ``RulesPlanner``
    for the rest of the cycle after the model failed (see the module docstring)."""

    name = "llm"

    def __init__(self, config: ModelConfig | None = None, *, on_delta=None):
        """``on_delta(kind, text)``, when given, makes each request stream and sees the answer as
        it arrives (``agent.model_client.chat``): for the chat to show text and tool calls live."""
        self.on_delta = on_delta
        self.config = config or ModelConfig.from_settings()
        if self.config is None:
            raise ValueError("no model configured: set WARDEN_MODEL_BASE_URL and WARDEN_MODEL")
        self.fallback = None
        self._fallback_at = 0
        self._estimated = 0  # the last built context's estimated tokens (calibrated from usage)
        self._sent: set | None = None  # fingerprints of the messages of the previous request
        self._fresh: int | None = None

    def messages(self, ctx) -> list[dict]:
        """System prompt (tiers, with facts recalled for the operator's message in the middle) plus the
        budgeted history of the session."""
        from agent.context import build_context
        from agent.memory import recall_for_prompt
        from agent.models import SessionState
        from agent.prompt import system_prompt

        recalled = "\n".join(recall_for_prompt(ctx.message or "", limit=8))  # the middle tier (seed 002)
        system = system_prompt(ctx.world.summary(), objectives=SessionState.get().objectives, recalled=recalled)
        from agent.model_digest import ModelSummarizer

        # older history is folded into a running summary the model writes (extractive if it cannot)
        context = build_context(run=ctx.run, system=system, summarize=ModelSummarizer(self.config, ctx.run))
        self._estimated = context.tokens
        self._fresh = self._new_tokens(context.messages, context.factor)
        return context.messages

    def _new_tokens(self, messages: list[dict], factor: float) -> int | None:
        """Estimated tokens of ``messages`` not sent in this planner's previous request (``None``
        for the first request: all of it is new). What ``token_budget`` counts (agent.breakers)."""
        import hashlib
        import json
        import math

        from agent.context import message_tokens

        prints = [hashlib.sha256(json.dumps(m, sort_keys=True, default=str).encode()).hexdigest() for m in messages]
        before, self._sent = self._sent, set(prints)
        if before is None:
            return None
        raw = sum(message_tokens(m) for m, p in zip(messages, prints, strict=True) if p not in before)
        return math.ceil(raw * factor)

    def next_turn(self, ctx) -> Turn | None:
        if self.fallback is not None:
            return self._rules_turn(ctx)
        begin, flush = getattr(self.on_delta, "begin_turn", None), getattr(self.on_delta, "flush", None)
        if begin is not None:  # a ChatStream (agent.chat_stream): frames name the turn
            begin(ctx.turn_index)
        try:
            reply = chat(self.config, self.messages(ctx), tool_schemas(), run=ctx.run, on_delta=self.on_delta)
        except (ModelError, SecretReferenceError) as exc:
            self._fall_back(ctx, exc)
            return self._rules_turn(ctx)
        finally:
            if flush is not None:
                flush(final=True)
        turn = turn_from_message(reply.message)
        turn.tokens_in, turn.tokens_out = reply.tokens_in, reply.tokens_out
        turn.tokens_fresh = self._fresh
        if self._estimated > 0 and reply.tokens_in > 0:  # the estimate learns from the API's usage
            from agent.context import calibrate

            calibrate(self._estimated, reply.tokens_in)
        if not reply.usage_reported:
            turn.estimate_tokens()
            if turn.tokens_fresh is None:  # no usage: the whole estimated prompt is new
                turn.tokens_fresh = self._estimated
        ctx.run.cost_usd += reply.cost  # saved with the run when it closes
        return turn

    def exhausted(self, ctx) -> bool:
        return self.fallback is not None and self.fallback.exhausted(ctx)

    # --- the fallback -------------------------------------------------------------------------
    def _fall_back(self, ctx, exc: Exception) -> None:
        from agent.planners.rules import RulesPlanner
        from fleet.alerts import raise_alert

        kind = getattr(exc, "kind", "permanent")
        why = redact(str(exc))
        what = (f"the model failed {getattr(exc, 'attempts', 1)} times ({why})" if kind == "transient"
                else f"the model could not be used ({why})")
        note = f"{FALLBACK_NOTE}: {what}; this cycle falls back to the rules planner"
        log.warning("run %s: %s", ctx.run.number, note)
        ctx.new_step(kind="message", actor="system", text=note, turn=ctx.turn_index)
        raise_alert("planner_fallback", f"run {ctx.run.number}: {note}", severity="P2", key=f"planner_fallback:{ctx.run.number}")
        self.fallback = RulesPlanner()
        self._fallback_at = ctx.turn_index

    def _rules_turn(self, ctx) -> Turn | None:
        # the rules planner counts its own turns from 0 (its first turn sizes the fleet)
        saved = ctx.turn_index
        ctx.turn_index = saved - self._fallback_at
        try:
            return self.fallback.next_turn(ctx)
        finally:
            ctx.turn_index = saved
