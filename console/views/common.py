"""Shared pieces of the console's views: the htmx request type, roles, flash answers and error wording."""

import functools
import logging

import kombu.exceptions
import redis
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponseForbidden
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST
from django_htmx.middleware import HtmxDetails

from console.forms import (
    CAPS,
)
from console.templatetags.console_extras import can_act
from fleet.demand.base import DemandError
from fleet.models import AuditLog

log = logging.getLogger(__name__)


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


def _page_context(request, **extra) -> dict:
    # the demo's own controls (add tasks, kill a worker) are not offered against a real Curio
    ctx = {"can_act": can_act(request.user), "demo_queue": settings.WARDEN["DEMAND_SOURCE"] == "local"}
    ctx.update(extra)
    return ctx


# --- actions (POST, operators) ---------------------------------------------------------------
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
    return isinstance(exc, (redis.exceptions.RedisError, kombu.exceptions.OperationalError, ConnectionError))


def redis_hint(exc: Exception) -> str:
    """A Redis failure named by its setting, with what to do."""
    where = "REDIS_URL" if not settings.REDIS_EMBEDDED else "the bundled redis-server (REDIS_URL unset)"
    todo = (
        "start Redis or fix REDIS_URL"
        if not settings.REDIS_EMBEDDED
        else "run `make run` (it starts it) or set REDIS_URL"
    )
    # what was kept is the caller's to say (a stored decision, a saved message): never assumed here
    return f"Redis unreachable via {where}: {type(exc).__name__}: {str(exc)[:160]} — {todo}"


def _record_after(row: AuditLog, after: dict) -> bool:
    """Write an action's outcome on its intent audit row; False when the database refused."""
    try:
        AuditLog.objects.filter(pk=row.pk).update(after=after)
        return True
    except DatabaseError as exc:
        log.warning("audit row %s: outcome not recorded: %s", row.pk, exc)
        return False


def _safe_next(request, default: str) -> str:
    """The ``next`` URL when it is ours and no longer than ``CAPS["next"]``, else ``default``."""
    nxt = request.POST.get("next") or request.GET.get("next") or ""
    if nxt and len(nxt) <= CAPS["next"] and url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()}):
        return nxt
    return default


def page_number(params) -> int:
    """The ``page`` query parameter as a whole number from 1 (1 when absent); ``ValueError``
    naming it otherwise. A page past the end shows the last one (``Paginator.get_page``)."""
    raw = (params.get("page") or "1").strip()
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 7 and int(raw) >= 1):
        raise ValueError(f"page must be a whole number from 1, e.g. ?page=2; got {raw[:20]!r}")
    return int(raw)
