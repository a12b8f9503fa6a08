"""The monitor's lifecycle rules: replace what is terminal, confirm a destroy, mind the orphans
(docs/contract.md, The cycle, step 2; docs/safety.md, The monitor is an actor like the agent).

Pure decisions over the cycle's world; ``agent.runtime.monitor_runner`` runs them through the same
policy table (``TOOL:monitor`` keys, its own default ``auto``), observe-only switch, guards,
forced approvals and idempotency as any call:

- a terminal instance is destroyed — which instances may be destroyed, and which are terminal,
  as the guards define it, in one place (``fleet.lifecycle.eligibility``, ``is_terminal``: a live worker is never terminal; ``exited`` only when we
  wanted it running; ``unknown``/``offline`` only after ``offline_grace_min``; stuck
  provisioning past ``provisioning_limit_min`` with a ``stuck_provisioning`` alert; a failed/host
  diagnosis on evidence from the machine);
- a destroy counts only once a re-list confirms it; unconfirmed after ``destroy_confirm_min``
  (15) minutes it raises ``destroy_unconfirmed`` and the destroy is sent again;
- an operator-owned SSH host is never destroyed;
- with ``WARDEN_ORPHANS=destroy``, an instance the reconcile adopted (labelled ours, no record:
  ``fleet.sync``) is destroyed, unless its label is one of our own launches (a launch whose
  answer was lost is ours, not an orphan: ``agent.policy.claims``). It is diagnosed first and goes
  through the guards like any destroy, so a machine whose worker serves queued work is not
  destroyed blind.
Instances missing from the provider's list are marked killed by ``fleet.sync`` (except those
younger than ``WARDEN_VANISH_GRACE_MIN``, which may not be listed yet).
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings

from fleet.clock import clock
from fleet.lifecycle import eligibility
from fleet.models import PENDING_STATUSES


@dataclass
class MonitorAction:
    """A call the monitor wants (``tool``, ``args``) and an alert to raise with it, if any."""

    tool: str
    args: dict
    alert: tuple[str, str] | None = None  # (kind, message)


def decide(world, ours: Callable[[set[str]], set[str]] = lambda labels: set()) -> list[MonitorAction]:
    """The monitor's actions for the cycle's ``world`` (``agent.runtime.observe.World``), in a stable order.

    ``ours(labels)``: those of ``labels`` that our own launches carry (the agent's claims know them:
    ``agent.policy.claims.our_launch_labels``); an adopted instance with such a label is not an orphan."""
    now = clock.now()
    confirm = timedelta(minutes=world.limits.destroy_confirm_min)
    actions = []
    orphans = _orphans(world, ours)
    for inst in sorted(world.instances, key=lambda i: i.external_id):
        elig = eligibility(inst, world, "destroy_instance", actor="monitor")
        if elig.code in ("target_gone", "owned_host"):  # a live worker's tasks are the guards' to refuse
            continue
        if inst.destroy_requested_at is not None:
            if now - inst.destroy_requested_at > confirm:
                limit = world.limits.destroy_confirm_min
                actions.append(MonitorAction(
                    "destroy_instance",
                    {"instance_id": inst.external_id, "reason": f"destroy unconfirmed after {limit:g} min; retrying"},
                    ("destroy_unconfirmed", f"{inst.external_id} (${inst.dph:.2f}/hr) still listed {limit:g} min after its destroy"),
                ))
            continue
        terminal, why = elig.terminal, elig.why
        if not terminal:
            if inst.pk in orphans:
                if world.fresh_diagnosis(inst) is None:  # the guards want one before any destroy of a non-terminal
                    actions.append(MonitorAction("diagnose_instance", {"instance_id": inst.external_id}))
                actions.append(MonitorAction("destroy_instance", {
                    "instance_id": inst.external_id,
                    "reason": f"orphan: labelled ours ({inst.label}) with no record of launching it; WARDEN_ORPHANS=destroy"}))
            continue
        alert = None
        if inst.status in PENDING_STATUSES:
            hours = (now - inst.status_since).total_seconds() / 3600
            alert = ("stuck_provisioning", f"{inst.external_id} stuck {inst.status or 'provisioning'} for {hours:.1f} h")
        actions.append(MonitorAction("destroy_instance", {"instance_id": inst.external_id, "reason": f"terminal: {why}"}, alert))
    return actions


def _orphans(world, ours: Callable[[set[str]], set[str]]) -> set[int]:
    """Primary keys of the adopted instances to destroy (``WARDEN_ORPHANS=destroy``); one call of ``ours``."""
    if settings.WARDEN.get("ORPHANS", "adopt") != "destroy":
        return set()
    adopted = {i.pk: i.label for i in world.instances
               if i.adopted_at is not None and i.killed_at is None and not i.is_owned_host}
    if not adopted:
        return set()
    # a provider may prefix the launch label (vast: WARDEN_VAST_LABEL_PREFIX before agent.policy.claims.launch_label)
    prefix = (getattr(settings, "VAST", None) or {}).get("LABEL_PREFIX") or ""
    bare = {pk: (lb[len(prefix):] if prefix and lb.startswith(prefix) else lb) for pk, lb in adopted.items()}
    known = ours({lb for lb in {*adopted.values(), *bare.values()} if lb})
    return {pk for pk, label in adopted.items() if label not in known and bare[pk] not in known}
