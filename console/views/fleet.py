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

#: the status chips: each a name and the provider statuses it covers (``all`` covers every one)
STATUS_CHIPS = {
    "running": ("running",),
    "pending": tuple(sorted(s for s in PENDING_STATUSES if s)),
    "stopped": ("stopped",),
    "exited": ("exited", "error", "unknown", "offline", "frozen"),
}


def fleet_filters(params) -> dict:
    """The fleet's filters from a query dict: ``status`` (a :data:`STATUS_CHIPS` name, else
    ``all``), ``q`` (id, label, worker or GPU contains; at most 100 characters), ``killed``
    (``1`` shows killed instances too). Raises ``ValueError`` naming a bad value."""
    status = params.get("status", "") or "all"
    if status != "all" and status not in STATUS_CHIPS:
        raise ValueError(f"status must be one of all, {', '.join(STATUS_CHIPS)}; got {status[:40]!r}")
    q = (params.get("q") or "").strip()
    if len(q) > 100:
        raise ValueError("q is longer than 100 characters; shorten the search")
    return {"status": status, "q": q, "show_killed": params.get("killed") == "1"}


def fleet_context(show_killed: bool, status: str = "all", q: str = "", page: int = 1,
                  per_page: int = FLEET_PAGE, compact: bool = False) -> dict:
    """One page of instances (newest first; killed ones hidden unless ``show_killed``) matching
    ``status`` and ``q``, how many killed ones the filter hides, and the count per status chip.
    Three queries whatever the fleet size: the chip counts, the page's count and the page's rows.
    ``compact`` (the dashboard): the newest ``per_page`` with a link to the fleet page, no pager."""
    base = Instance.objects.all()
    if q:
        base = base.filter(
            Q(external_id__icontains=q) | Q(label__icontains=q) | Q(worker_name__icontains=q) | Q(gpu_name__icontains=q)
        )
    aggregates = {"killed": Count("id", filter=Q(killed_at__isnull=False)), "live": Count("id", filter=Q(killed_at__isnull=True))}
    for name, statuses in STATUS_CHIPS.items():
        aggregates[name] = Count("id", filter=Q(status__in=statuses) & (Q() if show_killed else Q(killed_at__isnull=True)))
    counts = base.aggregate(**aggregates)
    qs = base.order_by("-created_at", "-id")
    if not show_killed:
        qs = qs.filter(killed_at__isnull=True)
    if status != "all":
        qs = qs.filter(status__in=STATUS_CHIPS[status])
    pager = Paginator(qs, per_page).get_page(page)
    return {
        "instances": list(pager.object_list),
        "fleet_pager": pager,
        "hidden_count": 0 if show_killed else counts["killed"],
        "show_killed": show_killed,
        "f_status": status,
        "f_q": q,
        "chip_counts": {name: counts[name] for name in STATUS_CHIPS},
        "all_count": counts["live"] + (counts["killed"] if show_killed else 0),
        "chips": list(STATUS_CHIPS),
        "compact": compact,
    }


@login_required
@require_GET
@never_cache
def fleet_page(request: HtmxHttpRequest) -> HttpResponse:
    """Every instance, 50 a page: ``?status=running|pending|stopped|exited`` (default all),
    ``?q=`` (search id, label, worker, GPU), ``?killed=1`` (killed ones too), ``?page=N``; the
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
