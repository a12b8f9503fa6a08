"""Event triggers: what happened starts a run at once, bursts coalesce, one run at a time.

Events start runs, and the cron timer stays as a heartbeat backup; a debounce of 2 s for P0
events and 10 s for P1 events; never two runs in parallel (docs/agent.md, Triggers).

Events (``fleet.events.trigger(kind, detail)``, or :func:`fire` from the agent and console):

=================  ====  ===============================================================
kind               prio  raised by
=================  ====  ===============================================================
worker_died        P0    ``fleet.sync``: an instance that was ``running`` is not any more;
                         :func:`note_demand`: a worker's heartbeat went stale
workers_all_dead   P0    ``fleet.sync``: the last running instance stopped running;
                         :func:`note_demand`: no expected worker is live any more
chat               P0    an operator's message (``console.views.dashboard.post_message``)
operator           P0    "Trigger observe cycle now"
instance_state     P1    ``fleet.sync``: any other status change of an instance
queue_nonempty     P1    the proving queue went from empty to non-empty (``fleet.demo.enqueue``;
                         :func:`note_demand` on the monitor's tick for a real Curio queue)
alert              P1    ``fleet.alerts.raise_alert``: a new alert fires
target             P1    ``agent.actions.session.do_set_target``: the operator changed the target
=================  ====  ===============================================================

Debounce, per priority, on the leading edge (all state in Redis, atomic Lua):

- the first event of a priority opens its window (P0 ``WARDEN_TRIGGER_P0_WINDOW_S`` 2 s, P1
  ``WARDEN_TRIGGER_P1_WINDOW_S`` 10 s) and starts a run at once;
- further events in the window schedule one follow-up run at the window's end; more events
  coalesce into it. A burst gives at most two runs per priority.

Every event is pushed to one pending list. A run drains the whole list (atomically, with the
follow-up flags) right after it takes the run lock and before it observes, and records the drained
events on ``Run.trigger_events``; a run started by an event whose list is already empty (an
earlier run took its events) does not run. So every event is accounted for by exactly one run,
and an event that arrives during a run is never dropped: it lands in the follow-up.

One run at a time: the run lock (``agent.runtime.runs.acquire_lock``) with its expiry, and the database
constraint ``one_running_run`` (at most one ``Run`` in ``running``) as the second net. A triggered
task that finds the lock held retries every ``RETRY_S`` until the holder is done.

Events that a run raises itself (its own observe sees an instance change, its own breaker raises
an alert) are not triggers: the run that caused them is already looking (this process holds the
run lock: ``agent.runtime.runs.lock_held_here``). The Celery beat's heartbeat run stays the backup for a
lost event or a Redis outage.
"""

import json
import logging
import time
import uuid

import redis
from celery import current_app
from django.conf import settings

from agent.runtime.runs import lock_held_here

log = logging.getLogger(__name__)

PRIORITY = {
    "worker_died": "P0",
    "workers_all_dead": "P0",
    "chat": "P0",
    "operator": "P0",
    "instance_state": "P1",
    "queue_nonempty": "P1",
    "alert": "P1",
    "target": "P1",
}
#: seconds between tries of a triggered task while another run holds the lock
RETRY_S = 0.1

_FIRE = """
redis.call('RPUSH', KEYS[1], ARGV[1])
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[2]) then return -1 end
local ttl = redis.call('PTTL', KEYS[2])
if ttl < 0 then ttl = 0 end
if redis.call('SET', KEYS[3], '1', 'NX', 'PX', ttl + 60000) then return ttl end
return -2
"""
_DRAIN = """
local events = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', unpack(KEYS))
return events
"""
_clients: dict[str, redis.Redis] = {}
#: a stand-in for Redis and Celery (a rehearsal on the virtual clock, ``agent.rehearse.events``):
#: when set, :func:`fire`, :func:`note_demand`, :func:`drain`, :func:`put_back`, :func:`pending`
#: and :func:`reset` use it instead (same windows, same edges), and nothing reaches Redis or Celery
_store = None


def set_store(store) -> None:
    """Route trigger state to ``store`` (None: back to Redis and Celery). ``store`` has
    ``fire(event, window_ms) -> int`` (the Lua script's answer: -1 lead, ms until the follow-up,
    -2 coalesced; it schedules the runs itself), ``note(key, value) -> bytes | None`` (the previous
    value), ``drain() -> list[dict]``, ``put_back(events)``, ``pending() -> int`` and ``reset()``."""
    global _store
    _store = store


def _redis() -> redis.Redis:
    url = settings.REDIS_URL
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=5)
    return _clients[url]


def _key(name: str) -> str:
    return f"warden:triggers:{name}"


def window_s(priority: str) -> float:
    """The debounce window of ``priority`` ("P0" or "P1"), seconds."""
    return settings.WARDEN["TRIGGER_WINDOWS_S"][priority]


def fire(kind: str, detail: str = "", *, at: float | None = None) -> dict | None:
    """Record event ``kind`` and start or schedule the run that will see it.

    Returns the event (``{"id", "kind", "priority", "detail", "at"}``, ``at`` unix seconds) with
    ``edge``: ``lead`` (a run starts now), ``follow`` (a follow-up run in ``delay_s``) or
    ``coalesced`` (into an already scheduled follow-up); ``None`` when triggers are off
    (WARDEN_EVENT_TRIGGERS=0) or the event was raised by the run this process is running.
    Raises ``KeyError`` for an unknown kind, ``redis.RedisError`` / kombu errors when Redis is
    unreachable (callers that must not fail use :func:`on_event`).
    """
    priority = PRIORITY[kind]
    if not settings.WARDEN["EVENT_TRIGGERS"] or lock_held_here():
        return None
    event = {"id": uuid.uuid4().hex[:12], "kind": kind, "priority": priority, "detail": detail[:200],
             "at": at if at is not None else time.time()}
    window_ms = int(window_s(priority) * 1000)
    if _store is not None:
        res = _store.fire(event, window_ms)
        event["edge"] = "lead" if res == -1 else "follow" if res >= 0 else "coalesced"
        if res >= 0:
            event["delay_s"] = res / 1000
        return event
    r = _redis()
    res = r.eval(_FIRE, 3, _key("pending"), _key(f"window:{priority}"), _key(f"follow:{priority}"),
                 json.dumps(event), window_ms)
    triggered_cycle = current_app.tasks["agent.tasks.triggered_cycle"]  # by name: agent.tasks imports triggers
    if res == -1:
        event["edge"] = "lead"
        triggered_cycle.delay(kind)
    elif res >= 0:
        event["edge"], event["delay_s"] = "follow", res / 1000
        triggered_cycle.apply_async((kind,), countdown=res / 1000)
    else:
        event["edge"] = "coalesced"
    return event


def on_event(sender=None, kind: str = "", detail: str = "", **_) -> None:
    """The ``fleet.events.happened`` receiver: :func:`fire`, logging (never raising) a failure."""
    try:
        fire(kind, detail)
    except Exception as exc:  # noqa: BLE001 — a lost event waits for the heartbeat; the caller goes on
        log.warning("trigger %s (%s) not started: %s; the heartbeat run will see it", kind, detail, exc)


_NOTE = """
local prev = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return prev
"""


def note_demand(demand, *, fire_events: bool = True) -> list[str]:
    """Compare a demand reading with the last one noted and fire its edges; returns the kinds fired.

    Edges (all workers dead with tasks queued must not wait for the heartbeat): queued
    0 → more (``queue_nonempty``); dead workers 0 → more (``worker_died``); live workers some → none
    while workers are expected (``workers_all_dead``). An unknown reading notes nothing. With
    ``fire_events=False`` (a planner run that observed it itself) only the state is noted. Redis
    errors are logged, never raised.
    """
    if demand is None or demand.state != "ok":
        return []
    now = {"queued": demand.queued, "dead": demand.workers_dead,
           "live": demand.workers_live if demand.workers_expected else None}
    fired = []
    try:
        if _store is not None:
            prev = {k: _store.note(k, "" if v is None else str(v)) for k, v in now.items()}
        else:
            r = _redis()
            prev = {k: r.eval(_NOTE, 1, _key("last_demand"), k, "" if v is None else str(v)) for k, v in now.items()}
        prev = {k: int(v) if v not in (None, b"") else None for k, v in prev.items()}
        edges = [
            ("queue_nonempty", prev["queued"] == 0 and (now["queued"] or 0) > 0, f"{now['queued']} task(s) queued"),
            ("worker_died", prev["dead"] == 0 and (now["dead"] or 0) > 0, f"{now['dead']} worker(s) dead"),
            ("workers_all_dead", bool(prev["live"]) and now["live"] == 0,
             f"0 of {demand.workers_expected} expected workers live"),
        ]
        for kind, edge, detail in edges:
            if edge and fire_events:
                fire(kind, detail)
                fired.append(kind)
    except Exception as exc:  # noqa: BLE001 — the heartbeat run is the backup
        log.warning("demand edges not noted: %s", exc)
    return fired


def pending() -> int:
    """How many events wait for a run."""
    if _store is not None:
        return _store.pending()
    return _redis().llen(_key("pending"))


def drain() -> list[dict]:
    """Take every waiting event (and clear the follow-up flags) in one atomic step; oldest first.

    Called by :func:`agent.runtime.loop.run_cycle` once it holds the run lock and before it observes, so an
    event that arrives later is left for the follow-up run.
    """
    if _store is not None:
        return _store.drain()
    raw = _redis().eval(_DRAIN, 3, _key("pending"), _key("follow:P0"), _key("follow:P1"))
    events = []
    for item in raw:
        try:
            events.append(json.loads(item))
        except ValueError:
            log.warning("unreadable trigger event dropped: %r", item[:200])
    return events


def put_back(events: list[dict]) -> None:
    """Return drained ``events`` to the front of the waiting list (their run could not start)."""
    if events and _store is not None:
        _store.put_back(events)
    elif events:
        _redis().lpush(_key("pending"), *[json.dumps(e) for e in reversed(events)])


def reset() -> None:
    """Forget every waiting event, window and follow-up flag (tests, benches, "Reset session")."""
    if _store is not None:
        _store.reset()
        return
    r = _redis()
    r.delete(_key("pending"), _key("window:P0"), _key("window:P1"), _key("follow:P0"), _key("follow:P1"),
             _key("last_demand"))
