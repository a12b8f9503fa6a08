"""Lifecycle truth: what an instance's status means, in one place for the guards, the monitor, the
``rules`` planner and the console (docs/contract.md: Terminal, Blind mode, Forced approval,
Starvation, ``rejected_recently``).

Every number comes from ``agent.policy.DEFAULT_LIMITS`` (settable as objectives):
``offline_grace_min``, ``provisioning_limit_min``, ``starve_min``, ``rejection_hold_min``.

- :func:`blind` — demand is not ``ok``: Warden cannot see its workers;
- :func:`worker_live` — a recent heartbeat, and not blind (blind: liveness unknown, not live);
- :func:`is_terminal` — replace, don't scale down (a live worker is never terminal);
- :func:`starving` — a pending launch that no longer blocks the next one;
- :func:`forced_approval` — calls that park whatever the policy says;
- :func:`recent_rejection` — an operator's "no" that still stands.
"""

from datetime import timedelta

from fleet.clock import clock
from fleet.models import PENDING_STATUSES

#: a diagnosis cause that only restates the provider's status (fleet.diagnostics.judge)
_RESTATES_PROVIDER = "provider reports"
#: evidence keys that are not from the machine itself
_NOT_MACHINE = {"provider", "worker", "ssh"}


def blind(world) -> bool:
    """True while demand is not ``ok`` (unknown or stale): worker liveness is unknown then."""
    return world.demand is None or world.demand.state != "ok"


def worker_live(inst, world) -> bool:
    """Whether ``inst``'s worker has a recent heartbeat; always False while :func:`blind`."""
    if blind(world):
        return False
    w = world.worker_for(inst)
    return bool(w is not None and w.live)


def from_machine(diag) -> bool:
    """A diagnosis resting on evidence from the machine itself (SSH answers), not one that only
    restates the provider's status (a diagnosis that only restates the provider's
    status does not count: docs/contract.md, Terminal)."""
    if diag.source != "ssh" or (diag.cause or "").startswith(_RESTATES_PROVIDER):
        return False
    return any(
        k not in _NOT_MACHINE and isinstance(v, dict) and v.get("rc") not in (None, 127) and not v.get("ssh_error")
        for k, v in (diag.evidence or {}).items()
    )


def is_terminal(inst, world) -> tuple[bool, str]:
    """Whether ``inst`` is terminal (retiring it is a replacement, not a scale-down), with why.

    docs/contract.md, Terminal: only when its worker is not live (:func:`worker_live`) and
    (the status rules never apply to one we stopped, intended ``stopped``: it is resumed, not
    destroyed, whatever status the provider shows)
    - its provider status is ``error``;
    - it is ``exited`` while its intended status is ``running`` (one we stopped is resumed);
    - it has been ``unknown``/``offline`` longer than ``offline_grace_min``;
    - it is stuck provisioning past ``provisioning_limit_min``;
    - its latest fresh diagnosis is failed/host on evidence from the machine (:func:`from_machine`).
    """
    if inst.killed_at is not None or worker_live(inst, world):
        return False, ""
    lim, now = world.limits, clock.now()
    # one we stopped is resumed, not destroyed, whatever status the provider shows: only
    # the machine's own evidence (the diagnosis rule below) makes it terminal
    status = None if inst.intended_status == "stopped" else inst.status
    if status == "error":
        return True, "provider status error"
    if status == "exited" and (inst.intended_status or "running") == "running":
        return True, "provider status exited (intended running)"
    if status in ("unknown", "offline"):
        since = (now - inst.status_since).total_seconds() / 60
        if since > lim.offline_grace_min:
            return True, f"provider status {status} for {since:.0f} min (grace {lim.offline_grace_min:g} min)"
        return False, ""
    if status is not None and status in PENDING_STATUSES and now - inst.status_since > timedelta(minutes=lim.provisioning_limit_min):
        return True, f"stuck {status or 'provisioning'} past {lim.provisioning_limit_min:g} min"
    d = world.fresh_diagnosis(inst)
    if d is not None and d.health == "failed" and d.fault_class == "host" and from_machine(d):
        return True, f"diagnosed failed (host): {d.cause}"
    return False, ""


def starving(inst, world) -> bool:
    """A launch pending longer than ``starve_min`` while tasks are queued and no worker is live.

    It stops counting for ``launch_pending`` (and as capacity for sizing); it still counts toward
    the instance cap until destroyed (docs/contract.md, Starvation).
    """
    d = world.demand
    if inst.killed_at is not None or inst.status not in PENDING_STATUSES or inst.status == "rebooting":
        return False
    if blind(world) or not (d.queued or getattr(d, "backlog", 0)) or d.workers_live:
        return False
    return clock.now() - inst.created_at > timedelta(minutes=world.limits.starve_min)


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
    if tool not in ("stop_instance", "destroy_instance", "reboot_instance"):
        return ""
    inst = world.instance(str(args.get("instance_id", "")))
    if inst is None or inst.killed_at is not None:
        return ""
    w = world.worker_for(inst)
    if w is not None and getattr(w, "identity", ""):
        return f"{inst.external_id}'s worker identity is in doubt (node_identity): {w.identity}"
    if tool == "reboot_instance":
        return ""
    if w is not None and w.owned_tasks and not worker_live(inst, world):
        return f"{inst.external_id}'s dead worker still owns {w.owned_tasks} task(s)"
    if tool == "destroy_instance" and blind(world) and is_terminal(inst, world)[0]:
        return f"demand is {world.demand.state if world.demand else 'unknown'} (blind): a terminal instance is destroyed only with an operator's approval"
    return ""


def _demand_kind(sample) -> tuple[bool, int | None]:
    return sample.state == "ok", sample.queued


def demand_changed_since(when) -> bool:
    """Whether demand changed state after ``when``: ok ↔ unknown/stale, or the queue going from
    empty to non-empty (docs/contract.md ``rejected_recently``), judged on the recorded samples."""
    from fleet.models import DemandSample

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
    from agent.models import Approval

    since = clock.now() - timedelta(minutes=world.limits.rejection_hold_min)
    rows = Approval.objects.filter(tool=tool, status="rejected", decided_at__gt=since).order_by("-decided_at")
    for a in rows:
        if isinstance(a.args, dict) and a.args.get("instance_id") == instance_id:
            if not demand_changed_since(a.decided_at):
                return a
            return None
    return None
