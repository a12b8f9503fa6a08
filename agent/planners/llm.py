"""The ``llm`` planner: a model behind any OpenAI-compatible chat-completions endpoint.

Each turn: the prompt (``agent.model.prompt``: role, how it works, hard rules) and the session history
(``agent.memory.context.build_context``, within the token budget) go to the model with the tool schemas
generated from the registry's pydantic argument models (``agent.runtime.tools.TOOLS``); the answer
becomes one :class:`Turn`:

- ``tool_calls`` → one call each, the argument string passed untouched as ``raw_arguments`` (the
  pipeline turns broken JSON into ``invalid_args``); several → one batch, scored whole;
- a message with role ``tool`` (or a ``tool_call_id``): the model writing a tool result →
  a forged proposal, refused as ``forged_observation`` (halts the run);
- otherwise a text turn (its ``<verdict>`` block parsed by the loop).

A tool call whose ``arguments`` string is empty or only whitespace (several servers send that for
a tool without parameters) means ``{}``; the schema then decides.

The context is budgeted within the model's window (:func:`agent.model.model_client.context_window`,
less ``max_tokens`` and the tool schemas); a 400 saying the prompt is too long shrinks the budget
and asks again (twice at most; the smaller budget holds for the rest of the run, and a window the
server's answer names is kept for the process). Each
request's timeout is bounded by what is left of the run's wall clock.

When the model fails :data:`agent.model.model_client.STRIKES` times (429, 5xx, timeouts, failed answers
such as a 200 carrying an ``error`` object), or fails permanently, the cycle falls back to the
``rules`` planner: a system step in the run says so and the one ``planner_fallback`` alert fires
(its count grows with each fallback; it resolves when the model answers again). No call of a
failed answer is dispatched: a failed answer never becomes a turn.
"""

import hashlib
import json
import logging
import math

from agent.chat.chat_answer import FALLBACK_NOTE
from agent.memory.context import CALIBRATION, DEFAULT_BUDGET_TOKENS, build_context, calibrate, message_tokens
from agent.memory.model_digest import ModelSummarizer
from agent.memory.store import recall_for_prompt
from agent.model import model_client
from agent.model.model_client import ModelConfig, ModelError, chat, context_window, estimate, wire_schema
from agent.model.prompt import system_prompt
from agent.models import SessionState
from agent.planners.base import Planner, Proposal, Turn
from agent.planners.rules import RulesPlanner
from fleet.alerts import raise_alert, resolve
from fleet.clock import clock
from fleet.secrets import SecretReferenceError, redact

log = logging.getLogger(__name__)

#: the one alert key of the condition "the model fails and the rules planner stands in"
FALLBACK_KEY = "planner_fallback"
#: shrink-and-retry rounds after a context-length answer, and the factor each applies
SHRINKS, SHRINK_FACTOR = 2, 0.6
#: tokens kept free beside the prompt and the answer (wire format, chat template)
WINDOW_MARGIN = 256


def tool_schemas() -> list[dict]:
    """OpenAI ``tools`` entries for every public tool, from its pydantic argument model."""
    # inside: upward import, listed in pyproject.toml ignore_imports (layers contract)
    from agent.runtime.tools import PUBLIC_TOOLS, TOOLS

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
        if isinstance(raw, str) and not raw.strip():
            raw = "{}"  # no arguments at all means none (several servers send "")
        calls.append(Proposal(tool=str(fn.get("name") or ""), raw_arguments=raw if isinstance(raw, str) else None,
                              args=None if isinstance(raw, str) else (raw if isinstance(raw, dict) else {}),
                              call_id=str(c.get("id") or "")))
    return Turn(calls=calls, text=text, batch=len(calls) > 1)


def _remember_window(cfg: ModelConfig, window: int) -> None:
    """Keep the window a server's context-length answer named, for this process's later budgets."""
    if cfg.context_tokens <= 0:
        model_client._WINDOWS[(cfg.base_url, cfg.model)] = (window, "the server's context-length answer")


class LlmPlanner(Planner):
    """Plans with the model ``config`` (default: the settings'); falls back to ``RulesPlanner``
    for the rest of the cycle after the model failed (see the module docstring)."""

    name = "llm"

    def __init__(self, config: ModelConfig | None = None, *, on_delta=None):
        """``on_delta(kind, text)``, when given, makes each request stream and sees the answer as
        it arrives (``agent.model.model_client.chat``): for the chat to show text and tool calls live."""
        self.on_delta = on_delta
        self.config = config or ModelConfig.from_settings()
        if self.config is None:
            raise ValueError("no model configured: set WARDEN_MODEL_BASE_URL and WARDEN_MODEL")
        self.fallback = None
        self._fallback_at = 0
        self._estimated = 0  # the last built context's estimated tokens (calibrated from usage)
        self._tools_sent = 0  # the tool schemas' estimated tokens in that request
        # the budget a context-length answer taught this run; not kept for later runs: one bloated
        # history once shrank it below the system prompt, and every later run of the process then
        # fell back without asking (a window the server names is kept: _remember_window)
        self._learnt: int | None = None
        self._sent: set | None = None  # fingerprints of the messages of the previous request
        self._fresh: int | None = None

    def budget(self) -> int:
        """Tokens the context may take: the model's window less ``max_tokens``, the tool schemas and
        a margin, at most ``agent.memory.context.DEFAULT_BUDGET_TOKENS``, at least 1,024; a budget this
        run learnt from a context-length answer is used when smaller."""
        window = context_window(self.config)
        budget = min(DEFAULT_BUDGET_TOKENS, window - self.config.max_tokens - self._tools_tokens(1.0) - WINDOW_MARGIN)
        if self._learnt is not None:
            budget = min(budget, self._learnt)
        return max(1024, budget)

    @staticmethod
    def _tools_tokens(factor: float | None = None) -> int:
        """Estimated tokens of the tool schemas as sent, times ``factor`` (default the calibration's):
        the server counts them in ``usage.prompt_tokens`` too (llama.cpp's template renders them as
        text). The budget sets them aside uncalibrated (``factor=1.0``): calibrated there, a server
        reporting far more than was sent (the token-budget tests) trimmed the history into churn."""
        raw = estimate(json.dumps([wire_schema(t) for t in tool_schemas()]))
        return math.ceil(raw * (CALIBRATION.factor if factor is None else factor))

    def messages(self, ctx, budget: int | None = None) -> list[dict]:
        """System prompt (tiers, with facts recalled for the operator's message in the middle) plus the
        budgeted history of the session, within ``budget`` tokens (:meth:`budget` by default)."""
        recalled = "\n".join(recall_for_prompt(ctx.message or "", limit=8))  # recalled memory: what the prompt adds to its fixed tiers
        system = system_prompt(ctx.world.summary(), objectives=SessionState.get().objectives, recalled=recalled)

        # older history is folded into a running summary the model writes (extractive if it cannot)
        context = build_context(run=ctx.run, system=system, summarize=ModelSummarizer(self.config, ctx.run),
                                budget_tokens=budget or self.budget())
        self._estimated = context.tokens
        self._tools_sent = self._tools_tokens(context.factor)
        self._fresh = self._new_tokens(context.messages, context.factor)
        return context.messages

    def _new_tokens(self, messages: list[dict], factor: float) -> int | None:
        """Estimated tokens of ``messages`` not sent in this planner's previous request (``None``
        for the first request: all of it is new). What ``token_budget`` counts (agent.runtime.breakers)."""
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
        if begin is not None:  # a ChatStream (agent.chat.chat_stream): frames name the turn
            begin(ctx.turn_index)
        try:
            reply = self._ask(ctx)
        except (ModelError, SecretReferenceError) as exc:
            self._fall_back(ctx, exc)
            return self._rules_turn(ctx)
        finally:
            if flush is not None:
                flush(final=True)

        resolve(FALLBACK_KEY)  # the model answers again: the fallback condition has ended
        turn = turn_from_message(reply.message)
        turn.tokens_in, turn.tokens_out = reply.tokens_in, reply.tokens_out
        turn.tokens_fresh = self._fresh
        if self._estimated > 0 and reply.tokens_in > 0 and reply.usage_reported:  # learn from the API's usage
            # the reported count holds the tool schemas too: calibrating on the messages alone made
            # the factor (schemas + messages) / messages, which grows as the budget cuts messages,
            # until the system prompt alone no longer fit and every later run fell back
            calibrate(self._estimated + self._tools_sent, reply.tokens_in)
        if not reply.usage_reported:  # the client estimated both counts (ModelCall.tokens_estimated)
            turn.estimate_tokens()
            if turn.tokens_fresh is None:  # no usage: the whole estimated prompt is new
                turn.tokens_fresh = self._estimated
        ctx.run.cost_usd += reply.cost  # saved with the run when it closes
        return turn

    def _ask(self, ctx):
        """One request, within the run's wall clock; a context-length answer shrinks the budget and
        asks again (at most :data:`SHRINKS` times): to the window the answer names, less
        ``max_tokens``, the tool schemas and a margin, or else to :data:`SHRINK_FACTOR` of what was
        sent. Raises ModelError (also when the system prompt alone cannot fit) /
        SecretReferenceError."""
        budget = None
        for shrink in range(SHRINKS + 1):
            left = ctx.limits.wall_clock_s - (clock.monotonic() - ctx.breakers.started)
            try:
                messages = self.messages(ctx, budget)
            except ValueError as exc:  # the system prompt alone does not fit (agent.memory.context.assemble)
                raise ModelError(f"the context does not fit the model's window: {exc}", kind="permanent") from None
            try:
                return chat(self.config, messages, tool_schemas(), run=ctx.run, on_delta=self.on_delta, time_left_s=left)
            except ModelError as exc:
                if exc.kind != "context_length" or shrink == SHRINKS:
                    raise
                sent = self._estimated
                if exc.window:
                    _remember_window(self.config, exc.window)
                    budget = min(self.budget(), int(sent * SHRINK_FACTOR))
                else:
                    budget = int(sent * SHRINK_FACTOR)
                self._learnt = budget
                ctx.new_step(kind="message", actor="system", turn=ctx.turn_index,
                             text=f"The model's server said the prompt (~{sent} tokens) exceeds its context window; "
                                  f"asking again within {budget} tokens")
        raise AssertionError("unreachable")

    def chat_answer(self, ctx) -> str:
        """A chat run's answer when it parks or halts before the final turn: the rules planner's
        answer from the observed state after a fallback (it says the model failed, and how),
        else "" (the loop adds the runtime's note of what the rails did)."""
        return self.fallback.chat_answer(ctx) if self.fallback is not None else ""

    def exhausted(self, ctx) -> bool:
        return self.fallback is not None and self.fallback.exhausted(ctx)

    # --- the fallback -------------------------------------------------------------------------
    def _fall_back(self, ctx, exc: Exception) -> None:
        kind = getattr(exc, "kind", "permanent")
        why = redact(str(exc))
        what = (f"the model failed {getattr(exc, 'attempts', 1)} times ({why})" if kind == "transient"
                else f"the model could not be used ({why})")
        note = f"{FALLBACK_NOTE}: {what}; this cycle falls back to the rules planner"
        log.warning("run %s: %s", ctx.run.number, note)
        ctx.new_step(kind="message", actor="system", text=note, turn=ctx.turn_index)
        ctx.extra["model_failure"] = what  # the chat answer says the model failed, and how
        raise_alert("planner_fallback", f"run {ctx.run.number}: {note}", severity="P2", key=FALLBACK_KEY, recurring=True)
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
