"""The trace-scoring page: ``agent.scoring.score_traces`` rendered for signed-in users (read-only)."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from agent.scoring import score_traces


@login_required
def traces(request):
    """GET ``/traces/`` (``?last=N`` for the newest N runs): histogram, halts, attempts, approvals, flags."""
    try:
        last = int(request.GET.get("last") or 0) or None
    except ValueError:
        last = None
    if last is not None and last < 1:
        last = None
    score = score_traces(last=last)
    peak = max((r["runs"] for r in score["step_histogram"]), default=0) or 1
    histogram = [dict(r, pct=round(100 * r["runs"] / peak)) for r in score["step_histogram"]]
    return render(request, "console/traces.html", {"score": score, "histogram": histogram, "last": last})
