"""Celery tasks: thin wrappers over the one cycle entry point (``agent.runtime.loop``)."""

from types import SimpleNamespace

from celery import shared_task
from django.conf import settings
from django.db import transaction

from agent.actions.runs import do_post_message
from agent.memory.model_digest import consolidate_by_model
from agent.model.model_client import ModelConfig
from agent.models import Run
from agent.notify.notifications import deliver, scan
from agent.rehearse.background import play_stored
from agent.runtime import triggers
from agent.runtime.diagnosis import diagnose_instances as run
from agent.runtime.loop import resume_run, run_cycle
from agent.runtime.monitor_runner import monitor_tick as tick
from agent.runtime.sweep import sweep_decided
from fleet.models import Instance

#: Celery's time limits on the tasks that run a cycle (or the monitor) under the run lock: the
#: last net under the Curio read's timeouts and deadline (``fleet.demand.curio.read_deadline``).
#: The soft limit raises ``SoftTimeLimitExceeded`` inside the task (``run_cycle`` fails its run and
#: releases the lock); the hard one kills the worker process. Both are inside the run lock's expiry.
CYCLE_LIMITS = {
    "soft_time_limit": settings.WARDEN["CYCLE_SOFT_TIME_LIMIT_S"],
    "time_limit": max(settings.WARDEN["CYCLE_TIME_LIMIT_S"], settings.WARDEN["CYCLE_SOFT_TIME_LIMIT_S"] + 5),
}


@shared_task(name="agent.tasks.observe_cycle", bind=True, acks_late=True, max_retries=None, **CYCLE_LIMITS)
def observe_cycle(self, trigger: str = "heartbeat", message: str | None = None, actor: str = "system"):
    """Run one observe cycle; returns the run number. Retried shortly while another run (the
    monitor, say) holds the lock, so a heartbeat is late by seconds, not skipped.

    A heartbeat gives up after 10 tries (the next beat comes). A cycle someone asked for (an
    operator's "Trigger observe cycle now", a chat message) waits as a ``queued`` run and is
    retried until it runs — or until another cycle picks that queued run up (docs/faults.md).
    """

    if message:  # stored once; a retry finds it waiting in its queued run
        do_post_message(message, actor)
    run = run_cycle(trigger, actor=actor, events="take")
    if run is None:
        if trigger == "heartbeat":
            if self.request.retries >= 10:
                return None
        elif not Run.objects.filter(status="queued").exists():
            return None  # another cycle ran the queued run: asked for and done
        raise self.retry(args=(trigger, None, actor), countdown=min(30, 3 * (1 + self.request.retries)))
    return run.number


@shared_task(name="agent.tasks.resume", bind=True, acks_late=True, **CYCLE_LIMITS)
def resume(self, run_id: int):
    """Resume a parked run after its approvals were decided; retried while the run lock is busy."""

    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return None
    run = resume_run(run)
    if run.status == "parked" and not run.approvals.filter(status="waiting").exists():
        # another run held the lock: try again shortly; an approved call is never dropped
        raise self.retry(countdown=2, max_retries=None)
    return run.number


@shared_task(name="agent.tasks.triggered_cycle", bind=True, acks_late=True, max_retries=None, **CYCLE_LIMITS)
def triggered_cycle(self, kind: str = "event"):
    """The run of a trigger event (``agent.runtime.triggers.fire``); returns the run number, or ``None``
    when an earlier run already took every waiting event.

    Tries again (every ``agent.runtime.triggers.RETRY_S``, backing off to 1 s) while another run holds the lock, so the events
    that arrived during that run start the follow-up as soon as it ends (never in parallel). A
    waiting chat message (a queued run) is run here too, one run per message.
    """

    if not triggers.pending():
        return None
    run = run_cycle("event", events="need")
    if run is None:
        if not triggers.pending():
            return None  # another run took the events
        # 0.1 s, 0.2 s, … up to 1 s between tries while a long run (a model's turns) holds the lock
        raise self.retry(args=(kind,), countdown=min(1.0, triggers.RETRY_S * (1 + self.request.retries)))
    return run.number


def start_cycle(trigger: str, message: str | None = None, actor: str = "system") -> None:
    """Enqueue an observe cycle once the current transaction commits."""
    transaction.on_commit(lambda: observe_cycle.delay(trigger, message, actor))


def start_resume(run_id: int) -> None:
    """Enqueue the resume of a parked run once the current transaction commits."""
    transaction.on_commit(lambda: resume.delay(run_id))


@shared_task(name="agent.tasks.monitor_tick", acks_late=True, **CYCLE_LIMITS)
def monitor_tick():
    """The monitor's lifecycle rules (beat, every 60 s); returns a run number when it acted.

    Then the sweep (``agent.runtime.sweep.sweep_decided``): a decision whose resume task was never queued
    (Redis down when the operator decided) or died with its worker is dispatched here, within a
    minute of the broker being back, not after the broker's visibility timeout."""

    number = tick()

    scan()  # approvals about to expire or expired, alerts whose silence ended
    sweep_decided()
    return number


@shared_task(name="agent.tasks.consolidate_memory", acks_late=True)
def consolidate_memory(run_pk: int) -> int:
    """The model's memory consolidation after run ``run_pk`` closed (``agent.memory.model_digest.after_run``
    defers it here so the run's answer never waits for it). Returns the facts written; 0 when the
    run is gone or no model is configured any more."""

    run = Run.objects.filter(pk=run_pk).first()
    config = ModelConfig.from_settings()
    if run is None or config is None:
        return 0
    return len(consolidate_by_model(config, run))


@shared_task(name="agent.tasks.deliver_notification", bind=True, acks_late=True, max_retries=5)
def deliver_notification(self, pk: int):
    """Send one queued notification (``agent.notify.notifications.deliver``); returns its status.

    Transient failures that outlast the in-process attempts are retried by Celery after 1, 2, 4,
    8 and 16 minutes; after the last retry the row is ``failed`` (audited)."""

    n = deliver(pk, last_try=self.request.retries >= self.max_retries)
    if n is not None and n.status == "retrying":
        raise self.retry(countdown=60 * 2 ** self.request.retries)
    return n.status if n is not None else None


@shared_task(name="agent.tasks.diagnose_instances", acks_late=True)
def diagnose_instances(instance_pks: list, workers: dict | None = None, timeout_s: float = 30) -> int:
    """One chunk of a diagnosis fan-out (``agent.runtime.diagnosis.diagnose_fanout``): diagnose these
    instances in this worker's thread pool and store their diagnoses. ``workers`` maps each pk (as a
    string) to its worker view (``live``, ``unschedulable``, ``owned_tasks``) or ``None``. Returns
    how many were diagnosed."""

    views = {int(pk): SimpleNamespace(**w) for pk, w in (workers or {}).items() if w}
    instances = list(Instance.objects.filter(pk__in=instance_pks, killed_at__isnull=True))
    return len(run(instances, workers=views, timeout_s=timeout_s))


@shared_task(name="agent.tasks.rehearse", acks_late=False, soft_time_limit=3 * 3600, time_limit=3 * 3600 + 60)
def rehearse(pk: int) -> str:
    """Play the stored rehearsal ``pk`` (``agent.models.Rehearsal``, queued by
    ``agent.actions.runs.do_start_rehearsal``) on a throwaway database in a child process, storing its
    progress and outcome on the row (``agent.rehearse.background.play_stored``). Returns the final
    status, ``""`` when the row is gone or was already played. Not retried: a redelivery would play
    the day twice (``acks_late`` off), and a failure is stored on the row, not raised."""

    return play_stored(pk)

