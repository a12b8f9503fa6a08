"""Running a day: the product's own cycle, monitor, approvals and guards over a simulated day.

:func:`run_day` takes a day file's JSON (``agent.rehearse.day``), and on the current database
(a throwaway one: the test database, or the scratch SQLite files ``manage.py rehearse`` makes)
plays it on the virtual clock:

- ``agent.runtime.loop.run_cycle`` every ``heartbeat_s`` (a heartbeat run, taking waiting events) and
  whenever a trigger event asks for a run (``agent.runtime.triggers`` with :class:`VirtualTriggers` as its
  store: the production windows, on virtual time);
- ``agent.runtime.monitor_runner.monitor_tick`` every 60 s (the beat's monitor);
- every approval the product parks is answered by the day's operator model at the time the model
  says (:class:`Operator`), through ``agent.runtime.approvals.do_decide`` and ``agent.runtime.loop.resume_run``
  — or left to expire;
- the market and the work move between those moments (``agent.rehearse.world.DayWorld``), and the
  provider and demand source the product reads are the world's (the ``scenario`` ones, extended).

After every cycle the run's records are checked for unsafe decisions (``agent.rehearse.unsafe``:
the product's ``agent.policy.invariants`` and the world's truth at each retirement).
Returns the outcome in the shape ``agent.models.Rehearsal.result`` documents.
"""

from __future__ import annotations

import contextlib
import heapq
import random
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connection

from agent.actions.session import do_set_target
from agent.model.model_client import ModelConfig
from agent.models import Approval, Run, SessionState
from agent.planners.llm import LlmPlanner
from agent.planners.rules import RulesPlanner
from agent.rehearse.day import Day, parse_day
from agent.rehearse.events import VirtualTriggers
from agent.rehearse.metrics import measure
from agent.rehearse.unsafe import Checker
from agent.rehearse.world import DayWorld
from agent.replay.world import file_policy, set_objectives
from agent.runtime import triggers
from agent.runtime.approvals import DecisionError, do_decide
from agent.runtime.loop import _settle_expired, expire_approvals, resume_run, run_cycle
from agent.runtime.monitor_runner import monitor_tick
from fleet import demand as demand_mod
from fleet import providers as providers_mod
from fleet.clock import VirtualClock, clock, use_clock
from fleet.events import changed
from fleet.models import Instance

OPERATOR_USERNAME = "rehearsal-operator"
#: the beat's monitor period, seconds (``agent.tasks.monitor_tick``: every 60 s)
MONITOR_S = 60.0


class Operator:
    """The day's operator: when (if ever) an approval parked at ``t`` seconds is answered, and how.

    An approval is answered ``approval_delay_min[hour]`` minutes after the first moment at or after
    ``t`` at which the operator is present (not in an ``away`` window, and the hour's delay is not
    null); ``reject_fraction`` of answers are rejections (seeded).
    """

    def __init__(self, day: Day):
        self.day = day
        self.rng = random.Random(f"{day.seed}:operator")

    def _present(self, t: float) -> bool:
        h = t / 3600
        if any(w.from_h <= h < w.to_h for w in self.day.operator.away):
            return False
        return self.delay_at(t) is not None

    def delay_at(self, t: float) -> float | None:
        hour = (self.day.start + timedelta(seconds=t)).hour
        return self.day.operator.approval_delay_min[hour]

    def answer_at(self, t: float, horizon: float) -> float | None:
        """Seconds since the start at which an approval parked at ``t`` is answered (None: never
        within ``horizon``). Presence is looked up minute by minute."""
        at = t
        while at <= horizon:
            if self._present(at):
                return at + 60 * float(self.delay_at(at))
            at = (at // 60 + 1) * 60
        return None

    def decision(self) -> str:
        return "reject" if self.rng.random() < self.day.operator.reject_fraction else "approve"


def make_planner(day: Day):
    """``RulesPlanner()``, or an ``LlmPlanner`` against the day's ``model`` (its key by reference)."""
    if day.planner == "rules":
        return RulesPlanner()

    m = settings.MODEL
    spec = day.model
    return LlmPlanner(ModelConfig(base_url=spec.base_url, model=spec.model,
                                  key_ref=f"env:{spec.api_key_env}" if spec.api_key_env else "",
                                  timeout_s=spec.timeout_s, max_tokens=m["MAX_TOKENS"], temperature=m["TEMPERATURE"],
                                  price_in=m["PRICE_IN"], price_out=m["PRICE_OUT"], stream="off"))


@contextlib.contextmanager
def isolated_day(day: Day):
    """The rehearsal's world for the ``with`` block: virtual clock at ``start``, the day's provider
    and demand source, trigger state in memory (nothing reaches Redis or Celery), no broadcasts,
    product-default policy (``WARDEN_UNATTENDED`` ignored). Yields ``(world, triggers store)``."""
    vclock = VirtualClock(day.start)
    saved_receivers = changed.receivers
    saved = {k: settings.WARDEN.get(k) for k in ("UNATTENDED", "EVENT_TRIGGERS")}
    changed.receivers = []
    changed.sender_receivers_cache.clear()
    settings.WARDEN["UNATTENDED"] = False
    settings.WARDEN["EVENT_TRIGGERS"] = True
    store = VirtualTriggers()
    try:
        with use_clock(vclock):
            world = DayWorld(day, day.start)
            providers_mod.set_override(world.provider)
            demand_mod.set_override(world.demand)
            triggers.set_store(store)
            yield world, store
    finally:
        triggers.set_store(None)
        providers_mod.set_override(None)
        demand_mod.set_override(None)
        settings.WARDEN.update(saved)
        changed.receivers = saved_receivers
        changed.sender_receivers_cache.clear()


def setup(day: Day, world: DayWorld) -> None:
    """Objectives, policy and the starting fleet in the current database; the operator user."""
    state = SessionState.get()
    set_objectives(state, day.objectives)
    overrides = dict(state.overrides or {})
    overrides["policy"] = {**overrides.get("policy", {}), **file_policy(day.policy)}
    state.overrides = overrides
    state.save()

    now = clock.now()
    for row in world.start_fleet():
        Instance.objects.create(provider="scenario", external_id=row["id"], label=row["id"], gpu_name=row["gpu_name"],
                                status=row["status"], intended_status=row["status"], status_since=now,
                                dph=row["dph"], ssh_host=row["id"], ssh_port=22, worker_name=row["id"],
                                created_at=now, started_at=now)
    user, _ = User.objects.get_or_create(username=OPERATOR_USERNAME)
    group, _ = Group.objects.get_or_create(name="operators")
    user.groups.add(group)


class Rehearsal:
    """One day being played (:func:`run_day` drives it)."""

    def __init__(self, day: Day, world: DayWorld, store: VirtualTriggers, *, progress=None, planner_factory=None):
        self.day, self.world, self.store, self.progress = day, world, store, progress
        self.planner_factory = planner_factory or (lambda: make_planner(day))
        self.operator = Operator(day)
        self.horizon = day.horizon_h * 3600
        self.decisions: list = []  # heap of (t, approval pk)
        self.seen_approval = Approval.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        self.first_run = (Run.objects.order_by("-number").values_list("number", flat=True).first() or 0) + 1
        self.cycles = 0
        self.samples: list[dict] = []
        self.markers: list[dict] = []
        self.unsafe: list[dict] = []
        self.planners: dict[int, object] = {}
        self.target_changes = sorted(day.operator.target_changes, key=lambda c: c.at_h)
        self.no_worker_min = 0

        self.checker = Checker(self)

    # --- the clock -----------------------------------------------------------------------------
    def move_to(self, t: float) -> None:
        """World and clock to ``t`` seconds since the start (the clock never goes back: a cycle
        may have slept past ``t``)."""
        now = self.world.now_s()
        if t > now:
            clock.active.advance(t - now)
        self.world.advance_to(max(t, self.world.now_s()))

    # --- the product's entry points ------------------------------------------------------------
    def heartbeat(self) -> None:
        planner = self.planner_factory()
        run = run_cycle("heartbeat", planner=planner, events="take")
        self.after(run, planner)

    def event_run(self) -> None:
        planner = self.planner_factory()
        run = run_cycle("event", planner=planner, events="need")
        self.after(run, planner)

    def monitor(self) -> None:
        number = monitor_tick()
        self.after(Run.objects.filter(number=number).first() if number else None, None)

    def decide(self, pk: int) -> None:
        for parked in expire_approvals():  # what the next beat would settle first
            _settle_expired(parked)
        a = Approval.objects.filter(pk=pk).select_related("run").first()
        if a is None or a.status != "waiting":
            return
        decision = self.operator.decision()
        comment = "rehearsal operator: not now" if decision == "reject" else ""
        try:
            do_decide(a, decision, f"user:{OPERATOR_USERNAME}", comment)
        except DecisionError:
            return
        self.markers.append({"at_s": round(self.world.now_s()), "kind": f"approval_{decision}d",
                             "detail": f"{a.tool} decided after {(self.world.now_s() - self._created_s(a)) / 60:.0f} min"})
        run = a.run
        run.refresh_from_db()
        planner = self.planners.get(run.pk) or self.planner_factory()
        out = resume_run(run, planner=planner)
        self.after(out, planner)

    def _created_s(self, a) -> float:
        return (a.created_at - self.day.start).total_seconds()

    def set_target(self, change) -> None:
        do_set_target(float(change.target_proofs_hr), f"user:{OPERATOR_USERNAME}", "rehearsal: the day's target change")
        self.markers.append({"at_s": round(change.at_h * 3600), "kind": "target", "detail": f"target {change.target_proofs_hr:g}/hr"})

    def after(self, run, planner) -> None:
        """After a product call: schedule the operator's answers to new approvals, check the run."""
        if run is not None:
            self.cycles += 1
            if planner is not None:
                self.planners[run.pk] = planner
        for a in Approval.objects.filter(pk__gt=self.seen_approval).order_by("pk"):
            self.seen_approval = a.pk
            created = self._created_s(a)
            when = self.operator.answer_at(created, self.horizon)
            if when is not None:
                heapq.heappush(self.decisions, (when, a.pk))
        if run is not None:
            found = self.checker.after_run(run)
            self.unsafe += found
            for v in found:
                self.markers.append({"at_s": round(self.world.now_s()), "kind": "unsafe",
                                     "detail": f"{v['invariant']}: run {v['run']} {v['call']}: {v['detail']}"})

    # --- sampling ------------------------------------------------------------------------------
    def sample(self, *, count: bool = True) -> None:
        """One minute's sample of the world (for the hourly series and the no-worker minutes; the
        last one, at the horizon, counts no minute)."""
        w = self.world
        demand, _ = w.demand_view()
        waiting = len(w.queue) + len(w.backlog) + len(w.orphans)  # due work only (not the "soon" backlog)
        live = demand["workers_live"]
        if count and waiting and not live:
            self.no_worker_min += 1

        self.samples.append({"t": w.t, "queued": demand["queued"], "backlog": demand["backlog"], "live": live,
                             "spend": w.gpu_usd + w.disk_usd, "gpu": w.gpu_usd,
                             "target": float(SessionState.objects.values_list("target_proofs_hr", flat=True).first() or 0)})

    # --- the day -------------------------------------------------------------------------------
    def play(self) -> None:
        next_hb, next_mon = 0.0, MONITOR_S
        t0 = self.world.now_s()
        self.sample()
        last_progress = -1.0
        while True:
            mono0 = clock.monotonic() - self.world.now_s()  # monotonic at the day's start
            candidates = [(next_hb, 1, "heartbeat"), (next_mon, 2, "monitor")]
            due = self.store.next_due()
            if due is not None:
                candidates.append((max(self.world.now_s(), due - mono0), 0, "event"))
            if self.decisions:
                candidates.append((self.decisions[0][0], 3, "decide"))
            if self.target_changes:
                candidates.append((self.target_changes[0].at_h * 3600, 4, "target"))
            t, _, kind = min(candidates)
            if t >= self.horizon:
                break
            self.move_to(t)
            if kind == "heartbeat":
                next_hb += self.day.heartbeat_s
                self.heartbeat()
            elif kind == "monitor":
                next_mon += MONITOR_S
                self.sample()
                self.monitor()
            elif kind == "event":
                self.store.pop_due()
                self.event_run()
            elif kind == "decide":
                _, pk = heapq.heappop(self.decisions)
                self.decide(pk)
            else:
                self.set_target(self.target_changes.pop(0))
            if self.progress is not None:
                frac = min(1.0, (self.world.now_s() - t0) / self.horizon)
                if frac - last_progress >= 0.01:
                    last_progress = frac
                    self.progress(frac)
        self.move_to(self.horizon)
        self.sample(count=False)

        final = self.checker.final(Run.objects.filter(number__gte=self.first_run))
        self.unsafe += final
        for v in final:
            self.markers.append({"at_s": round(self.horizon), "kind": "unsafe",
                                 "detail": f"{v['invariant']}: run {v['run']} call {v['call']}: {v['detail']}"})
        if self.progress is not None:
            self.progress(1.0)


def _fast_commits() -> None:
    """Commits of this connection stop waiting for the disk (PostgreSQL ``synchronous_commit=off``
    for the session, SQLite ``synchronous=OFF``): the database is a throwaway one, and a day makes
    tens of thousands of small commits."""
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SET synchronous_commit TO OFF")
        elif connection.vendor == "sqlite":
            cur.execute("PRAGMA synchronous=OFF")


def run_day(day: dict, *, progress=None, planner: str | None = None, hours: float | None = None,
            planner_factory=None) -> dict:
    """Play the day file ``day`` (its JSON as a dict) on the current database; returns the result.

    ``planner`` (``rules`` | ``llm``) and ``hours`` override the file's planner and horizon.
    ``progress(fraction)`` is called as the virtual clock advances (0..1 of the horizon).
    ``planner_factory`` (tests, benches) makes each run's planner instead. Returns
    ``{"summary", "hourly", "unsafe", "markers"}`` (``agent.models.Rehearsal``; the summary's keys
    are ``agent.rehearse.metrics.SUMMARY_KEYS``). Raises ``agent.rehearse.day.DayFileError`` for an
    invalid day. Use a throwaway database: it writes runs, approvals and instances.
    """
    raw = dict(day)
    if planner is not None:
        raw["planner"] = planner
    if hours is not None:
        raw["horizon_h"] = hours
    d = parse_day(raw)
    _fast_commits()
    with isolated_day(d) as (world, store):
        setup(d, world)
        reh = Rehearsal(d, world, store, progress=progress, planner_factory=planner_factory)
        reh.play()
        return measure(reh)
