"""Integration: a real Celery worker runs the agent's cycles against real PostgreSQL and Redis,
the agent launches real local worker processes, they drain 20 queued tasks, and after the
(shortened) dwell the agent retires them.

The Celery worker is a subprocess on this session's test databases (transactional test, so both
sides see committed rows) consuming a queue of its own; the test plays beat, sending the
heartbeat cycle every few seconds.
"""

import os
import subprocess
import time
import uuid

import psutil
import pytest
from django.db.models import Q

from agent.models import Run, SessionState, SideEffect
from console.celery import app
from fleet import demo
from fleet.harmony import HarmonyTask, HarmonyTaskHistory
from fleet.models import Diagnosis, Instance
from fleet.providers.local import LocalProvider
from tests.subprocs import BIN, ROOT, test_db_env

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True, databases="__all__"),
    pytest.mark.timeout(420),
]

MAX_WORKERS = 3


def wait_for(what: str, predicate, timeout: float, tick) -> None:
    """Call ``tick()`` then ``predicate()`` every 2 s until it is true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tick()
        if predicate():
            return
        time.sleep(2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for: {what}")


@pytest.fixture
def celery_worker(tmp_path):
    """A real ``celery -A console worker`` on the test databases, its own queue and var dir."""
    queue = f"warden-it-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        **test_db_env(),
        "WARDEN_VAR_DIR": str(tmp_path),
        "WARDEN_CELERY_QUEUE": queue,
        "WARDEN_PROOF_SECONDS": "1",
        "WARDEN_HEARTBEAT_S": "1",
        "WARDEN_STARTUP_GRACE_S": "3",
        "WARDEN_DWELL_MIN": "0.1",  # 6 s instead of 15 min
        "WARDEN_HOLD_OFF_MIN": "0.1",
        "WARDEN_MAX_INSTANCES": str(MAX_WORKERS),
        "WARDEN_STOP_GRACE_S": "3",
    }
    log = (tmp_path / "celery.log").open("w")
    proc = subprocess.Popen(
        [str(BIN / "celery"), "-A", "console", "worker", "-Q", queue, "-c", "2", "-l", "info",
         "--without-gossip", "--without-mingle", "-n", f"{queue}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield queue, proc, tmp_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        # Leave no demo worker behind, whatever happened.
        provider = LocalProvider(root=tmp_path / "workers")
        for inst in provider.list_instances():
            provider.destroy(inst.external_id)


def test_agent_launches_workers_drains_queue_and_retires_them(celery_worker):
    queue, proc, var_dir = celery_worker
    HarmonyTask.objects.using("harmony").all().delete()
    HarmonyTaskHistory.objects.using("harmony").all().delete()

    # An operator's objective high enough to want every allowed worker, and a policy that lets the
    # agent retire idle workers without an approval (launches with no live worker are P0: auto).
    state = SessionState.get()
    state.target_proofs_hr = 100_000
    # the scale-down budget is opened to every worker: this test waits for the whole idle fleet to retire
    state.overrides = {"policy": {"stop_instance": "auto", "launch_instance": "auto"}, "limits": {"retire_budget_pct": 100}}
    state.save()

    ids = demo.enqueue(20)
    assert len(ids) == 20

    def heartbeat():
        assert proc.poll() is None, (var_dir / "celery.log").read_text()[-3000:]
        # A connection of its own: other tests may have closed the app's shared producer pool.
        with app.connection_for_write() as conn:
            app.send_task("agent.tasks.observe_cycle", args=["heartbeat"], queue=queue, connection=conn)

    def log_tail():
        return (var_dir / "celery.log").read_text()[-4000:]

    local = Instance.objects.filter(provider="local")
    peak = {"running": 0}

    def launched():
        running = local.filter(killed_at__isnull=True, status="running").count()
        peak["running"] = max(peak["running"], running)
        return running >= 1

    wait_for("the agent to launch local workers", launched, 120, heartbeat)

    def drained():
        launched()
        done = HarmonyTaskHistory.objects.using("harmony").filter(task_id__in=ids, result=True).count()
        return done == 20 and not HarmonyTask.objects.using("harmony").filter(id__in=ids).exists()

    wait_for("the 20 tasks to drain", drained, 180, heartbeat)
    assert peak["running"] >= 2, f"expected several workers, saw at most {peak['running']}\n{log_tail()}"
    assert local.count() <= MAX_WORKERS

    def retired():
        return local.exists() and not local.filter(killed_at__isnull=True).exclude(status="stopped").exists()

    wait_for("the agent to retire the idle workers after the dwell", retired, 180, heartbeat)

    # retired = stopped by the agent after the dwell, with a diagnosis first; no worker process is left
    stops = SideEffect.objects.filter(tool="stop_instance", status="done")
    assert stops.count() == local.filter(killed_at__isnull=True).count() >= 2
    assert all(s.actor == "agent" and "idle" in s.args["reason"] for s in stops)
    for inst in local.filter(killed_at__isnull=True):
        assert inst.intended_status == "stopped"
        assert Diagnosis.objects.filter(instance=inst).exists()
        assert (
            inst.pid is None
            or not psutil.pid_exists(inst.pid)
            or psutil.Process(inst.pid).status() == psutil.STATUS_ZOMBIE
        )
    assert {p.status for p in LocalProvider(root=var_dir / "workers").list_instances()} == {"stopped"}
    # The cycles ran on the worker, through the one entry point, and finished.
    runs = Run.objects.filter(trigger="heartbeat")
    assert runs.filter(Q(status="done")).exists()
    assert not runs.filter(status="failed").exists(), list(runs.filter(status="failed").values("number", "halt_detail"))
