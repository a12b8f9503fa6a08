"""The runs list and one run's page: steps, model calls and the final answer; a run exported as a scenario."""

import json

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from agent.models import Run, Step
from agent.policy.tool_specs import TOOLS
from agent.replay.evaluation import standing
from agent.replay.scenario_export import ScenarioExportError, export_run
from agent.runtime.report import flagged_claims
from console.templatetags.sentences import observed
from console.views.common import HtmxHttpRequest, _is_region, _page_context, page_number
from fleet.clock import clock

#: runs per page of the runs list
RUNS_ON_PAGE = 50

RUN_STATUSES = ("running", "parked", "done", "halted", "failed", "queued", "cancelled")
#: tools whose execution changes the world (``agent.policy.tool_specs``: ``side_effect``)
SIDE_EFFECT_TOOLS = sorted(name for name, t in TOOLS.items() if t.side_effect)
#: step outcomes that mean the call ran (directly, or after an operator's approval)
EXECUTED = ("executed", "approved_executed")
#: a run the runtime's records show acted: one of its side-effect calls executed
ACTED = Q(steps__kind="call", steps__outcome__in=EXECUTED, steps__tool__in=SIDE_EFFECT_TOOLS)
#: a quiet run: the model's verdict says no action and no change, it ended done, and the records
#: agree (nothing executed) — a heartbeat that found nothing to do
QUIET = Q(included_in_prompt=False, status="done")
#: the verdict filter: ``acted`` (the runtime's records: a side effect executed), ``noop`` (a
#: no-op verdict, not parked, nothing executed: left out of later prompts), ``unknown`` (the model
#: gave no verdict, or a malformed one)
VERDICTS = {"acted": Q(pk__in=Run.objects.filter(ACTED).values("pk")),
            "noop": Q(included_in_prompt=False) & ~Q(status="parked") & ~Q(pk__in=Run.objects.filter(ACTED).values("pk")),
            "unknown": Q(verdict_action__isnull=True)}


def acted_lines(run_ids: list[int]) -> dict[int, list[str]]:
    """What each run's executed side effects did, from its steps: ``{run pk: ["destroy local-1",
    "launch local-3"]}`` in step order; a launch names the instance the tool's answer (the step's
    observation) says it created, else its GPU or offer. One query."""
    out: dict[int, list[str]] = {}
    for step in (Step.objects.filter(run_id__in=run_ids, kind="call", outcome__in=EXECUTED, tool__in=SIDE_EFFECT_TOOLS)
                 .order_by("run_id", "seq").only("run_id", "tool", "args", "observation")):
        run_id, tool = step.run_id, step.tool
        args = step.args if isinstance(step.args, dict) else {}
        made = observed(step).get("instance_id") if tool == "launch_instance" else None
        what = made or args.get("instance_id") or args.get("gpu_name") or args.get("offer_id") or ""
        out.setdefault(run_id, []).append(f"{tool.removesuffix('_instance')} {what}".strip())
    return out


def annotate_acted(runs: list) -> list:
    """Set ``acted`` (list of what its executed side effects did, see :func:`acted_lines`) and
    ``quiet`` (done, a no-op verdict and nothing executed) on each run. One query."""
    lines = acted_lines([r.pk for r in runs])
    for r in runs:
        r.acted = lines.get(r.pk, [])
        r.quiet = r.status == "done" and not r.included_in_prompt and not r.acted
    return runs


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


def runs_context(limit: int = RUNS_ON_PAGE, page: int = 1, status: str = "", trigger: str = "", verdict: str = "",
                 hide_quiet: bool = False) -> dict:
    """One page of runs, newest first, matching the filters, each with its step count and what
    the runtime's records say it did (:func:`annotate_acted`), and the pager ``runs_pager``
    (``runs_pager.paginator.count`` is how many match). ``hide_quiet`` (the dashboard's default)
    leaves out quiet runs (:data:`QUIET` with nothing executed) and says how many: ``quiet_hidden``.
    Five queries whatever the number of runs."""
    qs = Run.objects.order_by("-number")
    if status:
        qs = qs.filter(status=status)
    if trigger:
        qs = qs.filter(trigger=trigger)
    if verdict:
        qs = qs.filter(VERDICTS[verdict])
    quiet_hidden = 0
    if hide_quiet:
        quiet = QUIET & ~Q(pk__in=Run.objects.filter(ACTED).values("pk"))
        quiet_hidden = qs.filter(quiet).count()
        qs = qs.exclude(quiet)
    pager = Paginator(qs.only("pk"), limit).get_page(page)
    ids = [r.pk for r in pager.object_list]
    runs = list(Run.objects.filter(pk__in=ids).annotate(step_count=Count("steps")).order_by("-number")) if ids else []
    return {
        "runs": annotate_acted(runs),
        "runs_pager": pager,
        "f_status": status,
        "f_trigger": trigger,
        "f_verdict": verdict,
        "run_statuses": RUN_STATUSES,
        "verdicts": list(VERDICTS),
        "quiet_hidden": quiet_hidden,
        "hide_quiet": hide_quiet,
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

    ctx["model_standing"] = standing()
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
    annotate_acted([run])
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
    """"Export as scenario": the run's situation as a replay file (``agent.replay.scenario_export``),
    downloaded as ``run-N-scenario.json`` for ``manage.py replay``. A run that cannot be exported:
    409 with the reason."""
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
