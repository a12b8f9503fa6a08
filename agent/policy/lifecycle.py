"""Lifecycle rules that need the agent's records: calls that park whatever the policy says, and an
operator's rejection that still stands (docs/contract.md "Forced approval", ``rejected_recently``).
What an instance's status means (terminal, blind, worker live, starving) is ``fleet.lifecycle``.

- :func:`forced_approval` — calls that park whatever the policy says;
- :func:`recent_rejection` — an operator's "no" that still stands (``rejection_hold_min``).
"""

from datetime import timedelta

from agent.models import Approval
from fleet.clock import clock
from fleet.lifecycle import RETIRE_TOOLS, eligibility
from fleet.models import DemandSample


def forced_approval(tool: str, args: dict, world, *, injected: bool = False) -> str:
    """Why this side effect must park for an operator whatever the policy says ('' when it need not).

    docs/contract.md, Forced approval: any side effect in a run after that run raised
    ``prompt_injection`` (``injected``); stopping or destroying an instance whose dead worker still
    owns tasks; destroying a terminal instance while blind; stopping, rebooting or destroying an
    instance whose worker's identity is in doubt (``node_identity``: Curio's rows cannot tell its
    node apart from another's, so its liveness is unknown), by every actor, the monitor included.
    """
    if injected:
        return "this run saw instruction-like text (prompt_injection): every side effect needs an operator"
    if tool not in RETIRE_TOOLS:
        return ""
    inst = world.instance(str(args.get("instance_id", "")))
    if inst is None:
        return ""
    # the instance's own reasons are fleet.lifecycle.eligibility's (a refusal there parks nothing)
    return eligibility(inst, world, tool).park


def _demand_kind(sample) -> tuple[bool, int | None]:
    return sample.state == "ok", sample.queued


def demand_changed_since(when) -> bool:
    """Whether demand changed state after ``when``: ok ↔ unknown/stale, or the queue going from
    empty to non-empty (docs/contract.md ``rejected_recently``), judged on the recorded samples."""
    before = DemandSample.objects.filter(taken_at__lte=when).order_by("-taken_at", "-id").first()
    after = list(DemandSample.objects.filter(taken_at__gt=when).order_by("taken_at", "id"))
    if before is None:
        if not after:
            return False
        before, after = after[0], after[1:]
    ok, queued = _demand_kind(before)
    for s in after:
        s_ok, s_queued = _demand_kind(s)
        if s_ok != ok:
            return True
        if s_ok and queued == 0 and s_queued:
            return True
        if s_ok and s_queued is not None:
            queued = s_queued
    return False


def recent_rejection(tool: str, instance_id: str, world):
    """The operator's rejection of ``tool`` on ``instance_id`` that still stands, or None.

    It stands for every planner (and the monitor) until ``rejection_hold_min`` passes or demand
    changes state (:func:`demand_changed_since`).
    """
    since = clock.now() - timedelta(minutes=world.limits.rejection_hold_min)
    rows = Approval.objects.filter(tool=tool, status="rejected", decided_at__gt=since).order_by("-decided_at")
    for a in rows:
        if isinstance(a.args, dict) and a.args.get("instance_id") == instance_id:
            if not demand_changed_since(a.decided_at):
                return a
            return None
    return None
