"""``/healthz``: is every part Warden needs up? JSON, no login.

Checks (each ``{"up": bool, "detail": str}``):

* ``database`` — ``SELECT 1`` on the default database;
* ``harmony`` — one read of ``harmony_task`` on the HarmonyDB alias (Curio's queue);
* ``redis`` — ``PING`` on ``REDIS_URL`` (1 s timeouts);
* ``celery`` — a worker answers a control ping (skipped, down, when Redis is);
* ``runs`` — no run is stuck ``running`` without a live lock holder (:func:`check_runs`; only
  while the database is up);
* ``beat`` — Redis key ``warden:beat:last_tick`` (unix seconds, written by the beat tick task)
  is younger than two tick intervals (``console.tasks.BEAT_TICK_INTERVAL_S``, 30 s). A Redis
  up for less than that and holding no tick (restarted without its data) is not held against
  beat: ``bench/faults.py`` showed /healthz 503 for up to 30 s after every Redis restart.

* ``process:NAME`` — only under ``make run`` (supervisor sets ``SUPERVISOR_SERVER_URL`` in the
  processes it starts): one check per supervised program (``web``, ``worker``, ``beat``), up while
  supervisor reports it ``RUNNING``. A process that died and is being restarted (``STARTING``,
  ``BACKOFF``) or that supervisor gave up on (``FATAL``) is named down meanwhile.

Also reported, not judged: the last run (number, status, started_at) and the newest demand
sample (state, age in seconds). Status 200 when every check is up, else 503 with ``down`` naming
the failed checks.
"""

import http.client
import os
import socket
import time
import xmlrpc.client

import redis
from django.conf import settings
from django.db import connections

from agent.models import Run, SessionState
from agent.policy.claims import worker_alive
from console.tasks import BEAT_TICK_INTERVAL_S, BEAT_TICK_KEY
from fleet.clock import clock
from fleet.harmony import HarmonyTask
from fleet.models import DemandSample

BEAT_KEY = BEAT_TICK_KEY

REDIS_TIMEOUT_S = 1.0
CELERY_PING_TIMEOUT_S = 1.0


def beat_tick_s() -> float:
    """Seconds between beat ticks (the beat task writes :data:`BEAT_KEY` every tick)."""
    return float(settings.WARDEN.get("BEAT_TICK_S", BEAT_TICK_INTERVAL_S))


def _up(detail: str = "") -> dict:
    return {"up": True, "detail": detail}


def _down(detail: str) -> dict:
    return {"up": False, "detail": detail[:300]}


def check_database() -> dict:
    try:
        with connections["default"].cursor() as cur:
            cur.execute("SELECT 1")
        return _up()
    except Exception as exc:
        return _down(f"{type(exc).__name__}: {exc}")


def check_harmony() -> dict:
    try:
        HarmonyTask.objects.using("harmony").only("id").first()
        return _up()
    except Exception as exc:
        return _down(f"{type(exc).__name__}: {exc}")


def redis_client() -> redis.Redis:
    """A client for ``REDIS_URL`` that gives up within a second."""
    return redis.Redis.from_url(
        settings.REDIS_URL, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S
    )


def check_redis(client: redis.Redis) -> dict:
    try:
        client.ping()
        return _up()
    except Exception as exc:
        setting = "REDIS_URL" if not settings.REDIS_EMBEDDED else "the bundled redis-server (REDIS_URL unset; make run starts it)"
        return _down(f"{setting}: {type(exc).__name__}: {exc}")


def check_celery(redis_up: bool) -> dict:
    if not redis_up:
        return _down("not pinged: Redis (the broker) is down")
    try:
        # inside: the check reports a Celery app that fails to load as down
        from console.celery import app
    except Exception as exc:
        return _down(f"no Celery app: {exc}")
    try:
        replies = app.control.ping(timeout=CELERY_PING_TIMEOUT_S)
    except Exception as exc:
        return _down(f"{type(exc).__name__}: {exc}")
    if not replies:
        return _down(f"no worker answered a ping within {CELERY_PING_TIMEOUT_S:g} s")
    return _up(", ".join(sorted(name for reply in replies for name in reply)))


def check_beat(client: redis.Redis, redis_up: bool) -> dict:
    if not redis_up:
        return _down("unknown: Redis is down")
    limit = 2 * beat_tick_s()
    try:
        raw = client.get(BEAT_KEY)
    except Exception as exc:
        return _down(f"{type(exc).__name__}: {exc}")
    if raw is None:
        # the tick lives in Redis: a Redis restarted without its data (or a new one) has none
        # until beat's next tick, which is no sign of a dead beat for up to ``limit`` seconds
        try:
            uptime = float(client.info("server").get("uptime_in_seconds", limit + 1))
        except Exception:
            uptime = limit + 1
        if uptime <= limit:
            return _up(f"no tick since Redis started {uptime:.0f} s ago; beat's next is due within {beat_tick_s():.0f} s")
        return _down("beat has never ticked")
    try:
        age = time.time() - float(raw)
    except ValueError:
        return _down(f"bad tick value {raw!r}")
    if age > limit:
        return _down(f"last tick {age:.0f} s ago (limit {limit:.0f} s)")
    return _up(f"last tick {age:.0f} s ago")


SUPERVISOR_TIMEOUT_S = 1.0


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over supervisor's unix socket (``unix:///path``), giving up after a timeout."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path_ = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path_)
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    def __init__(self, path: str, timeout: float):
        super().__init__()
        self.path_, self.timeout = path, timeout

    def make_connection(self, host):
        return _UnixHTTPConnection(self.path_, self.timeout)


def supervised_processes(url: str | None = None, timeout: float = SUPERVISOR_TIMEOUT_S) -> list[dict] | None:
    """The processes supervisor runs, as its XML-RPC ``getAllProcessInfo`` lists them (dicts with
    ``name``, ``group``, ``statename``, ``pid``, ``description``), or None when this process was not
    started by supervisor (no ``SUPERVISOR_SERVER_URL``: pytest, systemd) or supervisor does not
    answer within ``timeout`` seconds. Only ``unix://`` server URLs (supervisord.conf) are read."""
    url = url if url is not None else os.environ.get("SUPERVISOR_SERVER_URL", "")
    if not url.startswith("unix://"):
        return None
    proxy = xmlrpc.client.ServerProxy("http://localhost", transport=_UnixTransport(url[len("unix://"):], timeout))
    try:
        return list(proxy.supervisor.getAllProcessInfo())
    except (OSError, xmlrpc.client.Error, http.client.HTTPException):
        return None


def check_processes(infos: list[dict] | None) -> dict[str, dict]:
    """``{"process:NAME": check}`` for each supervised process (none when ``infos`` is None)."""
    checks: dict[str, dict] = {}
    for info in infos or []:
        state, desc = info.get("statename", "UNKNOWN"), info.get("description", "")
        if state == "RUNNING":
            checks[f"process:{info['name']}"] = _up(desc)
        else:
            what = {"STARTING": "restarting", "BACKOFF": "exited too quickly; retrying with back-off",
                    "FATAL": "supervisor gave up after repeated failures; see the make run output, then "
                             f"`supervisorctl -c supervisord.conf start {info.get('group', 'warden')}:{info['name']}`"}
            checks[f"process:{info['name']}"] = _down(f"{state}: {what.get(state, desc or 'not running')}")
    return checks


def _stuck_runs() -> list[str]:
    lock = SessionState.objects.filter(pk=1).values("lock_token", "lock_expires_at", "lock_holder").first() or {}
    runs = list(Run.objects.filter(status="running").values_list("number", "started_at"))
    if not runs:
        return []
    token, expires, holder = lock.get("lock_token"), lock.get("lock_expires_at"), lock.get("lock_holder") or ""
    if not token:
        why = "no process holds the run lock"
    elif expires is not None and expires < clock.now():
        why = f"its run lock lapsed at {expires:%H:%M:%S} UTC"
    elif holder and worker_alive(holder) is False:
        why = f"the run lock's holder ({holder}) is dead"
    else:
        return []
    return [f"run {n} is running since {started:%H:%M:%S} UTC but {why}" for n, started in runs]


def check_runs() -> dict:
    """``runs``: no run is stuck — ``running`` while no live process holds the run lock (its
    process was interrupted or died mid-run). Read twice, so a run that closes between the two
    reads is not called stuck; the next cycle fails a stuck run with its report."""
    try:
        stuck = _stuck_runs()
        if stuck:
            stuck = [s for s in _stuck_runs() if s in stuck]
    except Exception as exc:
        return _down(f"{type(exc).__name__}: {exc}")
    if stuck:
        return _down("; ".join(stuck) + " (stuck: the next cycle fails it with a report)")
    return _up()


def last_run() -> dict | None:
    run = Run.objects.order_by("-started_at").only("number", "status", "started_at").first()
    if run is None:
        return None
    return {"number": run.number, "status": run.status, "started_at": run.started_at.isoformat()}


def demand() -> dict:
    sample = DemandSample.objects.order_by("-taken_at").only("state", "taken_at").first()
    if sample is None:
        return {"state": "unknown", "age_s": None, "detail": "no demand sample yet"}
    age = (clock.now() - sample.taken_at).total_seconds()
    return {"state": sample.state, "age_s": round(age, 1), "taken_at": sample.taken_at.isoformat()}


def report() -> tuple[dict, int]:
    """Run every check. Returns ``(body, http_status)``: 200 all up, 503 otherwise."""
    client = redis_client()
    checks = {"database": check_database(), "harmony": check_harmony(), "redis": check_redis(client)}
    redis_up = checks["redis"]["up"]
    checks["celery"] = check_celery(redis_up)
    checks["beat"] = check_beat(client, redis_up)
    checks.update(check_processes(supervised_processes()))
    try:
        client.close()
    except Exception:
        pass
    if checks["database"]["up"]:
        checks["runs"] = check_runs()
    body: dict = {"checks": checks}
    if checks["database"]["up"]:
        try:
            body["last_run"] = last_run()
            body["demand"] = demand()
        except Exception as exc:
            body["last_run"] = None
            body["demand"] = {"state": "unknown", "age_s": None, "detail": str(exc)[:300]}
    else:
        body["last_run"] = None
        body["demand"] = {"state": "unknown", "age_s": None, "detail": "database down"}
    down = [name for name, check in checks.items() if not check["up"]]
    body["status"] = "down" if down else "ok"
    body["down"] = down
    return body, 503 if down else 200
