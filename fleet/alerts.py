"""Raising and resolving alerts, once per episode.

An alert is keyed (``kind`` plus what it is about); raising a key that is already firing or
acknowledged does nothing, so an episode makes one alert; :func:`resolve` ends the episode when
the condition clears. A silence (``agent.actions.do_silence_alert``) is on the key: an alert
raised again while it lasts is created silenced.
"""

from fleet.clock import clock
from fleet.events import emit, trigger
from fleet.models import Alert
from fleet.secrets import redact


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
            from django.db.models import F

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


def resolve(key: str, *, prefix: bool = False) -> int:
    """Resolve every open alert with ``key`` (``prefix``: every key starting with it); returns how
    many were resolved."""
    key = redact(key)[:200]
    match = Alert.objects.filter(key__startswith=key) if prefix else Alert.objects.filter(key=key)
    n = match.exclude(state="resolved").update(state="resolved", resolved_at=clock.now())
    if n:
        emit("alerts-changed")
    return n
