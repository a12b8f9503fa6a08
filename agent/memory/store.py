"""The agent's memory: a short-term session, a long-term store and a digest; ``remember``/``recall`` (docs/agent.md).

Three layers, one file:

- **structured facts** (``MemoryFact.kind == "fact"``): permanent until changed; scored by
  ``importance`` alone.
- **long-term memories** (``kind == "memory"``): scored ``importance × 0.5^(age_days / 7)``
  (a half-life of one week, :func:`decayed`).
- **the short-term buffer** (:class:`~agent.models.ShortTermMessage`): the last
  :data:`BUFFER_SIZE` messages; a message evicted with importance above :data:`PROMOTE_ABOVE`
  is promoted to a long-term memory.

Every :data:`CONSOLIDATE_EVERY`-th run, facts are consolidated: by the model when one is configured
(``agent.memory.model_digest.consolidate_by_model``), else — and when the model fails — :func:`consolidate`
extracts rule-made facts: host faults from diagnoses (``incident``) and operator rejections
(``rule_learned``).
:func:`recall` ranks by PostgreSQL full-text search (``SearchVector``/``SearchRank``) × score;
on SQLite by the share of query words found × score. Text is redacted (``fleet.secrets.redact``)
before it is stored. Operators change facts through :func:`do_update_fact` / :func:`do_delete_fact`
(audited).
"""

import logging
import re
from datetime import timedelta

from django.contrib.postgres.search import SearchQuery, SearchRank, SearchVector
from django.db import connection, transaction

from agent.models import Approval, MemoryFact, ShortTermMessage
from fleet.audit import do_audit
from fleet.clock import clock
from fleet.events import emit
from fleet.models import Diagnosis
from fleet.secrets import redact

log = logging.getLogger(__name__)

#: categories the prompt and the memory page name; any other word is allowed too
CATEGORIES = ("machine_perf", "provider_note", "rule_learned", "incident", "rejection")
KINDS = ("fact", "memory")
BUFFER_SIZE = 20
PROMOTE_ABOVE = 0.6
HALF_LIFE_DAYS = 7.0
CONSOLIDATE_EVERY = 5
#: how far back consolidation looks for diagnoses and rejections
CONSOLIDATE_WINDOW = timedelta(days=7)


class MemoryInputError(ValueError):
    """Bad input to a memory change (empty text, unknown kind, importance outside 0..1)."""


def decayed(importance: float, created_at, now=None) -> float:
    """``importance × 0.5^(age_days / 7)``; ``age_days`` is fractional days since ``created_at``."""
    now = now or clock.now()
    age_days = max(0.0, (now - created_at).total_seconds() / 86400)
    return importance * 0.5 ** (age_days / HALF_LIFE_DAYS)


def score(fact: MemoryFact, now=None) -> float:
    """A fact's weight in recall: ``importance`` for structured facts, :func:`decayed` otherwise."""
    if fact.kind == "fact":
        return fact.importance
    return decayed(fact.importance, fact.created_at, now)


def _clean(field: str, value, limit: int) -> str:
    text = redact(str(value or "").strip())
    if not text:
        raise MemoryInputError(f"{field} is empty; give a {field}")
    return text[:limit]


def _importance(value) -> float:
    try:
        imp = float(0.5 if value is None else value)
    except (TypeError, ValueError):
        raise MemoryInputError(f"importance must be a number between 0 and 1; got {value!r}") from None
    if not 0 <= imp <= 1:
        raise MemoryInputError(f"importance must be between 0 and 1; got {imp}")
    return imp


def remember(category: str, key: str, value: str, *, importance=None, kind: str = "fact",
             source: str = "agent") -> tuple[MemoryFact, bool]:
    """Store or change the fact ``(category, key)`` (redacted). Returns ``(fact, created)``.

    A changed fact gets a new ``created_at`` (its decay starts again). Raises
    :class:`MemoryInputError` on empty text, a bad importance or an unknown ``kind``.
    """
    if kind not in KINDS:
        raise MemoryInputError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    fact, created = MemoryFact.objects.update_or_create(
        category=_clean("category", category, 40), key=_clean("key", key, 200),
        defaults={"value": _clean("value", value, 4000), "importance": _importance(importance), "kind": kind,
                  "source": source, "created_at": clock.now()},
    )
    emit("memory-changed")  # the Memory page refreshes after commit
    return fact, created


#: words too common to rank by (SQLite's ranking; PostgreSQL's ``english`` config has its own list)
STOPWORDS = frozenset("a an and are as at be by for from has have in is it its of off on or that the this to "
                      "was were what when which who why will with how many much".split())


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[\w.-]+", (text or "").lower()) if len(w) > 1 and w not in STOPWORDS]


def recall(query: str = "", *, category: str | None = None, limit: int = 20, touch: bool = True) -> list[dict]:
    """The best ``limit`` facts for ``query``: ``[{category, key, value, kind, importance, score}]``.

    With a query, PostgreSQL ranks by ``SearchRank(SearchVector(key, value, category),
    websearch query)`` × :func:`score` (facts that do not match are left out); SQLite by the share
    of query words present × score. Without a query, by score alone. ``touch`` records use.
    """
    qs = MemoryFact.objects.all()
    if category:
        qs = qs.filter(category=category)
    now = clock.now()
    query = (query or "").strip()
    if query and connection.vendor == "postgresql":
        sq = SearchQuery(query, search_type="websearch", config="english")
        vector = SearchVector("key", "value", "category", config="english")
        def matching(q):  # ts_rank is never 0 (1e-20 for no match): filter with @@ instead
            return [(f.rank * score(f, now), f)
                    for f in qs.annotate(search=vector, rank=SearchRank(vector, q)).filter(search=q)]

        rows = matching(sq)
        words = _words(query)
        if not rows and words:  # websearch ANDs the words; fall back to any word
            rows = matching(SearchQuery(" | ".join(re.sub(r"\W", "", w) or "x" for w in words), search_type="raw",
                                        config="english"))
    elif query:
        words = set(_words(query))
        rows = []
        for f in qs:
            found = set(_words(f"{f.category} {f.key} {f.value}"))
            share = len(words & found) / len(words) if words else 0
            if share:
                rows.append((share * score(f, now), f))
    else:
        rows = [(score(f, now), f) for f in qs]
    rows.sort(key=lambda r: (-r[0], -r[1].pk))
    best = rows[:limit]
    if touch and best:
        MemoryFact.objects.filter(pk__in=[f.pk for _, f in best]).update(last_used_at=now)
    return [{"category": f.category, "key": f.key, "value": f.value, "kind": f.kind,
             "importance": f.importance, "score": round(s, 4)} for s, f in best]


def recall_for_prompt(query: str = "", limit: int = 8) -> list[str]:
    """Recalled facts as prompt lines for the middle tier: ``"[category] key: value"``, best first.

    Without matches for ``query`` it gives the best-scored facts overall (rejections and rules
    the model should know even when the question does not name them).
    """
    facts = recall(query, limit=limit) if query else []
    if not facts:
        facts = recall("", limit=limit)
    return [f"[{f['category']}] {f['key']}: {f['value']}" for f in facts]


# --- short-term buffer ------------------------------------------------------------------------
def message_importance(text: str) -> float:
    """A rule-made importance for a buffered message: 0.8 when it states a standing rule or a
    fact to keep ("always", "never", "remember", "don't", "prefer"), else 0.3."""
    return 0.8 if re.search(r"\b(always|never|remember|don'?t|do not|prefer|avoid)\b", text or "", re.I) else 0.3


@transaction.atomic
def buffer_message(text: str, actor: str, *, run_number: int | None = None, importance: float | None = None) -> list[MemoryFact]:
    """Append a message to the short-term buffer (redacted); evict beyond :data:`BUFFER_SIZE`.

    Returns the long-term memories promoted from the evicted messages (importance above
    :data:`PROMOTE_ABOVE`).
    """
    text = redact((text or "").strip())[:4000]
    if not text:
        return []
    ShortTermMessage.objects.create(run_number=run_number, actor=actor[:150], text=text,
                                    importance=message_importance(text) if importance is None else importance,
                                    created_at=clock.now())
    keep = list(ShortTermMessage.objects.order_by("-id").values_list("id", flat=True)[:BUFFER_SIZE])
    return _evict(ShortTermMessage.objects.exclude(id__in=keep))


@transaction.atomic
def flush_buffer() -> list[MemoryFact]:
    """Empty the short-term buffer (``Reset session``), promoting as on eviction."""
    return _evict(ShortTermMessage.objects.all())


def _evict(qs) -> list[MemoryFact]:
    evicted = list(qs.select_for_update().order_by("id"))
    promoted = []
    for m in evicted:
        if m.importance > PROMOTE_ABOVE:
            fact, _ = remember("agent_note" if m.actor == "agent" else "operator_note", f"message {m.pk} from {m.actor}",
                               m.text, importance=m.importance, kind="memory", source="promotion")
            promoted.append(fact)
    ShortTermMessage.objects.filter(id__in=[m.id for m in evicted]).delete()
    return promoted


# --- consolidation ----------------------------------------------------------------------------
def consolidate() -> list[MemoryFact]:
    """Extract rule-made facts (no model): one ``incident`` memory per instance with a host fault
    diagnosed in the last week, one ``rule_learned`` fact per tool and target operators rejected.
    Idempotent: the same evidence rewrites the same ``(category, key)``."""
    since = clock.now() - CONSOLIDATE_WINDOW
    made = []
    host = (Diagnosis.objects.filter(taken_at__gte=since, fault_class="host").select_related("instance")
            .order_by("instance_id", "-taken_at"))
    seen = set()
    for d in host:
        if d.instance_id in seen:
            continue
        seen.add(d.instance_id)
        inst = d.instance
        made.append(remember("incident", f"host fault {inst.external_id}",
                             f"{inst.external_id} ({inst.provider}, {inst.gpu_name or 'gpu?'}) had a host fault "
                             f"({d.health}) at {d.taken_at:%Y-%m-%d %H:%M} UTC: {d.cause or 'no cause recorded'}",
                             importance=0.7, kind="memory", source="consolidation")[0])
    rejected = Approval.objects.filter(status="rejected", decided_at__gte=since).order_by("tool", "-decided_at")
    counts: dict[tuple[str, str], list] = {}
    for a in rejected:
        target = (a.args or {}).get("instance_id") or "any instance"
        counts.setdefault((a.tool, target), []).append(a)
    for (tool, target), rows in counts.items():
        last = rows[0]
        made.append(remember("rule_learned", f"operators reject {tool} {target}",
                             f"operators rejected {tool} on {target} {len(rows)} time(s) this week; last: "
                             f"{last.comment or 'no comment'}", importance=0.8, kind="fact", source="consolidation")[0])
    return made


# --- operator changes (the memory page) ---------------------------------------------------------
def _state(f: MemoryFact) -> dict:
    return {"category": f.category, "key": f.key, "value": f.value, "importance": f.importance, "kind": f.kind}


@transaction.atomic
def do_update_fact(fact: MemoryFact, *, value: str, importance, kind: str, actor: str, reason: str = "") -> MemoryFact:
    """An operator edits a fact's value, importance or kind (redacted; audited ``update_memory``).
    Raises :class:`MemoryInputError` on bad input (nothing changes then)."""
    if kind not in KINDS:
        raise MemoryInputError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    fact = MemoryFact.objects.select_for_update().get(pk=fact.pk)
    before = _state(fact)
    fact.value = _clean("value", value, 4000)
    fact.importance = _importance(importance)
    fact.kind = kind
    fact.source = "operator"
    fact.created_at = clock.now()
    fact.save()
    do_audit(actor, "update_memory", f"memory {fact.category}/{fact.key}", reason, before, _state(fact))
    emit("memory-changed")
    return fact


@transaction.atomic
def do_delete_fact(fact: MemoryFact, *, actor: str, reason: str = "") -> None:
    """An operator deletes a fact (audited ``delete_memory`` with what it said)."""
    before = _state(fact)
    deleted, _ = MemoryFact.objects.filter(pk=fact.pk).delete()
    if deleted:
        do_audit(actor, "delete_memory", f"memory {before['category']}/{before['key']}", reason, before, None)
        emit("memory-changed")
