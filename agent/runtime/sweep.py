"""The sweep: an operator's decision is dispatched even when the task that should carry it is lost.

A decision is stored first (``agent.runtime.approvals.do_decide``), then a ``resume`` task is queued. That
task can be lost in two ways: the broker (Redis) is unreachable when the operator decides, so
nothing is queued; or the Celery worker that took it dies, and Redis hands the unacked task back
only after its visibility timeout (``WARDEN_CELERY_VISIBILITY_TIMEOUT_S``, 900 s). The monitor's
beat task (``agent.tasks.monitor_tick``, every minute) calls :func:`sweep_decided`, which finds
approved-but-undispatched calls (and parked runs whose every approval is decided) older than
:data:`GRACE_S` and resumes their runs itself, in that task: the guards check each call again as
always (``agent.runtime.pipeline.dispatch_approved``). Its alert ``approval_stalled`` says what waited,
for how long, why, and what became of it.
"""

import logging
from datetime import timedelta

from django.conf import settings

from agent.models import Approval, Run, SideEffect
from agent.runtime.approvals import RESUME_NOT_QUEUED, undispatched
from agent.runtime.loop import resume_run
from fleet.alerts import raise_alert
from fleet.clock import clock

log = logging.getLogger(__name__)

#: seconds a decision is left to its own resume task before the sweep takes it up
GRACE_S = 10.0
#: seconds an approved call may stay undispatched (the run lock busy) before the sweep alerts anyway
STILL_WAITING_ALERT_S = 300.0
#: statuses of a run that is over: an approved call left in one (an older build closed it) re-parks it
_OVER = ("done", "failed", "halted", "cancelled")


def why_it_waited(approval: Approval, grace_s: float = GRACE_S) -> str:
    """Why an approved call was not dispatched by its own resume task (for the alert)."""
    detail = approval.outcome_detail or ""
    if detail.startswith(RESUME_NOT_QUEUED):
        return f"its resume could not be queued when it was decided ({detail[len(RESUME_NOT_QUEUED) + 2:][:240]})"
    claim = SideEffect.objects.filter(key=approval.idempotency_key, status="claimed").first()
    if claim is not None:
        return (f"its dispatch started (claim {claim.pk}) and did not finish: the worker running it "
                f"({claim.worker or 'unknown'}) stopped; the claim is settled against the provider")
    vt = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout", 900)
    return (f"its resume task was queued but no worker finished it within {grace_s:g} s (the worker that took it died, "
            f"or the broker lost it); Redis would deliver an unacked task again only after its visibility timeout ({vt} s)")


def sweep_decided(grace_s: float = GRACE_S) -> list[dict]:
    """Resume every run holding a decision older than ``grace_s`` seconds that no task carried out:
    approved calls not dispatched (:func:`agent.runtime.approvals.undispatched`), and parked runs whose
    approvals are all decided. Returns one ``{"approval", "tool", "waited_s", "why", "status"}``
    per approved call it found. Never raises (one run's failure is logged; the next sweep tries
    it again).

    A run that an older build closed while one of its calls was approved and unrun is parked again
    first (its planner is not asked again: ``ended_at`` is kept, so ``resume_run`` dispatches the
    calls and closes it)."""
    now = clock.now()
    cutoff = now - timedelta(seconds=grace_s)
    stalled = list(undispatched().filter(decided_at__lt=cutoff).select_related("run", "decided_by")
                   .order_by("decided_at", "pk"))
    found = [{"approval": a.pk, "tool": a.tool, "target": (a.args or {}).get("instance_id") or "",
              "waited_s": (now - a.decided_at).total_seconds(), "why": why_it_waited(a, grace_s),
              "by": a.decided_by.username if a.decided_by_id else "an operator", "decided_at": a.decided_at}
             for a in stalled]
    for a in stalled:
        if a.run.status in _OVER:
            Run.objects.filter(pk=a.run_id, status=a.run.status).update(
                status="parked", ended_at=a.run.ended_at or now)
    run_ids = list(dict.fromkeys(a.run_id for a in stalled))
    run_ids += [pk for pk in Run.objects.filter(status="parked", approvals__decided_at__lt=cutoff)
                .exclude(approvals__status="waiting").values_list("pk", flat=True).distinct() if pk not in run_ids]
    for run_id in run_ids:
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            continue
        try:
            resume_run(run)
        except Exception:  # noqa: BLE001 — the run stays parked (resume_run); the next sweep tries again
            log.exception("sweep: resuming run %s failed", run.number)
    for entry in found:
        a = Approval.objects.filter(pk=entry["approval"]).first()
        entry["status"] = a.status if a is not None else "gone"
        _alert(entry, a)
    return found


def _alert(entry: dict, approval: Approval | None) -> None:
    """``approval_stalled``: what waited, how long, why, and what the sweep's dispatch did."""
    status = entry["status"]
    if status == "approved" and entry["waited_s"] < STILL_WAITING_ALERT_S:
        return  # a live run holds the lock, most likely: its own resume (or the next sweep) follows
    if status == "approved":
        outcome = "it is still not dispatched (the run lock is busy or its claim is open); the next sweep tries again"
    else:
        note = (approval.outcome_detail or "")[:200] if approval is not None else ""
        outcome = f"the monitor's sweep dispatched it: {status}" + (f" ({note})" if note and status != "executed" else "")
    raise_alert("approval_stalled",
                f"approval {entry['approval']} ({entry['tool']} {entry['target']}), approved by {entry['by']} at "
                f"{entry['decided_at']:%H:%M:%S} UTC, waited {entry['waited_s']:.0f} s undispatched: {entry['why']}; {outcome}",
                severity="P2", key=f"approval_stalled:{entry['approval']}")
