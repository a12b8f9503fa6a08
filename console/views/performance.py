"""The Machine Performance tab: cost against the caps, $ per proof per GPU model, charts over time
(proofs/hr against the target, queue depth, fleet size, $/hr) and a per-instance table.

Charts are drawn in the browser by the vendored Chart.js (``static/vendor/``, ``make vendor``) from
the series this view puts in the page as JSON (``json_script``); the numbers come from the
``DemandSample`` and ``FleetSample`` rows the observe cycles write, the spend from ``fleet.cost``.
"""

from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from agent.policy.table import effective_limits
from console.views.common import HtmxHttpRequest, _is_region, _page_context
from fleet.clock import clock
from fleet.cost import Spend, fleet_dph, instance_dph, spend_by_instance
from fleet.models import DemandSample, FleetSample, Instance
from fleet.proof_cost import credited_proofs, proof_costs

#: the windows an operator can pick (hours): 1 h, 6 h, 24 h, 7 d; without a pick, the smallest
#: that holds every sample (a 20-minute demo fills the 1 h chart instead of the last pixels of 24 h)
WINDOWS = (1, 6, 24, 168)
DEFAULT_HOURS = 24
#: at most this many points per series (older samples are thinned evenly)
MAX_POINTS = 720


def _thin(rows: list) -> list:
    step = max(1, -(-len(rows) // MAX_POINTS))
    return rows[::step] if step > 1 else rows


def _ms(t) -> int:
    return int(t.timestamp() * 1000)


def series(since) -> dict:
    """The charts' series since ``since``, each a list of ``[epoch ms, value]`` (value null where the
    sample did not know it: an unknown demand read is a gap, never zero)."""
    demand = _thin(list(DemandSample.objects.filter(taken_at__gte=since).order_by("taken_at")
                        .values_list("taken_at", "state", "proofs_hr", "queued", "backlog")))
    fleet = _thin(list(FleetSample.objects.filter(taken_at__gte=since).order_by("taken_at")
                       .values_list("taken_at", "instances", "running", "dph", "target_proofs_hr")))
    # a read that was not ok counts nothing: null (a gap in the line)
    known = [(t, *(v if state == "ok" else None for v in vals)) for t, state, *vals in demand]
    return {
        "proofs_hr": [[_ms(t), p] for t, p, _, _ in known],
        "queued": [[_ms(t), q] for t, _, q, _ in known],
        "backlog": [[_ms(t), b] for t, _, _, b in known],
        "target": [[_ms(t), target] for t, _, _, _, target in fleet],
        "instances": [[_ms(t), n] for t, n, _, _, _ in fleet],
        "running": [[_ms(t), r] for t, _, r, _, _ in fleet],
        "dph": [[_ms(t), round(d, 4)] for t, _, _, d, _ in fleet],
    }


def performance_context(hours: int) -> dict:
    """Everything the tab shows for a window of ``hours``: caps against use, spend (to date and in
    the window), $ per proof per GPU model, the chart series and one row per instance alive in the
    window."""
    now = clock.now()
    since = now - timedelta(hours=hours)
    limits = effective_limits()
    instances = list(Instance.objects.all().order_by("killed_at", "-created_at"))  # killed ones cost until killed
    live = [i for i in instances if i.killed_at is None]
    to_date = spend_by_instance(instances, now)
    window = spend_by_instance(instances, now, since)
    total, in_window = Spend(), Spend()
    for s in to_date.values():
        total.add(s)
    for s in window.values():
        in_window.add(s)
    limit = timedelta(hours=limits.stopped_destroy_h)
    rows = [
        {"inst": i, "dph_now": instance_dph(i), "spend": to_date[i.pk], "window": window[i.pk],
         "stopped_h": (now - i.status_since).total_seconds() / 3600 if i.status == "stopped" and not i.killed_at else None,
         "past_limit": i.status == "stopped" and not i.killed_at and now - i.status_since > limit}
        for i in instances if i.killed_at is None or i.killed_at >= since
    ]
    costs, costs_error = proof_costs([i for i in instances if i.killed_at is None or i.killed_at >= since - timedelta(hours=24)])
    # proofs credited to each instance when they completed: kept after it stops or is destroyed
    credited = credited_proofs(since) if not costs_error else {}
    for r in rows:
        r["proofs"] = credited.get(r["inst"].pk, 0) if not costs_error else None
    burn = fleet_dph(live)
    counted = sum(i.dph for i in live)  # what the budget_cap guard counts: every live instance at its GPU rate
    return {
        "hours": hours,
        "windows": WINDOWS,
        "rows": rows,
        "spend_total": total,
        "spend_window": in_window,
        "burn": burn,
        "counted": counted,
        "max_dph": limits.max_dph,
        "dph_pct": min(100, round(100 * counted / limits.max_dph)) if limits.max_dph else 100,
        "live": len(live),
        "max_instances": limits.max_instances,
        "inst_pct": min(100, round(100 * len(live) / limits.max_instances)) if limits.max_instances else 100,
        "target": limits.target_proofs_hr,
        "stopped_destroy_h": limits.stopped_destroy_h,
        "proof_costs": costs,
        "proof_costs_error": costs_error,
        "proofs_not_ours": credited.get(None, 0),
        "series": series(since),
        "chart_frame": {"since": _ms(since), "now": _ms(now), "max_dph": limits.max_dph,
                        "max_instances": limits.max_instances},
    }


def data_hours() -> int:
    """The smallest of :data:`WINDOWS` that holds the oldest fleet sample of the last 7 days
    (:data:`DEFAULT_HOURS` when there is none). One query."""
    now = clock.now()
    oldest = (FleetSample.objects.filter(taken_at__gte=now - timedelta(hours=WINDOWS[-1]))
              .order_by("taken_at").values_list("taken_at", flat=True).first())
    if oldest is None:
        return DEFAULT_HOURS
    age_h = (now - oldest).total_seconds() / 3600
    return next((h for h in WINDOWS if h >= age_h), WINDOWS[-1])


def _hours(request) -> int:
    if not request.GET.get("hours"):
        return data_hours()
    try:
        h = int(request.GET["hours"])
    except ValueError:
        return DEFAULT_HOURS  # a bad pick: the usual day, not a guess
    return h if h in WINDOWS else DEFAULT_HOURS


@login_required
@require_GET
@never_cache
def performance_page(request: HtmxHttpRequest) -> HttpResponse:
    """The Machine Performance tab: ``?hours=1|6|24|168`` picks the window (default: the span that
    has data, :func:`data_hours`). htmx GET:
    the region only (re-fetched on ``fleet-changed``/``demand-changed``)."""
    ctx = _page_context(request, **performance_context(_hours(request)))
    if _is_region(request):
        return render(request, "console/partials/performance.html", ctx)
    return render(request, "console/performance.html", ctx)
