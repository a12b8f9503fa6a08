"""Raising and resolving alerts, once per episode.

An alert is keyed (``kind`` plus what it is about); raising a key that is already firing or
acknowledged does nothing, so an episode makes one alert; :func:`resolve` ends the episode when
the condition clears.
"""

from fleet.clock import clock
from fleet.events import emit, trigger
from fleet.models import Alert
from fleet.secrets import redact


def raise_alert(kind: str, message: str, *, severity: str = "P2", key: str | None = None, instance=None) -> Alert:
    """Raise ``kind`` unless an alert with the same key is still open; returns the open alert.

    ``message`` and ``key`` are redacted of secrets before they are stored.
    """
    key, message = redact(key or kind)[:200], redact(message)
    open_alert = Alert.objects.filter(key=key).exclude(state="resolved").first()
    if open_alert is not None:
        return open_alert
    alert = Alert.objects.create(
        kind=kind, key=key, severity=severity, message=message, instance=instance, raised_at=clock.now()
    )
    emit("alerts-changed")
    trigger("alert", f"{severity} {kind}: {message[:120]}")
    return alert


def resolve(key: str) -> int:
    """Resolve every open alert with ``key``; returns how many were resolved."""
    key = redact(key)[:200]
    n = Alert.objects.filter(key=key).exclude(state="resolved").update(state="resolved", resolved_at=clock.now())
    if n:
        emit("alerts-changed")
    return n
