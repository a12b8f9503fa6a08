"""Lifecycle truth the fleet itself needs: what an instance's status means, in one place for the
guards, the monitor, the ``rules`` planner and the console (docs/contract.md "Terminal", "Blind
mode", "Starvation").

Every number comes from the run's limits (``world.limits``, ``agent.policy.table.effective_limits``):
``offline_grace_min``, ``provisioning_limit_min``, ``starve_min``.

- :func:`blind` — demand is not ``ok``: Warden cannot see its workers;
- :func:`worker_live` — a recent heartbeat, and not blind (blind: liveness unknown, not live);
- :func:`is_terminal` — replace, don't scale down (a live worker is never terminal);
- :func:`starving` — a pending launch that no longer blocks the next one;
- :func:`eligibility` — whether an instance may be stopped, destroyed or rebooted now, and
  whether that is a replacement (terminal) or a scale-down: the one answer the guards, the
  forced approvals, the monitor, the ``rules`` planner and the ssh provider read.

It lives in ``fleet`` (the lowest layer) because the monitor's rules (``fleet.monitor``) read it;
``agent.policy.lifecycle`` keeps what needs the agent's records (forced approval, a rejection that stands).
"""

from dataclasses import dataclass
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


#: the tools whose target's eligibility :func:`eligibility` decides
RETIRE_TOOLS = ("stop_instance", "destroy_instance", "reboot_instance")


@dataclass(frozen=True)
class Eligibility:
    """:func:`eligibility`'s answer for one (instance, tool).

    ``code``/``detail``: the refusal that applies ('' when none), one of ``target_gone`` (killed),
    ``owned_host`` (a destroy of an operator-owned host) or ``owned_tasks`` (a live worker owns
    tasks: they would be lost with it); ``park``: why an operator must approve it whatever the
    policy says ('' when none: docs/contract.md, Forced approval); ``terminal``/``why``: retiring
    it replaces a terminal instance (:func:`is_terminal`, or a destroy already decided and
    re-sent), it is not a scale-down."""

    code: str = ""
    detail: str = ""
    park: str = ""
    terminal: bool = False
    why: str = ""

    @property
    def ok(self) -> bool:
        """No refusal applies (it may still park: :attr:`park`)."""
        return not self.code


def eligibility(inst, world, tool: str, *, actor: str = "agent") -> Eligibility:
    """When ``inst`` may be stopped, destroyed or rebooted (``tool``), in one place
    (docs/contract.md: guards ``target_gone``, ``owned_host``, ``owned_tasks``; Terminal; Forced
    approval).

    ``inst`` is a ``fleet.models.Instance`` (or any object with its fields); ``world`` the cycle's
    (``agent.runtime.observe.World``), or ``None`` where only the record is known (a provider refusing a
    destroy): then only ``target_gone`` and ``owned_host`` are judged. Any other ``tool`` is judged
    only for ``target_gone``. In order:

    - killed (destroyed and confirmed, or vanished): ``target_gone``, for every tool;
    - a destroy of an operator-owned SSH host: ``owned_host``, for every actor;
    - a live worker that owns tasks (stop, destroy, reboot): ``owned_tasks``;
    - parks: a worker whose identity is in doubt (``node_identity``: its liveness is unknown);
      a dead worker that still owns tasks (stop, destroy); a terminal instance destroyed while
      :func:`blind`.

    Never raises for a missing worker or demand (they make no refusal of their own).
    """
    if inst.killed_at is not None:
        return Eligibility("target_gone", f"{inst.external_id} is gone ({inst.kill_reason or 'killed'}, "
                                          f"{inst.killed_by or 'unknown'})")
    terminal, why = is_terminal(inst, world) if world is not None and tool in RETIRE_TOOLS else (False, "")
    if tool == "destroy_instance" and inst.destroy_requested_at is not None:
        terminal = True  # a destroy already decided, re-sent (destroy_unconfirmed): not a new scale-down
        why = why or "destroy already requested"
    if tool == "destroy_instance" and inst.is_owned_host:
        return Eligibility("owned_host", f"{inst.external_id} is an operator-owned SSH host; "
                                         f"it is never destroyed by {actor}", terminal=terminal, why=why)
    if world is None or tool not in RETIRE_TOOLS:
        return Eligibility()
    w = world.worker_for(inst)
    owned = (w.owned_tasks or 0) if w is not None else 0
    live = worker_live(inst, world)
    doubt = ""
    if w is not None and getattr(w, "identity", ""):
        doubt = f"{inst.external_id}'s worker identity is in doubt (node_identity): {w.identity}"
    if owned and live:
        detail = (f"{inst.external_id}'s live worker owns {owned} task(s); a reboot would lose them"
                  if tool == "reboot_instance" else f"{inst.external_id}'s worker owns {owned} task(s); cordon and drain first")
        # the refusal stands; an identity in doubt still parks whatever the refusal leaves
        return Eligibility("owned_tasks", detail, park=doubt, terminal=terminal, why=why)
    if doubt:
        return Eligibility(park=doubt, terminal=terminal, why=why)
    park = ""
    if tool != "reboot_instance" and owned and not live:
        park = f"{inst.external_id}'s dead worker still owns {owned} task(s)"
    elif tool == "destroy_instance" and blind(world) and is_terminal(inst, world)[0]:
        park = (f"demand is {world.demand.state if world.demand else 'unknown'} (blind): a terminal instance "
                "is destroyed only with an operator's approval")
    return Eligibility(park=park, terminal=terminal, why=why)
