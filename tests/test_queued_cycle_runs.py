"""A cycle the console calls "queued" does run, and a dead run's lock does not hold it up
(docs/faults.md).

- "Trigger observe cycle now" stores a ``queued`` run with its audit row; the next cycle to start
  runs it, whichever task starts it.
- The run lock records its holder; a lock whose holder is a dead process is taken over at once
  instead of after its 600 s expiry. With a real Celery worker: a lock left by a killed process,
  then "Trigger observe cycle now" — the cycle runs within seconds.
"""

import subprocess
import sys
from datetime import timedelta

import psutil

from agent.models import Run, SessionState
from agent.policy.claims import worker_identity
from agent.runtime.loop import acquire_lock, release_lock, run_cycle
from fleet.clock import clock
from fleet.models import AuditLog
from tests import fleet_support
from tests.fleet_support import FLEET_DB, wait_for
from tests.test_approval_restart import Worker, worker_env  # noqa: F401

pytestmark = FLEET_DB
local_fleet = fleet_support.local_fleet


def _dead_holder() -> str:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = psutil.Process(proc.pid).create_time()
    proc.kill()
    proc.wait()
    return worker_identity().split("|")[0] + f"|{proc.pid}|{started:.2f}"


def _lock_held_by(holder: str) -> None:
    SessionState.get()
    SessionState.objects.filter(pk=1).update(lock_token="f" * 32, lock_holder=holder,
                                             lock_expires_at=clock.now() + timedelta(seconds=600))


def test_a_queued_trigger_is_run_by_the_next_cycle(client, alice, local_fleet, broker_queue):
    token = acquire_lock(ttl_s=600)  # a cycle in progress (this process: alive)
    try:
        client.force_login(alice)
        resp = client.post("/actions/observe/")
        assert resp.status_code == 302
        [queued] = Run.objects.filter(status="queued")
        assert queued.trigger == "operator"
        assert AuditLog.objects.get(verb="observe_now").after == {"run": queued.number}
        assert run_cycle("heartbeat") is None  # the lock is held by a live run: nothing runs yet
    finally:
        release_lock(token)
    ran = run_cycle("heartbeat")  # whatever cycle starts next runs the queued one
    assert ran.pk == queued.pk
    queued.refresh_from_db()
    assert queued.status == "done" and queued.trigger == "operator"


def test_a_lock_whose_holder_is_dead_is_taken_over_at_once_and_a_live_one_is_not(local_fleet):
    _lock_held_by(worker_identity())
    assert acquire_lock() is None  # alive (this very process)
    orphan = Run.objects.create(number=99, trigger="heartbeat", planner="rules", status="running", started_at=clock.now())
    dead = _dead_holder()
    _lock_held_by(dead)
    token = acquire_lock()
    assert token is not None and SessionState.get().lock_holder == worker_identity()
    orphan.refresh_from_db()  # the dead holder's run is not left "running" for ever
    assert orphan.status == "failed" and f"pid {dead.split('|')[1]}" in orphan.halt_detail
    assert orphan.ended_at is not None and orphan.final_report
    assert acquire_lock() is None  # one taker wins
    release_lock(token)
    assert SessionState.get().lock_token == ""


def test_with_a_real_worker_a_dead_runs_lock_does_not_delay_the_trigger(worker_env, tmp_path, client, alice):  # noqa: F811
    env = {**worker_env, "WARDEN_RUN_LOCK_TTL_S": "600"}
    worker = Worker(env, tmp_path / "celery.log", "trigger").start()
    try:
        _lock_held_by(_dead_holder())  # a run whose worker was SIGKILLed
        client.force_login(alice)
        assert client.post("/actions/observe/").status_code == 302
        [queued] = Run.objects.filter(status="queued")
        wait_for(lambda: Run.objects.get(pk=queued.pk).status == "done", timeout=45,
                 what=f"the queued cycle to run; worker log:\n{worker.text()}")
        # the run is closed, then its lock released (agent.runtime.runs): a moment apart
        wait_for(lambda: SessionState.get().lock_token == "", timeout=10, what="the run lock released after the run")
    finally:
        worker.kill()
