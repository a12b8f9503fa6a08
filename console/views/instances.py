"""One instance's page and the operator's actions on it (stop, resume, reboot, destroy, cordon)."""

import logging
import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import DatabaseError
from django.db.models import F
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django_htmx.http import trigger_client_event

from agent.actions.instances import ActionRefused, do_cordon, do_operator_instance_action
from agent.policy.claims import EffectNotRecorded
from agent.policy.table import effective_limits
from agent.runtime.diagnosis import do_diagnose
from console.forms import (
    InstanceActionForm,
)
from console.views.common import (
    HtmxHttpRequest,
    _form_errors,
    _is_region,
    _page_context,
    _safe_next,
    _why,
    actor_of,
    operator_required,
)
from fleet.demand.base import DemandError
from fleet.models import Alert, AuditLog, Diagnosis, Instance
from fleet.providers.base import ProviderError

log = logging.getLogger(__name__)


# --- instance page and operator actions on instances ------------------------------------------
DIAGNOSES_ON_PAGE = 20


EVENTS_ON_PAGE = 100


def _instance(external_id: str) -> Instance:
    """The instance with ``external_id`` (a live one before a killed one); 404 when none."""
    inst = (
        Instance.objects.filter(external_id=external_id)
        .order_by(F("killed_at").desc(nulls_first=True), "-created_at")
        .first()
    )
    if inst is None:
        raise Http404(f"no instance {external_id}")
    return inst


def instance_context(inst: Instance) -> dict:
    """One instance: its diagnoses, its events (audit rows targeting it) and its alerts, and how
    long a diagnosis stays fresh for stop and destroy (``diagnosis_fresh_min``, minutes)."""
    return {
        "inst": inst,
        "diagnosis_fresh_min": effective_limits().diagnosis_fresh_min,
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


def run_instance_action(
    inst: Instance, action: str, *, actor: str, reason: str, override_reason: str = "", request_key: str = ""
) -> tuple[int, str, str]:
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
                return (
                    200,
                    "ok",
                    (
                        f"{action} of {inst.external_id} recorded; its worker has not registered with the queue yet"
                        + (" and is cordoned when it does" if action == "cordon" else "")
                    ),
                )
            return 200, "ok", f"{action}ed {inst.external_id}"
        do_operator_instance_action(
            inst, action, actor=actor, reason=reason, override_reason=override_reason, request_key=request_key
        )
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
        return (
            503,
            "database_unavailable",
            (
                f"the database is unavailable ({type(exc).__name__}: {str(exc)[:120]}); "
                "nothing was done; retry when it answers"
            ),
        )
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
        status, code, detail = run_instance_action(
            inst,
            d["action"],
            actor=actor_of(request),
            reason=d["reason"],
            override_reason=d["override_reason"],
            request_key=d["request_key"],
        )
    else:
        status, code, detail = 400, "invalid", _form_errors(form)
    result = {"ok": status == 200, "code": code, "detail": detail, "status": status,
              "action": request.POST.get("action", "")[:20] if code != "invalid" else ""}
    if request.htmx:
        inst.refresh_from_db()
        resp = render(
            request,
            "console/partials/instance_actions.html",
            _page_context(
                request,
                inst=inst,
                result=result,
                request_key=uuid.uuid4().hex,
                form_values=None if status == 200 else request.POST,
                oob=True,  # a refusal also lands at the top of the page (#page-alert); success clears it
            ),
        )
        if status == 200:
            trigger_client_event(resp, "fleet-changed")
        trigger_client_event(resp, "actions-changed")
        return resp
    if status == 200:
        messages.success(request, detail)
        return redirect(_safe_next(request, f"/instances/{inst.external_id}/"))
    ctx = _page_context(
        request, request_key=uuid.uuid4().hex, result=result, form_values=request.POST, **instance_context(inst)
    )
    return render(request, "console/instance.html", ctx, status=status)


@operator_required
def diagnose_now(request: HtmxHttpRequest, external_id: str) -> HttpResponse:
    """"Diagnose now" (POST): diagnose the instance at once (``agent.runtime.diagnosis.do_diagnose``: the
    SSH collector and the configured judge, audited). htmx gets the instance region back with the
    new diagnosis on top; a browser a redirect to the instance page with the verdict as a message.
    A killed instance answers 409 with why."""
    inst = _instance(external_id)
    try:
        d = do_diagnose(inst, actor=actor_of(request))
    except ValueError as exc:
        if request.htmx:
            return HttpResponse(str(exc), status=409)
        messages.error(request, str(exc))
        return redirect(f"/instances/{inst.external_id}/")
    text = f"diagnosed {inst.external_id}: {d.health} ({d.fault_class or 'no fault class'}) — {d.cause}"
    if request.htmx:
        ctx = _page_context(request, request_key=uuid.uuid4().hex, diagnosed=text, **instance_context(inst))
        return render(request, "console/partials/instance.html", ctx)
    messages.success(request, text)
    return redirect(f"/instances/{inst.external_id}/")
