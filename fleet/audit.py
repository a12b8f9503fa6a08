"""The audit log's one writer: who or what did what, when, why, with before and after.

It lives in ``fleet``, the lowest layer, so that ``fleet`` (the reconcile adopting an instance, a
cordon put back) and every ``do_*`` action of ``agent`` and ``console`` write the same row.
"""

from fleet.clock import clock
from fleet.events import emit
from fleet.models import AuditLog
from fleet.secrets import redact, redact_obj


def do_audit(actor: str, verb: str, target: str = "", reason: str = "", before=None, after=None) -> AuditLog:
    """Write one audit row (secrets redacted) and announce ``actions-changed``."""
    row = AuditLog.objects.create(
        at=clock.now(),
        actor=actor,
        verb=verb,
        target=str(target)[:200],
        reason=redact(reason or ""),
        before=redact_obj(before),
        after=redact_obj(after),
    )
    emit("actions-changed")
    return row
