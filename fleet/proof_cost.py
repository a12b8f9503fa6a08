"""Proofs credited to the machine that made them, and dollars per proof for each GPU model.

Curio writes one ``harmony_task_history`` row per finished attempt, with the ``host:port`` of the
node that ran it (filecoin-project/curio ``harmony/harmonytask/task_type_handler.go``, the
completion record; the demo worker writes the same rows). At each observe the demand reader hands
over the successful proofs recorded since the last one credited (by history ``id``, which the
database assigns in insertion order); :func:`record_proof_credits` maps each proof's address to
the one Curio row that has it, that row's ``machine_name`` to our instance (``worker_name``, else
its id: the demand reader's mapping) and stores a :class:`fleet.models.ProofCredit` with the
instance, its GPU model and $/hr at that time. The credit stays when the instance stops or is
destroyed, so the Performance tab and the instance's timeline keep its proofs.

Per GPU model (:func:`proof_costs`): the proofs credited in the window, their median seconds, the
median GPU $/hr of the instances that proved them, and so the cost of one proof on a busy worker,
``$/hr × median s / 3600``.
"""

import statistics
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import Error as DbError
from django.db.models import Count, Q

from fleet.clock import clock
from fleet.demand import DemandError, get_source
from fleet.demand.curio import HarmonyDemandSource, _name_proofs
from fleet.harmony import HarmonyMachine, HarmonyMachineDetails
from fleet.models import CurioRead, Instance, ProofCredit

#: the window proofs are counted over
WINDOW = timedelta(hours=24)
#: at most this many of the newest credits are read
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


#: read marks older than this are pruned
MARKS_KEPT = timedelta(days=2)


def record_proof_credits(proofs: list[dict], instances=(), read_at=None) -> int:
    """Store a ``ProofCredit`` for each of ``proofs`` (the reader's ``new_proofs``: history id,
    task id, name, address, ``worker`` name or '', ``seconds``, ``work_end``, ``seen_at``) that has
    none yet; returns how many were stored. The worker name is matched to ``instances`` first,
    then to any instance of ours with that name, the newest (killed ones included: a proof seen
    after its machine was destroyed is still its). Two writers crediting the same proof store it
    once (``history_id`` is unique).

    ``read_at``: the database's clock at the read that found them; it is recorded as a
    ``CurioRead`` mark (every proof recorded before it is now credited) and each credit's
    ``seen_after`` is the mark before it — the two bound when the proof ended on the database's
    clock (``fleet.demand.curio.node_clock_offsets``)."""
    read_at = read_at or (proofs[0]["seen_at"] if proofs else None)
    prev = None
    if read_at is not None:
        prev = CurioRead.objects.filter(at__lt=read_at).order_by("-at").values_list("at", flat=True).first()
        CurioRead.objects.create(at=read_at)
        CurioRead.objects.filter(at__lt=read_at - MARKS_KEPT).delete()  # the offsets look back a day
    if not proofs:
        return 0
    by_name = {}
    for inst in sorted(instances, key=lambda i: i.created_at):
        by_name[inst.worker_name or inst.external_id] = inst
    missing = {p["worker"] for p in proofs if p["worker"] and p["worker"] not in by_name}
    if missing:
        for inst in Instance.objects.filter(Q(worker_name__in=missing) | Q(worker_name="", external_id__in=missing)
                                            ).order_by("created_at"):
            by_name[inst.worker_name or inst.external_id] = inst
    rows = []
    for p in proofs:
        inst = by_name.get(p["worker"]) if p["worker"] else None
        rows.append(ProofCredit(
            history_id=p["history_id"], task_id=p["task_id"], name=p["name"][:16], instance=inst,
            worker_name=p["worker"][:100], host_and_port=p["host_and_port"][:300],
            gpu_name=(inst.gpu_name if inst is not None else "")[:64], dph=inst.dph if inst is not None else None,
            seconds=p["seconds"], work_end=p["work_end"], seen_at=p["seen_at"] or clock.now(), seen_after=prev,
        ))
    return len(ProofCredit.objects.bulk_create(rows, ignore_conflicts=True))


def credit_new_proofs(source, instances=()) -> int:
    """Credit the proofs ``source`` (a ``HarmonyDemandSource``) recorded since the last credited
    one, outside an observe (the Performance tab shows up-to-date credits). Raises
    ``django.db.Error`` when Curio's tables cannot be read."""
    names = list(settings.WARDEN["TASK_NAMES"])
    proofs = source._new_proofs(names)
    if not proofs:
        return 0  # no mark either: nothing changed since the last one
    machines = list(HarmonyMachine.objects.using(source.using).values("id", "host_and_port"))
    details = list(HarmonyMachineDetails.objects.using(source.using).values("machine_id", "machine_name"))
    hosts: dict[str, int] = {}
    for m in machines:
        hosts[m["host_and_port"] or ""] = hosts.get(m["host_and_port"] or "", 0) + 1
    shared = {hp for hp, n in hosts.items() if n > 1}
    return record_proof_credits(_name_proofs(proofs, machines, details, shared), instances, read_at=proofs[0]["seen_at"])


def proof_costs(instances, window: timedelta = WINDOW, using: str | None = None) -> tuple[list[GpuProofCost], str]:
    """(per-GPU costs, sorted cheapest first, then unmatched; error) over the proofs credited in
    the last ``window`` (``ProofCredit.seen_at``, the database's clock when first seen; never a
    node's ``work_end``). New proofs in the active demand source's HarmonyDB are credited first
    (``instances`` helps match them; ``using`` overrides the source's alias). ``error`` is '' on
    success and says why nothing was measured otherwise (a demand source without HarmonyDB, or an
    unreadable table): the list is then empty, never a row of zeros. The GPU model and $/hr are
    each credit's, recorded when the proof was seen: a stopped or destroyed instance keeps its."""
    try:
        source = get_source()
    except DemandError as exc:
        return [], str(exc)
    if not isinstance(source, HarmonyDemandSource):
        return [], f"the demand source in use ({type(source).__name__}) has no task history"
    if using is not None:
        source = HarmonyDemandSource(using=using, kind=source.kind)
    try:
        credit_new_proofs(source, instances)
    except DbError as exc:
        return [], f"task history unreadable: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
    credits = list(ProofCredit.objects.filter(seen_at__gte=clock.now() - window, seconds__gt=0)
                   .order_by("-seen_at").values_list("instance_id", "gpu_name", "dph", "seconds")[:SAMPLE])
    seconds: dict[str, list[float]] = {}
    rates: dict[str, dict[int, float]] = {}
    for inst_id, gpu, dph, secs in credits:
        gpu = (gpu or "unknown GPU") if inst_id is not None else ""
        seconds.setdefault(gpu, []).append(secs)
        if inst_id is not None and dph is not None:
            rates.setdefault(gpu, {})[inst_id] = dph
    out = []
    for gpu, secs in seconds.items():
        med = statistics.median(secs)
        dph = statistics.median(rates[gpu].values()) if rates.get(gpu) else None
        out.append(GpuProofCost(gpu, len(secs), med, dph, dph * med / 3600 if dph is not None else None))
    out.sort(key=lambda c: (c.usd_per_proof is None, c.usd_per_proof or 0, c.gpu_name))
    return out, ""


def credited_proofs(since, until=None) -> dict[int | None, int]:
    """How many proofs were credited to each instance id (None: not ours) with ``seen_at`` in
    ``[since, until)`` (database clock)."""
    qs = ProofCredit.objects.filter(seen_at__gte=since)
    if until is not None:
        qs = qs.filter(seen_at__lt=until)
    return dict(qs.values_list("instance_id").annotate(n=Count("id")).order_by())
