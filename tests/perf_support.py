"""A day of fleet history for the Machine Performance tab's tests: instances whose status changes
go through ``Instance.save()`` (so ``fleet.cost`` records them as it does live), and a demand and a
fleet sample every 10 minutes, with half an hour where demand was unknown."""

from datetime import timedelta

from fleet.harmony import HarmonyMachine, HarmonyMachineDetails, HarmonyTaskHistory
from fleet.models import DemandSample, FleetSample, Instance


def _instance(ext, gpu, dph, storage, created, history, killed=None) -> Instance:
    """``history``: [(hours before now, status)], the first at creation."""
    inst = Instance.objects.create(provider="rented", external_id=ext, worker_name=ext, gpu_name=gpu, dph=dph,
                                   storage_dph=storage, status=history[0][1], status_since=created, created_at=created)
    for at, status in history[1:]:
        inst.status, inst.status_since = status, at
        inst.save()
    if killed is not None:
        inst.killed_at, inst.killed_by, inst.kill_reason = killed, "monitor", "destroyed"
        inst.save(update_fields=["killed_at", "killed_by", "kill_reason"])
    return inst


def seed_day(now) -> dict[str, Instance]:
    """Four instances and 24 h of samples ending at ``now``; returns the instances by id."""
    h = lambda n: now - timedelta(hours=n)  # noqa: E731
    out = {
        "v-101": _instance("v-101", "RTX 4090", 0.40, 0.02, h(24), [(h(24), "loading"), (h(23.5), "running")]),
        "v-102": _instance("v-102", "A100", 1.60, 0.05, h(20), [(h(20), "loading"), (h(19.75), "running"), (h(8), "stopped")]),
        "v-103": _instance("v-103", "RTX 4090", 0.45, 0.03, h(40), [(h(40), "running"), (h(30), "stopped")]),
        "v-104": _instance("v-104", "A100", 1.50, 0.05, h(12), [(h(12), "running")], killed=h(6)),
    }
    demand, fleet = [], []
    for i in range(24 * 6 + 1):
        t = h(24) + timedelta(minutes=10 * i)
        hours_in = i / 6
        unknown = 19 <= hours_in < 19.5
        target = 120.0 if hours_in < 12 else 180.0
        running = 1 + (4 <= hours_in < 16) + (12 <= hours_in < 18)
        demand.append(DemandSample(
            taken_at=t, state="unknown" if unknown else "ok", error="harmony unreachable" if unknown else "",
            queued=None if unknown else max(0, 40 - i // 3), backlog=None if unknown else (i % 7),
            running=None if unknown else running, proofs_hr=None if unknown else 60.0 * running,
            workers_expected=None if unknown else running, workers_live=None if unknown else running,
            workers_dead=None if unknown else 0))
        fleet.append(FleetSample(taken_at=t, instances=running + 1, running=running,
                                 dph=round(0.4 * running + 0.05, 3), target_proofs_hr=target))
    DemandSample.objects.bulk_create(demand)
    FleetSample.objects.bulk_create(fleet)
    return out


def seed_proofs(now) -> None:
    """Curio task history on the ``harmony`` alias: v-101 (RTX 4090) proved 12 PoReps of 55–66 s,
    v-102 (A100) 8 of 25–32 s, in the last 20 hours (machine rows name them: the worker mapping)."""
    for ext, host, base, n in (("v-101", "10.1.0.1:12300", 55, 12), ("v-102", "10.1.0.2:12300", 25, 8)):
        m = HarmonyMachine.objects.using("harmony").create(last_contact=now, host_and_port=host)
        HarmonyMachineDetails.objects.using("harmony").create(machine=m, tasks="PoRep", machine_name=ext)
        for k in range(n):
            end = now - timedelta(hours=1 + k * 1.5)
            HarmonyTaskHistory.objects.using("harmony").create(
                task_id=k + 1, name="PoRep", posted=end - timedelta(minutes=5), work_start=end - timedelta(seconds=base + k),
                work_end=end, result=True, completed_by_host_and_port=host)
