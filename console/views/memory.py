"""The Memory page (docs/agent.md, Memory): what the agent remembers, for operators to read and correct.

Everyone signed in sees the facts, filtered by ``?category=`` and ``?q=`` (text in key or value);
operators edit a fact's value, importance and kind, or delete it — each an audited ``do_*`` action
of ``agent.memory.store``. htmx GETs and POSTs get the table partial (the same view renders both).
"""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from agent.memory import store as memory
from agent.models import MemoryFact
from console.forms import CAPS, too_long
from console.views.common import _page_context, actor_of, operator_required

PAGE_SIZE = 200


class FactForm(forms.Form):
    """An operator's edit of one fact: the new value, importance (0..1), kind and why."""

    value = forms.CharField(max_length=4000, strip=True, error_messages=too_long("value", "message"))
    importance = forms.FloatField(min_value=0, max_value=1)
    kind = forms.ChoiceField(choices=[(k, k) for k in memory.KINDS])
    reason = forms.CharField(required=False, max_length=CAPS["reason"], strip=True, error_messages=too_long("reason"))


def memory_context(category: str = "", q: str = "") -> dict:
    """Facts (newest first, at most :data:`PAGE_SIZE`) with their current score, the categories
    in use and the filter."""
    qs = MemoryFact.objects.all()
    if category:
        qs = qs.filter(category=category)
    if q:
        qs = qs.filter(Q(key__icontains=q) | Q(value__icontains=q))
    facts = list(qs.order_by("-created_at", "-pk")[:PAGE_SIZE])
    for f in facts:
        f.current_score = round(memory.score(f), 3)
    used = set(MemoryFact.objects.values_list("category", flat=True).distinct())
    return {
        "facts": facts,
        "categories": sorted(used | set(memory.CATEGORIES)),
        "category": category,
        "q": q,
        "kinds": memory.KINDS,
    }


def _filters(request) -> tuple[str, str]:
    src = request.POST if request.method == "POST" else request.GET
    return (src.get("category") or "").strip()[:40], (src.get("q") or "").strip()[:200]


def _answer(request, error: str = "", error_pk=None, status: int = 200, ok: str = "") -> HttpResponse:
    category, q = _filters(request)
    ctx = _page_context(request, error=error, error_pk=error_pk, **memory_context(category, q))
    if request.htmx:
        # no client event here: the region re-fetches on "memory-changed", so an event on every
        # answer (its own GETs too) made it fetch itself again, without end. A change is pushed
        # over the websocket by ``agent.memory.store`` after commit, which reaches every open tab.
        return render(request, "console/partials/memory.html", ctx, status=status)
    if status == 200 and request.method == "POST":
        messages.success(request, ok)
        return redirect(f"/memory/?category={category}&q={q}")
    return render(request, "console/memory.html", ctx, status=status)


@login_required
def memory_page(request) -> HttpResponse:
    """The Memory tab: list and filter facts. htmx GET: the table only."""
    if request.htmx:
        return _answer(request)
    category, q = _filters(request)
    return render(request, "console/memory.html", _page_context(request, **memory_context(category, q)))


@operator_required
def edit_fact(request, pk: int) -> HttpResponse:
    """Change one fact (``agent.memory.store.do_update_fact``). Bad input: 400 with the error by the row."""
    fact = get_object_or_404(MemoryFact, pk=pk)
    form = FactForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
        return _answer(request, error=errors, error_pk=pk, status=400)
    try:
        memory.do_update_fact(
            fact,
            value=form.cleaned_data["value"],
            importance=form.cleaned_data["importance"],
            kind=form.cleaned_data["kind"],
            actor=actor_of(request),
            reason=form.cleaned_data["reason"],
        )
    except memory.MemoryInputError as exc:
        return _answer(request, error=str(exc), error_pk=pk, status=400)
    return _answer(request, ok=f"memory {fact.category}/{fact.key} changed")


@operator_required
def delete_fact(request, pk: int) -> HttpResponse:
    """Delete one fact (``agent.memory.store.do_delete_fact``); the audit row keeps what it said."""
    fact = get_object_or_404(MemoryFact, pk=pk)
    reason = (request.POST.get("reason") or "").strip()[: CAPS["reason"]]
    memory.do_delete_fact(fact, actor=actor_of(request), reason=reason)
    return _answer(request, ok=f"memory {fact.category}/{fact.key} deleted")
