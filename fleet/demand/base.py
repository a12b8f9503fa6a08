"""The demand reading every source returns, and the error it raises.

A failed read is ``state="unknown"`` with every count ``None`` — never zeros (docs/safety.md
invariant 7: a database that cannot be reached means demand unknown, not 0).
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings

from fleet.clock import clock


@dataclass
class WorkerView:
    """Curio's view of one worker: heartbeat ``live``, cordoned (``unschedulable``), tasks owned."""

    name: str
    live: bool
    unschedulable: bool = False
    owned_tasks: int = 0
    last_contact: datetime | None = None
    machine_id: int | None = None
    #: why this worker's identity is in doubt ('' when it is not): Curio's rows cannot tell it
    #: apart from another node (``node_identity``); its liveness is unknown then, never dead
    identity: str = ""


@dataclass
class DemandReading:
    """One read of demand.

    ``queued``: proving tasks no live worker owns (Curio: ``owner_id IS NULL``, plus tasks owned
    by a dead node, which Curio has not yet requeued). ``running``: tasks owned by live workers.
    ``workers_expected``: our instances that should be running a worker, past the startup grace.
    ``workers_live``: expected workers with a fresh heartbeat that are not cordoned.
    ``workers_dead``: expected minus live minus cordoned (a cordoned worker drains, it is not dead).
    ``workers_starting``: running instances still inside the startup grace whose worker has not
    heartbeated yet (a worker that heartbeats is live whatever the grace).
    ``proofs_hr``: the current rate, successful proofs per hour over the source's recent window,
    ``rate_window_s`` seconds long (None: the source does not say). ``idle_since``: since when the queue
    has been empty with nothing running, when the source knows (else the observer derives it
    from earlier samples).
    ``workers`` maps a worker name (our ``Instance.worker_name``) to its :class:`WorkerView`.

    ``backlog``: proving work waiting in Curio's pipeline tables with no queue row yet (Curio adds
    queue rows only while a node that can claim them is alive; docs/curio.md, Demand) — demand like ``queued``, reported separately: the sectors that can be proved now plus those
    that become provable within ``loading_s`` (the measured time from a launch to a live worker),
    so that a machine is live when they are due. ``backlog_not_due``: SDR sectors whose PoRep is not
    due yet (Curio queues it only once the chain reaches ``seed_epoch`` + 3); ``backlog_soon`` of
    them fall within ``loading_s`` and are in ``backlog``; the rest count for nothing.
    ``backlog_next_due_at``: when the first of them becomes due. ``chain_epoch``: the chain head
    epoch the read used (database clock and the network's genesis). ``proof_s``: measured median seconds per
    proof per worker over the recent window (None: not measured); ``proof_s_by_worker`` and
    ``proof_s_by_gpu``: the same median per worker name and per GPU model (None: not measured).
    ``unmatched``: worker rows that
    match none of our instances (empty ``machine_name`` or a name no instance has), each
    ``{"machine_id", "host_and_port", "name", "live", "cordoned", "owned_tasks"}`` — reported, never
    counted dead (None: unknown). ``shared_hosts``: ``host_and_port`` values several rows share
    (Curio registers by it: such nodes share cordon flags), each with the row ids.
    ``workers_unmatched_live``: live, not cordoned, proving-capable rows with no ``machine_name``
    (``CURIO_NODE_NAME`` unset): counted in ``workers_live`` and as capacity, never matched to an
    instance nor the target of an action (None: unknown).
    ``node_identity``: instances whose Curio node cannot be told apart from another's (two nodes
    behind one ``host_and_port`` share a row), each ``{"instance", "machine_id", "why"}``; their
    worker's liveness is unknown, never dead.
    ``unreadable`` maps each field the source could not read this time (its value is None) to why;
    the rest of the reading stands. ``source``: the demand source that answered (``curio``,
    ``local``, ``http``, ``scenario``), set by ``fleet.demand.read_demand``.
    """

    state: str
    queued: int | None = None
    running: int | None = None
    workers_expected: int | None = None
    workers_live: int | None = None
    workers_dead: int | None = None
    workers_cordoned: int | None = None
    workers_starting: int | None = None
    proofs_hr: float | None = None
    backlog: int | None = None
    backlog_not_due: int | None = None
    backlog_soon: int | None = None
    backlog_next_due_at: datetime | None = None
    chain_epoch: int | None = None
    loading_s: float | None = None
    workers_unmatched_live: int | None = None
    proof_s: float | None = None
    proof_s_by_worker: dict[str, float] | None = None
    proof_s_by_gpu: dict[str, float] | None = None
    rate_window_s: float | None = None
    oldest_queued_s: float | None = None
    idle_since: datetime | None = None
    error: str = ""
    taken_at: datetime | None = None
    workers: dict[str, WorkerView] = field(default_factory=dict)
    unmatched: list[dict] | None = field(default_factory=list)
    shared_hosts: dict[str, list[int]] = field(default_factory=dict)
    node_identity: list[dict] = field(default_factory=list)
    #: successful proofs Curio recorded since the last credited one, for ``fleet.proof_cost``
    #: (``record_proof_credits``): each {"history_id", "task_id", "name", "host_and_port",
    #: "worker", "seconds", "work_end", "seen_at"}; ``seen_at`` is the database's clock at the read
    new_proofs: list[dict] = field(default_factory=list)
    #: the database's clock when the task history was read (None: not read); the instant credits
    #: of this read are ``seen_at``
    history_at: datetime | None = None
    unreadable: dict[str, str] = field(default_factory=dict)
    source: str = ""

    @classmethod
    def unknown(cls, error: str, taken_at: datetime | None = None) -> "DemandReading":
        return cls(state="unknown", error=error, taken_at=taken_at, unmatched=None)


class DemandError(Exception):
    """The demand source could not be read (the caller turns it into ``state="unknown"``)."""


def in_startup_grace(inst, now: datetime, grace: timedelta) -> bool:
    """Whether ``inst`` started less than ``grace`` before ``now`` (``started_at``, else
    ``status_since``; neither known: still starting). Its worker is excused from heartbeating
    until then."""
    since = inst.started_at or inst.status_since
    return since is None or since > now - grace


@dataclass
class WorkerCounts:
    """The worker counts of one reading, from :func:`count_workers`.

    ``expected``: our running instances past the startup grace, or heartbeating already;
    ``live``: expected ones whose worker is live and not cordoned; ``cordoned``: expected, live
    and ``unschedulable`` (draining, not dead); ``starting``: running instances inside the grace
    whose worker is not live yet; ``rowless``: names of expected instances the source has no worker
    for (counted dead unless a source knows better: Curio's unnamed rows, a node identity in doubt).
    """

    expected: int
    live: int
    cordoned: int
    starting: int
    rowless: list[str]

    @property
    def dead(self) -> int:
        """Expected minus live minus cordoned (a cordoned worker drains, it is not dead)."""
        return self.expected - self.live - self.cordoned

    def fields(self) -> dict:
        """The counts as :class:`DemandReading` fields."""
        return {"workers_expected": self.expected, "workers_live": self.live, "workers_cordoned": self.cordoned,
                "workers_dead": self.dead, "workers_starting": self.starting}


def count_workers(instances, views: dict[str, WorkerView], *, now: datetime | None = None,
                  grace_s: float | None = None) -> WorkerCounts:
    """Count our workers: the one rule every demand source uses (``curio``, ``local``, ``http``,
    ``scenario``).

    ``instances``: our instances (rows or their likes: ``status``, ``killed_at``, ``worker_name``,
    ``external_id``, ``started_at``, ``status_since``); only non-killed ``running`` ones count.
    ``views``: worker name (an instance's ``worker_name``, else its ``external_id``) to the source's
    :class:`WorkerView`; an expected instance without one gets a ``live=False`` view added here.
    ``grace_s``: the startup grace, seconds (default ``WARDEN["STARTUP_GRACE_S"]``): a running
    instance inside it whose worker is not live yet is *starting*, neither expected nor dead; a
    worker that heartbeats is live whatever the grace.
    """
    now = now or clock.now()
    grace = timedelta(seconds=settings.WARDEN["STARTUP_GRACE_S"] if grace_s is None else grace_s)
    expected = live = cordoned = starting = 0
    rowless = []
    for inst in instances:
        if getattr(inst, "killed_at", None) is not None or inst.status != "running":
            continue
        name = inst.worker_name or inst.external_id
        view = views.get(name)
        if in_startup_grace(inst, now, grace) and not (view is not None and view.live):
            starting += 1
            continue
        expected += 1
        if view is None:
            views[name] = WorkerView(name=name, live=False)
            rowless.append(name)
        elif view.live and view.unschedulable:
            cordoned += 1
        elif view.live:
            live += 1
    return WorkerCounts(expected, live, cordoned, starting, rowless)
