"""Warden's Celery app: broker and beat scheduler come from Django settings (``CELERY_*``).

Workers start with ``celery -A console worker -Q warden`` and beat with ``celery -A console beat``
(see supervisord.conf and docs/deploy.md). Tasks are discovered from each installed app's ``tasks`` module
(``agent.tasks``, ``fleet.tasks``, ``console.tasks``). The broker connection is lazy: importing
this module never touches Redis.
"""

import logging
import os

from celery import Celery
from celery.signals import beat_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("warden")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@beat_init.connect
def tick_at_start(sender=None, **kwargs) -> None:
    """Write beat's tick as soon as beat starts: ``/healthz`` then reports beat up
    at once instead of 503 "beat has never ticked" until the first scheduled tick has gone through
    the broker and a worker (about 30 s). A Redis that cannot be reached is only logged."""
    # inside: app loading (this module loads before the apps are ready)
    from console.tasks import beat_tick

    try:
        beat_tick()
    except Exception as exc:  # Redis down: the scheduled ticks write it later
        logging.getLogger(__name__).warning("beat: first tick not written: %s", exc)


@worker_ready.connect
def fail_stuck_runs_at_start(sender=None, **kwargs) -> None:
    """At a worker's start-up, a run left ``running`` by a process that is gone (Ctrl-C, SIGTERM,
    SIGKILL mid-run) is failed with its report (``agent.runtime.runs.fail_stuck_runs``, through the run
    lock: a lock a live run holds is left alone), and a chat message queued behind it is answered
    by a cycle queued here. Errors are only logged: the next cycle does the same."""
    try:
        # inside: app loading (this module loads before the apps are ready)
        from agent.models import Run
        from agent.runtime.runs import acquire_lock, release_lock

        token = acquire_lock(sees_events=False)
        if token is None:
            return
        release_lock(token)
        if Run.objects.filter(status="queued").exists():
            # inside: app loading (this module loads before the apps are ready)
            from agent.tasks import observe_cycle

            observe_cycle.delay("heartbeat")
    except Exception as exc:  # noqa: BLE001 — the database or Redis may still be starting
        logging.getLogger(__name__).warning("worker start-up: stuck runs not checked: %s", exc)
