"""The alerts page: acknowledge with a comment (one or many), silence for a time, end a silence."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django_htmx.http import trigger_client_event

from agent.actions.alerts import SILENCE_CHOICES, do_ack_alert, do_ack_alerts, do_silence_alert, do_unsilence_alert
from console.forms import (
    AckForm,
    SilenceForm,
)
from console.views.common import HtmxHttpRequest, _is_region, _page_context, actor_of, operator_required
from fleet.alerts import ENDS
from fleet.clock import clock
from fleet.models import Alert

# --- alerts tab --------------------------------------------------------------------------------
ALERT_STATES = ("firing", "acknowledged", "resolved")
#: the chips: ``silenced`` is an open alert under a silence (it is not counted as firing meanwhile)
ALERT_FILTERS = ("firing", "silenced", "acknowledged", "resolved")


ALERTS_ON_PAGE = 200


SEVERITIES = ("P0", "P1", "P2", "P3")


def alerts_context(state: str, severity: str = "") -> dict:
    """Alerts in ``state`` (``all`` for every state) and of ``severity`` (P0–P3; empty: any),
    newest first, with a count per chip.

    ``firing`` leaves out silenced alerts (they show under ``silenced`` until the silence ends)."""
    now = clock.now()
    silenced = Q(silenced_until__gt=now) & ~Q(state="resolved")
    base = Alert.objects.filter(severity=severity) if severity in SEVERITIES else Alert.objects.all()
    counts = dict.fromkeys(ALERT_FILTERS, 0)
    counts.update(base.aggregate(
        firing=Count("id", filter=Q(state="firing") & ~silenced),
        silenced=Count("id", filter=silenced),
        acknowledged=Count("id", filter=Q(state="acknowledged")),
        resolved=Count("id", filter=Q(state="resolved")),
    ))
    qs = base.select_related("instance").order_by("-raised_at", "-pk")
    if state == "firing":
        qs = qs.filter(state="firing").exclude(silenced)
    elif state == "silenced":
        qs = qs.filter(silenced)
    elif state in ALERT_STATES:
        qs = qs.filter(state=state)
    alerts = list(qs[:ALERTS_ON_PAGE])
    for al in alerts:
        al.silenced_now = al.is_silenced(now)
        al.ends = ENDS.get(al.kind, "")
    return {
        "alerts": alerts,
        "state": state,
        "counts": counts,
        "states": ALERT_FILTERS,
        "firing_count": counts["firing"],
        "silence_choices": [(m, _duration(m)) for m in SILENCE_CHOICES],
        "bulk_ackable": any(al.state == "firing" for al in alerts),
        "severity": severity if severity in SEVERITIES else "",
        "severities": SEVERITIES,
    }


def _duration(minutes: int) -> str:
    return f"{minutes // 60} h" if minutes >= 60 else f"{minutes} min"


def _alert_state(request) -> str:
    state = request.GET.get("state", "firing")
    return state if state in (*ALERT_FILTERS, "all") else "firing"


@login_required
@require_GET
@never_cache
def alerts_page(request: HtmxHttpRequest) -> HttpResponse:
    """The Alerts tab: ``?state=firing|silenced|acknowledged|resolved|all`` (default firing) and
    ``?severity=P0|P1|P2|P3``, kept in the URL; operators acknowledge firing alerts with a comment
    (one or a selection) and silence open ones for a time. htmx GET: the table only."""
    ctx = _page_context(request, **alerts_context(_alert_state(request), request.GET.get("severity", "")))
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
    return _answer(request, error, status, pk, f"alert {pk} acknowledged")


@operator_required
def ack_alerts(request: HtmxHttpRequest) -> HttpResponse:
    """Acknowledge the selected alerts (``alert`` values) with one comment (``do_ack_alerts``: an
    audit row each, all or none). Nothing selected or no comment: 400; one no longer firing: 409."""
    form = AckForm(request.POST)
    try:
        pks = [int(v) for v in request.POST.getlist("alert")]
    except ValueError:
        return _answer(request, "the selection is not a list of alert numbers; reload the page", 400, None, "")
    error, status, done = "", 200, []
    if not pks:
        error, status = "select at least one alert to acknowledge", 400
    elif not form.is_valid():
        error, status = "; ".join(form.errors["comment"]), 400
    else:
        try:
            done = do_ack_alerts(pks, actor_of(request), form.cleaned_data["comment"])
        except ValueError as exc:
            error, status = f"nothing acknowledged: {exc}", 409
    return _answer(request, error, status, None, f"{len(done)} alerts acknowledged")


@operator_required
def silence_alert(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Silence one open alert for ``minutes`` (one of ``SILENCE_CHOICES``), with an optional
    comment (``do_silence_alert``). A bad duration: 400; a resolved alert: 409."""
    alert = get_object_or_404(Alert, pk=pk)
    form = SilenceForm(request.POST)
    error, status = "", 200
    if not form.is_valid():
        error, status = "; ".join(e for errs in form.errors.values() for e in errs), 400
    else:
        try:
            do_silence_alert(alert, actor_of(request), int(form.cleaned_data["minutes"]), form.cleaned_data["comment"])
        except ValueError as exc:
            error, status = str(exc), 409
    return _answer(request, error, status, pk, f"alert {pk} silenced")


@operator_required
def unsilence_alert(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """End an alert's silence now (``do_unsilence_alert``); not silenced: 409."""
    alert = get_object_or_404(Alert, pk=pk)
    error, status = "", 200
    try:
        do_unsilence_alert(alert, actor_of(request))
    except ValueError as exc:
        error, status = str(exc), 409
    return _answer(request, error, status, pk, f"alert {pk}: silence ended")


def _answer(request: HtmxHttpRequest, error: str, status: int, pk: int | None, done: str) -> HttpResponse:
    """htmx: the refreshed table (the error beside the row, or above the table); a browser: a
    redirect back to the chip it came from, or the page with the error and ``status``."""
    state = _alert_state(request) if request.GET.get("state") else request.POST.get("state", "firing")
    state = state if state in (*ALERT_FILTERS, "all") else "firing"
    ctx = _page_context(request, error=error, error_pk=pk, **alerts_context(state))
    if request.htmx:
        resp = render(request, "console/partials/alerts.html", ctx)  # 200: htmx swaps it, the error inline
        trigger_client_event(resp, "alerts-changed")
        return resp
    if status == 200:
        messages.success(request, done)
        return redirect(f"/alerts/?state={state}")
    return render(request, "console/alerts.html", ctx, status=status)
