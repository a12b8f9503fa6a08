"""Raising and resolving alerts, once per episode.

An alert is keyed (``kind`` plus what it is about); raising a key that is already firing or
acknowledged does nothing, so an episode makes one alert; :func:`resolve` ends the episode when
the condition clears. A silence (``agent.actions.alerts.do_silence_alert``) is on the key: an alert
raised again while it lasts is created silenced.
"""

from django.db.models import F
from django.dispatch import Signal

from fleet.clock import clock
from fleet.events import emit, trigger
from fleet.models import Alert
from fleet.secrets import redact

#: sent once per alert an episode's end resolved (``alert=``, the resolved row);
#: ``agent.apps`` connects the notifications to it (fleet never imports agent)
resolved = Signal()

#: what ends each kind's episode: the condition :func:`resolve` is called on (shown on the Alerts
#: page). The instance-scoped kinds also end when their instance is destroyed
#: (``agent.runtime.observe.end_gone_episodes``).
ENDS = {
    "workers_dead": "every expected worker heartbeats again (or is no longer expected: destroyed or stopped)",
    "demand_unknown": "the demand source is readable again",
    "provider_error": "the provider (or the owned host) answers again",
    "instance_exited": "the instance runs with a live worker again, or is stopped or destroyed",
    "stuck_provisioning": "the launch has a live worker, the queue is served, or the instance is destroyed",
    "destroy_unconfirmed": "the provider no longer lists the instance",
    "prompt_injection": "the text is gone from the instance's fields, the instance is destroyed, or the run that read it closed",
    "stale_claim": "a report: it ends when an operator acknowledges it",
    "escalation": "a report: it ends when an operator acknowledges it",
}


def raise_alert(kind: str, message: str, *, severity: str = "P2", key: str | None = None, instance=None,
                recurring: bool = False) -> Alert:
    """Raise ``kind`` unless an alert with the same key is still open; returns the open alert.

    ``recurring``: the key names a condition that recurs while it lasts (the model keeps failing,
    runs keep halting): raising it again while it is open adds one to its ``count`` and keeps the
    newest ``message``, instead of making another alert. ``message`` and ``key`` are redacted of
    secrets before they are stored.
    """
    key, message = redact(key or kind)[:200], redact(message)
    open_alert = Alert.objects.filter(key=key).exclude(state="resolved").first()
    if open_alert is not None:
        if recurring:
            Alert.objects.filter(pk=open_alert.pk).update(count=F("count") + 1, message=message)
            open_alert.refresh_from_db(fields=["count", "message"])
            emit("alerts-changed")
        return open_alert
    now = clock.now()
    # a silence on this key outlives the episode it was set on: a new episode inside it stays quiet
    silence = (Alert.objects.filter(key=key, silenced_until__gt=now).order_by("-silenced_until")
               .values("silenced_until", "silenced_by", "silence_comment").first()) or {}
    alert = Alert.objects.create(
        kind=kind, key=key, severity=severity, message=message, instance=instance, raised_at=now, **silence
    )
    emit("alerts-changed")
    trigger("alert", f"{severity} {kind}: {message[:120]}")
    return alert


def resolve(key: str, reason: str = "the condition cleared", *, prefix: bool = False) -> int:
    """Resolve every open alert with ``key`` (``prefix``: every key starting with it), stamped with
    the time and ``reason`` (a short sentence, redacted, at most 300 characters: "local-1
    destroyed"); returns how many were resolved. Each resolved alert is announced on
    :data:`resolved` after commit, so the operators its raise notified hear that it ended (the
    notification rows are written in the current transaction, as a raise's are)."""
    key, reason = redact(key)[:200], redact(reason)[:300]
    match = Alert.objects.filter(key__startswith=key) if prefix else Alert.objects.filter(key=key)
    rows = list(match.exclude(state="resolved"))
    if not rows:
        return 0
    now = clock.now()
    Alert.objects.filter(pk__in=[a.pk for a in rows]).update(state="resolved", resolved_at=now, resolved_reason=reason)
    for a in rows:
        a.state, a.resolved_at, a.resolved_reason = "resolved", now, reason
        resolved.send_robust(sender=Alert, alert=a)  # in this transaction, like a raise's post_save
    emit("alerts-changed")
    return len(rows)
