"""The runs list and one run's page: steps, model calls and the final answer; a run exported as a scenario."""

import json

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from agent.models import Run
from agent.report import flagged_claims
from console.views.common import HtmxHttpRequest, _is_region, _page_context, page_number
from fleet.clock import clock

#: runs per page of the runs list
RUNS_ON_PAGE = 50

RUN_STATUSES = ("running", "parked", "done", "halted", "failed", "queued", "cancelled")
#: the verdict filter: ``acted`` (the verdict says it acted), ``noop`` (no action, nothing
#: changed: left out of later prompts), ``unknown`` (no verdict, or a malformed one)
VERDICTS = {"acted": Q(verdict_action=True), "noop": Q(included_in_prompt=False), "unknown": Q(verdict_action__isnull=True)}


def runs_filters(params) -> dict:
    """The runs list's filters from a query dict: ``status`` (one of :data:`RUN_STATUSES`),
    ``trigger`` (beat, operator, chat, …; at most 20 characters), ``verdict`` (a :data:`VERDICTS`
    key); empty means any. Raises ``ValueError`` naming a bad value."""
    status = (params.get("status") or "").strip()
    if status and status not in RUN_STATUSES:
        raise ValueError(f"status must be one of {', '.join(RUN_STATUSES)}; got {status[:40]!r}")
    verdict = (params.get("verdict") or "").strip()
    if verdict and verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}; got {verdict[:40]!r}")
    trigger = (params.get("trigger") or "").strip()
    if len(trigger) > 20:
        raise ValueError("trigger is longer than 20 characters; it names how a run started (beat, operator, chat)")
    return {"status": status, "trigger": trigger, "verdict": verdict}


def runs_context(limit: int = RUNS_ON_PAGE, page: int = 1, status: str = "", trigger: str = "", verdict: str = "") -> dict:
    """One page of runs, newest first, matching the filters, each with its step count, and the
    pager ``runs_pager`` (``runs_pager.paginator.count`` is how many match). Three queries whatever the number of runs:
    the count, the page's run numbers, the page's rows with their step counts."""
    qs = Run.objects.order_by("-number")
    if status:
        qs = qs.filter(status=status)
    if trigger:
        qs = qs.filter(trigger=trigger)
    if verdict:
        qs = qs.filter(VERDICTS[verdict])
    pager = Paginator(qs.only("pk"), limit).get_page(page)
    ids = [r.pk for r in pager.object_list]
    runs = Run.objects.filter(pk__in=ids).annotate(step_count=Count("steps")).order_by("-number") if ids else []
    return {
        "runs": list(runs),
        "runs_pager": pager,
        "f_status": status,
        "f_trigger": trigger,
        "f_verdict": verdict,
        "run_statuses": RUN_STATUSES,
        "verdicts": list(VERDICTS),
    }


@login_required
@require_GET
@never_cache
def runs_page(request: HtmxHttpRequest) -> HttpResponse:
    """The runs, 50 a page, newest first: ``?status=``, ``?trigger=``, ``?verdict=acted|noop|unknown``,
    ``?page=N``; the filters live in the URL. A bad filter: 400 naming it. htmx GET: the table only."""
    try:
        filters = runs_filters(request.GET)
        page = page_number(request.GET)
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain")
    ctx = _page_context(request, runs_list=True, **runs_context(page=page, **filters))
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
        flag_claims=flagged_claims(run.final_answer, run.entailment_flags or []),
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
