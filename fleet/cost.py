"""What the fleet costs: the rate each status bills, and spend to date from the time an instance
spent in each billed state.

Billing (vast.ai's instance docs): "Storage charges begin at creation. GPU charges begin when status reaches
running"; ``stopped`` is "halted — disk charges only"; ``frozen`` keeps paying GPU charges; destroy
"stops all billing". So an instance pays its ``dph`` while GPU-billed (:data:`GPU_BILLED`), its
``storage_dph`` in every other state until it is killed, and nothing after ``killed_at``.

Time in state comes from :class:`fleet.models.StatusChange` rows, written by :func:`track_saves`'s
receivers whenever an ``Instance`` is saved with a new status or new rates, and by the reconcile
for the rows it adopts (``bulk_create`` sends no signal). A row with no change row counts its
current status from ``status_since``; the time before the first known period (an adopted
instance's life before we saw it) counts at the storage rate.
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models.signals import post_init, post_save

from fleet.clock import clock
from fleet.models import FleetSample, Instance, StatusChange

#: statuses that pay the GPU rate ``dph`` (vast: running; frozen "paused with memory — GPU charges
#: apply"; a reboot keeps the machine's GPU rented)
GPU_BILLED = frozenset({"running", "frozen", "rebooting"})
#: statuses that pay nothing: the instance no longer exists at the provider
UNBILLED = frozenset({"destroyed"})
#: the fields whose change is a new billing period
_TRACKED = ("status", "dph", "storage_dph")


def rate(status: str, dph: float, storage_dph: float) -> float:
    """Dollars per hour an instance in ``status`` pays: ``dph`` when GPU-billed, 0 once destroyed,
    ``storage_dph`` otherwise (stopped, exited, loading, created, unknown, offline, error)."""
    if status in GPU_BILLED:
        return dph or 0.0
    if status in UNBILLED:
        return 0.0
    return storage_dph or 0.0


def instance_dph(inst) -> float:
    """What ``inst`` (an ``Instance``) costs per hour now: 0 once killed."""
    if inst.killed_at is not None:
        return 0.0
    return rate(inst.status, inst.dph, inst.storage_dph)


def fleet_dph(instances) -> float:
    """The fleet's current burn in $/hr: :func:`instance_dph` summed over ``instances``."""
    return sum(instance_dph(i) for i in instances)


@dataclass
class Spend:
    """One instance's (or the fleet's) spend: ``usd`` dollars, and ``seconds`` spent in each status
    (a dict status -> seconds), both over the accounted window."""

    usd: float = 0.0
    seconds: dict = field(default_factory=dict)

    def add(self, other: "Spend") -> None:
        self.usd += other.usd
        for k, v in other.seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v

    @property
    def gpu_hours(self) -> float:
        """Hours spent in GPU-billed statuses."""
        return sum(v for k, v in self.seconds.items() if k in GPU_BILLED) / 3600

    @property
    def storage_hours(self) -> float:
        """Hours spent paying storage only."""
        return sum(v for k, v in self.seconds.items() if k not in GPU_BILLED and k not in UNBILLED) / 3600


def periods(inst, changes) -> list[tuple[datetime, str, float, float]]:
    """``inst``'s billing periods as ``(start, status, dph, storage_dph)`` in time order, from its
    ``changes`` (its ``StatusChange`` rows, oldest first). The time before the first known period
    is storage-billed ``created``; a current status no change row records starts at ``status_since``."""
    out = [(c.at, c.status, c.dph, c.storage_dph) for c in changes]
    if not out or (out[-1][1], out[-1][2], out[-1][3]) != (inst.status, inst.dph, inst.storage_dph):
        if not out or inst.status_since >= out[-1][0]:
            out.append((inst.status_since, inst.status, inst.dph, inst.storage_dph))
    if out[0][0] > inst.created_at:
        out.insert(0, (inst.created_at, "created", out[0][2], out[0][3]))
    return out


def spend(inst, changes, now: datetime | None = None, since: datetime | None = None) -> Spend:
    """What ``inst`` cost from ``since`` (default: its creation) to ``now`` (default ``clock.now()``)
    or its ``killed_at``: each period's hours × :func:`rate`. ``changes`` as for :func:`periods`."""
    now = now or clock.now()
    end = min(inst.killed_at, now) if inst.killed_at is not None else now
    out = Spend()
    ps = periods(inst, changes)
    for n, (start, status, dph, storage_dph) in enumerate(ps):
        stop = ps[n + 1][0] if n + 1 < len(ps) else end
        start, stop = max(start, since or start, inst.created_at), min(stop, end)
        if stop <= start:
            continue
        secs = (stop - start).total_seconds()
        out.seconds[status] = out.seconds.get(status, 0.0) + secs
        out.usd += secs / 3600 * rate(status, dph, storage_dph)
    return out


def spend_by_instance(instances, now: datetime | None = None, since: datetime | None = None) -> dict[int, Spend]:
    """:func:`spend` of each of ``instances`` (keyed by pk), reading their change rows in one query."""
    now = now or clock.now()
    rows: dict[int, list] = {}
    for c in StatusChange.objects.filter(instance_id__in=[i.pk for i in instances]).order_by("instance_id", "at", "id"):
        rows.setdefault(c.instance_id, []).append(c)
    return {i.pk: spend(i, rows.get(i.pk, []), now, since) for i in instances}


def fleet_spend(instances, now: datetime | None = None, since: datetime | None = None) -> Spend:
    """The total of :func:`spend_by_instance` (killed instances included: they cost until killed)."""
    total = Spend()
    for s in spend_by_instance(instances, now, since).values():
        total.add(s)
    return total


def record_fleet_sample(instances, target_proofs_hr: float | None):
    """Store one :class:`fleet.models.FleetSample` for the cycle that saw ``instances`` (its
    non-killed ``Instance`` rows) under the objective ``target_proofs_hr``; returns it."""
    live = [i for i in instances if i.killed_at is None]
    return FleetSample.objects.create(
        taken_at=clock.now(),
        instances=len(live),
        running=sum(1 for i in live if i.status == "running"),
        dph=round(fleet_dph(live), 6),
        target_proofs_hr=target_proofs_hr,
    )


# -- the receivers that keep StatusChange rows -------------------------------------------------

def _remember(sender, instance, **kwargs) -> None:
    # __dict__, not getattr: a deferred field must not cost a query per loaded row
    instance._billed = tuple(instance.__dict__.get(f) for f in _TRACKED)


def _record(sender, instance, created, update_fields=None, raw=False, **kwargs) -> None:
    if raw or (update_fields is not None and not set(update_fields) & set(_TRACKED)):
        return
    now = tuple(instance.__dict__.get(f) for f in _TRACKED)
    before = getattr(instance, "_billed", None)
    if not created and before == now:
        return
    status_changed = created or before is None or before[0] != now[0]
    StatusChange.objects.create(
        instance=instance,
        at=instance.status_since if status_changed and instance.status_since else clock.now(),
        status=instance.status,
        dph=instance.dph or 0.0,
        storage_dph=instance.storage_dph or 0.0,
    )
    instance._billed = now


def track_saves() -> None:
    """Connect the receivers (``FleetConfig.ready``): every ``Instance.save()`` that changes its
    status, ``dph`` or ``storage_dph`` writes a :class:`fleet.models.StatusChange`."""
    post_init.connect(_remember, sender=Instance, dispatch_uid="fleet.cost.remember")
    post_save.connect(_record, sender=Instance, dispatch_uid="fleet.cost.record")
