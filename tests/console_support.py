"""Helpers for the console tests: read what reached the Celery broker, capture change topics.

``ensure_start_cycle()`` is a stand-in used ONLY while ``agent.tasks`` is not written yet: it
installs a module whose ``start_cycle`` publishes ``agent.tasks.observe_cycle`` to the broker after
commit, exactly as the contract says the real one does. With the real module present it does
nothing.
"""

import base64
import contextlib
import json
import sys
import types

import redis
from django.conf import settings
from django.db import transaction

from fleet.events import changed


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def queue_name() -> str:
    return settings.CELERY_TASK_DEFAULT_QUEUE


def purge_broker() -> None:
    """Drop every message waiting in the Warden queue of the test Redis db."""
    client = broker()
    for key in client.keys(queue_name() + "*"):
        client.delete(key)


def broker_messages() -> list[dict]:
    """Tasks waiting in the queue: ``[{"task": name, "args": [...], "kwargs": {...}}]``, oldest first."""
    out = []
    for raw in reversed(broker().lrange(queue_name(), 0, -1)):
        msg = json.loads(raw)
        body = msg["body"]
        if msg.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args, kwargs, _embed = json.loads(body)
        out.append({"task": msg["headers"]["task"], "args": args, "kwargs": kwargs})
    return out


def ensure_start_cycle() -> bool:
    """Install the stand-in ``agent.tasks`` if the real one is missing. Returns True if it did."""
    try:
        import agent.tasks  # noqa: F401

        return False
    except ImportError:
        pass
    from console.celery import app

    module = types.ModuleType("agent.tasks")

    def start_cycle(trigger, message=None, actor="system"):
        transaction.on_commit(
            lambda: app.send_task("agent.tasks.observe_cycle", args=(trigger, message, actor), queue=queue_name())
        )

    module.start_cycle = start_cycle
    sys.modules["agent.tasks"] = module
    return True


def cycle_messages(trigger: str) -> list[dict]:
    """Observe-cycle tasks in the queue for ``trigger`` (positional or keyword)."""
    found = []
    for m in broker_messages():
        if m["task"] != "agent.tasks.observe_cycle":
            continue
        got = m["args"][0] if m["args"] else m["kwargs"].get("trigger")
        if got == trigger:
            found.append(m)
    return found


@contextlib.contextmanager
def capture_topics():
    """Collect the topics of every ``fleet.events.changed`` signal sent inside the block."""
    seen: list[str] = []

    def receiver(sender, topics=(), **kwargs):
        seen.extend(topics)

    changed.connect(receiver, dispatch_uid="test-capture-topics")
    try:
        yield seen
    finally:
        changed.disconnect(dispatch_uid="test-capture-topics")
