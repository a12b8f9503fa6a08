"""The run lifecycle: lock, claim, turn context, close — shared by every kind of cycle.

``agent.runtime.loop`` (the planner's cycle and resumes) and ``agent.runtime.monitor_runner`` (the monitor's own
tick) both go through these functions, so neither imports the other's internals::

    acquire_lock() → claim_run(trigger) → turn_context(run, world, …) → … → close_run(run)
                                                                          (fail_run on error)
    release_lock(token)

The lock is the single-flight guarantee (never two runs in parallel): one row
(``SessionState`` pk=1) taken with a conditional UPDATE, with an expiry so a crashed run cannot
wedge the agent.
"""

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, connections, transaction
from django.db.models import Q

from agent.memory.model_digest import after_run
from agent.model.model_client import ModelConfig
from agent.models import Run, SessionState, Step
from agent.policy.claims import worker_alive, worker_identity
from agent.policy.tool_specs import TOOLS
from agent.runtime.approvals import undispatched
from agent.runtime.breakers import BreakerState, Halt
from agent.runtime.report import entailment_flags, final_report
from fleet.alerts import raise_alert
from fleet.clock import clock
from fleet.events import emit
from fleet.secrets import redact

log = logging.getLogger(__name__)
#: seconds a "not cancelled" answer stands for a read-only call (TurnContext.cancel_requested)
CANCEL_CHECK_S = 1.0
_held = threading.local()  # the lock token this thread holds, if any


class RunBusy(Exception):
    """Another run is ``running`` (the database's ``one_running_run`` constraint said no)."""


def lock_held_here() -> bool:
    """True while this thread holds the run lock for a planner's cycle (``acquire_lock(sees_events=
    True)``): events raised now are what that run itself observed or did, not triggers."""
    return bool(getattr(_held, "token", None))


# --- the run lock ------------------------------------------------------------------------------
def acquire_lock(ttl_s: float | None = None, *, sees_events: bool = True) -> str | None:
    """Take the run lock (a conditional UPDATE on the anchor); ``None`` if another run holds it.

    The lock records its holder (``agent.policy.claims.worker_identity``). It is free when released,
    past its expiry (``ttl_s``, WARDEN_RUN_LOCK_TTL_S), or as soon as its holder is known dead
    (a SIGKILLed worker on this host, docs/faults.md) — then taken over with a conditional UPDATE
    on the dead holder's token, so two takers cannot both win. ``sees_events=False`` (the monitor's
    tick, which runs no planner) lets the events its observe finds start a run after it.
    """
    ttl_s = ttl_s or settings.WARDEN["RUN_LOCK_TTL_S"]
    now = clock.now()
    token = secrets.token_hex(16)
    mine = dict(lock_token=token, lock_expires_at=now + timedelta(seconds=ttl_s), lock_holder=worker_identity())
    free = Q(lock_token="") | Q(lock_expires_at__lt=now) | Q(lock_expires_at__isnull=True)
    n = SessionState.objects.filter(pk=1).filter(free).update(**mine)  # one round trip when free
    row = None
    if n == 0:
        row = SessionState.objects.filter(pk=1).values_list("lock_token", "lock_holder").first()
        if row is None:  # the anchor's first use
            SessionState.get()
            n = SessionState.objects.filter(pk=1).filter(free).update(**mine)
    if n == 1:
        _took(token, ttl_s, sees_events)
        fail_stuck_runs()
        return token
    if row is None:
        return None
    held, holder = row
    if held and holder and worker_alive(holder) is False:
        if SessionState.objects.filter(pk=1, lock_token=held).update(**mine) == 1:
            log.warning("run lock taken over from a dead holder (%s)", holder)
            _took(token, ttl_s, sees_events)
            _fail_orphans(holder)
            return token
    return None


def _took(token: str, ttl_s: float, sees_events: bool) -> None:
    _held.token = token if sees_events else None
    _held.keeper = None
    if not clock.virtual:  # replay's virtual clock: one thread, no renewal needed (nothing waits for real)
        _held.keeper = LockKeeper(token, ttl_s)
        _held.keeper.start()


def _fail_orphans(holder: str) -> None:
    """Runs left ``running`` by the lock's dead holder end ``failed``, saying so (only the lock's
    holder runs a cycle, so every ``running`` run was its). A call it left claimed is settled
    against the provider by the next observe (``agent.policy.claims``)."""
    pid = holder.split("|")[1] if holder.count("|") == 2 else holder
    for run in Run.objects.filter(status="running"):
        fail_run(run, RuntimeError(f"its worker process (pid {pid}) died mid-run; the next cycle re-observes"))


#: why a run found ``running`` by a new lock holder is stuck (:func:`fail_stuck_runs`)
STUCK_DETAIL = ("its process let go of the run lock without closing the run (interrupted mid-run: Ctrl-C, "
                "SIGTERM or a cold shutdown, or it died, or its lock lapsed); failed by the next cycle, which "
                "re-observes")


def fail_stuck_runs() -> list[int]:
    """Fail every ``running`` run; call only while holding the run lock. Returns their numbers.

    Only the lock's holder runs a cycle and the lock is renewed while a run works
    (:class:`LockKeeper`), so a run still ``running`` when the lock is taken anew has no live
    process: it was interrupted (``KeyboardInterrupt`` or ``SystemExit`` whose own failure write did
    not get through, a SIGKILL), or its lock lapsed. It ends ``failed`` with its report; a call it
    left claimed is settled against the provider by the next observe (``agent.policy.claims``). Without
    this, every later cycle would meet the ``one_running_run`` constraint and a queued chat
    message would wait for ever."""
    stuck = list(Run.objects.filter(status="running"))
    for run in stuck:
        log.warning("run %s was left running without a lock holder: failing it", run.number)
        fail_run(run, StuckRun(STUCK_DETAIL))
    return [r.number for r in stuck]


class StuckRun(RuntimeError):
    """A run left ``running`` with no live process (:func:`fail_stuck_runs`)."""


def release_lock(token: str) -> None:
    """Free the run lock if ``token`` still holds it (a lock taken over meanwhile stays its taker's)."""
    if getattr(_held, "token", None) == token:
        _held.token = None
    keeper = getattr(_held, "keeper", None)
    if keeper is not None and keeper.token == token:
        keeper.stop()
        _held.keeper = None
    SessionState.objects.filter(pk=1, lock_token=token).update(lock_token="", lock_expires_at=None, lock_holder="")


# --- renewing the lock while a run works --------------------------------------------------------
class LockKeeper(threading.Thread):
    """Renews the run lock ``token`` every ``ttl_s / 3`` seconds while its run works, so a run
    blocked inside one call (a model that takes minutes, a provider that never answers) keeps the
    agent single-flight: its lock does not lapse under it and no second run starts.

    Bounded: past ``until`` (monotonic seconds; :func:`bound_lock` sets it from the run's
    ``wall_clock_s``) it stops renewing, raises a ``run_overdue`` alert and sets :attr:`lost`; the
    lock then lapses within ``ttl_s`` and the next cycle fails the run (:func:`fail_stuck_runs`).
    A renewal that finds the token gone (taken over) also sets :attr:`lost`. The run checks
    :func:`lock_lost` before each turn and each side effect (``TurnContext.cancel_requested``) and
    stops there. Each renewal is one UPDATE on its own database connection, closed after it.
    """

    def __init__(self, token: str, ttl_s: float):
        super().__init__(name="run-lock-keeper", daemon=True)
        self.token, self.ttl_s = token, float(ttl_s)
        self.every = max(0.2, self.ttl_s / 3)
        self.until: float | None = None
        self.run_number: int | None = None
        self.lost = ""
        self.renewals = 0
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self.every):
            if self.until is not None and time.monotonic() > self.until:
                self._overdue()
                return
            try:
                n = SessionState.objects.filter(pk=1, lock_token=self.token).update(
                    lock_expires_at=clock.now() + timedelta(seconds=self.ttl_s))
            except Exception as exc:  # noqa: BLE001 — a database blip: the next renewal tries again
                log.warning("run lock renewal failed: %s", exc)
                n = None
            finally:
                connections.close_all()  # this thread's own connections
            if n == 0 and not self._stop_event.is_set():
                self.lost = "the run lock was taken over by another process while this run worked"
                log.warning("run %s: %s", self.run_number, self.lost)
                return
            if n:
                self.renewals += 1

    def _overdue(self) -> None:
        self.lost = (f"run {self.run_number} passed its wall clock while blocked inside one call; its run lock is no "
                     f"longer renewed and lapses within {self.ttl_s:g} s, then the next cycle fails it")
        log.warning(self.lost)
        try:
            raise_alert("run_overdue", self.lost, severity="P2", key=f"run_overdue:{self.run_number}")
        except Exception as exc:  # noqa: BLE001 — the alert is best effort; the lapse still frees the agent
            log.warning("run_overdue alert not raised: %s", exc)
        finally:
            connections.close_all()


def bound_lock(run_number: int, seconds: float) -> None:
    """Renew this thread's run lock for at most ``seconds`` more (the run's wall clock plus a
    margin); see :class:`LockKeeper`."""
    keeper = getattr(_held, "keeper", None)
    if keeper is not None:
        keeper.run_number = run_number
        keeper.until = time.monotonic() + max(0.0, seconds)


def lock_lost() -> str:
    """Why this thread's run lock is no longer its run's (``""`` while it is)."""
    keeper = getattr(_held, "keeper", None)
    return keeper.lost if keeper is not None else ""


# --- the turn context ------------------------------------------------------------------------
@dataclass
class TurnContext:
    """What the planner and the pipeline share during one run."""

    run: Run
    world: object  # agent.runtime.observe.World
    limits: object
    breakers: BreakerState
    actor: str = "agent"
    message: str = ""
    turn_index: int = 0
    observe_only: bool = False
    _seq: int = 0
    extra: dict = field(default_factory=dict)
    _cancel_checked_at: float = float("-inf")
    _cancelled: bool = False

    def new_step(self, **fields) -> Step:
        """A step of this run, numbered and saved (one INSERT)."""
        step = self.draft_step(**fields)
        step.save(force_insert=True)
        return step

    def draft_step(self, **fields) -> Step:
        """A step of this run, numbered but not saved yet: the pipeline saves a scored call once,
        with its outcome (one INSERT per step; ``agent.runtime.pipeline._finish``), or before anything
        leaves the process (a side effect's claim, an approval)."""
        self._seq += 1
        return Step(run=self.run, seq=self._seq, created_at=clock.now(), actor=fields.pop("actor", self.actor), **fields)

    def call_steps(self) -> list[Step]:
        return list(self.run.steps.filter(kind="call").order_by("seq"))

    def after_error(self, step: Step) -> Halt | None:
        self.breakers.record_call(step)
        spec = TOOLS.get(step.tool)
        return self.breakers.after_error(step.tool, bool(spec and spec.fallback))

    def cancel_requested(self, *, must_check: bool = True) -> bool:
        """Whether an operator asked to cancel this run (one query). With ``must_check=False`` the
        answer of a check less than ``CANCEL_CHECK_S`` ago stands (a read-only call between
        planner turns need not pay a round trip each); callers check for real before a side
        effect and between the calls of one batch."""
        if lock_lost():
            return True
        now = clock.monotonic()
        if must_check or now - self._cancel_checked_at >= CANCEL_CHECK_S:
            self._cancel_checked_at = now
            self._cancelled = Run.objects.filter(pk=self.run.pk, cancel_requested=True).exists()
        return self._cancelled


def turn_context(run: Run, world, limits, state: SessionState) -> TurnContext:
    """The :class:`TurnContext` of ``run``: its breakers, first message and last step number."""
    breakers = BreakerState.load(run, limits)
    last = run.steps.order_by("-seq").first()
    message = run.steps.filter(kind="message").order_by("seq").values_list("text", flat=True).first() or ""
    tc = TurnContext(run=run, world=world, limits=limits, breakers=breakers, message=message,
                     turn_index=breakers.turns, observe_only=state.observe_only)
    tc._seq = last.seq if last else 0
    return tc


def claim_run(trigger: str, planner, events: list[dict] | None = None) -> Run:
    """The oldest queued run (a chat message waiting), else a new run numbered from the anchor.

    ``events`` (``agent.runtime.triggers.drain``) are recorded on the run as ``trigger_events``; a new
    run's ``trigger`` is then the first event's kind. Raises :class:`RunBusy` when another run is
    still ``running`` (the database constraint ``one_running_run``, the lock's second net).
    """
    if planner is None:  # the planner the loop will choose (agent.runtime.loop.default_planner): what the chat shows live
        name = "llm" if ModelConfig.from_settings() is not None else "rules"
    else:
        name = getattr(planner, "name", "rules")
    events = events or []
    if events and trigger == "event":
        trigger = events[0]["kind"]
    try:
        with transaction.atomic():
            queued = Run.objects.select_for_update().filter(status="queued").order_by("number").first()
            if queued is not None:
                queued.status, queued.planner, queued.started_at = "running", name, clock.now()
                queued.trigger_events = events
                queued.save(update_fields=["status", "planner", "started_at", "trigger_events"])
                run = queued
            else:
                number, epoch = _next_run_number()
                run = Run.objects.create(number=number, epoch=epoch, trigger=trigger, planner=name,
                                         status="running", started_at=clock.now(), trigger_events=events)
    except IntegrityError as exc:
        # PostgreSQL names the constraint; SQLite names the columns ("UNIQUE constraint failed:
        # agent_run.status"): either way, it is another run still running
        if "one_running_run" not in str(exc) and not Run.objects.filter(status="running").exists():
            raise
        raise RunBusy("another run is still running (constraint one_running_run)") from exc
    emit("runs-changed")
    return run


def _next_run_number() -> tuple[int, int]:
    """Take the anchor's next run number in one round trip (an UPDATE … RETURNING, row-locked until
    the caller's transaction ends); returns ``(number, epoch)``. Creates the anchor on first use."""
    sql = (f"UPDATE {SessionState._meta.db_table} SET next_run_id = next_run_id + 1, updated_at = %s"
           " WHERE id = 1 RETURNING next_run_id - 1, epoch")
    for _ in range(2):
        with connection.cursor() as cur:
            cur.execute(sql, [connection.ops.adapt_datetimefield_value(clock.now())])
            row = cur.fetchone()
        if row is not None:
            return row[0], row[1]
        SessionState.get()
    raise RuntimeError("the session anchor (SessionState pk=1) could not be created")


def close_run(run: Run) -> None:
    """Write the honest report (and entailment flags), end time, and announce.

    A run whose planner finished while calls of the monitor still wait for an operator (or were
    approved and are not dispatched yet) stays ``parked`` (so the decision is dispatched like any approved call) but gets its end time:
    :func:`agent.runtime.loop.resume_run` then dispatches and closes it without asking the planner again.
    """
    if run.status == "done" and (run.approvals.filter(status="waiting").exists() or undispatched(run).exists()):
        # never ``done`` while a call waits for an operator, or was approved and not dispatched yet
        run.status = "parked"
        run.ended_at = clock.now()
    elif run.status != "parked":
        run.ended_at = clock.now()
    run.final_report = final_report(run)
    run.entailment_flags = entailment_flags(run)
    run.save()
    emit("runs-changed", "chat-changed", "fleet-changed")  # the answer first; memory upkeep after it
    if run.status != "parked":
        try:
            after_run(run, deferred=True)  # the model's consolidation runs in its own task
        except Exception:  # noqa: BLE001 — memory upkeep never fails the run it follows
            log.exception("memory upkeep after run %s failed", run.number)


def fail_run(run: Run, exc: BaseException) -> None:
    """End ``run`` ``failed`` with ``exc`` (redacted) as its detail, and its report.

    ``exc`` may be a ``KeyboardInterrupt`` or ``SystemExit`` (Ctrl-C, a worker's cold shutdown):
    the detail then says the process was interrupted mid-run."""
    if isinstance(exc, Exception):
        if not isinstance(exc, StuckRun):
            log.exception("run %s failed", run.number)
        detail = f"{type(exc).__name__}: {exc}"
    else:
        log.warning("run %s interrupted by %s", run.number, type(exc).__name__)
        detail = (f"interrupted ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''}): its process was "
                  "stopped mid-run; nothing after this point ran, and the next cycle re-observes")
    run.status = "failed"
    run.halt_detail = redact(detail)[:2000]
    run.ended_at = clock.now()
    run.final_report = final_report(run)
    run.save()
    emit("runs-changed")
