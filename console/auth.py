"""Login throttling with django-axes: who is locked out, what the login page says, the alert.

Rules (settings ``AXES_*``, from ``WARDEN_LOGIN_FAILURE_LIMIT`` and ``WARDEN_LOGIN_LOCKOUT_MIN``):
after that many failed sign-ins for one username — from anywhere — or from one address — for any
usernames — that username, or that address, is refused for the lockout time, even with the right
password; a success resets the count. Each lockout raises one ``login_lockout`` alert (P2) per
episode. The address is the connection's (``REMOTE_ADDR``): behind a proxy every client shares
the proxy's address (docs/security.md).

A username typed on the login page is an outsider's text: it is named in the alert only when such
a user exists (then it is a name a superuser chose), never as typed.
"""

import logging

from axes.backends import AxesStandaloneBackend
from axes.signals import user_locked_out
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from fleet.alerts import raise_alert
from fleet.models import Alert

log = logging.getLogger(__name__)


class ThrottleBackend(AxesStandaloneBackend):
    """Axes' lockout check before Django's ``ModelBackend`` (``AUTHENTICATION_BACKENDS``).

    A sign-in through a page (``authenticate(request, ...)``) is refused while its username or
    address is locked out (``axes.exceptions.AxesBackendPermissionDenied``). An ``authenticate``
    with no request is an in-process call (Django's test client ``login()``, a shell) that no
    outsider can repeat: it is not throttled here and goes on to ``ModelBackend``.
    """

    def authenticate(self, request: HttpRequest | None, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def lockout_minutes() -> float:
    """The lockout time in minutes (``AXES_COOLOFF_TIME``)."""
    return settings.AXES_COOLOFF_TIME.total_seconds() / 60


def lockout_text() -> str:
    """The one line the login page shows while a sign-in is locked out."""
    until = (timezone.now() + settings.AXES_COOLOFF_TIME).strftime("%H:%M UTC")
    return (f"Too many failed sign-ins for this username or from this address: sign-in is locked for "
            f"{lockout_minutes():g} minutes (until about {until}), even with the right password. "
            "Wait, or ask a superuser to unlock it (manage.py axes_reset_username NAME / axes_reset_ip ADDRESS).")


def lockout_response(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the login page again, status 429, with :func:`lockout_text`.

    Axes calls it as ``(request, original_response, credentials)`` or ``(request, credentials)``
    depending on its sync/async path; neither is needed here."""
    form = AuthenticationForm(request)
    return render(request, "console/login.html", {"form": form, "locked_out": lockout_text(), "next": ""},
                  status=settings.AXES_HTTP_RESPONSE_CODE)


def existing_username(typed: str | None) -> str | None:
    """The username of the user called ``typed``, or None when there is no such user (the typed
    text is an outsider's and is never repeated)."""
    if typed:
        user = get_user_model().objects.filter(username=typed).first()
        if user is not None:
            return user.get_username()
    return None


@receiver(user_locked_out)
def alert_on_lockout(sender, request=None, username=None, ip_address=None, **kwargs) -> None:
    """Raise one ``login_lockout`` alert per episode: none while an open one already covers this
    address or this (existing) user — a locked address refuses every username tried from it, and
    a locked user every address, each a new lockout signal for axes."""
    name = existing_username(username)
    address = ip_address or "unknown"
    who = f"user {name!r}" if name else "a username that is not a Warden user"
    open_alerts = Alert.objects.filter(kind="login_lockout").exclude(state="resolved")
    if open_alerts.filter(key__startswith=f"login_lockout:{address}|").exists() or (
            name and open_alerts.filter(key__endswith=f"|{name}").exists()):
        return
    log.warning("login lockout: %s from %s", who, address)
    try:
        raise_alert("login_lockout",
                    f"sign-in locked for {lockout_minutes():g} min after {settings.AXES_FAILURE_LIMIT} failed "
                    f"attempts: {who} from {address}", severity="P2", key=f"login_lockout:{address}|{name or '-'}")
    except Exception:  # noqa: BLE001 — the lockout itself holds even if the alert cannot be written
        log.exception("login lockout: the alert could not be raised")
