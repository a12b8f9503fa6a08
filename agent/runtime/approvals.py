"""Operator decisions on parked calls: exactly once, durable, audited.

A decision is a conditional UPDATE ``waiting → approved|rejected`` (healthchecks' "the row is
the queue"): a double click, two operators at once or a replayed POST change the row once; the
others get :class:`DecisionError`. Execution happens later in ``agent.runtime.loop.resume_run``, where the
guards run again and the idempotency claim makes the side effect run at most once.
"""

from django.db import transaction

from agent.memory.store import remember
from agent.models import Approval
from fleet.audit import do_audit
from fleet.clock import clock
from fleet.events import emit


class DecisionError(ValueError):
    """The decision cannot be taken (already decided, expired, bad input); the message says why."""


def do_decide(approval: Approval, decision: str, actor: str, comment: str = "", user=None) -> Approval:
    """Approve or reject ``approval`` once. ``decision``: ``approve`` | ``reject``.

    A rejection needs a comment. Raises :class:`DecisionError` when the approval is no longer
    waiting (someone decided first, or it expired) or the input is bad.
    """
    if decision not in ("approve", "reject"):
        raise DecisionError("decision must be approve or reject")
    comment = (comment or "").strip()
    if decision == "reject" and not comment:
        raise DecisionError("a rejection needs a comment saying why")
    status = "approved" if decision == "approve" else "rejected"
    now = clock.now()
    with transaction.atomic():
        n = Approval.objects.filter(pk=approval.pk, status="waiting", expires_at__gte=now).update(
            status=status, decided_by=user, comment=comment[:2000], decided_at=now
        )
        if n != 1:
            current = Approval.objects.get(pk=approval.pk)
            if current.status == "waiting":
                raise DecisionError(f"approval {approval.pk} has expired")
            raise DecisionError(f"approval {approval.pk} was already {current.status}")
        do_audit(actor, f"{decision}_call", f"approval {approval.pk}", comment,
                 {"status": "waiting"}, {"status": status, "tool": approval.tool, "args": approval.args})
        if status == "rejected":
            remember_rejection(approval, actor, comment, now)
        emit("approvals-changed", "runs-changed")
    approval.refresh_from_db()
    return approval


def remember_rejection(approval: Approval, actor: str, comment: str, when) -> None:
    """Record an operator's rejection in the agent's memory (docs/agent.md, Memory): category
    ``rejection``, key ``TOOL INSTANCE``. The guard ``rejected_recently`` (``agent.policy.lifecycle``)
    is what enforces it; the fact lets every planner (and the model) know why."""
    target = (approval.args or {}).get("instance_id") or "any instance"
    remember("rejection", f"{approval.tool} {target}",
             f"{actor} rejected {approval.tool} on {target} at {when:%Y-%m-%d %H:%M} UTC: {comment}",
             importance=0.9, kind="fact", source="approvals")


#: the prefix of ``Approval.outcome_detail`` when a decision's resume could not be queued
#: (the broker was unreachable); the sweep (``agent.runtime.sweep``) reads it to say why the call waited
RESUME_NOT_QUEUED = "resume not queued"


def undispatched(run=None):
    """Approvals an operator approved whose call has not been dispatched yet (approval
    ``approved``, its step still ``parked``), optionally of one ``run``: a QuerySet.

    A run holding one is never closed ``done`` (``agent.runtime.runs.close_run``) and never expires it;
    the sweep (``agent.runtime.sweep.sweep_decided``) dispatches them."""
    qs = Approval.objects.filter(status="approved", step__outcome="parked")
    return qs.filter(run=run) if run is not None else qs


def note_resume_not_queued(approval_ids, why: str) -> None:
    """Record on each approval that its resume could not be queued (``why``, e.g. Redis
    unreachable): the decision is stored, the sweep dispatches it and its alert says why it waited."""
    Approval.objects.filter(pk__in=list(approval_ids)).update(outcome_detail=f"{RESUME_NOT_QUEUED}: {why}"[:2000])
