"""A cordon is Warden's state (docs/curio.md, Grants: Warden may write only the cordon flag): ``Instance.cordoned`` records it, and it is put back
on the worker whenever the worker could have lost it.

Curio keeps its cordon bit in ``harmony_machines.unschedulable``; a node that restarts
re-registers schedulable. So after a reboot or resume (``agent.actions.instances.do_instance_action``) and
at every observe (a re-registration can happen any time), :func:`reapply` sets the bit again on
every cordoned instance's worker. The local provider also starts a cordoned worker with
``--cordoned``, so it never claims a task between its start and the next re-application.
"""

from fleet.audit import do_audit
from fleet.harmony import HARMONY_ALIAS, HarmonyMachine, HarmonyMachineDetails


def reapply(instances) -> list[str]:
    """Set ``unschedulable`` again on the workers of cordoned ``instances`` that lost it.

    Returns the external ids re-cordoned (each audited as ``cordon_reapplied``). Raises
    ``DatabaseError`` when the harmony database cannot be written.
    """
    cordoned = {i.worker_name or i.external_id: i for i in instances if i.cordoned and i.killed_at is None}
    if not cordoned:
        return []
    lost = dict(
        HarmonyMachineDetails.objects.using(HARMONY_ALIAS)
        .filter(machine_name__in=list(cordoned), machine__unschedulable=False)
        .values_list("machine_id", "machine_name")
    )
    if not lost:
        return []
    HarmonyMachine.objects.using(HARMONY_ALIAS).filter(id__in=list(lost)).update(unschedulable=True)
    names = sorted({cordoned[n].external_id for n in lost.values()})
    for ext in names:
        do_audit("system", "cordon_reapplied", ext, "the worker came back schedulable; Warden's cordon stands", None,
                 {"unschedulable": True})
    return names
