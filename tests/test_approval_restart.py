"""Approvals survive restarts, and an approved call executes exactly once even when the Celery worker
is SIGKILLed between the approval and the execution.

A real worker (``celery -A console worker -Q warden --pool solo``) runs against the test
databases and Redis db of this session. The parked call is a P1 ``launch_instance`` on the
``local`` provider (a real worker process per launch), so the provider-side effect is countable:
one state file per launched instance.

To kill the worker at a known point, the test holds a row lock on the session anchor from its
own database connection: the worker takes the resume task, then blocks in the run-lock UPDATE
(visible in ``pg_stat_activity``) — it has received the task but executed nothing — and is
SIGKILLed there. Redis keeps the unacked message (``acks_late`` + ``reject_on_worker_lost``);
the restarted worker gets it back after the broker's visibility timeout.
"""

import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
import redis
from django.conf import settings
from django.db import connections

from agent.models import Approval, Run, SessionState, SideEffect
from agent.planners.script import ScriptPlanner
from agent.runtime.approvals import do_decide
from agent.runtime.loop import expire_approvals, run_cycle
from agent.tasks import start_resume
from fleet.models import Instance
from fleet.providers.local import child_env
from tests import fleet_support
from tests.console_support import broker_idle, tasks_done
from tests.fleet_support import FLEET_DB, wait_for

pytestmark = [FLEET_DB, pytest.mark.slow]  # real processes: `make test-slow`
local_fleet = fleet_support.local_fleet

ROOT = Path(__file__).resolve().parent.parent
CELERY = ROOT / ".venv" / "bin" / "celery"
VISIBILITY_S = 5  # broker visibility timeout given to the worker: an unacked task comes back after this
LOCK_TTL_S = 3  # run-lock expiry given to the worker: a lock a killed worker left behind frees after this


class Worker:
    """One ``celery worker`` subprocess in its own process group, logging to ``log``."""

    def __init__(self, env: dict, log: Path, name: str):
        self.env, self.log, self.name = env, log, name
        self.proc: subprocess.Popen | None = None
        self._offset = 0

    def start(self) -> "Worker":
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(
                [str(CELERY), "-A", "console", "worker", "-Q", settings.CELERY_TASK_DEFAULT_QUEUE, "--pool", "solo", "-l", "info",
                 "-n", f"{self.name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"],
                cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: self.proc.poll() is not None or "ready." in self.text(), timeout=60, what="celery worker ready")
        assert self.proc.poll() is None, f"celery worker exited:\n{self.text()}"
        return self

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")[self._offset:]
        except OSError:
            return ""

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)


@pytest.fixture
def worker_env(local_fleet, settings):
    # these tests are about one approved call surviving a killed worker: no event-triggered run
    # (agent.runtime.triggers) may take the worker or the provider meanwhile (tests/test_triggers.py has those)
    settings.WARDEN = {**settings.WARDEN, "EVENT_TRIGGERS": False}
    if not CELERY.exists() or not (ROOT / "console" / "celery.py").exists():
        pytest.skip("the Celery app (console/celery.py) or .venv/bin/celery is missing")
    redis.Redis.from_url(settings.REDIS_URL).flushdb()  # this session's own Redis db: no stale tasks
    env = {
        **child_env(),  # test database URLs, WARDEN_VAR_DIR of local_fleet, demo knobs
        "REDIS_URL": settings.REDIS_URL,
        "WARDEN_PROVIDER": "local",
        "WARDEN_DEMAND_SOURCE": "local",
        "WARDEN_RUN_LOCK_TTL_S": str(LOCK_TTL_S),
        "WARDEN_CELERY_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S),
        "WARDEN_STARTUP_GRACE_S": "0",
        "WARDEN_EVENT_TRIGGERS": "0",
        "WARDEN_CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,  # the queue this session sends to
    }
    return env


@pytest.fixture
def workers(worker_env, tmp_path):
    started: list[Worker] = []

    def make(name: str) -> Worker:
        w = Worker(worker_env, tmp_path / "celery.log", name)
        started.append(w)
        return w.start()

    yield make
    for w in started:
        w.kill()


def park_a_launch() -> Approval:
    """A P1 launch parks for an operator (policy: approval). A task waits in the demo queue, so the
    launch is still needed when it is dispatched (no ``no_longer_needed``)."""
    from fleet import demo

    demo.enqueue(1)
    run = run_cycle("test", planner=ScriptPlanner([
        {"tool": "launch_instance", "args": {"gpu_name": "local-cpu", "launch_priority": "P1", "reason": "queue"}},
    ]))
    run.refresh_from_db()
    assert run.status == "parked"
    return Approval.objects.get(run=run)


def launched(provider) -> list[str]:
    """Instances the provider really created (one state file each; destroyed ones are gone too)."""
    return [p.name for p in Path(provider.root).glob("local-*.json") if not p.name.endswith(".run.json")]


def pg_connect(autocommit: bool) -> psycopg.Connection:
    """A connection of our own to the test database (outside Django's)."""
    cfg = connections["default"].settings_dict
    return psycopg.connect(host=cfg["HOST"] or "127.0.0.1", port=cfg["PORT"] or 5432, user=cfg["USER"],
                           password=cfg["PASSWORD"] or None, dbname=cfg["NAME"], autocommit=autocommit)


def anchor_lock() -> psycopg.Connection:
    """A connection holding ``FOR UPDATE`` on the session anchor row until it rolls back."""
    conn = pg_connect(autocommit=False)
    conn.execute("SELECT id FROM agent_sessionstate WHERE id = 1 FOR UPDATE")
    return conn


def blocked_on_anchor() -> bool:
    """Whether another backend waits for the anchor's row lock (the worker's run-lock UPDATE).

    Asked on a fresh autocommit connection: pg_stat_activity is a per-transaction snapshot.
    """
    with pg_connect(autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND wait_event_type = 'Lock' AND query ILIKE 'UPDATE %agent_sessionstate%lock_token%'"
        ).fetchone()
    return row[0] > 0


def test_a_waiting_approval_survives_a_restart_of_every_process(workers, local_fleet, alice):
    approval = park_a_launch()
    w = workers("first")
    w.kill()  # SIGKILL while the approval waits
    w2 = workers("second")

    expire_approvals()
    wait_for(broker_idle, timeout=30, what="the broker to hold no task that could act on the approval")
    approval.refresh_from_db()
    assert approval.status == "waiting"
    assert approval.run.status == "parked"
    assert approval.step.outcome == "parked"
    assert launched(local_fleet) == [] and not SideEffect.objects.exists()

    # and it can still be approved afterwards: the surviving worker executes it once
    do_decide(approval, "approve", "user:alice", user=alice)
    start_resume(approval.run_id)
    wait_for(lambda: Approval.objects.get(pk=approval.pk).status == "executed", timeout=60,
             what=f"the approved call to run; worker log:\n{w2.text()}")
    assert len(launched(local_fleet)) == 1


def test_a_worker_killed_between_the_approval_and_the_execution_executes_the_call_once(workers, local_fleet, alice):
    approval = park_a_launch()
    run = approval.run
    w = workers("victim")

    lock = anchor_lock()
    try:
        do_decide(approval, "approve", "user:alice", user=alice)
        start_resume(run.pk)
        # the worker took the task and is stuck before executing anything
        wait_for(blocked_on_anchor, timeout=30, what="the worker to pick up the resume task")
        assert Approval.objects.get(pk=approval.pk).status == "approved" and not SideEffect.objects.exists()
        w.kill()
        assert w.proc.returncode == -signal.SIGKILL
    finally:
        w.kill()  # also when a check above failed: it must not run on once the lock is gone
        lock.rollback()
        lock.close()

    approval.refresh_from_db()
    assert approval.status == "approved"  # approved, not executed, not denied
    assert not SideEffect.objects.exists() and launched(local_fleet) == []

    time.sleep(VISIBILITY_S + 1)  # past the visibility timeout: the unacked task is due again
    workers("restarted")
    wait_for(lambda: Approval.objects.get(pk=approval.pk).status == "executed", timeout=90,
             what="the approved call to execute after the restart (the broker must deliver the killed worker's "
                  "unacked task again: console/settings.py has to honour WARDEN_CELERY_VISIBILITY_TIMEOUT_S)")
    # nothing runs it a second time: every resume task delivered has finished and none is left
    wait_for(lambda: broker_idle() and tasks_done(Path(w.log).read_text(errors="replace"), "agent.tasks.resume"),
             timeout=60, what="the redelivered resume task to finish and the broker to be empty")

    approval.refresh_from_db()
    step = approval.step
    step.refresh_from_db()
    assert step.outcome == "approved_executed"
    [effect] = SideEffect.objects.filter(key=approval.idempotency_key)
    assert effect.status == "done"
    assert SideEffect.objects.filter(tool="launch_instance").count() == 1
    assert len(launched(local_fleet)) == 1  # the provider saw exactly one launch
    assert Instance.objects.filter(provider="local").count() == 1
    run.refresh_from_db()
    assert run.status in ("done", "halted") and run.status != "parked"
    assert SessionState.get().lock_token == ""


def test_an_approval_decided_while_another_run_holds_the_lock_still_executes_once(workers, local_fleet, alice):
    """The resume task meets a busy run lock: the call must run once the lock frees, not be dropped."""
    from agent.runtime.loop import acquire_lock, release_lock

    approval = park_a_launch()
    w = workers("busy")
    token = acquire_lock(ttl_s=600)  # a cycle in progress elsewhere
    assert token
    try:
        do_decide(approval, "approve", "user:alice", user=alice)
        start_resume(approval.run_id)
        # the positive signal: the worker ran the resume, met the busy lock and scheduled a retry
        wait_for(lambda: "agent.tasks.resume[" in w.text() and "retry: Retry in" in w.text(), timeout=60,
                 what=f"the resume task to meet the busy lock and retry; worker log:\n{w.text()}")
        assert Approval.objects.get(pk=approval.pk).status == "approved"
    finally:
        release_lock(token)

    wait_for(lambda: Approval.objects.get(pk=approval.pk).status == "executed", timeout=90,
             what="the approved call to execute after the lock was released (agent.tasks.resume must retry "
                  "while the run lock is busy instead of dropping the task)")
    assert len(launched(local_fleet)) == 1
    # the run leaves "parked" a moment after its approval is marked executed (same resume)
    wait_for(lambda: Run.objects.get(pk=approval.run_id).status != "parked", timeout=30, what="the resumed run to go on")
