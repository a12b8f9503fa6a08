"""The dashboard: its live regions, the chat, the target and the demo buttons."""

import logging
import uuid
from datetime import datetime

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import DatabaseError, transaction
from django.db.models import Count, Q, Sum
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django_htmx.http import trigger_client_event

from agent.actions.runs import do_post_message, do_queue_cycle
from agent.actions.session import do_set_target
from agent.chat.verdicts import without_verdicts
from agent.models import ModelCall, Run, SessionState, Step
from agent.policy.capacity import retire_budget
from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import World
from agent.tasks import start_cycle
from console.forms import (
    EnqueueForm,
    MessageForm,
    TargetForm,
)
from console.views.approvals import approvals_context
from console.views.common import (
    HtmxHttpRequest,
    _is_region,
    _page_context,
    _record_after,
    _why,
    actor_of,
    operator_required,
)
from console.views.fleet import FLEET_ON_DASHBOARD, fleet_context
from console.views.runs import runs_context
from fleet import demo
from fleet.audit import do_audit
from fleet.clock import clock
from fleet.demand.base import DemandReading
from fleet.models import BILLABLE_STATUSES, PENDING_STATUSES, AuditLog, DemandSample, Instance

log = logging.getLogger(__name__)


RUNS_ON_DASHBOARD = 20


CHAT_ITEMS = 50


# --- region contexts (each a constant number of queries, whatever the fleet size) -------------
def demand_context() -> dict:
    """The newest demand sample and its age; ``demand_state`` is ``unknown`` when there is none."""
    sample = DemandSample.objects.order_by("-taken_at").first()
    if sample is None:
        return {"demand": None, "demand_state": "unknown", "demand_age_s": None}
    age_s = (clock.now() - sample.taken_at).total_seconds()
    state = sample.state
    # a good read older than two heartbeats no longer describes the queue: say so; unless the run
    # that read it is still at work (a model's turns can outlast a heartbeat while it holds the
    # lock): then it is stale only past that run's wall clock too
    limit = 2 * settings.WARDEN["OBSERVE_INTERVAL_S"]
    if state == "ok" and age_s > limit:
        running = Run.objects.filter(status="running").values_list("started_at", flat=True).first()
        if running is not None and sample.taken_at >= running:
            limit += effective_limits().wall_clock_s
    if state == "ok" and age_s > limit:
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
    # (a worker that heartbeats is live whatever the grace)
    fleet["starting"] = ((ctx["demand"].detail or {}).get("workers_starting") or 0) if ctx["demand"] is not None else 0
    # the denominator operators read: the instances we intend to be running (not being destroyed),
    # whether or not their worker is up; the demand read's ``workers_expected`` (running ones past
    # their grace) stays what the guards read and is shown in the card's title
    intended = list(Instance.objects.filter(killed_at__isnull=True, intended_status="running",
                                            destroy_requested_at__isnull=True)
                    .values_list("external_id", "status", "created_at"))
    # launched after the last read (a run reads, then launches): that read cannot have seen their
    # worker, so they are starting until the next read, never dead
    if ctx["demand"] is not None:
        fleet["starting"] += sum(1 for _, _, made in intended if made > ctx["demand"].taken_at)
    intended = [(ext, status) for ext, status, _ in intended]
    fleet["intended"] = len(intended)
    fleet["down"] = [(ext, status) for ext, status in intended if status != "running" and status not in PENDING_STATUSES]
    if ctx["demand"] is not None and ctx["demand_state"] != "unknown":
        d = ctx["demand"]
        # an exited instance's worker is not live, whatever heartbeat the last read still saw
        fleet["live_workers"] = min(d.workers_live or 0, len(intended) - len(fleet["down"])) \
            if d.workers_live is not None else None
        fleet["dead"] = max(d.workers_dead or 0, len(fleet["down"]),
                            len(intended) - (d.workers_live or 0) - (d.workers_cordoned or 0) - fleet["starting"]
                            - sum(1 for _, st in intended if st in PENDING_STATUSES))
    ok = ctx["demand_state"] == "ok"
    ctx.update(
        state=state,
        target=state.target_proofs_hr,
        fleet=fleet,
        dph=fleet["dph"] or 0.0,
        # counts of a demand read that failed are unknown, never zero (invariant 7)
        counts_known=ctx["demand"] is not None and ctx["demand_state"] != "unknown",
        counts_stale=not ok and ctx["demand"] is not None and ctx["demand_state"] != "unknown",
        backlog_next_due=_next_due(ctx["demand"]),
        last_run=Run.objects.order_by("-number").only("number", "status", "started_at", "trigger").first(),
        model_today=model_spend_today(),
        retire_budget=retire_budget_context(ctx["demand"]),
    )
    return ctx


def _next_due(sample):
    """When the first SDR sector not due yet becomes due (aware datetime), from the sample's
    ``detail["backlog_next_due_at"]`` (``agent.runtime.observe.backlog_view``); None when none waits."""
    raw = ((sample.detail or {}) if sample is not None else {}).get("backlog_next_due_at")
    try:
        return datetime.fromisoformat(raw) if raw else None
    except (TypeError, ValueError):
        return None


def retire_budget_context(sample):
    """The scale-down budget's state for the dashboard ("2 of 2 retirements left in this window"),
    from the records (``agent.policy.capacity.recorded_world``), or None when demand was never read."""
    if sample is None:
        return None
    return retire_budget(recorded_world(sample))


def model_spend_today() -> dict:
    """The model's spend since 00:00 UTC today (``fleet.clock``): ``{"cost": dollars, "tokens_in",
    "tokens_out", "calls"}`` summed over ``ModelCall`` rows."""
    start = clock.now().replace(hour=0, minute=0, second=0, microsecond=0)
    agg = ModelCall.objects.filter(created_at__gte=start).aggregate(
        cost=Sum("cost_usd"), tokens_in=Sum("tokens_in"), tokens_out=Sum("tokens_out"), calls=Count("id")
    )
    return {k: v or 0 for k, v in agg.items()}


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
        {
            "kind": "report",
            "at": r.ended_at or r.started_at,
            "actor": "agent",
            "run": r,
            "text": without_verdicts(r.final_answer, sep=" ", strip=True).strip() or r.final_report,
        }
        for r in reports
    ]
    # a chat run still being planned: what it said and called so far (the page adds what streams)
    answered = {item["run"].pk for item in items if item["kind"] == "report"}
    live = [m["run"] for m in items if m["kind"] == "message" and m["run"].status == "running"
            and m["run"].pk not in answered]
    items += [{"kind": "live", "at": r.started_at or clock.now(), "actor": "agent", "run": r, "text": ""} for r in live]
    shown = {item["run"].pk: item for item in items if item["kind"] != "message"}
    for item in shown.values():
        item["calls"], item["trace"], item["turns"] = [], [], -1
    for s in (Step.objects.filter(run_id__in=list(shown), kind__in=["call", "text"]).exclude(actor="system")
              .only("run_id", "seq", "turn", "kind", "actor", "tool", "args", "outcome", "reason_code", "detail", "text")
              .order_by("run_id", "seq")):
        item = shown[s.run_id]
        if s.turn is not None:
            item["turns"] = max(item["turns"], s.turn)
        if s.kind == "call":
            item["calls"].append(s)
            item["trace"].append(s)
        elif item["kind"] == "live":
            s.said = without_verdicts(s.text, sep=" ", strip=True).strip()
            item["trace"].append(s)
    items.sort(key=lambda item: (item["at"], item["kind"] != "message"))
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
    "fleet": ("console/partials/fleet.html", lambda: fleet_context(False, per_page=FLEET_ON_DASHBOARD, compact=True)),
    "runs": ("console/partials/runs.html", lambda: runs_context(RUNS_ON_DASHBOARD, hide_quiet=True)),
}


def _dashboard_page(request, status: int = 200, **forms) -> HttpResponse:
    ctx = _page_context(
        request,
        target_form=forms.get("target_form") or TargetForm(initial={"target": SessionState.get().target_proofs_hr}),
        message_form=forms.get("message_form") or MessageForm(),
        enqueue_form=forms.get("enqueue_form") or EnqueueForm(),
        flash=forms.get("flash"),
        dashboard=True,
        request_key=uuid.uuid4().hex,
    )
    ctx.update(cards_context())
    ctx.update(chat_context())
    ctx.update(fleet_context(False, per_page=FLEET_ON_DASHBOARD, compact=True))
    ctx.update(runs_context(RUNS_ON_DASHBOARD, hide_quiet=request.GET.get("quiet") != "1"))
    ctx.update(inline_approvals_context())
    return render(request, "console/dashboard.html", ctx, status=status)


# --- pages -----------------------------------------------------------------------------------


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


@login_required
@require_GET
@never_cache
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    """The dashboard; an htmx GET with ``?partial=cards|chat|fleet|runs|approvals|observe_only`` gets
    that region only. Quiet runs (no-op heartbeats) are hidden with a count; ``?quiet=1`` shows them."""
    name = request.GET.get("partial", "")
    if _is_region(request) and name in DASHBOARD_REGIONS:
        template, build = DASHBOARD_REGIONS[name]
        built = build()
        if name == "runs" and request.GET.get("quiet") == "1":  # "show" quiet runs: the region keeps it
            built = runs_context(RUNS_ON_DASHBOARD)
        # request_key: the fleet rows' action forms carry a one-time token (a replayed POST is a duplicate)
        return render(request, template, _page_context(request, request_key=uuid.uuid4().hex, **built))
    return _dashboard_page(request)


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
        resp = render(
            request, "console/partials/target_form.html", _page_context(request, target_form=form, saved=saved)
        )
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
                form.add_error(None, f"message saved, but the agent could not be started: {_why(exc)}; "
                               "it waits as a queued run, which the next cycle answers")
    if request.htmx:
        if sent:
            form = MessageForm()
        resp = render(request, "console/partials/chat_form.html", _page_context(request, message_form=form, sent=sent))
        trigger_client_event(resp, "chat-changed")
        return resp
    if sent:
        return redirect("dashboard")
    return _dashboard_page(request, status=400, message_form=form)


@operator_required
def observe_now(request: HtmxHttpRequest) -> HttpResponse:
    """ "Trigger observe cycle now": a ``queued`` run and its audit row (``do_queue_cycle``), then an
    ``operator`` cycle enqueued after commit. The queued run is what makes "queued" true: if the
    broker is down, the next heartbeat cycle runs it."""
    actor = actor_of(request)
    try:
        with transaction.atomic():
            run = do_queue_cycle(actor)
    except DatabaseError as exc:
        log.warning("observe now: database error: %s", exc)
        return _flash_response(
            request,
            False,
            f"the database is unavailable ({type(exc).__name__}); nothing was queued",
            status_on_error=503,
        )
    try:
        start_cycle("operator", actor=actor)
    except Exception as exc:
        log.warning("start_cycle(operator) failed: %s", exc)
        return _flash_response(
            request,
            True,
            f"observe cycle queued as run {run.number}; the task queue is unreachable "
            f"({_why(exc)}), so the next heartbeat runs it",
            topics=("runs-changed",),
        )
    return _flash_response(request, True, f"observe cycle queued (run {run.number})", topics=("runs-changed",))


@operator_required
def demo_enqueue(request: HtmxHttpRequest) -> HttpResponse:
    """Add N demo proving tasks to the local queue (``fleet.demo.enqueue``)."""
    form = EnqueueForm(request.POST)
    if not form.is_valid():
        return _flash_response(request, False, "; ".join(form.errors.get("n", ["bad input"])), enqueue_form=form)
    n = form.cleaned_data["n"]
    try:  # the intent first: an effect never happens without its audit row
        row = do_audit(actor_of(request), "demo_enqueue", "harmony_task", "", None, {"n": n, "task_ids": None})
    except DatabaseError as exc:
        log.warning("demo enqueue: database error: %s", exc)
        return _flash_response(
            request,
            False,
            f"the database is unavailable ({type(exc).__name__}); no task was added",
            enqueue_form=form,
            status_on_error=503,
        )
    try:
        ids = demo.enqueue(n)
    except Exception as exc:  # harmony database unreadable
        log.warning("demo enqueue failed: %s", exc)
        _record_after(row, {"n": n, "task_ids": [], "error": str(exc)[:300]})
        return _flash_response(
            request, False, f"could not add tasks: {_why(exc)}", enqueue_form=form, status_on_error=503
        )
    note = (
        ""
        if _record_after(row, {"n": n, "task_ids": list(ids)[:100]})
        else " (recording their ids in the audit log failed)"
    )
    return _flash_response(
        request,
        True,
        f"added {len(ids)} task{'s' if len(ids) != 1 else ''} to the queue{note}",
        topics=("demand-changed",),
    )


@operator_required
def demo_kill(request: HtmxHttpRequest) -> HttpResponse:
    """SIGKILL one running local worker (``fleet.demo.kill_one_worker``) to watch the agent react."""
    try:  # the intent first: an effect never happens without its audit row
        row = do_audit(actor_of(request), "demo_kill_worker", "", "SIGKILL from the console", None, {"pid": None})
    except DatabaseError as exc:
        log.warning("demo kill: database error: %s", exc)
        return _flash_response(
            request,
            False,
            f"the database is unavailable ({type(exc).__name__}); nothing was killed",
            status_on_error=503,
        )
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
    return _flash_response(
        request, True, f"sent SIGKILL to worker {inst.external_id} (pid {inst.pid})", topics=("fleet-changed",)
    )


def recorded_world(sample=None):
    """A world from the records alone, for pages that must not read the provider or the demand
    source: the instances not killed and the newest ``DemandSample`` (``sample``), whose totals
    stand in for per-worker views (``agent.policy.capacity.capacity`` counts running instances live up to its
    ``workers_live``). Returns an ``agent.runtime.observe.World``."""
    sample = sample if sample is not None else DemandSample.objects.order_by("-taken_at").first()
    if sample is None:
        reading = DemandReading.unknown("no demand sample yet")
    else:
        reading = DemandReading(state=sample.state, queued=sample.queued, running=sample.running,
                                workers_expected=sample.workers_expected, workers_live=sample.workers_live,
                                workers_dead=sample.workers_dead, backlog=sample.backlog, proof_s=sample.proof_s,
                                idle_since=sample.idle_since, taken_at=sample.taken_at)
    return World(list(Instance.objects.filter(killed_at__isnull=True)), reading, effective_limits(), effective_policy())
