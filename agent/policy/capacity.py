"""Money moves only on facts: the one count of capacity, the need, and a launch's facts priority.

Everything that decides whether a machine may be rented without an operator reads this module:
the ``rules`` planner's sizing (:func:`agent.planners.rules.sizing`), the pipeline when it scores a
launch or resume (:func:`agent.runtime.pipeline.score_turn`) and again when an approved one is dispatched
(:func:`agent.runtime.pipeline.dispatch_approved`, ``no_longer_needed``), the scale-down budget
(:func:`retire_budget`) and the approval cards. There is no second copy of these counts.

- **Capacity** (:func:`capacity`): workers live, plus instances *starting* — launched or resumed
  and not live yet (provisioning and not starving, or running inside ``startup_grace_s``). An
  instance whose worker is dead is not capacity whatever the provider says (it is being diagnosed,
  rebooted or replaced); terminal, draining (cordoned) instances and ones being destroyed are not
  either. Calls waiting for an operator's approval are not capacity.
- **The need** (:func:`need_for`): the sizing's ``min(max_instances, queued + backlog,
  max(1, ceil(target / per-worker rate)), workers that drain the queue within one loading time)``
  workers minus capacity, at least 0. The rule is the
  cluster autoscaler's "pending work over per-node throughput" (autoscaling on waiting work, never
  on a flag), with Curio's queue as the pending work.
- **The facts priority** (:func:`facts_priority`): ``P0`` when work waits and no worker is live,
  ``P1`` when work waits and a worker is live, ``P3`` when no work waits. ``P2`` is never derived.
  The policy key is the less urgent of the proposed and the facts priority (:func:`less_urgent`):
  a planner cannot make a launch urgent by saying so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db.models import Q

from agent.models import Step
from fleet.clock import clock
from fleet.lifecycle import blind, is_terminal, starving, worker_live
from fleet.models import PENDING_STATUSES

#: workers' worth of rate ignored before rounding up (measured proof times jitter by a few ms)
SIZING_SLACK = 0.05

#: launches and resumes are the calls that add capacity (and cost money by the hour)
CAPACITY_TOOLS = ("launch_instance", "resume_instance")


def per_worker_rate(demand) -> float:
    """Proofs/hr one worker delivers: ``3600 / proof_s`` from the measured seconds per proof
    (Curio's history, median of recent successful proofs) when known, else from the configured
    proof length (``WARDEN_PROOF_SECONDS``). Never below 1 proof/hr."""
    proof_s = getattr(demand, "proof_s", None)
    if proof_s:
        return max(1.0, 3600.0 / proof_s)
    return 3600.0 / max(1.0, settings.WARDEN["PROOF_SECONDS"])


def draining(inst, world) -> bool:
    """Whether ``inst`` is cordoned (Warden's record, or Curio's ``unschedulable`` on its worker):
    it finishes what it owns and takes no new work, so it is not capacity."""
    if getattr(inst, "cordoned", False):
        return True
    w = world.worker_for(inst)
    return bool(w is not None and w.unschedulable)


def work_waiting(world) -> int:
    """Queued + backlog proving tasks when demand reads ``ok``; 0 otherwise (blind: no work is
    known to wait, so nothing is urgent and nothing is sized)."""
    d = world.demand
    if d is None or d.state != "ok":
        return 0
    return (d.queued or 0) + (getattr(d, "backlog", 0) or 0)


@dataclass
class Capacity:
    """The one count of capacity on a world: ``live`` and ``starting`` instances (lists of
    ``fleet.models.Instance``), and ``dead``: running instances whose worker is not live past the
    grace (they are diagnosed, rebooted or replaced, never counted); ``unmatched``: live workers
    the demand source sees that match no instance of ours (Curio nodes with no ``CURIO_NODE_NAME``,
    ``DemandReading.workers_unmatched_live``). They prove, so they are capacity and end the
    emergency, but no action ever targets them."""

    live: list = field(default_factory=list)
    starting: list = field(default_factory=list)
    dead: list = field(default_factory=list)
    unmatched: int = 0

    @property
    def count(self) -> int:
        return len(self.live) + len(self.starting) + self.unmatched

    @property
    def instances(self) -> list:
        return [*self.live, *self.starting]

    def holds(self, inst) -> bool:
        """Whether ``inst`` is counted (live or starting)."""
        return any(i.pk == inst.pk for i in self.instances)


def _in_grace(inst, now, grace) -> bool:
    """Whether a running instance whose worker is not live yet is inside its startup grace: it has
    been ``running`` (``status_since``, our record of the status change: a resume or a launch that
    came up) for less than ``grace``. A time after ``now`` (a clock that disagrees) is no grace."""
    since = getattr(inst, "status_since", None)
    return since is not None and timedelta(0) <= now - since < grace


def capacity(world) -> Capacity:
    """Count capacity on ``world`` (see the module docstring). Per instance, from the demand
    source's view of its worker; a running instance the source gives no worker view of (a demand
    signal that reports only totals) is counted live up to the reading's ``workers_live`` total,
    and otherwise as starting inside the grace, else dead."""
    d = world.demand
    now = clock.now()
    grace = timedelta(seconds=world.limits.startup_grace_s)
    cap = Capacity()
    unviewed = []
    for inst in world.instances:
        if inst.killed_at is not None or inst.destroy_requested_at is not None:
            continue
        if is_terminal(inst, world)[0] or draining(inst, world):
            continue
        w = world.worker_for(inst)
        if inst.status in ("stopped", "exited") or inst.intended_status == "stopped":
            continue  # a heartbeat still in its window after a stop (or the process ending) is the last one
        if worker_live(inst, world):
            cap.live.append(inst)
        elif inst.status in PENDING_STATUSES and inst.status != "rebooting":
            if not starving(inst, world):
                cap.starting.append(inst)
        elif inst.status == "running":
            if w is None and not blind(world):
                unviewed.append(inst)
            elif _in_grace(inst, now, grace):
                cap.starting.append(inst)
            else:
                cap.dead.append(inst)
    absorbed = 0
    if unviewed:
        extra = max(0, (d.workers_live or 0) - len(cap.live)) if d is not None else 0
        cap.live += unviewed[:extra]
        absorbed = min(extra, len(unviewed))
        for inst in unviewed[extra:]:
            (cap.starting if _in_grace(inst, now, grace) else cap.dead).append(inst)
    if d is not None and not blind(world):
        # unnamed live workers first stand in for our instances the source has no row for (most
        # likely the same nodes, unnamed); the rest prove for us all the same and are capacity
        unmatched = max(0, int(getattr(d, "workers_unmatched_live", 0) or 0))
        cap.unmatched = max(0, unmatched - absorbed)
    return cap


@dataclass
class Need:
    """What the sizing asks for on one world: ``desired`` workers, the ``capacity`` counted
    (:class:`Capacity`), and ``ahead``: launches and resumes of this run dispatched or about to be
    (earlier in the batch) that the world does not show yet. ``workers`` is the need left."""

    desired: int
    capacity: Capacity
    ahead: int = 0

    @property
    def live(self) -> int:
        return len(self.capacity.live) + self.capacity.unmatched

    @property
    def starting(self) -> int:
        return len(self.capacity.starting) + self.ahead

    @property
    def counted(self) -> int:
        """Workers live or starting, counting the calls ahead."""
        return self.capacity.count + self.ahead

    @property
    def workers(self) -> int:
        """The need: desired minus counted, at least 0."""
        return max(0, self.desired - self.counted)

    def after(self, n: int) -> Need:
        """The same need with ``n`` more calls ahead of the next one."""
        return Need(self.desired, self.capacity, self.ahead + n)

    def words(self) -> str:
        """The need in the console's words: "the sizing asks for 3 workers; 1 live, 1 starting"."""
        return f"the sizing asks for {self.desired} worker{'s' if self.desired != 1 else ''}; {self.live} live, {self.starting} starting"

    def record(self, within: bool | None = None) -> dict:
        """The need as stored on a step and an approval (``within``: the call fit in it)."""
        out = {"workers": self.desired, "capacity": self.counted, "live": self.live, "starting": self.starting}
        if within is not None:
            out["within"] = within
        return out


def drain_workers(world, work: int) -> int | None:
    """Workers that drain ``work`` waiting tasks within one loading time: ``max(1, ceil(work ×
    proof seconds / loading_s))``, or None when the demand source does not say how long a launch
    takes to give a live worker (``DemandReading.loading_s``). A machine beyond this many would come
    up after the queue it was rented for has drained (the rehearsed days show it: five tasks at
    20 s a proof, sized by a 540/hr target, rented three machines and one came up idle)."""
    loading = getattr(world.demand, "loading_s", None)
    if not loading or loading <= 0:
        return None
    proof_s = 3600.0 / per_worker_rate(world.demand)
    return max(1, math.ceil(work * proof_s / loading - SIZING_SLACK))


def desired_workers(world) -> int:
    """The sizing rule alone: ``min(max_instances, work, max(1, ceil(target / rate)), drain)``
    workers while work waits (queued + backlog, demand ``ok``), else 0; ``drain`` is
    :func:`drain_workers` (left out when the loading time is not known). ``target / rate`` is
    rounded up after ignoring :data:`SIZING_SLACK` of a worker (a measured 20.006 s proof must not
    ask for a third worker where 2.0006 are due)."""
    work = work_waiting(world)
    if not work:
        return 0
    lim = world.limits
    want = max(1, math.ceil((lim.target_proofs_hr or 0) / per_worker_rate(world.demand) - SIZING_SLACK))
    drain = drain_workers(world, work)
    return min(lim.max_instances, work, want, *(() if drain is None else (drain,)))


def need_for(world, *, ahead: int = 0) -> Need:
    """The need on ``world``: :func:`desired_workers` minus :func:`capacity`, with ``ahead`` more
    calls counted as starting. The one function the rules planner, the pipeline and dispatch use."""
    return Need(desired_workers(world), capacity(world), ahead)


def facts_priority(world) -> str:
    """The runtime's priority of a launch on ``world``: ``P0`` when work waits and no worker is
    live (starting ones do not end the emergency: the need bounds how many launch), ``P1`` when
    work waits and a worker is live, ``P3`` when no work waits. Never ``P2``."""
    if not work_waiting(world):
        return "P3"
    cap = capacity(world)
    return "P1" if cap.live or cap.unmatched else "P0"


def less_urgent(a: str | None, b: str | None) -> str | None:
    """The less urgent of two priorities (``P3`` is the least urgent); an invalid one is ignored."""
    valid = [p for p in (a, b) if p in ("P0", "P1", "P2", "P3")]
    return max(valid) if valid else None


def priority_detail(proposed: str | None, facts: str) -> str:
    """"proposed P0, facts P1" when they differ, else ''."""
    return f"proposed {proposed}, facts {facts}" if proposed != facts else ""


def beyond_detail(need: Need) -> str:
    """The detail of a call beyond the need (the wording operators and scenarios read)."""
    return (f"beyond the need: the sizing asks for {need.desired} worker{'s' if need.desired != 1 else ''}, "
            f"{need.counted} {'is' if need.counted == 1 else 'are'} live or starting")


@dataclass
class RetireBudget:
    """The scale-down budget's state: ``used`` retirements of capacity in the window (executed or
    waiting for approval), ``total`` allowed, over ``window_min`` minutes, from ``base`` (W:
    capacity now plus what the window already retired) and ``pct``."""

    used: int
    total: int
    window_min: float
    base: int
    pct: float

    @property
    def left(self) -> int:
        return max(0, self.total - self.used)

    def words(self) -> str:
        """"2 of 2 retirements left in this window (15 min; 50% of 4 workers)"."""
        return (f"{self.left} of {self.total} retirement{'s' if self.total != 1 else ''} left in this window "
                f"({self.window_min:g} min; {self.pct:g}% of {self.base} worker{'s' if self.base != 1 else ''})")


def retire_budget(world, *, cap: Capacity | None = None, exclude_key: str = "", ahead: int = 0) -> RetireBudget:
    """The agent's scale-down budget on ``world`` (defence in depth against a misread signal, the
    "maximum unavailable" of a Kubernetes PodDisruptionBudget applied to a sliding window).

    Counts the agent's ``stop_instance`` / ``destroy_instance`` calls that retired capacity
    (``Step.facts["retires_capacity"]``, set when the call was scored) within the last
    ``retire_window_min`` minutes, executed or still waiting for an operator (rejected, expired or
    refused ones do not count), plus ``ahead`` earlier calls of the same batch; ``exclude_key``
    leaves out the call being dispatched itself. The total is ``max(1, floor(retire_budget_pct /
    100 × W))`` with W = capacity now + the executed retirements of the window."""
    lim = world.limits
    window = float(getattr(lim, "retire_window_min", 15))
    pct = float(getattr(lim, "retire_budget_pct", 50))
    cap = cap if cap is not None else capacity(world)
    since = clock.now() - timedelta(minutes=window)
    rows = (Step.objects.filter(kind="call", tool__in=["stop_instance", "destroy_instance"], actor="agent",
                                created_at__gte=since, facts__retires_capacity=True)
            .filter(Q(outcome__in=["executed", "approved_executed"])
                    | Q(outcome="parked", approval__status__in=["waiting", "approved"])))
    if exclude_key:
        rows = rows.exclude(idempotency_key=exclude_key)
    outcomes = list(rows.values_list("outcome", flat=True))
    retired = sum(1 for o in outcomes if o != "parked")
    base = cap.count + retired
    total = max(1, math.floor(pct / 100.0 * base + 1e-9))
    return RetireBudget(used=len(outcomes) + ahead, total=total, window_min=window, base=base, pct=pct)

