"""The runs list and one run's page: steps, model calls and the final answer; a run exported as a scenario."""

import json

from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from agent.models import Run
from console.views.common import HtmxHttpRequest, _is_region, _page_context
from fleet.clock import clock

RUNS_ON_PAGE = 200


def runs_context(limit: int) -> dict:
    """Newest runs with their step counts (one query)."""
    runs = Run.objects.annotate(step_count=Count("steps")).order_by("-number")[:limit]
    return {"runs": list(runs)}


@login_required
@require_GET
@never_cache
def runs_page(request: HtmxHttpRequest) -> HttpResponse:
    """The newest runs. htmx GET: the table only."""
    ctx = _page_context(request, **runs_context(RUNS_ON_PAGE))
    if _is_region(request):
        return render(request, "console/partials/runs.html", ctx)
    return render(request, "console/runs.html", ctx)


@login_required
@require_GET
@never_cache
def run_detail(request: HtmxHttpRequest, number: int) -> HttpResponse:
    """One run: halt reason, the honest report, entailment flags, and every step of its trace with its
    outcome and reason code (observe-only refusals as "would have done"; parked calls with their
    approval inline), and each model call: what was sent (redacted) and what came back, tokens and
    cost. htmx GET: the trace only."""
    run = Run.objects.annotate(step_count=Count("steps")).filter(number=number).first()
    if run is None:
        raise Http404(f"no run {number}")
    steps = list(run.steps.select_related("approval", "approval__decided_by").order_by("seq"))
    now = clock.now()
    for s in steps:
        a = getattr(s, "approval", None) if s.kind == "call" else None
        if a is not None:
            a.seconds_left = (a.expires_at - now).total_seconds()
            a.run, a.step = run, s
    ctx = _page_context(
        request,
        run=run,
        steps=steps,
        now=now,
        model_calls=list(run.model_calls.order_by("seq")),
        would_have=sum(1 for s in steps if s.reason_code == "observe_only"),
    )
    if _is_region(request):
        return render(request, "console/partials/run_trace.html", ctx)
    return render(request, "console/run.html", ctx)


@login_required
@require_GET
@never_cache
def export_scenario(request: HtmxHttpRequest, number: int) -> HttpResponse:
    """"Export as scenario": the run's situation as a replay file (``agent.scenario_export``),
    downloaded as ``run-N-scenario.json`` for ``manage.py replay``. A run that cannot be exported:
    409 with the reason."""
    from agent.scenario_export import ScenarioExportError, export_run

    run = Run.objects.filter(number=number).first()
    if run is None:
        raise Http404(f"no run {number}")
    try:
        data = export_run(run)
    except ScenarioExportError as exc:
        return HttpResponse(str(exc), status=409, content_type="text/plain; charset=utf-8")
    resp = HttpResponse(json.dumps(data, indent=2, ensure_ascii=False) + "\n", content_type="application/json")
    resp["Content-Disposition"] = f'attachment; filename="run-{run.number}-scenario.json"'
    return resp
