"""Console-side Celery tasks: the beat tick that ``/healthz`` reads to tell whether beat is alive."""

import time

import redis
from celery import shared_task
from django.conf import settings

BEAT_TICK_KEY = "warden:beat:last_tick"
BEAT_TICK_INTERVAL_S = 30


def redis_client() -> redis.Redis:
    """A client for ``settings.REDIS_URL`` with short timeouts (3 s connect, 5 s per command)."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3, socket_timeout=5)


@shared_task(name="console.tasks.beat_tick", ignore_result=True)
def beat_tick() -> int:
    """Write the current unix time (whole seconds) to Redis key ``warden:beat:last_tick``.

    Scheduled by beat every 30 s (``manage.py bootstrap`` creates the PeriodicTask). Beat counts as
    up while the stored tick is younger than two intervals. Returns the time written. Raises
    ``redis.RedisError`` when Redis is unreachable (the tick is then simply missing).
    """
    now = int(time.time())
    redis_client().set(BEAT_TICK_KEY, now)
    return now
