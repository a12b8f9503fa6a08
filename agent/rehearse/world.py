# Over 500 lines on purpose: the market and the work move on one virtual clock and share its events (docs/rehearse.md).
"""The rehearsal's world: the market (a scenario provider that loads, fails and prices like the
day file says) and Curio's side (tasks, workers, sealing sectors), moved along the virtual clock.

The product never reads this module: it reaches the market through ``fleet.providers``
(:class:`DayProvider`, an extended ``scenario`` provider) and the work through ``fleet.demand``
(:class:`DayDemand`, an extended ``scenario`` demand source whose counts — queued, running, workers
expected and live, idle since, backlog, measured proof seconds — are those this world holds at the
moment of the read). Everything random comes from one ``random.Random(seed)`` per purpose, so the
same day file gives the same arrivals, loading times and faults whatever the policy under test.

Curio's rules as simulated (docs/curio.md): a worker claims one task at a time, only while live;
the task a dead worker owns stays owned (counted queued, not running) until ``looks_dead_s`` after
its last heartbeat, then requeues; an SDR sector's PoRep is due at its seed epoch, and queue rows
exist only while a live worker can claim them (before that it is the pipeline's backlog).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings

from agent.policy.table import effective_limits
from fleet.clock import clock
from fleet.demand.scenario import ScenarioDemandSource
from fleet.providers.scenario import ScenarioProvider

#: hours in a month, for disk $/GB-month → $/hr (vast.ai bills storage by the month of 730 h)
HOURS_PER_MONTH = 730.0
#: the SSH answer of a healthy machine (diagnosis reads the GPU list)
HEALTHY_SSH = {"reachable": True, "commands": {"nvidia-smi -L": {
    "rc": 0, "out": "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-00000000-0000-0000-0000-000000000001)"}}}


def lognormal(rng: random.Random, median: float, p95: float) -> float:
    """A lognormal sample with that median and 95th percentile (sigma = ln(p95/median)/1.645)."""
    if p95 <= median:
        return median
    sigma = math.log(p95 / median) / 1.6448536
    return median * math.exp(rng.gauss(0.0, sigma))


@dataclass
class Task:
    """One proving task: ``arrived`` (s since start), ``due`` (s; sealing: when its PoRep is due),
    ``claimed`` and ``done`` (s, None until then), ``factor`` (its type's proof-time factor);
    once done, ``took`` (s, the proof's drawn duration) and ``gpu`` (the GPU model that proved it)."""

    id: int
    type: str
    arrived: float
    factor: float = 1.0
    due: float = 0.0
    claimed: float | None = None
    done: float | None = None
    owner: str = ""
    took: float = 0.0
    gpu: str = ""


@dataclass
class Machine:
    """One rented instance as the world knows it (the provider's dict holds what the product sees)."""

    id: str
    gpu: str
    dph: float
    disk_dph: float
    interruptible: bool
    born: float
    running_since: float | None = None
    worker_live_at: float | None = None  # when its worker's first heartbeat comes (None: no worker)
    worker_dead: bool = False
    last_heartbeat: float | None = None
    task: Task | None = None
    gone: float | None = None  # destroyed at
    stopped: bool = False
    stuck: bool = False  # a launch that never leaves loading
    launched: bool = False  # rented during the day (not the starting fleet)
    epoch: int = 0  # bumps on every change, so stale scheduled events are skipped
    events: list = field(default_factory=list)


class DayProvider(ScenarioProvider):
    """The ``scenario`` provider with the day's market: a launch loads for a sampled time (or
    forever: ``stuck_loading_fraction``), a running instance can fail or be preempted, a destroy
    can fail to take, stop and resume take their time; offers come back when a machine is
    destroyed and follow the day's price changes. Every change is reported to :class:`DayWorld`."""

    def __init__(self, world: DayWorld, offers: list[dict]):
        super().__init__([], offers, [], name="scenario")
        self.world = world

    def launch(self, *, gpu_name: str = "", offer_id: str = "", label: str = ""):
        view = super().launch(gpu_name=gpu_name, offer_id=offer_id, label=label)
        self.world.launched(view.external_id, self.instances[view.external_id])
        return view

    def stop(self, external_id: str) -> None:
        self.world.note_retire("stop_instance", str(external_id))
        self._request("stop_instance", external_id=external_id)
        inst = self._get(external_id)
        inst["intended_status"] = "stopped"
        self.world.stopping(str(external_id))

    def resume(self, external_id: str) -> None:
        self._request("resume_instance", external_id=external_id)
        inst = self._get(external_id)
        inst["intended_status"] = "running"
        inst["status"] = "scheduling"
        self.world.resuming(str(external_id))

    def reboot(self, external_id: str) -> None:
        super().reboot(external_id)
        self.world.rebooted(str(external_id))

    def destroy(self, external_id: str) -> None:
        self.world.note_retire("destroy_instance", str(external_id))
        self._request("destroy_instance", external_id=external_id)
        inst = self._get(external_id)
        if self.world.destroy_fails():
            inst["intended_status"] = "destroyed"  # accepted, never taken: it stays listed
            return
        del self.instances[str(external_id)]
        self.world.destroyed(str(external_id), inst)


class DayDemand(ScenarioDemandSource):
    """The ``scenario`` demand source reading the world's counts at the moment of the read."""

    def __init__(self, world: DayWorld):
        super().__init__({"state": "ok"}, [])
        self.world = world

    def read(self, instances=None):
        self.demand, self.fleet = self.world.demand_view()
        reading = super().read(instances)
        reading.backlog_not_due = self.world.not_due_count()
        reading.loading_s = self.world.loading_s
        return reading


class DayWorld:
    """The market and the work of one day, advanced with :meth:`advance_to` (seconds since start).

    ``day`` is an ``agent.rehearse.day.Day``. Tasks and machines live in memory; per-second work is
    event-driven (a heap of timed events), so advancing costs the events that happen, not the
    fleet size times the time step.
    """

    def __init__(self, day, start: datetime):
        self.day, self.start = day, start
        m, w = day.market, day.work
        seed = day.seed
        self.rng_load = random.Random(f"{seed}:load")
        self.rng_fail = random.Random(f"{seed}:fail")
        self.rng_proof = random.Random(f"{seed}:proof")
        self.rng_destroy = random.Random(f"{seed}:destroy")
        self.t = 0.0
        self.heap: list = []
        self._seq = 0
        self.machines: dict[str, Machine] = {}
        self.queue: deque[Task] = deque()  # unowned, claimable (queue rows)
        self.backlog: deque[Task] = deque()  # due sealing sectors with no queue row (no live worker)
        self.not_due: list = []  # heap of (due, id, task)
        self.tasks: list[Task] = []
        self.orphans: dict[int, tuple[Task, float]] = {}  # owned by a dead worker: task, requeue time
        self.idle: set[str] = set()  # live workers with no task
        self.idle_q: deque[str] = deque()  # the same, in the order they became idle (stale entries skipped)
        self.busy = 0  # machines whose worker holds a task
        self._rates: tuple[float, float] | None = None  # (GPU $/hr, disk $/hr) of the fleet; None: recount
        self.idle_since: float | None = 0.0
        self.proof_samples: deque[float] = deque(maxlen=50)
        self.loading_samples: list[float] = []  # each launch's loading time, from rented to running (s)
        self.running_at_start = 0  # machines of the starting fleet that began the day running
        self.loading_s = float(m.loading.median_s)
        self.proof_s = {g: (p.median_s, p.spread) for g, p in w.proof_s.items()}
        self.prices = {o.gpu_name: o.dph for o in m.offers}
        self.offer_spec = {o.gpu_name: o for o in m.offers}
        self.counts = {"launches": 0, "resumes": 0, "stops": 0, "destroys": 0, "reboots": 0,
                       "destroys_not_taken": 0, "failures": 0, "preemptions": 0, "stuck_loading": 0,
                       "late_launches": 0}
        self.retired_at: list[float] = []
        self.retire_log: list[dict] = []
        self.marks: list[dict] = []  # the day's events for the charts: {"at_s", "kind", "detail"}
        self.launched_at: list[float] = []
        self.gpu_usd = 0.0
        self.disk_usd = 0.0
        self._spent_to = 0.0
        offers = []
        for o in m.offers:
            for n in range(o.count):
                offers.append({"id": f"{o.gpu_name.replace(' ', '-')}-{n}", "gpu_name": o.gpu_name, "dph": o.dph})
        self.provider = DayProvider(self, offers)
        self.demand = DayDemand(self)
        self._schedule_work()
        for ch in m.price_changes:
            self._at(ch.at_h * 3600, "price", ch)
        for d in m.worker_deaths:
            self._at(d.at_h * 3600, "deaths", d)

    # --- scheduling ------------------------------------------------------------------------------
    def _at(self, t: float, kind: str, payload=None, epoch: int | None = None) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, payload, epoch))

    def _schedule_work(self) -> None:
        w = self.day.work
        horizon = self.day.horizon_h * 3600
        factors = w.task_types
        arrivals: list[tuple[float, str]] = [(0.0, w.arrivals.hourly_type)] * w.queued_at_start
        prof = w.arrivals.hourly
        if prof:
            for h in range(math.ceil(self.day.horizon_h)):
                n = prof[h % len(prof)]
                whole = int(n) + (1 if self.rng_proof.random() < n - int(n) else 0)
                arrivals += [(h * 3600 + (k + 0.5) * 3600 / whole, w.arrivals.hourly_type) for k in range(whole)]
        for b in w.arrivals.bursts:
            span = b.over_min * 60
            arrivals += [(b.at_h * 3600 + (span * k / b.count if b.count else 0), b.type) for k in range(b.count)]
        for a in w.arrivals.tasks:
            arrivals += [(a.at_s, a.type)] * a.count
        for at, typ in arrivals:
            if at < horizon:
                self._at(at, "arrive", (typ, factors.get(typ, 1.0)))
        s = w.sealing
        if s is not None and s.hourly:
            for h in range(math.ceil(self.day.horizon_h)):
                n = s.hourly[h % len(s.hourly)]
                whole = int(n) + (1 if self.rng_proof.random() < n - int(n) else 0)
                for k in range(whole):
                    at = h * 3600 + (k + 0.5) * 3600 / whole
                    if at < horizon:
                        self._at(at, "sector", (s.type, factors.get(s.type, 1.0), at + s.due_after_min * 60))

    def start_fleet(self) -> list[dict]:
        """Rent the day's starting fleet (before the first cycle); returns rows for the database."""
        rows = []
        for f in self.day.market.fleet:
            for _ in range(f.count):
                offer = next((o for o in self.provider.offers if o["gpu_name"] == f.gpu_name), None)
                if offer is not None:
                    self.provider.offers.remove(offer)
                iid = f"s-{next(self.provider._ids)}"
                dph = f.dph if f.dph is not None else self.prices.get(f.gpu_name, 0.0)
                status = "running" if f.status == "running" else "stopped"
                self.provider.instances[iid] = {"status": status, "intended_status": status, "status_msg": "",
                                                "gpu_name": f.gpu_name, "dph": float(dph), "started_at": clock.now(),
                                                "provider": "scenario", "label": iid}
                self.provider.ssh[iid] = HEALTHY_SSH
                mach = self._machine(iid, f.gpu_name, float(dph))
                if status == "running":
                    self.running_at_start += 1
                    mach.running_since = 0.0
                    mach.worker_live_at = 0.0
                    self._worker_up(mach)
                    self._schedule_failure(mach)
                else:
                    mach.stopped = True
                rows.append({"id": iid, "gpu_name": f.gpu_name, "dph": float(dph), "status": status})
        return rows

    def _machine(self, iid: str, gpu: str, dph: float) -> Machine:
        spec = self.offer_spec.get(gpu)
        disk = (spec.disk_gb * spec.disk_usd_gb_month / HOURS_PER_MONTH) if spec else 0.0
        mach = Machine(id=iid, gpu=gpu, dph=dph, disk_dph=disk, interruptible=bool(spec and spec.interruptible), born=self.t)
        self.machines[iid] = mach
        self._rates = None
        return mach

    # --- the provider's calls ------------------------------------------------------------------
    def now_s(self) -> float:
        return (clock.now() - self.start).total_seconds()

    def launched(self, iid: str, inst: dict) -> None:
        self.advance_to(self.now_s())
        self._spend_to(self.now_s())
        self.counts["launches"] += 1
        self.mark("launch", f"{iid} {inst['gpu_name']} at ${inst['dph']:g}/hr")
        self.launched_at.append(self.now_s())
        inst["dph"] = float(self.prices.get(inst["gpu_name"], inst["dph"]))
        self.provider.ssh[iid] = HEALTHY_SSH
        mach = self._machine(iid, inst["gpu_name"], inst["dph"])
        mach.born = self.now_s()
        mach.launched = True
        m = self.day.market
        if self.rng_load.random() < m.stuck_loading_fraction:
            self.counts["stuck_loading"] += 1
            mach.stuck = True
            return
        took = lognormal(self.rng_load, m.loading.median_s, m.loading.p95_s)
        self._at(self.now_s() + took, "loaded", iid, mach.epoch)

    def stopping(self, iid: str) -> None:
        self.advance_to(self.now_s())
        self._spend_to(self.now_s())
        self.counts["stops"] += 1
        self.mark("stop", iid)
        self.retired_at.append(self.now_s())
        mach = self.machines.get(iid)
        if mach is None:
            return
        mach.epoch += 1
        self._at(self.now_s() + self.day.market.stop_s, "stopped", iid, mach.epoch)

    def resuming(self, iid: str) -> None:
        self.advance_to(self.now_s())
        self._spend_to(self.now_s())
        self.counts["resumes"] += 1
        self.mark("resume", iid)
        self.launched_at.append(self.now_s())
        mach = self.machines.get(iid)
        if mach is None:
            return
        self._worker_down(mach, hard=True)
        mach.stopped = False
        self._rates = None
        mach.epoch += 1
        self._at(self.now_s() + self.day.market.resume_s, "loaded", iid, mach.epoch)

    def rebooted(self, iid: str) -> None:
        self.advance_to(self.now_s())
        self.counts["reboots"] += 1
        self.mark("reboot", iid)
        mach = self.machines.get(iid)
        if mach is None:
            return
        self._worker_down(mach, hard=True)
        mach.epoch += 1
        mach.worker_dead = False
        self.provider.instances[iid]["status"] = "running"
        mach.running_since = self.now_s()
        self._at(self.now_s() + self.day.work.worker_start_s, "worker", iid, mach.epoch)
        self._schedule_failure(mach)

    def mark(self, kind: str, detail: str) -> None:
        self.marks.append({"at_s": round(self.now_s() if kind in ("launch", "resume", "stop", "destroy", "reboot", "destroy_not_taken") else self.t),
                           "kind": kind, "detail": detail})

    def note_retire(self, call: str, iid: str) -> None:
        """Record what the world was when ``call`` retired ``iid`` (``retire_log``, for the unsafe
        checks): its worker live or starting, owning a task; work waiting; an expected worker dead."""
        self.advance_to(self.now_s())
        mach = self.machines.get(iid)
        inst = self.provider.instances.get(iid) or {}
        live = bool(mach and mach.worker_live_at is not None and not mach.worker_dead)

        limit_s = 60 * float(effective_limits().provisioning_limit_min)
        # starting: it will come up — not stuck, and not loading past the provisioning limit (the
        # policy calls that terminal, and replacing it is no scale-down)
        starting = bool(mach and not live and not mach.worker_dead and not mach.stuck
                        and inst.get("status") in ("loading", "scheduling", "running")
                        and inst.get("intended_status") == "running"
                        and not (inst.get("status") == "loading" and self.now_s() - mach.born >= limit_s))
        dead = sum(1 for m in self.machines.values() if m.gone is None and m.worker_dead
                   and (self.provider.instances.get(m.id) or {}).get("status") == "running"
                   and (self.provider.instances.get(m.id) or {}).get("intended_status") == "running" and m.id != iid)
        self.retire_log.append({"t": self.now_s(), "call": call, "instance": iid, "live": live, "starting": starting,
                                "owns": bool(mach and mach.task is not None and live),
                                "waiting": len(self.queue) + len(self.backlog) + len(self.orphans), "dead": dead})

    def destroy_fails(self) -> bool:
        fails = self.rng_destroy.random() < self.day.market.destroy_fails_fraction
        if fails:
            self.counts["destroys_not_taken"] += 1
            self.mark("destroy_not_taken", "the provider accepted a destroy that did not take")
        return fails

    def destroyed(self, iid: str, inst: dict) -> None:
        self.advance_to(self.now_s())
        self._spend_to(self.now_s())
        self.counts["destroys"] += 1
        self.mark("destroy", iid)
        self.retired_at.append(self.now_s())
        mach = self.machines.get(iid)
        if mach is not None:
            self._worker_down(mach, hard=True)
            mach.gone = self.now_s()
            self._rates = None
            mach.epoch += 1
        gpu = inst.get("gpu_name", "")
        self.provider.offers.append({"id": f"{gpu.replace(' ', '-')}-back-{iid}", "gpu_name": gpu,
                                     "dph": float(self.prices.get(gpu, inst.get("dph", 0.0)))})

    # --- workers and tasks -----------------------------------------------------------------------
    def _worker_up(self, mach: Machine) -> None:
        mach.worker_dead = False
        mach.last_heartbeat = self.t
        self._set_idle(mach.id)
        if self.backlog:  # a node that can claim them is alive: Curio adds the queue rows
            self.queue.extend(self.backlog)
            self.backlog.clear()
        self._claim()

    def _worker_down(self, mach: Machine, *, hard: bool) -> None:
        """The machine's worker stops heartbeating; its task stays owned until Curio requeues it."""
        was_live = mach.worker_live_at is not None and not mach.worker_dead and mach.id in self.machines
        mach.worker_live_at = None if hard else mach.worker_live_at
        mach.worker_dead = True
        self.idle.discard(mach.id)
        self._rates = None
        if mach.task is not None:
            self.busy -= 1
            task, mach.task = mach.task, None
            task.owner = f"dead:{mach.id}"
            self.orphans[task.id] = (task, self.t + self.day.work.looks_dead_s)
            self._at(self.t + self.day.work.looks_dead_s, "requeue", task.id)
        if was_live:
            mach.last_heartbeat = self.t

    def _set_idle(self, iid: str) -> None:
        if iid not in self.idle:
            self.idle.add(iid)
            self.idle_q.append(iid)

    def _schedule_failure(self, mach: Machine) -> None:
        m = self.day.market
        rate = m.failure_per_hr + (m.preemption_per_hr if mach.interruptible else 0.0)
        if rate <= 0:
            return
        after = self.rng_fail.expovariate(rate / 3600.0)
        kind = "preempt" if mach.interruptible and self.rng_fail.random() < m.preemption_per_hr / rate else "fail"
        self._at(self.t + after, kind, mach.id, mach.epoch)

    def _proof_s(self, mach: Machine, task: Task) -> float:
        median, spread = self.proof_s.get(mach.gpu, (60.0, 0.0))
        s = median * task.factor
        return s * math.exp(self.rng_proof.gauss(0.0, spread)) if spread else s

    def _claim(self) -> None:
        while self.queue and self.idle:
            iid = self.idle_q.popleft()
            if iid not in self.idle:
                continue  # it stopped being idle since it was queued
            self.idle.discard(iid)
            mach = self.machines[iid]
            task = self.queue.popleft()
            task.claimed = task.claimed if task.claimed is not None else self.t
            task.owner = iid
            mach.task = task
            self.busy += 1
            took = self._proof_s(mach, task)
            self._at(self.t + took, "proved", (iid, task.id, took), mach.epoch)
        self._idle_mark()

    def _idle_mark(self) -> None:
        busy = bool(self.queue or self.backlog or self.orphans or self.busy)
        if busy:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = self.t

    def _live_machines(self):
        return (m for m in self.machines.values() if m.worker_live_at is not None and not m.worker_dead and m.gone is None)

    def live_workers(self) -> int:
        return sum(1 for _ in self._live_machines())

    def not_due_count(self) -> int:
        return len(self.not_due)

    # --- time ------------------------------------------------------------------------------------
    def _spend_to(self, t: float) -> None:
        """Charge GPU $ for every instance rented and not stopped (loading included), disk $ for
        every instance that exists, from the last charge to ``t``. The fleet's $/hr is recounted
        only after the fleet changed, so a proof costs nothing here whatever the fleet size."""
        dt = t - self._spent_to
        if dt <= 0:
            return
        if self._rates is None:
            live = [m for m in self.machines.values() if m.gone is None]
            self._rates = (sum(m.dph for m in live if not m.stopped), sum(m.disk_dph for m in live))
        hours = dt / 3600.0
        self.gpu_usd += self._rates[0] * hours
        self.disk_usd += self._rates[1] * hours
        self._spent_to = t

    def advance_to(self, t: float) -> None:
        """Play every world event up to ``t`` seconds since the start."""
        while self.heap and self.heap[0][0] <= t:
            at, _, kind, payload, epoch = heapq.heappop(self.heap)
            self._spend_to(at)
            self.t = max(self.t, at)
            getattr(self, f"_on_{kind}")(payload, epoch)
        self._spend_to(t)
        self.t = max(self.t, t)
        # Curio queues a sector's PoRep when it is due: with a live worker as a queue row
        for mach in self._live_machines():
            mach.last_heartbeat = self.t

    def _current(self, iid: str, epoch) -> Machine | None:
        mach = self.machines.get(iid)
        if mach is None or mach.gone is not None or (epoch is not None and epoch != mach.epoch):
            return None
        return mach

    def _on_arrive(self, payload, _epoch) -> None:
        typ, factor = payload
        task = Task(id=len(self.tasks), type=typ, arrived=self.t, factor=factor, due=self.t)
        self.tasks.append(task)
        self.queue.append(task)
        self._claim()

    def _on_sector(self, payload, _epoch) -> None:
        typ, factor, due = payload
        task = Task(id=len(self.tasks), type=typ, arrived=due, factor=factor, due=due)
        self.tasks.append(task)
        heapq.heappush(self.not_due, (due, task.id, task))
        self._at(due, "due", task.id)

    def _on_due(self, _tid, _epoch) -> None:
        while self.not_due and self.not_due[0][0] <= self.t:
            _, _, task = heapq.heappop(self.not_due)
            (self.queue if self.live_workers() else self.backlog).append(task)
        self._claim()

    def _on_loaded(self, iid, epoch) -> None:
        mach = self._current(iid, epoch)
        if mach is None:
            return
        inst = self.provider.instances.get(iid)
        if inst is None:
            return
        if inst["status"] == "loading":
            self.loading_samples.append(self.t - mach.born)
        inst["status"] = "running"
        mach.running_since = self.t
        self._at(self.t + self.day.work.worker_start_s, "worker", iid, mach.epoch)
        self._schedule_failure(mach)

    def _on_worker(self, iid, epoch) -> None:
        mach = self._current(iid, epoch)
        if mach is None:
            return
        first = mach.last_heartbeat is None
        mach.worker_live_at = self.t
        if first and mach.launched and not (self.queue or self.backlog or self.orphans):
            self.counts["late_launches"] += 1  # it came up after the work it was launched for was gone
            self.mark("late_launch", f"{iid} came up with no work waiting")
        self._worker_up(mach)

    def _on_stopped(self, iid, epoch) -> None:
        mach = self._current(iid, epoch)
        inst = self.provider.instances.get(iid)
        if mach is None or inst is None:
            return
        self._worker_down(mach, hard=True)
        mach.stopped = True
        self._rates = None
        inst["status"] = "stopped"

    def _on_fail(self, iid, epoch) -> None:
        mach = self._current(iid, epoch)
        inst = self.provider.instances.get(iid)
        if mach is None or inst is None or inst["status"] != "running":
            return
        self.counts["failures"] += 1
        self.mark("failure", iid)
        self._worker_down(mach, hard=True)
        mach.epoch += 1
        inst["status"], inst["status_msg"] = "exited", "the container exited (code 137)"

    def _on_preempt(self, iid, epoch) -> None:
        mach = self._current(iid, epoch)
        inst = self.provider.instances.get(iid)
        if mach is None or inst is None or inst["status"] != "running":
            return
        self.counts["preemptions"] += 1
        self.mark("preemption", iid)
        self._worker_down(mach, hard=True)
        mach.epoch += 1
        inst["status"], inst["status_msg"] = "exited", "preempted: an interruptible instance was outbid"

    def _on_deaths(self, d, _epoch) -> None:
        live = sorted(self._live_machines(), key=lambda m: m.id)
        dying = live[: d.count if d.count is not None else len(live)]
        for mach in dying:
            self._worker_down(mach, hard=False)
        self.mark("worker_deaths", f"{len(dying)} worker(s) died")

    def _on_proved(self, payload, epoch) -> None:
        iid, tid, took = payload
        mach = self._current(iid, epoch)
        if mach is None or mach.task is None or mach.task.id != tid or mach.worker_dead:
            return
        mach.task.done, mach.task.took, mach.task.gpu = self.t, took, mach.gpu
        mach.task = None
        self.busy -= 1
        self.proof_samples.append(took)
        self._set_idle(iid)
        self._claim()

    def _on_requeue(self, tid, _epoch) -> None:
        entry = self.orphans.pop(tid, None)
        if entry is None:
            return
        task = entry[0]
        task.owner = ""
        (self.queue if self.live_workers() else self.backlog if task.due != task.arrived else self.queue).appendleft(task)
        self._claim()

    def _on_price(self, ch, _epoch) -> None:
        self.prices[ch.gpu_name] = ch.dph
        for o in self.provider.offers:
            if o["gpu_name"] == ch.gpu_name:
                o["dph"] = ch.dph

    # --- what Curio shows --------------------------------------------------------------------------
    def demand_view(self) -> tuple[dict, list[dict]]:
        """``(demand, fleet)`` in the ``scenario`` demand source's terms, at the world's time.

        ``workers_expected``: instances the provider shows ``running`` (intended running) whose
        worker heartbeated or whose startup grace is over; ``workers_live``: live workers;
        ``queued``: queue rows plus tasks a dead worker still owns; ``backlog``: due sealing
        sectors with no queue row plus those due within the loading time.
        """
        grace = float(settings.WARDEN["STARTUP_GRACE_S"])
        fleet, expected, live, running = [], 0, 0, 0
        for mach in self.machines.values():
            if mach.gone is not None:
                continue
            inst = self.provider.instances.get(mach.id)
            if inst is None:
                continue
            worker = None
            if mach.last_heartbeat is not None:
                is_live = mach.worker_live_at is not None and not mach.worker_dead
                worker = {"live": is_live, "owned_tasks": 1 if mach.task is not None else 0}
                live += is_live
                running += bool(is_live and mach.task is not None)
            if inst["status"] == "running" and inst["intended_status"] == "running":
                if worker is not None or (mach.running_since is not None and self.t - mach.running_since >= grace):
                    expected += 1
            if worker is not None:
                fleet.append({"id": mach.id, "worker": worker})
        soon = sum(1 for due, _, _ in self.not_due if due - self.t <= self.loading_s)
        median = sorted(self.proof_samples)[len(self.proof_samples) // 2] if self.proof_samples else None
        idle_min = None if self.idle_since is None else (self.t - self.idle_since) / 60.0
        demand = {"state": "ok", "queued": len(self.queue) + len(self.orphans), "running": running,
                  "workers_expected": expected, "workers_live": live, "idle_min": idle_min,
                  "backlog": len(self.backlog) + soon, "proof_s": median, "active": running > 0}
        return demand, fleet

    def at(self, seconds: float) -> datetime:
        return self.start + timedelta(seconds=seconds)
