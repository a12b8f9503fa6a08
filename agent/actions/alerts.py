"""Acknowledging and silencing alerts (``fleet.models.Alert``), one or many.

Each ``do_*`` writes its audit row and announces change topics after commit (``agent.actions``).
"""


from datetime import timedelta

from django.db import transaction

from agent.actions.text import check_text
from fleet.audit import do_audit
from fleet.clock import clock
from fleet.events import emit
from fleet.models import Alert
from fleet.secrets import redact


@transaction.atomic
def do_ack_alert(alert, actor: str, comment: str):
    """Acknowledge a firing alert with a comment (who is on it, and why); audited.

    A conditional UPDATE ``firing → acknowledged``: a second acknowledgement, or one of a resolved
    alert, raises ValueError saying its current state. An empty comment raises ValueError.
    Returns the refreshed alert; announces ``alerts-changed``.
    """
    comment = (comment or "").strip()
    if not comment:
        raise ValueError("say what you are doing about it (the comment is shown to other operators)")
    n = Alert.objects.filter(pk=alert.pk, state="firing").update(
        state="acknowledged", acknowledged_by=actor[:150], ack_comment=redact(comment)[:2000]
    )
    if n != 1:
        current = Alert.objects.get(pk=alert.pk)
        raise ValueError(f"alert {alert.pk} is already {current.state}")
    alert.refresh_from_db()
    do_audit(actor, "ack_alert", f"alert {alert.pk}", comment, {"state": "firing"},
             {"state": "acknowledged", "kind": alert.kind, "key": alert.key})
    emit("alerts-changed")
    return alert


#: the silences an operator can pick (minutes)
SILENCE_CHOICES = (15, 60, 240, 1440)


@transaction.atomic
def do_silence_alert(alert, actor: str, minutes: float, comment: str = ""):
    """Silence ``alert`` (and any new episode of its key) for ``minutes``: until then it neither
    notifies nor shows as firing (like Grafana's "silence notifications").

    ``minutes`` must be between 1 and 10,080 (a week); a resolved alert cannot be silenced; a
    silence replaces the alert's previous one. Raises ValueError saying what was wrong. Audited as
    ``silence_alert`` with the end time; announces ``alerts-changed``. Returns the refreshed alert.
    """
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not 1 <= minutes <= 10_080:
        raise ValueError("silence for between 1 minute and 7 days (10,080 minutes)")
    comment = check_text("comment", comment)
    until = clock.now() + timedelta(minutes=minutes)
    before = Alert.objects.select_for_update().filter(pk=alert.pk).values("state", "silenced_until").first()
    if before is None or before["state"] == "resolved":
        raise ValueError(f"alert {alert.pk} is resolved; there is nothing to silence")
    Alert.objects.filter(pk=alert.pk).update(silenced_until=until, silenced_by=actor[:150],
                                             silence_comment=redact(comment)[:2000])
    alert.refresh_from_db()
    do_audit(actor, "silence_alert", f"alert {alert.pk}", comment,
             {"silenced_until": before["silenced_until"].isoformat() if before["silenced_until"] else None},
             {"silenced_until": until.isoformat(), "minutes": minutes, "kind": alert.kind, "key": alert.key})
    emit("alerts-changed")
    return alert


@transaction.atomic
def do_unsilence_alert(alert, actor: str):
    """End ``alert``'s silence now (it shows as firing again and later episodes notify). Raises
    ValueError when it is not silenced. Audited as ``unsilence_alert``."""
    now = clock.now()
    n = Alert.objects.filter(pk=alert.pk, silenced_until__gt=now).update(silenced_until=now)
    if n != 1:
        raise ValueError(f"alert {alert.pk} is not silenced")
    Alert.objects.filter(key=alert.key, silenced_until__gt=now).update(silenced_until=now)
    alert.refresh_from_db()
    do_audit(actor, "unsilence_alert", f"alert {alert.pk}", "", None, {"silenced_until": now.isoformat()})
    emit("alerts-changed")
    return alert


@transaction.atomic
def do_ack_alerts(pks: list[int], actor: str, comment: str) -> list:
    """Acknowledge several firing alerts with one comment (bulk acknowledge, Grafana PR #105363):
    one :func:`do_ack_alert` each, so each writes its own audit row, all in one transaction.

    Raises ValueError, with nothing acknowledged, when no alert is selected, more than 500 are, the
    comment is empty, or one of them is not firing any more (the message names it)."""
    pks = sorted({int(pk) for pk in pks})
    if not pks:
        raise ValueError("select at least one alert to acknowledge")
    if len(pks) > 500:
        raise ValueError("acknowledge at most 500 alerts at once")
    alerts = list(Alert.objects.filter(pk__in=pks).order_by("pk"))
    missing = sorted(set(pks) - {a.pk for a in alerts})
    if missing:
        raise ValueError(f"no alert {missing[0]}; reload the page")
    return [do_ack_alert(a, actor, comment) for a in alerts]
