"""The actions page: the audit log, filtered by actor, verb and target."""

import json

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from console.forms import (
    too_long_error,
)
from console.views.common import HtmxHttpRequest, _is_region, _page_context
from fleet.models import AuditLog

# --- actions tab (the audit log) ---------------------------------------------------------------
AUDIT_ON_PAGE = 200


def audit_context(actor: str = "", verb: str = "", target: str = "", limit: int = AUDIT_ON_PAGE) -> dict:
    """Audit rows, newest first, optionally filtered by actor / verb prefix / target (one query)."""
    qs = AuditLog.objects.order_by("-at", "-id")
    if actor:
        qs = qs.filter(actor__icontains=actor)
    if verb:
        qs = qs.filter(verb__startswith=verb)
    if target:
        qs = qs.filter(target__icontains=target)
    rows = list(qs[:limit])
    for r in rows:
        r.changes = changed_fields(r.before, r.after)
    return {"rows": rows, "f_actor": actor, "f_verb": verb, "f_target": target, "limit": limit}


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= 120 else text[:119] + "…"


def changed_fields(before, after) -> list[tuple[str, str, str]]:
    """The fields an audit row changed: ``[(field, before, after)]`` (values shortened to 120
    characters; "–" for absent), sorted by field. Two dicts compare key by key and keep only the
    keys whose value differs; anything else is one ``("", before, after)`` entry (or none when
    both are None)."""
    if isinstance(before, dict) and isinstance(after, dict):
        keys = sorted(set(before) | set(after))
        return [(k, _short(before[k]) if k in before else "–", _short(after[k]) if k in after else "–")
                for k in keys if before.get(k, object()) != after.get(k, object())]
    if before is None and after is None:
        return []
    if isinstance(after, dict) and before is None:
        return [(k, "–", _short(v)) for k, v in sorted(after.items())]
    return [("", "–" if before is None else _short(before), "–" if after is None else _short(after))]


@login_required
@require_GET
@never_cache
def actions_page(request: HtmxHttpRequest) -> HttpResponse:
    """The Actions tab: who or what did what, when, why, before and after (``?actor=&verb=&target=``
    filter, kept in the URL). htmx GET: the table only."""
    filters = {k: request.GET.get(k, "").strip() for k in ("actor", "verb", "target")}
    for name, value in filters.items():
        if error := too_long_error(f"{name} filter", value, "filter"):
            return HttpResponseBadRequest(error, content_type="text/plain")
    ctx = _page_context(request, **audit_context(**filters))
    if _is_region(request):
        return render(request, "console/partials/audit.html", ctx)
    return render(request, "console/actions.html", ctx)
