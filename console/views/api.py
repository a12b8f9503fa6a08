"""JSON endpoints: the instance action API and the health check."""

import json
import logging

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.csrf import csrf_failure as django_csrf_failure
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from console import health
from console.forms import (
    CAPS,
    InstanceActionForm,
    too_long_error,
)
from console.templatetags.console_extras import can_act
from console.views.common import actor_of
from console.views.instances import _instance, run_instance_action

log = logging.getLogger(__name__)


# --- health ----------------------------------------------------------------------------------
@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """``/healthz`` (no login needed): 200 when every check is up, 503 otherwise.

    Anonymous callers get the status only: ``{"status": "ok"|"down", "up": [names], "down": [names]}``.
    A signed-in user gets the whole report (each check's detail, the last run, the demand state),
    which may name hosts, run numbers and error texts an outsider has no business reading."""
    body, status = health.report()
    if not request.user.is_authenticated:
        body = {"status": body["status"], "up": [n for n, c in body["checks"].items() if c["up"]], "down": body["down"]}
    return JsonResponse(body, status=status)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: on ``/api/…`` a JSON 403 ``{"ok": false, "code": "csrf_failed", "detail"}``
    a script can read; elsewhere Django's own HTML page (``django.views.csrf.csrf_failure``)."""
    if request.path.startswith("/api/"):
        return _json_error(403, "csrf_failed", f"CSRF check failed ({reason or 'no reason given'}): send the "
                           "csrftoken cookie's value in an X-CSRFToken header from a signed-in session")
    return django_csrf_failure(request, reason=reason)


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
        return _json_error(
            404, "unknown_action", f"unknown action {action!r}; use one of {', '.join(InstanceActionForm.ACTIONS)}"
        )
    try:
        raw = request.body
    except RequestDataTooBig:
        raw = None
    if raw is None or len(raw) > CAPS["json_body"]:
        return _json_error(413, "too_large", f"the body is too large: at most {CAPS['json_body']:,} bytes")
    try:
        body = json.loads(raw or b"{}")
    except RecursionError:  # brackets nested past the parser's depth (about 1,000)
        return _json_error(
            400, "invalid", 'the body\'s JSON nests too deeply; send one flat object, e.g. {"reason": "wedged"}'
        )
    except ValueError:
        return _json_error(400, "invalid", 'the body must be JSON, e.g. {"reason": "wedged"}')
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
        return _json_error(
            500, "internal_error", f"{type(exc).__name__}: {str(exc)[:200]}; see the Actions page before retrying"
        )
    if status == 200:
        return JsonResponse({"ok": True, "detail": detail})
    return _json_error(status, code, detail)
