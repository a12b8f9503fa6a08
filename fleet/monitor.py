"""The monitor's lifecycle rules (seed 002; autoscalers.md §1.7 rules 7–9).

Pure decisions over our instance rows; the agent's pipeline executes them (same guards and
idempotency as any call, no approval: these rules are the monitor's policy):

- an instance whose provider status is exited, error, unknown or offline is destroyed;
- one stuck in created, loading or scheduling for more than the provisioning limit (3 h) is
  destroyed, with a ``stuck_provisioning`` alert;
- a destroy counts only once a re-list confirms it; unconfirmed after 15 minutes it raises
  ``destroy_unconfirmed`` (and the destroy is retried);
- an operator-owned SSH host is never destroyed.
Instances missing from the provider's list are marked killed by ``fleet.sync`` (except those
created in the last 10 minutes, which are still pending).
"""

from dataclasses import dataclass
from datetime import timedelta

from fleet.clock import clock
from fleet.models import TERMINAL_STATUSES, Instance

STUCK_STATUSES = {"created", "loading", "scheduling"}
DESTROY_CONFIRM_LIMIT = timedelta(minutes=15)


@dataclass
class MonitorAction:
    """A call the monitor wants (``tool``, ``args``) and an alert to raise with it, if any."""

    tool: str
    args: dict
    alert: tuple[str, str] | None = None  # (kind, message)


def decide(instances: list[Instance], *, provisioning_limit_min: float = 180) -> list[MonitorAction]:
    """The monitor's actions for ``instances`` (non-killed rows), in a stable order."""
    now = clock.now()
    limit = timedelta(minutes=provisioning_limit_min)
    actions = []
    for inst in sorted(instances, key=lambda i: i.external_id):
        if inst.killed_at is not None or inst.is_owned_host:
            continue
        if inst.destroy_requested_at is not None:
            if now - inst.destroy_requested_at > DESTROY_CONFIRM_LIMIT:
                actions.append(MonitorAction(
                    "destroy_instance",
                    {"instance_id": inst.external_id, "reason": "destroy unconfirmed after 15 min; retrying"},
                    ("destroy_unconfirmed", f"{inst.external_id} (${inst.dph:.2f}/hr) still listed 15 min after its destroy"),
                ))
            continue
        if inst.status in TERMINAL_STATUSES:
            actions.append(MonitorAction(
                "destroy_instance", {"instance_id": inst.external_id, "reason": f"terminal: provider status {inst.status}"}
            ))
        elif inst.status in STUCK_STATUSES and now - inst.status_since > limit:
            hours = (now - inst.status_since).total_seconds() / 3600
            actions.append(MonitorAction(
                "destroy_instance",
                {"instance_id": inst.external_id, "reason": f"stuck {inst.status} for {hours:.1f} h"},
                ("stuck_provisioning", f"{inst.external_id} stuck {inst.status} for {hours:.1f} h; destroying"),
            ))
    return actions
