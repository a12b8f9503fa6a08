"""The console's pages, live regions and operator actions: thin function views.

Regions re-fetch themselves over htmx (on a websocket signal, on reconnect, on tab focus); each
region is served by the view of the page that owns it: an htmx GET gets the region's partial,
a plain GET the whole page. Side effects are POSTs (CSRF, login, operator role) that call one
``do_*`` action or ``start_cycle`` and answer htmx with the form's partial, plain browsers with a
redirect (success) or the page with the form's errors (status 400).

Roles: operators (group ``operators``) and superusers act; everyone else signed in sees pages with
the buttons disabled and gets 403 on POST.
"""

import functools
import logging

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q, Sum
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseForbidden, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import trigger_client_event
from django_htmx.middleware import HtmxDetails

from agent.actions import do_audit, do_post_message, do_set_target
from agent.models import Run, SessionState, Step
from console import health
from console.forms import EnqueueForm, MessageForm, TargetForm
from console.templatetags.console_extras import can_act
from fleet.clock import clock
from fleet.demand.base import DemandError
from fleet.models import BILLABLE_STATUSES, DemandSample, Instance

log = logging.getLogger(__name__)

RUNS_ON_DASHBOARD = 20
RUNS_ON_PAGE = 200
CHAT_ITEMS = 50


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def _is_region(request: HtmxHttpRequest) -> bool:
    return bool(request.htmx) and not request.htmx.boosted


def actor_of(request: HttpRequest) -> str:
    """The audit actor string of the signed-in user: ``user:<username>``."""
    return f"user:{request.user.get_username()}"


def operator_required(view):
    """POST only, signed in, operator role; viewers get 403 ``viewers cannot act``."""

    @functools.wraps(view)
    @login_required
    @require_POST
    def wrapped(request, *args, **kwargs):
        if not can_act(request.user):
            return HttpResponseForbidden("viewers cannot act")
        return view(request, *args, **kwargs)

    return wrapped


# --- region contexts (each a constant number of queries, whatever the fleet size) -------------
def demand_context() -> dict:
    """The newest demand sample and its age; ``demand_state`` is ``unknown`` when there is none."""
    sample = DemandSample.objects.order_by("-taken_at").first()
    if sample is None:
        return {"demand": None, "demand_state": "unknown", "demand_age_s": None}
    age_s = (clock.now() - sample.taken_at).total_seconds()
    return {"demand": sample, "demand_state": sample.state, "demand_age_s": age_s}


def cards_context() -> dict:
    """Summary cards: target and current proofs/hr, queue, workers, $/hr, instance counts."""
    state = SessionState.get()
    fleet = Instance.objects.filter(killed_at__isnull=True).aggregate(
        live=Count("id"),
        running=Count("id", filter=Q(status="running")),
        dph=Sum("dph", filter=Q(status__in=BILLABLE_STATUSES)),
    )
    ctx = demand_context()
    ok = ctx["demand_state"] == "ok"
    ctx.update(
        state=state,
        target=state.target_proofs_hr,
        fleet=fleet,
        dph=fleet["dph"] or 0.0,
        # counts of a demand read that failed are unknown, never zero (invariant 7)
        counts_known=ctx["demand"] is not None and ctx["demand_state"] != "unknown",
        counts_stale=not ok and ctx["demand"] is not None and ctx["demand_state"] != "unknown",
        last_run=Run.objects.order_by("-number").only("number", "status", "started_at", "trigger").first(),
    )
    return ctx


def fleet_context(show_killed: bool) -> dict:
    """Instances (killed ones hidden unless ``show_killed``) and how many are hidden."""
    qs = Instance.objects.order_by("-created_at")
    hidden = 0
    if not show_killed:
        hidden = Instance.objects.filter(killed_at__isnull=False).count()
        qs = qs.filter(killed_at__isnull=True)
    return {"instances": list(qs), "hidden_count": hidden, "show_killed": show_killed}


def runs_context(limit: int) -> dict:
    """Newest runs with their step counts (one query)."""
    runs = Run.objects.annotate(step_count=Count("steps")).order_by("-number")[:limit]
    return {"runs": list(runs)}


def chat_context() -> dict:
    """The chat: operator messages of chat runs and each chat run's final report, oldest first."""
    msgs = list(
        Step.objects.filter(kind="message", run__trigger="chat")
        .select_related("run")
        .order_by("-created_at")[:CHAT_ITEMS]
    )
    reports = list(
        Run.objects.filter(trigger="chat").exclude(final_report="").order_by("-number")[:CHAT_ITEMS]
    )
    items = [{"kind": "message", "at": s.created_at, "actor": s.actor, "text": s.text, "run": s.run} for s in msgs]
    items += [
        {"kind": "report", "at": r.ended_at or r.started_at, "actor": "agent", "text": r.final_report, "run": r}
        for r in reports
    ]
    items.sort(key=lambda item: (item["at"], item["kind"] == "report"))
    return {"chat_items": items[-CHAT_ITEMS:]}


DASHBOARD_REGIONS = {
    "cards": ("console/partials/cards.html", cards_context),
    "chat": ("console/partials/chat_log.html", chat_context),
    "fleet": ("console/partials/fleet.html", lambda: fleet_context(False)),
    "runs": ("console/partials/runs.html", lambda: runs_context(RUNS_ON_DASHBOARD)),
}


def _page_context(request, **extra) -> dict:
    ctx = {"can_act": can_act(request.user)}
    ctx.update(extra)
    return ctx


def _dashboard_page(request, status: int = 200, **forms) -> HttpResponse:
    ctx = _page_context(
        request,
        target_form=forms.get("target_form") or TargetForm(initial={"target": SessionState.get().target_proofs_hr}),
        message_form=forms.get("message_form") or MessageForm(),
        enqueue_form=forms.get("enqueue_form") or EnqueueForm(),
        flash=forms.get("flash"),
        dashboard=True,
    )
    ctx.update(cards_context())
    ctx.update(chat_context())
    ctx.update(fleet_context(False))
    ctx.update(runs_context(RUNS_ON_DASHBOARD))
    return render(request, "console/dashboard.html", ctx, status=status)


# --- pages -----------------------------------------------------------------------------------
@login_required
@require_GET
@never_cache
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    """The dashboard; an htmx GET with ``?partial=cards|chat|fleet|runs`` gets that region only."""
    name = request.GET.get("partial", "")
    if _is_region(request) and name in DASHBOARD_REGIONS:
        template, build = DASHBOARD_REGIONS[name]
        return render(request, template, _page_context(request, **build()))
    return _dashboard_page(request)


@login_required
@require_GET
@never_cache
def fleet_page(request: HtmxHttpRequest) -> HttpResponse:
    """Every instance; ``?killed=1`` shows killed ones too. htmx GET: the table only."""
    ctx = _page_context(request, **fleet_context(request.GET.get("killed") == "1"))
    if _is_region(request):
        return render(request, "console/partials/fleet.html", ctx)
    return render(request, "console/fleet.html", ctx)


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
    """One run and every step of its trace. htmx GET: the trace only."""
    run = Run.objects.annotate(step_count=Count("steps")).filter(number=number).first()
    if run is None:
        raise Http404(f"no run {number}")
    ctx = _page_context(request, run=run, steps=list(run.steps.order_by("seq")))
    if _is_region(request):
        return render(request, "console/partials/run_trace.html", ctx)
    return render(request, "console/run.html", ctx)


# --- actions (POST, operators) ---------------------------------------------------------------
def _flash_response(request, ok: bool, text: str, enqueue_form=None, status_on_error: int = 400, topics=()):
    """Answer a control action: htmx gets the controls partial, a browser a redirect or the page."""
    if request.htmx:
        ctx = _page_context(request, flash={"ok": ok, "text": text}, enqueue_form=enqueue_form or EnqueueForm())
        resp = render(request, "console/partials/controls.html", ctx)
        for topic in topics:
            trigger_client_event(resp, topic)
        return resp
    if ok:
        messages.success(request, text)
        return redirect("dashboard")
    return _dashboard_page(
        request, status=status_on_error, enqueue_form=enqueue_form, flash={"ok": False, "text": text}
    )


@operator_required
def set_target(request: HtmxHttpRequest) -> HttpResponse:
    """Set the target proofs/hr (``do_set_target``). Bad input: the form comes back with the error."""
    form = TargetForm(request.POST)
    saved = None
    if form.is_valid():
        try:
            state = do_set_target(form.cleaned_data["target"], actor_of(request), form.cleaned_data["reason"])
            saved = state.target_proofs_hr
        except ValueError as exc:
            form.add_error("target", str(exc))
    if request.htmx:
        if saved is not None:
            form = TargetForm(initial={"target": saved})
        resp = render(request, "console/partials/target_form.html", _page_context(request, target_form=form, saved=saved))
        if saved is not None:
            trigger_client_event(resp, "settings-changed")
        return resp
    if saved is not None:
        messages.success(request, f"target set to {saved:g} proofs/hr")
        return redirect("dashboard")
    return _dashboard_page(request, status=400, target_form=form)


@operator_required
def post_message(request: HtmxHttpRequest) -> HttpResponse:
    """A chat message: stored by ``do_post_message`` (a queued ``chat`` run), then a ``chat`` cycle is
    started, which picks the queued message up. The message survives a broker outage."""
    from agent.tasks import start_cycle

    form = MessageForm(request.POST)
    sent = False
    if form.is_valid():
        text = form.cleaned_data["text"]
        try:
            do_post_message(text, actor_of(request))
        except ValueError as exc:
            form.add_error("text", str(exc))
        else:
            try:
                # the message is already stored in a queued chat run, which the cycle picks up;
                # passing message= again would make run_cycle post it a second time
                start_cycle("chat", actor=actor_of(request))
                sent = True
            except Exception as exc:  # broker down: the message is stored, the run is not queued
                log.warning("start_cycle(chat) failed: %s", exc)
                form.add_error(None, f"message saved, but the agent could not be started: {_why(exc)}")
    if request.htmx:
        if sent:
            form = MessageForm()
        resp = render(request, "console/partials/chat_form.html", _page_context(request, message_form=form, sent=sent))
        trigger_client_event(resp, "chat-changed")
        return resp
    if sent:
        return redirect("dashboard")
    return _dashboard_page(request, status=400, message_form=form)


def _why(exc: Exception) -> str:
    """An error for the operator: our own errors by their message, others with their type."""
    if isinstance(exc, (ValueError, DemandError)):
        return str(exc)[:300]
    return f"{type(exc).__name__}: {exc}"[:300]


@operator_required
def observe_now(request: HtmxHttpRequest) -> HttpResponse:
    """"Trigger observe cycle now": enqueue an ``operator`` cycle (the run appears when it starts)."""
    from agent.tasks import start_cycle

    actor = actor_of(request)
    try:
        start_cycle("operator", actor=actor)
    except Exception as exc:
        log.warning("start_cycle(operator) failed: %s", exc)
        return _flash_response(request, False, f"could not queue the observe cycle: {_why(exc)}", status_on_error=503)
    do_audit(actor, "observe_now", "agent", "operator pressed Trigger observe cycle now")
    return _flash_response(request, True, "observe cycle queued", topics=("runs-changed",))


@operator_required
def demo_enqueue(request: HtmxHttpRequest) -> HttpResponse:
    """Add N demo proving tasks to the local queue (``fleet.demo.enqueue``)."""
    from fleet import demo

    form = EnqueueForm(request.POST)
    if not form.is_valid():
        return _flash_response(request, False, "; ".join(form.errors.get("n", ["bad input"])), enqueue_form=form)
    n = form.cleaned_data["n"]
    try:
        ids = demo.enqueue(n)
    except Exception as exc:  # harmony database unreadable
        log.warning("demo enqueue failed: %s", exc)
        return _flash_response(request, False, f"could not add tasks: {_why(exc)}", enqueue_form=form, status_on_error=503)
    do_audit(actor_of(request), "demo_enqueue", "harmony_task", "", None, {"n": n, "task_ids": list(ids)[:100]})
    return _flash_response(request, True, f"added {len(ids)} task{'s' if len(ids) != 1 else ''} to the queue", topics=("demand-changed",))


@operator_required
def demo_kill(request: HtmxHttpRequest) -> HttpResponse:
    """SIGKILL one running local worker (``fleet.demo.kill_one_worker``) to watch the agent react."""
    from fleet import demo

    try:
        inst = demo.kill_one_worker()
    except Exception as exc:
        log.warning("demo kill failed: %s", exc)
        return _flash_response(request, False, f"could not kill a worker: {_why(exc)}", status_on_error=503)
    if inst is None:
        return _flash_response(request, False, "no running local worker to kill", status_on_error=409)
    do_audit(actor_of(request), "demo_kill_worker", inst.external_id, "SIGKILL from the console", None, {"pid": inst.pid})
    return _flash_response(request, True, f"sent SIGKILL to worker {inst.label or inst.external_id} (pid {inst.pid})", topics=("fleet-changed",))


# --- health ----------------------------------------------------------------------------------
@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """``/healthz`` (no login): JSON of every check; 200 when all are up, 503 naming what is down."""
    body, status = health.report()
    return JsonResponse(body, status=status)
