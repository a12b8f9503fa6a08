"""Dollars per proof for each GPU model, from the proofs our instances completed.

Curio writes one ``harmony_task_history`` row per finished attempt, with the ``host:port`` of the
node that ran it (curio.md; the demo worker writes the same rows). That address is mapped to a
machine name through ``harmony_machines`` and ``harmony_machine_details``, the name to our
instance (``worker_name``, else its id: the same mapping the demand reader uses) and the instance
to its GPU model. Per model: the proofs counted in the window, their median seconds, the median
GPU $/hr of the instances that proved them, and so the cost of one proof on a busy worker,
``$/hr × median s / 3600``.
"""

import statistics
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError
from django.db.models import DurationField, ExpressionWrapper, F
from django.db.models.functions import Now

from fleet.harmony import HarmonyMachine, HarmonyMachineDetails, HarmonyTaskHistory

#: the window proofs are counted over
WINDOW = timedelta(hours=24)
#: at most this many of the newest proofs are read
SAMPLE = 5000


@dataclass
class GpuProofCost:
    """One GPU model's proving cost: ``proofs`` in the window, ``proof_s`` their median seconds,
    ``dph`` the median $/hr of its instances that proved, ``usd_per_proof`` = dph × proof_s / 3600
    (None when ``dph`` is unknown: proofs by a worker no instance of ours matches)."""

    gpu_name: str
    proofs: int
    proof_s: float
    dph: float | None
    usd_per_proof: float | None


def proof_costs(instances, window: timedelta = WINDOW, using: str | None = None) -> tuple[list[GpuProofCost], str]:
    """(per-GPU costs, sorted cheapest first, then unmatched; error) for ``instances`` (``Instance``
    rows, killed ones included: they proved while alive), read from the active demand source's
    HarmonyDB (``fleet.demand.get_source()``; ``using`` overrides its alias). ``error`` is '' on
    success and says why nothing was measured otherwise (a demand source without HarmonyDB, or an
    unreadable table): the list is then empty, never a row of zeros."""
    from fleet.demand import DemandError, get_source
    from fleet.demand.curio import HarmonyDemandSource

    try:
        source = get_source()
    except DemandError as exc:
        return [], str(exc)
    if not isinstance(source, HarmonyDemandSource):
        return [], f"the demand source in use ({type(source).__name__}) has no task history"
    using = source.using if using is None else using
    names = list(settings.WARDEN["TASK_NAMES"])
    try:
        spans = list(
            HarmonyTaskHistory.objects.using(using)
            .filter(result=True, name__in=names, work_end__gte=Now() - window, work_end__lte=Now())
            .annotate(span=ExpressionWrapper(F("work_end") - F("work_start"), output_field=DurationField()))
            .order_by("-work_end")
            .values_list("completed_by_host_and_port", "span")[:SAMPLE]
        )
        machines = dict(HarmonyMachine.objects.using(using).values_list("id", "host_and_port"))
        named = dict(HarmonyMachineDetails.objects.using(using).values_list("machine_id", "machine_name"))
    except DatabaseError as exc:
        return [], f"task history unreadable: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
    name_at = {hp: named.get(mid) for mid, hp in sorted(machines.items()) if named.get(mid)}
    by_worker = {}
    for inst in sorted(instances, key=lambda i: i.created_at):  # the newest instance of a name wins
        by_worker[inst.worker_name or inst.external_id] = inst
    seconds: dict[str, list[float]] = {}
    rates: dict[str, dict[int, float]] = {}
    for hp, span in spans:
        if span is None or span.total_seconds() <= 0:
            continue
        inst = by_worker.get(name_at.get(hp or "", ""))
        gpu = (inst.gpu_name or "unknown GPU") if inst is not None else ""
        seconds.setdefault(gpu, []).append(span.total_seconds())
        if inst is not None:
            rates.setdefault(gpu, {})[inst.pk] = inst.dph
    out = []
    for gpu, secs in seconds.items():
        med = statistics.median(secs)
        dph = statistics.median(rates[gpu].values()) if rates.get(gpu) else None
        out.append(GpuProofCost(gpu, len(secs), med, dph, dph * med / 3600 if dph is not None else None))
    out.sort(key=lambda c: (c.usd_per_proof is None, c.usd_per_proof or 0, c.gpu_name))
    return out, ""
