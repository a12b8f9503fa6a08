"""The fleet page: every instance with its status, worker and heartbeat, filtered and paged by URL."""

import uuid

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from console.views.common import HtmxHttpRequest, _is_region, _page_context, page_number
from fleet.models import PENDING_STATUSES, Instance

#: instances per page of the fleet table (each row carries its action form)
FLEET_PAGE = 50
#: instances on the dashboard's fleet table (the rest: the fleet page)
FLEET_ON_DASHBOARD = 20

#: the status chips of instances not destroyed: each a name and the provider statuses it covers
#: (vast.ai's ``actual_status`` values and ours). One word per state: ``exited`` is a process that
#: ended on a machine still listed; ``destroyed`` (the :data:`DESTROYED` chip) is an instance
#: gone from the provider. Every status falls in exactly one chip (``other`` takes the rest), so
#: the chips add up to ``all``.
STATUS_CHIPS = {
    "running": ("running",),
    "pending": tuple(sorted(s for s in PENDING_STATUSES if s)),
    "stopped": ("stopped",),
    "exited": ("exited",),
    "error": ("error",),
    "offline": ("offline",),
    "frozen": ("frozen",),
    "unknown": ("unknown",),
}
#: the chip of destroyed instances (``killed_at`` set), shown with them
DESTROYED = "destroyed"
#: chips shown even at zero (the others only when some instance is in them)
ALWAYS_SHOWN = ("running", "pending", "stopped", "exited")
_COVERED = tuple(s for statuses in STATUS_CHIPS.values() for s in statuses) + ("",)


def fleet_filters(params) -> dict:
    """The fleet's filters from a query dict: ``status`` (a :data:`STATUS_CHIPS` name, else
    ``all``), ``q`` (id, label, worker or GPU contains; at most 100 characters), ``killed``
    (``1`` shows destroyed instances too; ``status=destroyed`` shows only them). Raises
    ``ValueError`` naming a bad value."""
    status = params.get("status", "") or "all"
    if status not in ("all", "other", DESTROYED) and status not in STATUS_CHIPS:
        raise ValueError(f"status must be one of all, {', '.join(STATUS_CHIPS)}, other, {DESTROYED}; got {status[:40]!r}")
    q = (params.get("q") or "").strip()
    if len(q) > 100:
        raise ValueError("q is longer than 100 characters; shorten the search")
    return {"status": status, "q": q, "show_killed": params.get("killed") == "1" or status == DESTROYED}


def fleet_context(show_killed: bool, status: str = "all", q: str = "", page: int = 1,
                  per_page: int = FLEET_PAGE, compact: bool = False) -> dict:
    """One page of instances (newest first; destroyed ones hidden unless ``show_killed``) matching
    ``status`` and ``q``, how many destroyed ones the filter hides, and the count per chip: the
    status chips count instances not destroyed, ``destroyed`` the rest, so with destroyed shown
    the chips add up to ``all``.
    Three queries whatever the fleet size: the chip counts, the page's count and the page's rows.
    ``compact`` (the dashboard): the newest ``per_page`` with a link to the fleet page, no pager."""
    base = Instance.objects.all()
    if q:
        base = base.filter(
            Q(external_id__icontains=q) | Q(label__icontains=q) | Q(worker_name__icontains=q) | Q(gpu_name__icontains=q)
        )
    live = Q(killed_at__isnull=True)
    aggregates = {"killed": Count("id", filter=Q(killed_at__isnull=False)), "live": Count("id", filter=live)}
    for name, statuses in STATUS_CHIPS.items():  # the status chips count instances not destroyed
        aggregates[name] = Count("id", filter=Q(status__in=statuses) & live)
    aggregates["other"] = Count("id", filter=live & ~Q(status__in=_COVERED))
    counts = base.aggregate(**aggregates)
    qs = base.order_by("-created_at", "-id")
    if status == DESTROYED:
        qs = qs.filter(killed_at__isnull=False)
    elif status == "other":
        qs = qs.filter(live).exclude(status__in=_COVERED)
    elif status != "all":
        qs = qs.filter(live, status__in=STATUS_CHIPS[status])
    elif not show_killed:
        qs = qs.filter(live)
    pager = Paginator(qs, per_page).get_page(page)
    return {
        "instances": list(pager.object_list),
        "fleet_pager": pager,
        "hidden_count": 0 if show_killed else counts["killed"],
        "show_killed": show_killed,
        "f_status": status,
        "f_q": q,
        "chip_counts": {**{name: counts[name] for name in STATUS_CHIPS}, "other": counts["other"],
                        DESTROYED: counts["killed"]},
        "all_count": counts["live"] + (counts["killed"] if show_killed else 0),
        "chips": [c for c in STATUS_CHIPS if c in ALWAYS_SHOWN or counts[c] or status == c]
                 + (["other"] if counts["other"] or status == "other" else [])
                 + ([DESTROYED] if show_killed else []),
        "compact": compact,
    }


@login_required
@require_GET
@never_cache
def fleet_page(request: HtmxHttpRequest) -> HttpResponse:
    """Every instance, 50 a page: ``?status=`` a chip (running, pending, stopped, exited, error,
    offline, frozen, unknown, other, destroyed; default all), ``?q=`` (search id, label, worker,
    GPU), ``?killed=1`` (destroyed ones too), ``?page=N``; the
    filters live in the URL, so a reload or a shared link keeps them. A bad filter: 400 naming it.
    htmx GET: the table only."""
    try:
        filters = fleet_filters(request.GET)
        page = page_number(request.GET)
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain")
    ctx = _page_context(request, request_key=uuid.uuid4().hex, **fleet_context(page=page, **filters))
    if _is_region(request):
        return render(request, "console/partials/fleet.html", ctx)
    return render(request, "console/fleet.html", ctx)
