"""The model's two side jobs besides planning: the running summary of older history, and memory
consolidation (docs/agent.md, Memory; docs/model.md, The context window).

- :class:`ModelSummarizer` is the ``summarize`` callable of ``agent.memory.context.build_context`` when a
  model is configured: the omitted units' one-line extracts go to the model with
  ``agent.model.prompt.SUMMARY``; its text becomes the summary message. Without a model, or when the
  call fails or answers nothing, the extractive summary (``agent.memory.context.extractive_summary``) is
  used and the failure is logged. Summaries are cached per process by their exact input, so a
  prompt rebuilt with the same omitted history costs no second call.
- :func:`consolidate_by_model` is what :func:`after_run` runs every
  ``CONSOLIDATE_EVERY``-th run when a model is configured: the short-term buffer, the week's host
  faults and operator rejections and the stored facts' keys go to the model with
  ``agent.model.prompt.CONSOLIDATE``; the JSON facts it returns are stored through
  ``agent.memory.store.remember`` (redacted, validated; source ``consolidation``). A failed call or an
  answer that is not the asked JSON falls back to the rule-made facts (``agent.memory.store.consolidate``).

Every call is a :class:`agent.models.ModelCall` of the run it serves, and its tokens and cost are
added to that run (they count against its ``token_budget``, ``agent.runtime.breakers``).
"""

import hashlib
import json
import logging
from collections import OrderedDict

from celery import current_app
from django.db import transaction

from agent.memory.context import extractive_summary
from agent.memory.store import (
    CONSOLIDATE_EVERY,
    CONSOLIDATE_WINDOW,
    MemoryInputError,
    buffer_message,
    consolidate,
    remember,
)
from agent.model.model_client import ModelConfig, ModelError, chat
from agent.model.prompt import CONSOLIDATE, SUMMARY
from agent.models import Approval, MemoryFact, ShortTermMessage
from fleet.clock import clock
from fleet.models import Diagnosis
from fleet.secrets import SecretReferenceError

log = logging.getLogger(__name__)

#: characters of omitted history sent to the summariser (the newest lines are kept)
SUMMARY_INPUT_CHARS = 12_000
#: the summary asked for, in characters
SUMMARY_CHARS = 1_500
#: facts one consolidation may store
CONSOLIDATE_MAX_FACTS = 12
_CACHE: "OrderedDict[str, str]" = OrderedDict()
_CACHE_SIZE = 32


def _charge(run, reply) -> None:
    """Add one side call's tokens and cost to ``run`` (in memory; saved with the run)."""
    if run is None:
        return
    run.tokens_in += reply.tokens_in
    run.tokens_out += reply.tokens_out
    run.budget_tokens += reply.tokens_in + reply.tokens_out  # a side call's prompt is all new
    run.cost_usd += reply.cost


class ModelSummarizer:
    """``summarize(lines) -> str`` for ``build_context``: the model's summary of ``lines`` (the
    omitted units' extracts, oldest first), or the extractive one when the model cannot give it.
    ``used_model`` tells which the last call gave (for tests and the run page)."""

    def __init__(self, config: ModelConfig, run=None):
        self.config = config
        self.run = run
        self.used_model = False

    def __call__(self, lines: list[str]) -> str:

        text = "\n".join(f"- {line}" for line in lines)
        if len(text) > SUMMARY_INPUT_CHARS:
            text = "[… older lines left out …]\n" + text[-SUMMARY_INPUT_CHARS:]
        key = hashlib.sha256(f"{self.config.model}\n{text}".encode()).hexdigest()
        if key in _CACHE:
            _CACHE.move_to_end(key)
            self.used_model = True
            return _CACHE[key]
        messages = [{"role": "system", "content": SUMMARY.format(limit=SUMMARY_CHARS)},
                    {"role": "user", "content": text}]
        try:
            reply = chat(self.config, messages, [], run=self.run)
        except (ModelError, SecretReferenceError) as exc:
            log.warning("running summary by the model failed (%s); the extractive summary is used", exc)
            self.used_model = False
            return extractive_summary(lines)
        _charge(self.run, reply)
        summary = (reply.message.get("content") or "").strip() if isinstance(reply.message.get("content"), str) else ""
        if not summary:
            log.warning("the model gave an empty running summary; the extractive summary is used")
            self.used_model = False
            return extractive_summary(lines)
        self.used_model = True
        _CACHE[key] = summary
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
        return summary


def consolidation_evidence() -> str:
    """The text the consolidating model reads: the short-term buffer, the week's host faults and
    operator rejections, and the stored facts' category/key (so it updates rather than repeats)."""
    since = clock.now() - CONSOLIDATE_WINDOW
    parts = ["Latest messages (oldest first):"]
    parts += [f"- {m.actor}: {m.text[:600]}" for m in ShortTermMessage.objects.order_by("id")[:40]] or ["- none"]
    parts.append("Host faults diagnosed this week:")
    parts += [f"- {d.instance.external_id} ({d.instance.provider}, {d.instance.gpu_name or 'gpu?'}) {d.health} at "
              f"{d.taken_at:%Y-%m-%d %H:%M} UTC: {d.cause or 'no cause recorded'}"
              for d in Diagnosis.objects.filter(taken_at__gte=since, fault_class="host").select_related("instance")
              .order_by("-taken_at")[:20]] or ["- none"]
    parts.append("Operator rejections this week:")
    parts += [f"- {a.tool} {(a.args or {}).get('instance_id', '')}: {a.comment or 'no comment'}"
              for a in Approval.objects.filter(status="rejected", decided_at__gte=since).order_by("-decided_at")[:20]] \
        or ["- none"]
    parts.append("Facts already stored (category / key):")
    parts += [f"- {c} / {k}" for c, k in MemoryFact.objects.order_by("-created_at").values_list("category", "key")[:60]] \
        or ["- none"]
    return "\n".join(parts)


def parse_facts(content: str) -> list[dict]:
    """The ``facts`` list of the model's answer. Raises ValueError (saying what was wrong) when the
    answer is not one JSON object with a ``facts`` list of objects."""
    text = (content or "").strip()
    if text.startswith("```"):  # a fenced answer: the object inside the fence
        text = text.strip("`").removeprefix("json").strip()
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("facts"), list):
        raise ValueError('the answer is not an object with a "facts" list')
    facts = [f for f in data["facts"] if isinstance(f, dict)]
    if len(facts) != len(data["facts"]):
        raise ValueError("an entry of facts is not an object")
    return facts[:CONSOLIDATE_MAX_FACTS]


def consolidate_by_model(config: ModelConfig, run=None) -> list:
    """Consolidate memory with the model (see the module docstring). Returns the ``MemoryFact``
    rows written. Falls back to ``agent.memory.store.consolidate`` (rule-made facts) when the call fails
    or the answer is unusable; a single bad fact (empty value, importance out of range) is skipped
    and logged. Raises nothing."""
    messages = [{"role": "system", "content": CONSOLIDATE.format(limit=CONSOLIDATE_MAX_FACTS)},
                {"role": "user", "content": consolidation_evidence()}]
    try:
        reply = chat(config, messages, [], run=run)
    except (ModelError, SecretReferenceError) as exc:
        log.warning("memory consolidation by the model failed (%s); rule-made facts instead", exc)
        return consolidate()
    _charge(run, reply)
    if run is not None:
        run.save(update_fields=["tokens_in", "tokens_out", "budget_tokens", "cost_usd"])
    try:
        facts = parse_facts(reply.message.get("content") if isinstance(reply.message.get("content"), str) else "")
    except ValueError as exc:
        log.warning("memory consolidation: the model's answer is unusable (%s); rule-made facts instead", exc)
        return consolidate()
    made = []
    for f in facts:
        try:
            made.append(remember(str(f.get("category") or "rule_learned"), f.get("key"), f.get("value"),
                                 importance=f.get("importance"), kind=str(f.get("kind") or "fact"),
                                 source="consolidation")[0])
        except MemoryInputError as exc:
            log.warning("memory consolidation: a fact was skipped: %s", exc)
    return made


def after_run(run, *, deferred: bool = False) -> list[MemoryFact]:
    """Called when a run closes: buffers its operator messages and final answer (once per run), and on every
    :data:`CONSOLIDATE_EVERY`-th run number consolidates (by the model when one is configured).
    ``deferred`` (what ``agent.runtime.runs.close_run`` passes): the model's consolidation, a call of its
    own that took a small local model 50 s, runs after the answer in the Celery task
    ``agent.tasks.consolidate_memory`` once the transaction commits, not inside the run.
    Returns the facts made or promoted (here and now)."""
    made = []
    if not ShortTermMessage.objects.filter(run_number=run.number).exists():  # a run closes once in the buffer
        for s in run.steps.filter(kind="message").exclude(actor="system"):
            made += buffer_message(s.text, s.actor, run_number=run.number)
        if run.final_answer:
            made += buffer_message(run.final_answer, "agent", run_number=run.number)
    if run.number % CONSOLIDATE_EVERY == 0:
        config = ModelConfig.from_settings()
        if config is None:
            made += consolidate()
        elif deferred:
            transaction.on_commit(lambda: _enqueue_consolidation(run.pk))
        else:  # the model extracts the facts (rule-made ones when it cannot: agent.memory.model_digest)
            made += consolidate_by_model(config, run)
    return made


def _enqueue_consolidation(run_pk: int) -> None:
    try:  # by name: agent.tasks is the top of agent and imports this room
        current_app.tasks["agent.tasks.consolidate_memory"].apply_async((run_pk,), retry=False)
    except Exception:  # noqa: BLE001 — no broker: the facts wait for the next consolidation
        log.warning("memory consolidation after run pk %s could not be queued", run_pk, exc_info=True)
