"""Telling operators when something needs them: email and Slack-compatible webhooks.

What notifies (``KINDS``): a call parked for approval, an approval about to expire and one that
expired unanswered (approvals expire after ``approval_expiry_min``, 30 by default), a P0/P1
alert (and its end, with when and why: :func:`alert_resolved`), and a P0/P1 escalation by the
agent (``escalate_human``). Lower severities go to the
Alerts page only (docs/notifications.md): :func:`alert_routes` is the one routing rule.

The flow is a transactional outbox: the event's transaction writes one :class:`Notification`
row per operator and channel (``dedupe_key`` keeps it to one), and after commit the Celery task
``agent.tasks.deliver_notification`` sends it, off the request path. :func:`deliver` tries a few
times (tenacity, exponential wait) on transient failures (connection refused, timeouts, HTTP 429
and 5xx, SMTP 4xx); the task retries later once those run out. Every final outcome is audited
(``notify_sent`` / ``notify_failed``).

Secrets are references: an operator's webhook URL (Slack's carries its token) is stored as
``env:NAME`` or ``file:/path`` and the SMTP password as ``WARDEN_EMAIL_PASSWORD_REF``; both are
resolved at send time (``fleet.secrets.resolve``), never stored, logged or shown.
"""

import json
import logging
import smtplib
import urllib.error
import urllib.request
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db import IntegrityError, transaction
from django.db.models import Q
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from agent.models import Approval, Notification, NotificationSettings
from fleet.audit import do_audit
from fleet.clock import clock
from fleet.models import Alert
from fleet.secrets import SecretReferenceError, redact, resolve

#: kind -> what an operator ticks on the Notifications page
KINDS = {
    "approval_new": "a call waits for approval",
    "approval_expiring": "an approval is about to expire",
    "approval_expired": "an approval expired unanswered",
    "alert": "a P0 or P1 alert is raised",
    "escalation": "the agent escalates to a human (P0 or P1)",
}
#: severities that notify; every alert shows on the Alerts page
NOTIFY_SEVERITIES = ("P0", "P1")
CHANNELS = ("email", "webhook")
log = logging.getLogger(__name__)


class TransientError(Exception):
    """A delivery failed in a way a later attempt may not (no connection, timeout, 429, 5xx, SMTP 4xx)."""


class PermanentError(Exception):
    """A delivery that cannot succeed as configured (an HTTP 4xx, SMTP 5xx, an unresolvable reference)."""


# --- settings ------------------------------------------------------------------------------------
def check_webhook_ref(ref: str) -> str:
    """``ref`` stripped, or ValueError saying what to give instead. Empty means no webhook.

    A URL pasted as is is refused: a Slack incoming-webhook URL is its own credential, so it lives
    in an environment variable (``env:NAME``) or a file (``file:/path``) and Warden keeps the name.
    """
    ref = (ref or "").strip()
    if not ref:
        return ""
    if ref.startswith(("http://", "https://")):
        raise ValueError("do not paste the webhook URL (it carries its token): put it in an environment variable "
                         "or a file and give env:NAME or file:/path")
    if not ref.startswith(("env:", "file:")) or len(ref) < 6 or len(ref) > 500:
        raise ValueError("the webhook must be a reference: env:NAME or file:/path")
    kind, _, name = ref.partition(":")
    # "env:https://hooks…" or a URL without its scheme is still the URL: refused, never stored
    if kind == "env" and not (name.isascii() and name.isidentifier()):
        raise ValueError("env: takes an environment variable's name (letters, digits, _), not its value")
    if kind == "file" and (not name.startswith("/") or "://" in name or any(c.isspace() for c in name)):
        raise ValueError("file: takes an absolute path (file:/etc/warden/slack-url), not the URL")
    return ref


def reference_status(ref: str) -> str:
    """``"set"`` when ``ref`` resolves now, else why not (names the reference, never a value)."""
    try:
        resolve(ref)
    except SecretReferenceError as exc:
        return str(exc)
    return "set"


# --- routing -------------------------------------------------------------------------------------
def alert_routes(severity: str) -> list[str]:
    """Where an alert of ``severity`` goes: always ``alerts`` (the Alerts page), plus
    ``notifications`` for P0 and P1 (docs/notifications.md)."""
    return ["alerts", "notifications"] if severity in NOTIFY_SEVERITIES else ["alerts"]


def _recipients(kind: str) -> list[NotificationSettings]:
    return [
        s for s in NotificationSettings.objects.filter(user__is_active=True).select_related("user")
        if kind in (s.kinds or [])
    ]


def notify(kind: str, key: str, subject: str, body: str, link: str = "") -> list[Notification]:
    """Queue ``kind`` for every active operator who wants it, on each channel they configured.

    ``key`` names the event (``approval:12``); with the operator and channel it makes the
    ``dedupe_key``, so announcing an event twice sends once. Rows are written in the current
    transaction; each is sent by ``agent.tasks.deliver_notification`` after commit. Subject and
    body are redacted. Returns the rows created.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown notification kind {kind!r}; known: {', '.join(KINDS)}")
    created = []
    for prefs in _recipients(kind):
        for channel, configured in (("email", prefs.email), ("webhook", prefs.webhook_ref)):
            if not configured:
                continue
            try:
                with transaction.atomic():
                    row = Notification.objects.create(
                        user=prefs.user, kind=kind, channel=channel, dedupe_key=f"{key}:{prefs.user_id}:{channel}"[:200],
                        subject=_one_line(redact(subject))[:300], body=redact(body), link=link[:300],
                        created_at=clock.now())
            except IntegrityError:
                continue  # already announced to this operator on this channel
            created.append(row)
            transaction.on_commit(lambda pk=row.pk: enqueue(pk), robust=True)
    return created


def _one_line(text: str) -> str:
    """``text`` with its line breaks and runs of whitespace as single spaces: an email subject is
    one header line (Django raises BadHeaderError for a newline; an alert's message may span lines)."""
    return " ".join(text.split())


def enqueue(pk: int) -> bool:
    """Hand notification ``pk`` to Celery. A broker that is down never breaks the event that
    raised it: the row stays ``queued`` and :func:`scan` hands it over again. Returns True when sent."""
    try:  # by name: agent.tasks is the top of agent and imports this room
        current_app.tasks["agent.tasks.deliver_notification"].delay(pk)
        return True
    except Exception as exc:  # noqa: BLE001 — kombu/redis errors vary; the scan re-sends
        log.warning("notification %s not enqueued (%s); the monitor's scan re-sends it", pk, type(exc).__name__)
        return False


def send_test(user, actor: str) -> list[Notification]:
    """A test message to ``user`` on each channel they configured (the Notifications page's "Send a
    test"); audited as ``notify_test``. Raises ValueError when no channel is configured."""
    prefs = NotificationSettings.objects.filter(user=user).first()
    channels = [c for c, on in (("email", prefs and prefs.email), ("webhook", prefs and prefs.webhook_ref)) if on]
    if not channels:
        raise ValueError("set an email address or a webhook reference first, then send a test")
    now = clock.now()
    rows = [Notification.objects.create(
        user=user, kind="test", channel=c, dedupe_key=f"test:{user.pk}:{c}:{now.timestamp()}"[:200],
        subject="Warden test notification", body=f"{actor} asked for a test at {now:%Y-%m-%d %H:%M:%S} UTC; "
        "this channel works.", link=_url("/notifications/"), created_at=now) for c in channels]
    for row in rows:
        transaction.on_commit(lambda pk=row.pk: enqueue(pk), robust=True)
    do_audit(actor, "notify_test", f"user:{user.get_username()}", "", None, {"channels": channels})
    return rows


def _url(path: str) -> str:
    return settings.NOTIFY["BASE_URL"] + path


def _call(approval: Approval) -> str:
    args = {k: v for k, v in (approval.args or {}).items() if k != "reason"}
    return f"{approval.tool}({json.dumps(args, sort_keys=True)})"


def approval_parked(approval: Approval) -> None:
    """A call was parked for approval (``post_save`` of a new waiting :class:`Approval`)."""
    minutes = max(0, round((approval.expires_at - clock.now()).total_seconds() / 60))
    notify("approval_new", f"approval:{approval.pk}", f"Approval {approval.pk} waiting: {_call(approval)}",
           f"Run {approval.run.number} asks for {_call(approval)}.\nReason: {approval.reason or '(none given)'}\n"
           f"It expires in {minutes} min; nothing runs until an operator approves.", _url("/approvals/"))


def alert_raised(alert, now=None) -> None:
    """A new alert (``post_save`` of a new :class:`fleet.models.Alert`): P0/P1 notify unless silenced
    at ``now``; an escalation as ``escalation``, any other kind as ``alert``."""
    if "notifications" not in alert_routes(alert.severity) or alert.is_silenced(now or clock.now()):
        return
    kind = "escalation" if alert.kind == "escalation" else "alert"
    where = f" on {alert.instance.external_id}" if alert.instance_id else ""
    notify(kind, f"alert:{alert.pk}", f"[{alert.severity}] {alert.kind}{where}: {alert.message[:120]}",
           f"{alert.severity} {alert.kind}{where}\n{alert.message}", _url("/alerts/?state=firing"))


def alert_resolved(alert, now=None) -> None:
    """An alert whose episode ended (``fleet.alerts.resolved``): the operators its raise notified
    (P0/P1, not silenced) hear that it ended, when and why, on the same kind's channels."""
    if "notifications" not in alert_routes(alert.severity) or alert.is_silenced(now or clock.now()):
        return
    kind = "escalation" if alert.kind == "escalation" else "alert"
    where = f" on {alert.instance.external_id}" if alert.instance_id else ""
    at = f"{alert.resolved_at:%Y-%m-%d %H:%M:%S} UTC" if alert.resolved_at else "now"
    notify(kind, f"alert_resolved:{alert.pk}",
           f"[resolved] [{alert.severity}] {alert.kind}{where}: {alert.resolved_reason or 'the condition cleared'}",
           f"Resolved at {at}: {alert.resolved_reason or 'the condition cleared'}.\n"
           f"It was: {alert.severity} {alert.kind}{where}\n{alert.message}", _url("/alerts/?state=resolved"))


def scan(now=None) -> int:
    """Announce approvals about to expire (within ``EXPIRY_WARNING_MIN``) or expired in the last
    hour, and P0/P1 alerts still firing when their silence ended; hand over again rows whose
    enqueue failed (queued, never tried, older than 2 minutes). Run by the monitor's beat tick;
    the dedupe keys make repeated scans send once. Returns the number of rows queued."""
    now = now or clock.now()
    warn = timedelta(minutes=settings.NOTIFY["EXPIRY_WARNING_MIN"])
    n = 0
    for a in Approval.objects.filter(status="waiting", expires_at__gte=now, expires_at__lte=now + warn).select_related("run"):
        minutes = max(0, round((a.expires_at - now).total_seconds() / 60))
        n += len(notify("approval_expiring", f"approval_expiring:{a.pk}",
                        f"Approval {a.pk} expires in {minutes} min: {_call(a)}",
                        f"Run {a.run.number} still waits for {_call(a)}. Unanswered, it expires at "
                        f"{a.expires_at:%H:%M} UTC and nothing runs.", _url("/approvals/")))
    expired = Q(status="expired", decided_at__gte=now - timedelta(hours=1)) | Q(status="waiting", expires_at__lt=now,
                                                                                 expires_at__gte=now - timedelta(hours=1))
    for a in Approval.objects.filter(expired).select_related("run"):
        n += len(notify("approval_expired", f"approval_expired:{a.pk}", f"Approval {a.pk} expired: {_call(a)}",
                        f"Nobody answered run {a.run.number}'s request for {_call(a)} in time; it did not run.",
                        _url(f"/runs/{a.run.number}/")))
    # rows whose hand-over to Celery failed (the broker was down at commit)
    for pk in Notification.objects.filter(status="queued", attempts=0, created_at__lt=now - timedelta(minutes=2),
                                          created_at__gte=now - timedelta(hours=6)).values_list("pk", flat=True):
        enqueue(pk)

    for alert in Alert.objects.filter(state="firing", severity__in=NOTIFY_SEVERITIES, silenced_until__lte=now,
                                      silenced_until__gte=now - timedelta(hours=1)).select_related("instance"):
        before = Notification.objects.count()
        alert_raised(alert, now)
        n += Notification.objects.count() - before
    return n


# --- delivery ------------------------------------------------------------------------------------
def _payload(n: Notification) -> dict:
    """Slack's incoming-webhook JSON (``text`` plus one mrkdwn section), which Mattermost,
    Rocket.Chat and Discord's ``/slack`` endpoint accept too."""
    text = f"*{n.subject}*\n{n.body}" + (f"\n<{n.link}|Open in Warden>" if n.link else "")
    return {"text": text, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}}]}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib follows a 301/302/303 by sending a GET elsewhere, which a webhook reads as nothing
    sent: a redirect is an answer (an ``HTTPError`` with its 3xx code) instead."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


#: the opener webhooks use: redirects are answers, not followed (:func:`post_webhook` allows http(s) only)
_OPENER = urllib.request.build_opener(_NoRedirect)


def post_webhook(n: Notification, url: str) -> None:
    """POST ``n`` as Slack-compatible JSON to ``url``. Raises :class:`TransientError` (no
    connection, timeout, 429, 5xx) or :class:`PermanentError` (another 4xx, a 3xx, which is not
    followed, or a value that is not an http(s) URL); messages never contain the URL."""
    if not url.startswith(("http://", "https://")) or any(c.isspace() for c in url):
        # never the value itself: a wrong file holds anything
        raise PermanentError("the webhook reference does not hold an http(s) URL; put the URL alone in it")
    try:
        req = urllib.request.Request(url, data=json.dumps(_payload(n)).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "warden-notify"})
    except ValueError:
        raise PermanentError("the webhook reference does not hold a valid URL") from None
    try:
        with _OPENER.open(req, timeout=settings.NOTIFY["WEBHOOK_TIMEOUT_S"]):
            pass  # the status is the answer; the body is not read (one dripped slowly held the worker for hours)
    except urllib.error.HTTPError as exc:
        if exc.code == 429 or exc.code >= 500:
            raise TransientError(f"webhook answered HTTP {exc.code}") from None
        if 300 <= exc.code < 400:
            raise PermanentError(f"webhook answered HTTP {exc.code} (a redirect, not followed: a POST redirected "
                                 "becomes a GET that delivers nothing); give the final URL") from None
        raise PermanentError(f"webhook answered HTTP {exc.code}; check the URL behind the reference") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TransientError(f"webhook unreachable: {type(reason).__name__}: {redact(str(reason))[:160]}") from None


def send_email(n: Notification, address: str) -> None:
    """Send ``n`` to ``address`` through Django's configured email backend; the SMTP password is
    resolved from ``WARDEN_EMAIL_PASSWORD_REF`` now. Raises :class:`TransientError` (no connection,
    SMTP 4xx) or :class:`PermanentError` (SMTP 5xx, an unresolvable password reference)."""
    ref = settings.NOTIFY["EMAIL_PASSWORD_REF"]
    try:
        password = resolve(ref) if ref else None
    except SecretReferenceError as exc:
        raise PermanentError(f"SMTP login: {exc}") from None
    body = n.body + (f"\n\n{n.link}" if n.link else "")
    try:
        connection = get_connection(password=password) if password is not None else get_connection()
        EmailMessage(_one_line(n.subject), body, to=[address], connection=connection).send()
    except smtplib.SMTPResponseException as exc:
        if 400 <= exc.smtp_code < 500:
            raise TransientError(f"SMTP {exc.smtp_code}") from None
        raise PermanentError(f"SMTP {exc.smtp_code}: {redact(str(exc.smtp_error))[:160]}") from None
    except (smtplib.SMTPException, OSError) as exc:
        raise TransientError(f"SMTP: {type(exc).__name__}: {redact(str(exc))[:160]}") from None


def _send_once(n: Notification) -> None:
    Notification.objects.filter(pk=n.pk).update(attempts=n.attempts + 1)
    n.attempts += 1
    prefs = NotificationSettings.objects.filter(user_id=n.user_id).first()
    if prefs is None:
        raise PermanentError("the operator removed their notification settings")
    if n.channel == "email":
        if not prefs.email:
            raise PermanentError("the operator removed their email address")
        send_email(n, prefs.email)
    else:
        if not prefs.webhook_ref:
            raise PermanentError("the operator removed their webhook")
        try:
            url = resolve(prefs.webhook_ref)
        except SecretReferenceError as exc:
            raise PermanentError(str(exc)) from None
        post_webhook(n, url)


def deliver(pk: int, *, last_try: bool = True) -> Notification | None:
    """Send notification ``pk`` now, up to ``NOTIFY["ATTEMPTS"]`` attempts on transient failures.

    Returns the row with its new ``status``: ``sent``; ``failed`` (a permanent failure, or transient
    ones on the ``last_try``); ``retrying`` (transient failures, and the caller retries later). A row
    already sent is left alone (a redelivered task sends nothing twice). None when the row is gone.
    """
    n = Notification.objects.filter(pk=pk).first()
    if n is None or n.status == "sent":
        return n
    attempt = retry(retry=retry_if_exception_type(TransientError), stop=stop_after_attempt(settings.NOTIFY["ATTEMPTS"]),
                    wait=wait_exponential(multiplier=settings.NOTIFY["RETRY_WAIT_S"], max=60), reraise=True)(_send_once)
    error, status = "", "sent"
    try:
        attempt(n)
    except TransientError as exc:
        error, status = str(exc), "failed" if last_try else "retrying"
    except PermanentError as exc:
        error, status = str(exc), "failed"
    now = clock.now()
    Notification.objects.filter(pk=pk).update(status=status, last_error=redact(error)[:2000],
                                              sent_at=now if status == "sent" else None)
    n.refresh_from_db()
    verb = {"sent": "notify_sent", "failed": "notify_failed", "retrying": "notify_retrying"}[status]
    do_audit("system", verb, f"notification {n.pk}", error,
             None, {"kind": n.kind, "channel": n.channel, "user": n.user.get_username(), "attempts": n.attempts})
    return n

