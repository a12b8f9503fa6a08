"""The alerts page and acknowledging an alert."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django_htmx.http import trigger_client_event

from agent.actions import (
    do_ack_alert,
)
from console.forms import (
    AckForm,
)
from console.views.common import HtmxHttpRequest, _is_region, _page_context, actor_of, operator_required
from fleet.models import Alert

# --- alerts tab --------------------------------------------------------------------------------
ALERT_STATES = ("firing", "acknowledged", "resolved")


ALERTS_ON_PAGE = 200


SEVERITIES = ("P0", "P1", "P2", "P3")


def alerts_context(state: str, severity: str = "") -> dict:
    """Alerts in ``state`` (``all`` for every state) and of ``severity`` (P0–P3; empty: any),
    newest first, with a count per state."""
    counts = dict.fromkeys(ALERT_STATES, 0)
    base = Alert.objects.filter(severity=severity) if severity in SEVERITIES else Alert.objects.all()
    counts.update(dict(base.values_list("state").annotate(n=Count("id")).order_by()))
    qs = base.select_related("instance").order_by("-raised_at", "-pk")
    if state in ALERT_STATES:
        qs = qs.filter(state=state)
    return {
        "alerts": list(qs[:ALERTS_ON_PAGE]),
        "state": state,
        "counts": counts,
        "states": ALERT_STATES,
        "firing_count": counts["firing"],
        "severity": severity if severity in SEVERITIES else "",
        "severities": SEVERITIES,
    }


def _alert_state(request) -> str:
    state = request.GET.get("state", "firing")
    return state if state in (*ALERT_STATES, "all") else "firing"


@login_required
@require_GET
@never_cache
def alerts_page(request: HtmxHttpRequest) -> HttpResponse:
    """The Alerts tab: ``?state=firing|acknowledged|resolved|all`` (default firing) and
    ``?severity=P0|P1|P2|P3``, kept in the URL; operators
    acknowledge firing alerts with a comment. htmx GET: the table only."""
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
    state = _alert_state(request) if request.GET.get("state") else request.POST.get("state", "firing")
    state = state if state in (*ALERT_STATES, "all") else "firing"
    if request.htmx:
        resp = render(
            request,
            "console/partials/alerts.html",
            _page_context(request, error=error, error_pk=pk, **alerts_context(state)),
        )
        trigger_client_event(resp, "alerts-changed")
        return resp
    if status == 200:
        messages.success(request, f"alert {pk} acknowledged")
        return redirect(f"/alerts/?state={state}")
    return render(
        request,
        "console/alerts.html",
        _page_context(request, error=error, error_pk=pk, **alerts_context(state)),
        status=status,
    )
