"""Machines an instance of ours failed on, remembered so later offers leave them out.

SkyPilot's vast provisioner does the same (``excluded_machine_ids``): a
replacement on the machine that just failed is likely to fail again.
"""

from fleet.clock import clock
from fleet.models import FailedMachine


def remember_failure(inst, reason: str) -> FailedMachine | None:
    """Record that ``inst`` (an ``Instance``) failed on its machine; ``None`` when it has no
    ``machine_id``. A machine already recorded counts one more failure (once per instance)."""
    if not inst.machine_id:
        return None
    now = clock.now()
    row, created = FailedMachine.objects.get_or_create(
        provider=inst.provider, machine_id=inst.machine_id,
        defaults={"instance_ref": inst.external_id, "reason": reason[:500], "first_failed_at": now, "last_failed_at": now},
    )
    if not created and row.instance_ref != inst.external_id:
        row.failures += 1
        row.instance_ref, row.reason, row.last_failed_at = inst.external_id, reason[:500], now
        row.save(update_fields=["failures", "instance_ref", "reason", "last_failed_at"])
    return row


def excluded_machines(provider: str) -> set[str]:
    """The ``machine_id`` of every machine ``provider`` must not offer again (one query)."""
    return set(FailedMachine.objects.filter(provider=provider).values_list("machine_id", flat=True))
