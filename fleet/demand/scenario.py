"""The ``scenario`` demand source: the demand signal of a replay file (docs/replay.md).

Built from the file's ``demand`` block and each ``fleet[]`` entry's ``worker`` (Curio's view of
that instance's worker). Worker names are instance ids (the scenario provider reports
``worker_name`` = instance id). ``idle_min`` becomes ``idle_since = now - idle_min`` on the
virtual clock, so guards can tell how long the queue has been empty.
"""

from datetime import timedelta

from fleet.clock import clock
from fleet.demand.base import DemandError, DemandReading, WorkerView, count_workers


class ScenarioDemandSource:
    """Reads demand from a scenario file's ``demand`` dict and ``fleet`` list.

    ``demand`` keys: ``state`` (ok | unknown | stale), ``active``, ``queued``, ``running``,
    ``workers_expected``, ``workers_live``, ``idle_min`` (minutes, None = not idle), ``backlog``,
    ``proof_s`` and ``loading_s`` (passed through to the reading), optional ``proofs_hr``. A replay's timeline
    replaces :attr:`demand` and changes :attr:`fleet` between cycles. ``state: unknown`` makes :meth:`read` raise :class:`DemandError` (the caller,
    ``fleet.demand.read_demand``, turns that into an unknown reading with every count None).
    """

    name = "scenario"

    def __init__(self, demand: dict | None, fleet: list[dict] | None = None):
        self.demand = dict(demand or {"state": "unknown"})
        self.fleet = list(fleet or [])
        self.reads = 0

    def read(self, instances=None) -> DemandReading:
        """One reading at the virtual clock's now. Worker counts are
        :func:`fleet.demand.base.count_workers` over ``instances`` and the fleet's workers (the
        startup grace included), unless the file states ``workers_expected``/``workers_live``."""
        self.reads += 1
        d = self.demand
        state = d.get("state", "ok")
        if state == "unknown":
            raise DemandError("scenario demand source: state unknown (the source could not be read)")
        now = clock.now()
        workers = {}
        for entry in self.fleet:
            w = entry.get("worker")
            if w is None:
                continue
            workers[entry["id"]] = WorkerView(
                name=entry["id"],
                live=bool(w.get("live", False)),
                unschedulable=bool(w.get("unschedulable", False)),
                owned_tasks=int(w.get("owned_tasks", 0) or 0),
                last_contact=now if w.get("live") else None,
            )
        if d.get("workers_expected") is None and d.get("workers_live") is None:
            counts = count_workers(instances or [], workers, now=now).fields()
        else:
            # the file states the counts the source reports: they stand as given, and dead is
            # expected minus live minus cordoned as in count_workers (WorkerCounts.dead)
            cordoned = sum(1 for w in workers.values() if w.unschedulable)
            expected, live = d.get("workers_expected"), d.get("workers_live")
            dead = None if expected is None or live is None else max(0, expected - live - cordoned)
            counts = {"workers_expected": expected, "workers_live": live, "workers_dead": dead,
                      "workers_cordoned": cordoned, "workers_starting": None}
        idle_min = d.get("idle_min")
        return DemandReading(
            state=state,
            queued=d.get("queued"),
            running=d.get("running"),
            **counts,
            proofs_hr=d.get("proofs_hr"),
            backlog=d.get("backlog"),
            proof_s=d.get("proof_s"),
            loading_s=d.get("loading_s"),
            taken_at=now,
            idle_since=None if idle_min is None else now - timedelta(minutes=float(idle_min)),
            workers=workers,
        )
