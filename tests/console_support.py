"""Helpers for the console tests: read what reached the Celery broker, capture change topics."""

import base64
import contextlib
import json
import re

import redis
from django.conf import settings

from fleet.events import changed


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def queue_name() -> str:
    return settings.CELERY_TASK_DEFAULT_QUEUE


def purge_broker() -> None:
    """Drop every message waiting in the Warden queue of the test Redis db, and every message a
    worker of an earlier test took and never acknowledged (kombu's ``unacked`` hash: a worker
    killed while it held a task, which the broker would hand out again after its visibility
    timeout — to this test's worker)."""
    client = broker()
    for key in client.keys(queue_name() + "*"):
        client.delete(key)
    client.delete("unacked", "unacked_index")


def tasks_done(text: str, task: str) -> set[str]:
    """Ids of the Celery ``task`` (its name) that a worker log shows finished (succeeded or raised)."""
    return set(re.findall(rf"Task {re.escape(task)}\[([0-9a-f-]+)\] (?:succeeded|raised)", text))


def broker_idle() -> bool:
    """Nothing waits in this session's queue and nothing is delivered and unacknowledged (kombu's
    ``unacked`` hash): no task is left that could still act. The positive signal before a check
    that something did *not* happen."""
    r = broker()
    return r.llen(queue_name()) == 0 and r.hlen("unacked") == 0


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


# --- parked approvals through the real loop (approvals, exactly-once, roles tests) ------------
HX = {"HX-Request": "true"}
IDLE = {"state": "ok", "active": False, "queued": 0, "running": 0, "workers_expected": 2, "workers_live": 2, "idle_min": 60}
BUSY = {"state": "ok", "active": True, "queued": 7, "running": 1, "workers_expected": 1, "workers_live": 1, "idle_min": None}


def stop_script(*iids: str) -> list[dict]:
    """A script that diagnoses ``iids`` and then proposes stopping each (one batch when several)."""
    diag = [{"tool": "diagnose_instance", "args": {"instance_id": i}} for i in iids]
    stops = [{"tool": "stop_instance", "args": {"instance_id": i, "reason": f"{i} idle past the dwell"}} for i in iids]
    if len(iids) == 1:
        return [diag[0], stops[0]]
    return [{"parallel": diag}, {"parallel": stops}]


def park_stops(*iids: str):
    """Run one real cycle (script planner) that parks a ``stop_instance`` per id; returns ``(run, planner)``.

    Call inside ``tests.scenario_world.scenario_world`` with those ids in the fleet and idle demand.
    """
    from agent.planners.script import ScriptPlanner
    from agent.runtime.loop import run_cycle

    planner = ScriptPlanner(stop_script(*iids) + [{"text": 'done <verdict>{"action": true, "state_changed": true}</verdict>'}])
    run = run_cycle("operator", planner=planner)
    run.refresh_from_db()
    assert run.status == "parked", (run.status, run.halt_reason, list(run.steps.values_list("tool", "outcome", "reason_code")))
    return run, planner


def resume_messages() -> list[dict]:
    """``agent.tasks.resume`` tasks waiting in the broker."""
    return [m for m in broker_messages() if m["task"] == "agent.tasks.resume"]
