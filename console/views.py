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
import json
import logging
import uuid

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.db.models import Count, F, Q, Sum
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseForbidden, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import trigger_client_event
from django_htmx.middleware import HtmxDetails

from agent.actions import (
    LIMIT_RANGES,
    ActionRefused,
    EffectNotRecorded,
    OverrideError,
    baseline_settings,
    do_ack_alert,
    do_audit,
    do_cordon,
    do_operator_instance_action,
    do_post_message,
    do_reset_session,
    do_set_observe_only,
    do_set_target,
    do_update_overrides,
    policy_keys,
)
from agent.approvals import DecisionError, do_decide
from agent.models import Approval, AuditLog, Run, SessionState, Step
from agent.planners.base import without_verdicts
from agent.policy import effective_limits, effective_policy
from console import health
from console.forms import (
    CAPS,
    AckForm,
    DecisionForm,
    EnqueueForm,
    InstanceActionForm,
    MessageForm,
    ObserveOnlyForm,
    ResetForm,
    SettingsForm,
    TargetForm,
    too_long_error,
)
from console.templatetags.console_extras import can_act
from fleet.clock import clock
from fleet.demand.base import DemandError
from fleet.models import BILLABLE_STATUSES, Alert, DemandSample, Diagnosis, Instance
from fleet.providers.base import ProviderError

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
    state = sample.state
    # a good read older than two heartbeats no longer describes the queue: say so
    if state == "ok" and age_s > 2 * settings.WARDEN["OBSERVE_INTERVAL_S"]:
        state = "stale"
    return {"demand": sample, "demand_state": state, "demand_age_s": age_s}


def cards_context() -> dict:
    """Summary cards: target and current proofs/hr, queue, workers, $/hr, instance counts."""
    state = SessionState.get()
    fleet = Instance.objects.filter(killed_at__isnull=True).aggregate(
        live=Count("id"),
        running=Count("id", filter=Q(status="running")),
        dph=Sum("dph", filter=Q(status__in=BILLABLE_STATUSES)),
    )
    ctx = demand_context()
    # starting: inside the startup grace and not heartbeating yet, as the demand read counted them
    # (a worker that heartbeats is live whatever the grace: issue 9 §1.7)
    fleet["starting"] = ((ctx["demand"].detail or {}).get("workers_starting") or 0) if ctx["demand"] is not None else 0
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
        model_today=model_spend_today(),
    )
    return ctx


def model_spend_today() -> dict:
    """The model's spend since 00:00 UTC today (``fleet.clock``): ``{"cost": dollars, "tokens_in",
    "tokens_out", "calls"}`` summed over ``ModelCall`` rows."""
    from agent.models import ModelCall

    start = clock.now().replace(hour=0, minute=0, second=0, microsecond=0)
    agg = ModelCall.objects.filter(created_at__gte=start).aggregate(
        cost=Sum("cost_usd"), tokens_in=Sum("tokens_in"), tokens_out=Sum("tokens_out"), calls=Count("id"))
    return {k: v or 0 for k, v in agg.items()}


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
    """The chat: operator messages of chat runs and each chat run's answer (else its final report), oldest first."""
    epoch = SessionState.get().epoch  # "Reset session" clears the chat: only this epoch's
    msgs = list(
        Step.objects.filter(kind="message", run__trigger="chat", run__epoch=epoch)
        .select_related("run")
        .order_by("-created_at")[:CHAT_ITEMS]
    )
    reports = list(
        Run.objects.filter(trigger="chat", epoch=epoch).exclude(final_report="").order_by("-number")[:CHAT_ITEMS]
    )
    items = [{"kind": "message", "at": s.created_at, "actor": s.actor, "text": s.text, "run": s.run} for s in msgs]
    # the agent's answer (its verdict block parsed, never shown); the runtime's report when the
    # run ended without one (halted, failed)
    items += [
        {"kind": "report", "at": r.ended_at or r.started_at, "actor": "agent", "run": r,
         "text": without_verdicts(r.final_answer, sep=" ", strip=True).strip() or r.final_report}
        for r in reports
    ]
    items.sort(key=lambda item: (item["at"], item["kind"] == "report"))
    return {"chat_items": items[-CHAT_ITEMS:]}


def observe_only_context() -> dict:
    """The observe-only switch's state (the session anchor)."""
    return {"state": SessionState.get()}


def inline_approvals_context() -> dict:
    """Waiting approvals only, for the chat column (the inbox page also lists recent decisions)."""
    return approvals_context(recent=0)


DASHBOARD_REGIONS = {
    "approvals": ("console/partials/approvals.html", inline_approvals_context),
    "observe_only": ("console/partials/observe_only.html", observe_only_context),
    "cards": ("console/partials/cards.html", cards_context),
    "chat": ("console/partials/chat_log.html", chat_context),
    "fleet": ("console/partials/fleet.html", lambda: fleet_context(False)),
    "runs": ("console/partials/runs.html", lambda: runs_context(RUNS_ON_DASHBOARD)),
}


def _page_context(request, **extra) -> dict:
    # the demo's own controls (add tasks, kill a worker) are not offered against a real Curio
    ctx = {"can_act": can_act(request.user), "demo_queue": settings.WARDEN["DEMAND_SOURCE"] == "local"}
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
    ctx.update(inline_approvals_context())
    return render(request, "console/dashboard.html", ctx, status=status)


# --- pages -----------------------------------------------------------------------------------
@login_required
@require_GET
@never_cache
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    """The dashboard; an htmx GET with ``?partial=cards|chat|fleet|runs|approvals|observe_only`` gets
    that region only."""
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
    ctx = _page_context(request, request_key=uuid.uuid4().hex, **fleet_context(request.GET.get("killed") == "1"))
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
    ctx = _page_context(request, run=run, steps=steps, now=now, model_calls=list(run.model_calls.order_by("seq")),
                        would_have=sum(1 for s in steps if s.reason_code == "observe_only"))
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


def _form_errors(form) -> str:
    """A form's errors as one line, each naming its field (``reason is too long: …``)."""
    return "; ".join(e for errs in form.errors.values() for e in errs)


def _why(exc: Exception) -> str:
    """An error for the operator: our own errors by their message, others with their type."""
    if isinstance(exc, (ValueError, DemandError)):
        return str(exc)[:300]
    if _is_broker_error(exc):
        return redis_hint(exc)
    return f"{type(exc).__name__}: {exc}"[:300]


def _is_broker_error(exc: Exception) -> bool:
    import kombu.exceptions
    import redis

    return isinstance(exc, (redis.exceptions.RedisError, kombu.exceptions.OperationalError, ConnectionError))


def redis_hint(exc: Exception) -> str:
    """A Redis failure named by its setting, with what to do."""
    where = "REDIS_URL" if not settings.REDIS_EMBEDDED else "the bundled redis-server (REDIS_URL unset)"
    todo = "start Redis or fix REDIS_URL" if not settings.REDIS_EMBEDDED else "run `make run` (it starts it) or set REDIS_URL"
    return f"Redis unreachable via {where}: {type(exc).__name__}: {str(exc)[:160]} — {todo}; nothing was lost"


@operator_required
def observe_now(request: HtmxHttpRequest) -> HttpResponse:
    """"Trigger observe cycle now": a ``queued`` run and its audit row (``do_queue_cycle``), then an
    ``operator`` cycle enqueued after commit. The queued run is what makes "queued" true: if the
    broker is down, the next heartbeat cycle runs it."""
    from django.db import transaction

    from agent.actions import do_queue_cycle
    from agent.tasks import start_cycle

    actor = actor_of(request)
    try:
        with transaction.atomic():
            run = do_queue_cycle(actor)
    except DatabaseError as exc:
        log.warning("observe now: database error: %s", exc)
        return _flash_response(request, False, f"the database is unavailable ({type(exc).__name__}); nothing was queued",
                               status_on_error=503)
    try:
        start_cycle("operator", actor=actor)
    except Exception as exc:
        log.warning("start_cycle(operator) failed: %s", exc)
        return _flash_response(request, True, f"observe cycle queued as run {run.number}; the task queue is unreachable "
                               f"({_why(exc)}), so the next heartbeat runs it", topics=("runs-changed",))
    return _flash_response(request, True, f"observe cycle queued (run {run.number})", topics=("runs-changed",))


@operator_required
def demo_enqueue(request: HtmxHttpRequest) -> HttpResponse:
    """Add N demo proving tasks to the local queue (``fleet.demo.enqueue``)."""
    from fleet import demo

    form = EnqueueForm(request.POST)
    if not form.is_valid():
        return _flash_response(request, False, "; ".join(form.errors.get("n", ["bad input"])), enqueue_form=form)
    n = form.cleaned_data["n"]
    try:  # the intent first: an effect never happens without its audit row
        row = do_audit(actor_of(request), "demo_enqueue", "harmony_task", "", None, {"n": n, "task_ids": None})
    except DatabaseError as exc:
        log.warning("demo enqueue: database error: %s", exc)
        return _flash_response(request, False, f"the database is unavailable ({type(exc).__name__}); no task was added",
                               enqueue_form=form, status_on_error=503)
    try:
        ids = demo.enqueue(n)
    except Exception as exc:  # harmony database unreadable
        log.warning("demo enqueue failed: %s", exc)
        _record_after(row, {"n": n, "task_ids": [], "error": str(exc)[:300]})
        return _flash_response(request, False, f"could not add tasks: {_why(exc)}", enqueue_form=form, status_on_error=503)
    note = "" if _record_after(row, {"n": n, "task_ids": list(ids)[:100]}) else " (recording their ids in the audit log failed)"
    return _flash_response(request, True, f"added {len(ids)} task{'s' if len(ids) != 1 else ''} to the queue{note}",
                           topics=("demand-changed",))


def _record_after(row: AuditLog, after: dict) -> bool:
    """Write an action's outcome on its intent audit row; False when the database refused."""
    try:
        AuditLog.objects.filter(pk=row.pk).update(after=after)
        return True
    except DatabaseError as exc:
        log.warning("audit row %s: outcome not recorded: %s", row.pk, exc)
        return False


@operator_required
def demo_kill(request: HtmxHttpRequest) -> HttpResponse:
    """SIGKILL one running local worker (``fleet.demo.kill_one_worker``) to watch the agent react."""
    from fleet import demo

    try:  # the intent first: an effect never happens without its audit row
        row = do_audit(actor_of(request), "demo_kill_worker", "", "SIGKILL from the console", None, {"pid": None})
    except DatabaseError as exc:
        log.warning("demo kill: database error: %s", exc)
        return _flash_response(request, False, f"the database is unavailable ({type(exc).__name__}); nothing was killed",
                               status_on_error=503)
    try:
        inst = demo.kill_one_worker()
    except Exception as exc:
        log.warning("demo kill failed: %s", exc)
        _record_after(row, {"pid": None, "error": str(exc)[:300]})
        return _flash_response(request, False, f"could not kill a worker: {_why(exc)}", status_on_error=503)
    if inst is None:
        _record_after(row, {"pid": None, "error": "no running local worker"})
        return _flash_response(request, False, "no running local worker to kill", status_on_error=409)
    try:
        AuditLog.objects.filter(pk=row.pk).update(target=inst.external_id, after={"pid": inst.pid})
    except DatabaseError as exc:
        log.warning("audit row %s: outcome not recorded: %s", row.pk, exc)
    return _flash_response(request, True, f"sent SIGKILL to worker {inst.external_id} (pid {inst.pid})", topics=("fleet-changed",))


# --- health ----------------------------------------------------------------------------------
@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """``/healthz`` (no login): JSON of every check; 200 when all are up, 503 naming what is down."""
    body, status = health.report()
    return JsonResponse(body, status=status)


# --- approvals inbox ---------------------------------------------------------------------------
APPROVALS_RECENT = 30


def approvals_context(recent: int = APPROVALS_RECENT) -> dict:
    """Waiting approvals (soonest expiry first) and the newest decided ones: two queries.

    A waiting row past its expiry is shown as expired (the loop marks it ``expired`` on its next
    cycle; ``do_decide`` already refuses it).
    """
    now = clock.now()
    waiting = list(
        Approval.objects.filter(status="waiting").select_related("run", "step", "decided_by").order_by("expires_at", "pk")
    )
    for a in waiting:
        a.seconds_left = (a.expires_at - now).total_seconds()
    attach_situation_now(waiting)
    decided = []
    if recent:
        decided = list(
            Approval.objects.exclude(status="waiting").select_related("run", "step", "decided_by")
            .order_by(F("decided_at").desc(nulls_last=True), "-pk")[:recent]
        )
    return {"waiting": waiting, "decided": decided, "now": now}


def attach_situation_now(approvals: list) -> None:
    """Set ``a.now`` on each approval: the situation now, in the shape of ``a.situation`` (the one
    when it was parked, ``agent.pipeline.situation``), so a card shows then and now side by side
    (issue 9 §1.4). Two queries whatever the number of approvals."""
    if not approvals:
        return
    sample = DemandSample.objects.order_by("-taken_at").first()
    ids = {str((a.args or {}).get("instance_id")) for a in approvals if (a.args or {}).get("instance_id")}
    rows = {}
    for inst in Instance.objects.filter(external_id__in=ids).order_by("killed_at"):
        rows.setdefault(inst.external_id, inst)
    for a in approvals:
        ident = (a.args or {}).get("instance_id")
        target = None
        if ident:
            inst = rows.get(str(ident))
            target = {"id": ident, "status": "absent" if inst is None else ("gone" if inst.killed_at else inst.status)}
        a.now = {"demand": sample.state if sample else "unknown", "queued": sample.queued if sample else None,
                 "workers_live": sample.workers_live if sample else None,
                 "workers_expected": sample.workers_expected if sample else None, "target": target}


def _safe_next(request, default: str) -> str:
    """The ``next`` URL when it is ours and no longer than ``CAPS["next"]``, else ``default``."""
    nxt = request.POST.get("next") or request.GET.get("next") or ""
    if nxt and len(nxt) <= CAPS["next"] and url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()}):
        return nxt
    return default


@login_required
@require_GET
@never_cache
def approvals_page(request: HtmxHttpRequest) -> HttpResponse:
    """The approvals inbox: waiting calls with approve / reject-with-comment and their expiry,
    then recent decisions. htmx GET: the inbox region only."""
    ctx = _page_context(request, **approvals_context())
    if _is_region(request):
        return render(request, "console/partials/approvals.html", ctx)
    return render(request, "console/approvals.html", ctx)


@operator_required
def decide_approval(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Approve or reject one parked call (``do_decide``), then enqueue the run's resume.

    Exactly once: ``do_decide`` is a conditional UPDATE, so a double click, a second operator or a
    replayed POST gets 409 naming who decided first, and only the winner enqueues the resume.
    A rejection without a comment is 400. htmx gets the approval's card (status 200, message in
    it); a browser a redirect to ``next`` (or the inbox) or the inbox with the error.
    """
    from agent.tasks import start_resume

    approval = get_object_or_404(Approval.objects.select_related("run", "step"), pk=pk)
    form = DecisionForm(request.POST)
    error, status, note = "", 200, ""
    if not form.is_valid():
        error, status = "; ".join(e for errs in form.errors.values() for e in errs), 400
    else:
        try:
            approval = do_decide(approval, form.cleaned_data["decision"], actor_of(request),
                                 form.cleaned_data["comment"], user=request.user)
        except DecisionError as exc:
            error, status = str(exc), 409
            approval.refresh_from_db()
        else:
            try:
                start_resume(approval.run_id)
                note = f"{approval.status}; the agent resumes run #{approval.run.number}"
            except Exception as exc:  # broker down: the decision is stored, the resume is not queued
                log.warning("start_resume(%s) failed: %s", approval.run_id, exc)
                note = f"{approval.status}, but the agent could not be resumed: {_why(exc)}"
    if request.htmx:
        now = clock.now()
        approval.seconds_left = (approval.expires_at - now).total_seconds()
        attach_situation_now([approval])
        resp = render(request, "console/partials/approval_card.html",
                      _page_context(request, a=approval, error=error, note=note, now=now))
        trigger_client_event(resp, "approvals-changed")
        return resp
    if status == 200:
        messages.success(request, f"approval {approval.pk}: {note}")
        return redirect(_safe_next(request, "/approvals/"))
    ctx = _page_context(request, error=error, **approvals_context())
    return render(request, "console/approvals.html", ctx, status=status)


# --- alerts tab --------------------------------------------------------------------------------
ALERT_STATES = ("firing", "acknowledged", "resolved")
ALERTS_ON_PAGE = 200


def alerts_context(state: str) -> dict:
    """Alerts in ``state`` (``all`` for every state), newest first, with a count per state."""
    counts = dict.fromkeys(ALERT_STATES, 0)
    counts.update(dict(Alert.objects.values_list("state").annotate(n=Count("id")).order_by()))
    qs = Alert.objects.select_related("instance").order_by("-raised_at", "-pk")
    if state in ALERT_STATES:
        qs = qs.filter(state=state)
    return {"alerts": list(qs[:ALERTS_ON_PAGE]), "state": state, "counts": counts,
            "states": ALERT_STATES, "firing_count": counts["firing"]}


def _alert_state(request) -> str:
    state = request.GET.get("state", "firing")
    return state if state in (*ALERT_STATES, "all") else "firing"


@login_required
@require_GET
@never_cache
def alerts_page(request: HtmxHttpRequest) -> HttpResponse:
    """The Alerts tab: ``?state=firing|acknowledged|resolved|all`` (default firing); operators
    acknowledge firing alerts with a comment. htmx GET: the table only."""
    ctx = _page_context(request, **alerts_context(_alert_state(request)))
    if _is_region(request):
        return render(request, "console/partials/alerts.html", ctx)
    return render(request, "console/alerts.html", ctx)


@operator_required
def ack_alert(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Acknowledge one firing alert with a comment (``do_ack_alert``). Already acknowledged or
    resolved: 409; no comment: 400. htmx gets the refreshed table; a browser a redirect."""
    alert = get_object_or_404(Alert, pk=pk)
    form = AckForm(request.POST)
    error, status = "", 200
    if not form.is_valid():
        error, status = "; ".join(form.errors["comment"]), 400
    else:
        try:
            do_ack_alert(alert, actor_of(request), form.cleaned_data["comment"])
        except ValueError as exc:
            error, status = str(exc), 409
    state = _alert_state(request) if request.GET.get("state") else request.POST.get("state", "firing")
    state = state if state in (*ALERT_STATES, "all") else "firing"
    if request.htmx:
        resp = render(request, "console/partials/alerts.html",
                      _page_context(request, error=error, error_pk=pk, **alerts_context(state)))
        trigger_client_event(resp, "alerts-changed")
        return resp
    if status == 200:
        messages.success(request, f"alert {pk} acknowledged")
        return redirect(f"/alerts/?state={state}")
    return render(request, "console/alerts.html",
                  _page_context(request, error=error, error_pk=pk, **alerts_context(state)), status=status)


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
    return {"rows": list(qs[:limit]), "f_actor": actor, "f_verb": verb, "f_target": target, "limit": limit}


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


# --- instance page and operator actions on instances ------------------------------------------
DIAGNOSES_ON_PAGE = 20
EVENTS_ON_PAGE = 100


def _instance(external_id: str) -> Instance:
    """The instance with ``external_id`` (a live one before a killed one); 404 when none."""
    inst = (Instance.objects.filter(external_id=external_id)
            .order_by(F("killed_at").desc(nulls_first=True), "-created_at").first())
    if inst is None:
        raise Http404(f"no instance {external_id}")
    return inst


def instance_context(inst: Instance) -> dict:
    """One instance: its diagnoses, its events (audit rows targeting it) and its alerts."""
    return {
        "inst": inst,
        "diagnoses": list(Diagnosis.objects.filter(instance=inst).order_by("-taken_at")[:DIAGNOSES_ON_PAGE]),
        "events": list(AuditLog.objects.filter(target=inst.external_id).order_by("-at", "-id")[:EVENTS_ON_PAGE]),
        "inst_alerts": list(Alert.objects.filter(instance=inst).order_by("-raised_at")[:50]),
    }


@login_required
@require_GET
@never_cache
def instance_page(request: HtmxHttpRequest, external_id: str) -> HttpResponse:
    """An instance: facts, stop/destroy/reboot/resume/cordon buttons, diagnoses and events.
    htmx GET: the detail region only."""
    inst = _instance(external_id)
    ctx = _page_context(request, request_key=uuid.uuid4().hex, **instance_context(inst))
    if _is_region(request):
        return render(request, "console/partials/instance.html", ctx)
    return render(request, "console/instance.html", ctx)


def run_instance_action(inst: Instance, action: str, *, actor: str, reason: str, override_reason: str = "",
                        request_key: str = "") -> tuple[int, str, str]:
    """Run one operator action on ``inst``; returns ``(http_status, code, detail)``.

    stop/destroy/reboot/resume go through ``do_operator_instance_action`` (the agent's guards;
    ``override_reason`` passes demand_guard/hold_off, audited; ``request_key`` makes a replay a
    ``duplicate``); cordon/uncordon through ``do_cordon``. 200 ``ok``; refusals 428
    (diagnosis_required) or 409 with their reason code; 400 bad input; 502 provider failure.
    """
    if inst.killed_at is not None:
        return 409, "killed", f"{inst.external_id} is already gone ({inst.kill_reason or 'killed'})"
    try:
        if action in ("cordon", "uncordon"):
            n = do_cordon(inst, action == "cordon", actor=actor, reason=reason)
            if n == 0:
                return 200, "ok", (f"{action} of {inst.external_id} recorded; its worker has not registered with the queue yet"
                                   + (" and is cordoned when it does" if action == "cordon" else ""))
            return 200, "ok", f"{action}ed {inst.external_id}"
        do_operator_instance_action(inst, action, actor=actor, reason=reason, override_reason=override_reason,
                                    request_key=request_key)
    except ActionRefused as exc:
        return exc.status, exc.code, exc.detail
    except ProviderError as exc:
        if exc.code == "outcome_unknown":
            return 502, "outcome_unknown", _why(exc)
        return 502, "provider_error", _why(exc)
    except DemandError as exc:  # Curio's database refused the cordon (e.g. a read-only role): says which grant
        return 503, "harmony_error", _why(exc)
    except ValueError as exc:
        return 400, "invalid", str(exc)
    except EffectNotRecorded as exc:
        # the effect happened (or was recorded and will be re-applied): never an error page that hides it
        log.warning("%s of %s: %s", action, inst.external_id, exc)
        return (200, "ok", str(exc)) if exc.applied else (503, "not_applied", str(exc))
    except DatabaseError as exc:
        # raised before the intent was recorded (actions write it first): nothing was done
        log.warning("%s of %s: database error: %s", action, inst.external_id, exc)
        return 503, "database_unavailable", (f"the database is unavailable ({type(exc).__name__}: {str(exc)[:120]}); "
                                             "nothing was done; retry when it answers")
    return 200, "ok", f"{action} of {inst.external_id} sent"


@operator_required
def instance_action(request: HtmxHttpRequest, external_id: str) -> HttpResponse:
    """The fleet and instance pages' action form (HTML): action, reason, optional override reason,
    and the form's one-time ``request_key``. htmx gets the form back with the outcome (a fresh
    token on success); a browser a redirect on success or the instance page with the refusal,
    answered with the refusal's status (428 for diagnosis_required, 409 otherwise)."""
    inst = _instance(external_id)
    form = InstanceActionForm(request.POST)
    if form.is_valid():
        d = form.cleaned_data
        status, code, detail = run_instance_action(inst, d["action"], actor=actor_of(request), reason=d["reason"],
                                                   override_reason=d["override_reason"], request_key=d["request_key"])
    else:
        status, code, detail = 400, "invalid", _form_errors(form)
    result = {"ok": status == 200, "code": code, "detail": detail, "status": status}
    if request.htmx:
        inst.refresh_from_db()
        resp = render(request, "console/partials/instance_actions.html",
                      _page_context(request, inst=inst, result=result, request_key=uuid.uuid4().hex,
                                    form_values=None if status == 200 else request.POST))
        if status == 200:
            trigger_client_event(resp, "fleet-changed")
        trigger_client_event(resp, "actions-changed")
        return resp
    if status == 200:
        messages.success(request, detail)
        return redirect(_safe_next(request, f"/instances/{inst.external_id}/"))
    ctx = _page_context(request, request_key=uuid.uuid4().hex, result=result, form_values=request.POST,
                        **instance_context(inst))
    return render(request, "console/instance.html", ctx, status=status)


def _json_error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"ok": False, "code": code, "detail": detail}, status=status)


@require_POST
def api_instance_action(request: HttpRequest, external_id: str, action: str) -> JsonResponse:
    """``POST /api/instances/<external_id>/<action>/`` with JSON ``{"reason", "override_reason"?,
    "request_key"?}`` (session auth + CSRF header). Answers 200 ``{"ok": true}``, or
    ``{"ok": false, "code", "detail"}`` with 428 (diagnosis_required), 409 (other refusals),
    400 (bad input), 401 (not signed in), 403 (viewer), 404 (no instance), 502 (provider)."""
    if not request.user.is_authenticated:
        return _json_error(401, "unauthenticated", "sign in first")
    if not can_act(request.user):
        return _json_error(403, "forbidden", "viewers cannot act")
    if action not in InstanceActionForm.ACTIONS:
        return _json_error(404, "unknown_action", f"unknown action {action!r}; use one of {', '.join(InstanceActionForm.ACTIONS)}")
    try:
        raw = request.body
    except RequestDataTooBig:
        raw = None
    if raw is None or len(raw) > CAPS["json_body"]:
        return _json_error(413, "too_large", f"the body is too large: at most {CAPS['json_body']:,} bytes")
    try:
        body = json.loads(raw or b"{}")
    except RecursionError:  # brackets nested past the parser's depth (about 1,000)
        return _json_error(400, "invalid", "the body's JSON nests too deeply; send one flat object, e.g. {\"reason\": \"wedged\"}")
    except ValueError:
        return _json_error(400, "invalid", "the body must be JSON, e.g. {\"reason\": \"wedged\"}")
    if not isinstance(body, dict):
        return _json_error(400, "invalid", "the body must be a JSON object")
    fields = {k: body.get(k, "") for k in ("reason", "override_reason", "request_key")}
    if not all(isinstance(v, str) for v in fields.values()):
        return _json_error(400, "invalid", "reason, override_reason and request_key must be strings")
    for name, value in fields.items():
        if error := too_long_error(name, value):
            return _json_error(400, "too_long", error)
    try:
        inst = _instance(external_id)
        status, code, detail = run_instance_action(inst, action, actor=actor_of(request), **fields)
    except Http404:
        return _json_error(404, "not_found", f"no instance {external_id}")
    except Exception as exc:  # noqa: BLE001 — the JSON API answers JSON, never an HTML 500
        log.exception("api %s %s failed", action, external_id)
        return _json_error(500, "internal_error", f"{type(exc).__name__}: {str(exc)[:200]}; see the Actions page before retrying")
    if status == 200:
        return JsonResponse({"ok": True, "detail": detail})
    return _json_error(status, code, detail)


# --- observe-only switch, reset session ---------------------------------------------------------
@operator_required
def set_observe_only(request: HtmxHttpRequest) -> HttpResponse:
    """The observe-only switch (``do_set_observe_only``): ``on=1`` stops every side effect; the agent
    still observes and proposes, its calls shown as "would have done". htmx: the switch partial."""
    form = ObserveOnlyForm(request.POST)
    if not form.is_valid():  # both fields are optional (a missing ``on`` means off); a reason may be too long
        return _flash_response(request, False, _form_errors(form))
    on = bool(form.cleaned_data.get("on"))
    state = do_set_observe_only(on, actor_of(request), form.cleaned_data.get("reason", ""))
    if request.htmx:
        resp = render(request, "console/partials/observe_only.html", _page_context(request, state=state))
        trigger_client_event(resp, "settings-changed")
        return resp
    messages.success(request, f"observe-only {'on: nothing executes' if on else 'off'}")
    return redirect(_safe_next(request, "/"))


@operator_required
def reset_session(request: HtmxHttpRequest) -> HttpResponse:
    """"Reset session" (``do_reset_session``, confirmed in the browser): clears the conversation;
    runs stay on the Runs pages, run numbers keep counting, objectives and memory stay."""
    form = ResetForm(request.POST)
    if not form.is_valid():
        return _flash_response(request, False, _form_errors(form))
    state = do_reset_session(actor_of(request), form.cleaned_data.get("reason", "") or "operator pressed Reset session")
    return _flash_response(request, True, f"session reset: conversation epoch {state.epoch}",
                           topics=("runs-changed", "chat-changed"))


# --- settings page ------------------------------------------------------------------------------
def _settings_form(state: SessionState, data=None) -> SettingsForm:
    table = effective_policy(state)
    overrides = (state.overrides or {}).get("policy", {})
    policy = {}
    inherit = []
    for key in policy_keys():
        if key in table:
            policy[key] = table[key]
        else:  # launch_instance:P1..P3 follow launch_instance unless overridden
            inherit.append(key)
            policy[key] = overrides.get(key, "")
    limits = effective_limits(state).values
    return SettingsForm(data, policy=policy, limits={k: limits.get(k) for k in LIMIT_RANGES}, inherit_keys=inherit)


def settings_context(state: SessionState, form: SettingsForm) -> dict:
    """The settings form with, per field, its default and whether an override is in force."""
    base_policy, base_limits = baseline_settings(state)
    ov = state.overrides or {}
    rows_policy = [
        {"key": key, "field": form[name], "default": base_policy.get(key, "same as launch_instance"),
         "overridden": key in ov.get("policy", {})}
        for key, name in form.policy_fields
    ]
    rows_limits = [
        {"key": key, "field": form[name], "default": base_limits.get(key), "overridden": key in ov.get("limits", {}),
         "range": LIMIT_RANGES[key]}
        for key, name in form.limit_fields
    ]
    return {"form": form, "rows_policy": rows_policy, "rows_limits": rows_limits, "state": state,
            "unattended": bool(settings.WARDEN.get("UNATTENDED"))}


@login_required
@require_http_methods(["GET", "POST"])
@never_cache
def settings_page(request: HtmxHttpRequest) -> HttpResponse:
    """Policies (auto / approval / forbidden per tool and launch priority), caps, dwell, hold-off,
    diagnosis freshness, approval expiry and breaker limits. POST (operators) saves through
    ``do_update_overrides``: audited with who and why; bad input names the field, saves nothing
    (400)."""
    state = SessionState.get()
    saved = False
    status = 200
    if request.method == "POST":
        if not can_act(request.user):
            return HttpResponseForbidden("viewers cannot act")
        form = _settings_form(state, request.POST)
        if form.is_valid():
            policy, limits = form.overrides()
            try:
                state = do_update_overrides(policy, limits, actor_of(request), form.cleaned_data["reason"])
                saved = True
            except OverrideError as exc:
                name = form.field_name(exc.field)
                form.add_error(name, f"{exc.field}: {exc.message}" if name is None else exc.message)
        if saved:
            if not request.htmx:
                messages.success(request, "settings saved")
                return redirect("settings")
            form = _settings_form(state)
        else:
            status = 400
    else:
        form = _settings_form(state)
    ctx = _page_context(request, saved=saved, **settings_context(state, form))
    if request.htmx:
        resp = render(request, "console/partials/settings_form.html", ctx, status=200 if request.method == "POST" else status)
        if saved:
            trigger_client_event(resp, "settings-changed")
        return resp
    return render(request, "console/settings.html", ctx, status=status)
