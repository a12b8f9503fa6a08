"""Celery tasks: thin wrappers over the one cycle entry point (``agent.loop``)."""

from celery import shared_task
from django.db import transaction


@shared_task(name="agent.tasks.observe_cycle", acks_late=True)
def observe_cycle(trigger: str = "heartbeat", message: str | None = None, actor: str = "system"):
    """Run one observe cycle; returns the run number, or None when another run held the lock."""
    from agent.loop import run_cycle

    run = run_cycle(trigger, message=message, actor=actor)
    return run.number if run else None


@shared_task(name="agent.tasks.resume", acks_late=True)
def resume(run_id: int):
    """Resume a parked run after its approvals were decided."""
    from agent.loop import resume_run
    from agent.models import Run

    run = Run.objects.filter(pk=run_id).first()
    if run is not None:
        resume_run(run)
        return run.number
    return None


def start_cycle(trigger: str, message: str | None = None, actor: str = "system") -> None:
    """Enqueue an observe cycle once the current transaction commits."""
    transaction.on_commit(lambda: observe_cycle.delay(trigger, message, actor))


def start_resume(run_id: int) -> None:
    """Enqueue the resume of a parked run once the current transaction commits."""
    transaction.on_commit(lambda: resume.delay(run_id))


@shared_task(name="agent.tasks.monitor_tick", acks_late=True)
def monitor_tick():
    """The monitor's lifecycle rules (beat, every 60 s); returns a run number when it acted."""
    from agent.monitor_runner import monitor_tick as tick

    return tick()
