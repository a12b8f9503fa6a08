"""The trace-scoring page: ``agent.replay.scoring.score_traces`` rendered for signed-in users (read-only)."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponseBadRequest
from django.shortcuts import render

from agent.replay.scoring import score_traces

#: the most runs ``?last=`` may ask for
MAX_LAST = 100_000


@login_required
def traces(request):
    """GET ``/traces/`` (``?last=N`` for the newest N runs): histogram, halts, attempts, approvals, flags."""
    raw = (request.GET.get("last") or "").strip()
    if raw and not (raw.isascii() and raw.isdigit() and len(raw) <= 7 and 1 <= int(raw) <= MAX_LAST):
        return HttpResponseBadRequest(
            f"last must be a whole number of runs from 1 to {MAX_LAST:,}, e.g. ?last=50", content_type="text/plain"
        )
    last = int(raw) if raw else None
    score = score_traces(last=last)
    peak = max((r["runs"] for r in score["step_histogram"]), default=0) or 1
    histogram = [dict(r, pct=round(100 * r["runs"] / peak)) for r in score["step_histogram"]]
    return render(request, "console/traces.html", {"score": score, "histogram": histogram, "last": last})
