"""Fault figures (issue 11 §3): SIGKILL of the Celery worker mid-approval and mid-run, several times.

What runs — the real stack, no stand-ins: throwaway PostgreSQL test databases (Django's test
machinery; created and dropped here), this session's Redis db, a real ``celery worker --pool solo``
subprocess, the ``local`` provider (a real demo worker process per launch). The bench process
plays beat, compressed (through the broker: ``agent.tasks.monitor_tick`` every 2 s — beat: 60 s — and
a heartbeat ``observe_cycle`` every 10 s — beat: ``WARDEN_OBSERVE_INTERVAL_S``, 300 s) and the operator (it approves a parked launch, and approves again one that came back to
waiting after a ``stale_claim``).

Faults, each ``--reps`` times:

- ``approval, before claim``: the worker took the resume task of an approved P1 launch and is
  SIGKILLed before it claimed anything (it waits on the session anchor's row lock);
- ``approval, after claim``: SIGKILLed after the side-effect claim, inside the provider call (it
  waits on the local provider's id counter ``flock``), before the provider created anything;
- ``run, after claim``: an unattended heartbeat cycle's own P0 launch, SIGKILLed the same way —
  the dead run holds the run lock (TTL 600 s).

Then a new worker starts, and the bench waits (at most ``--timeout`` s) for the launch to exist.
Printed per fault: duplicated side effects (instances sharing one launch label, plus launches
beyond one per approval), lost approvals (approved and never executed), runs in parallel
(overlapping runs), runs stuck after recovery (``running``, or parked with nothing waiting), and
the median / max time to recover (kill → launch recorded). Goal: every count 0.

Usage::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench \\
    HARMONY_DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench_h \\
    REDIS_URL=redis://127.0.0.1:6379/2 WARDEN_CELERY_QUEUE=warden_bench \\
        .venv/bin/python bench/faults.py [--reps 3] [--timeout 120]

It flushes the Redis db named by REDIS_URL: give it one of its own.
"""

import argparse
import fcntl
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
os.environ.setdefault("WARDEN_LOG_LEVEL", "WARNING")
CELERY = ROOT / ".venv" / "bin" / "celery"


class Worker:
    """One ``celery worker`` subprocess in its own process group."""

    def __init__(self, env: dict, log: Path):
        self.env, self.log, self.proc = env, log, None

    def start(self) -> "Worker":
        from django.conf import settings

        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(
                [str(CELERY), "-A", "console", "worker", "-Q", settings.CELERY_TASK_DEFAULT_QUEUE, "--pool", "solo",
                 "-l", "info", "-n", f"bench{time.monotonic_ns()}@%h", "--without-gossip", "--without-mingle",
                 "--without-heartbeat"],
                cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        _wait(lambda: self.proc.poll() is not None or "ready." in self.log.read_text(errors="replace")[offset:], 60,
              "the celery worker to start")
        if self.proc.poll() is not None:
            raise SystemExit(f"celery worker exited; see {self.log}")
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)


def _wait(pred, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    return None


def _pg():
    import psycopg
    from django.db import connections

    cfg = connections["default"].settings_dict
    return psycopg.connect(host=cfg["HOST"] or "127.0.0.1", port=cfg["PORT"] or 5432, user=cfg["USER"],
                           password=cfg["PASSWORD"] or None, dbname=cfg["NAME"], autocommit=False)


def _blocked_on_anchor() -> bool:
    conn = _pg()
    conn.autocommit = True
    with conn:
        n = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND wait_event_type = 'Lock' AND query ILIKE 'UPDATE %agent_sessionstate%lock_token%'").fetchone()[0]
    return n > 0


def _reset(provider) -> None:
    import redis
    from django.conf import settings

    from agent.models import Approval, AuditLog, Run, SessionState, SideEffect, Step
    from fleet.harmony import HarmonyMachine, HarmonyMachineDetails, HarmonyTask, HarmonyTaskHistory
    from fleet.models import Alert, Instance

    for meta in sorted(provider.root.glob("local-*.json")):
        if not meta.name.endswith(".run.json"):
            try:
                provider.destroy(meta.name[: -len(".json")])
            except Exception:  # noqa: BLE001 — best effort between trials
                pass
    for model in (Approval, Step, Run, SideEffect, AuditLog, Alert, Instance):
        model.objects.all().delete()
    for model in (HarmonyTaskHistory, HarmonyTask, HarmonyMachineDetails, HarmonyMachine):
        model.objects.all().delete()
    state = SessionState.get()
    state.lock_token, state.lock_holder, state.lock_expires_at, state.overrides = "", "", None, {}
    state.save()
    redis.Redis.from_url(settings.REDIS_URL).flushdb()


def _park_launch():
    from agent.loop import run_cycle
    from agent.models import Approval
    from agent.planners.script import ScriptPlanner

    run = run_cycle("bench", planner=ScriptPlanner([
        {"tool": "launch_instance", "args": {"gpu_name": "local-cpu", "launch_priority": "P1", "reason": "bench"}}]))
    return Approval.objects.get(run=run)


def _beat_and_operator(approval, tick: int) -> None:
    """Beat, compressed (the monitor tick every call, a heartbeat cycle every fifth), through the
    broker; the operator re-approves a launch sent back to them."""
    from agent.approvals import DecisionError, do_decide
    from agent.tasks import monitor_tick, observe_cycle, start_resume

    monitor_tick.delay()
    if tick % 5 == 4:
        observe_cycle.delay("heartbeat")
    if approval is None:
        return
    approval.refresh_from_db()
    if approval.status == "waiting" and approval.outcome_detail.startswith("stale_claim"):
        try:
            do_decide(approval, "approve", "user:bench")
            start_resume(approval.run_id)
        except DecisionError:
            pass


def trial(kind: str, provider, env: dict, log: Path, timeout: float) -> dict:
    """One fault; returns the counts and the time to recover (None: not recovered in time)."""
    from agent.approvals import do_decide
    from agent.models import Approval, SessionState, SideEffect
    from agent.tasks import observe_cycle, start_resume
    from fleet import demo
    from fleet.models import Instance

    _reset(provider)
    approval = None
    victim = Worker(env, log).start()
    counter = None
    anchor = None
    try:
        if kind.startswith("approval"):
            approval = _park_launch()
        if kind == "approval, before claim":
            anchor = _pg()
            anchor.execute("SELECT id FROM agent_sessionstate WHERE id = 1 FOR UPDATE")
            do_decide(approval, "approve", "user:bench")
            start_resume(approval.run_id)
            _wait(_blocked_on_anchor, 60, "the worker to take the resume task")
        else:
            counter = open(provider.root / "counter", "a+")  # noqa: SIM115 — held across the kill
            fcntl.flock(counter, fcntl.LOCK_EX)
            if approval is not None:
                do_decide(approval, "approve", "user:bench")
                start_resume(approval.run_id)
            else:
                state = SessionState.get()
                state.overrides = {"policy": {"launch_instance": "auto", **{f"launch_instance:P{i}": "auto" for i in range(4)}}}
                state.save()
                demo.enqueue(10)
                observe_cycle.delay("heartbeat")
            _wait(lambda: SideEffect.objects.filter(tool="launch_instance").exists(), 60, "the claim")
            time.sleep(0.3)
        victim.kill()
    finally:
        victim.kill()
        if anchor is not None:
            anchor.rollback()
            anchor.close()
        if counter is not None:
            fcntl.flock(counter, fcntl.LOCK_UN)
            counter.close()
    t0 = time.monotonic()
    survivor = Worker(env, log).start()
    recovered = None
    try:
        deadline = time.monotonic() + timeout
        tick = 0
        while time.monotonic() < deadline:
            done = (Approval.objects.filter(pk=approval.pk, status="executed").exists() if approval is not None
                    else Instance.objects.filter(provider="local").exists())
            if done:
                recovered = time.monotonic() - t0
                break
            _beat_and_operator(approval, tick)
            tick += 1
            time.sleep(2)
        time.sleep(3)  # anything left to run twice has its chance
        return {"recovered": recovered, **_counts(provider, approval)}
    finally:
        survivor.kill()


def _counts(provider, approval) -> dict:
    from collections import Counter

    from agent.models import Approval, Run

    labels = Counter(pi.label for pi in provider.list_instances() if pi.label)
    duplicated = sum(n - 1 for n in labels.values() if n > 1)
    if approval is not None:
        duplicated += max(0, len(provider.list_instances()) - 1)
    lost = Approval.objects.filter(status="approved").count() + Approval.objects.filter(status__in=["void", "failed"]).count()
    runs = list(Run.objects.exclude(status__in=["queued", "parked"]).exclude(ended_at=None).order_by("started_at"))
    parallel = sum(1 for a, b in zip(runs, runs[1:], strict=False) if b.started_at < a.ended_at)
    stuck = Run.objects.filter(status="running").count() + sum(
        1 for r in Run.objects.filter(status="parked") if not r.approvals.filter(status="waiting").exists()
        and not r.approvals.filter(step__outcome="parked").exists())
    return {"duplicated": duplicated, "lost": lost, "parallel": parallel, "stuck": stuck}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)

    import django

    django.setup()
    from django.conf import settings
    from django.test.utils import setup_databases, teardown_databases

    from fleet.harmony import ensure_schema
    from fleet.providers.local import LocalProvider, child_env

    if not CELERY.exists():
        print("no .venv/bin/celery: install the requirements first", file=sys.stderr)
        return 2
    db_cfg = setup_databases(verbosity=0, interactive=False, aliases={"default", "harmony"})
    var = Path(tempfile.mkdtemp(prefix="warden-faults-"))
    settings.VAR_DIR = var
    settings.WARDEN = {**settings.WARDEN, "HEARTBEAT_S": 1, "PROOF_SECONDS": 1.0, "STOP_GRACE_S": 2.0, "STARTUP_GRACE_S": 0,
                       "DEMAND_SOURCE": "local", "PROVIDER": "local"}
    provider = LocalProvider()
    rows = []
    try:
        ensure_schema("harmony")
        env = {**child_env(), "REDIS_URL": settings.REDIS_URL, "WARDEN_PROVIDER": "local", "WARDEN_DEMAND_SOURCE": "local",
               "WARDEN_RUN_LOCK_TTL_S": "600", "WARDEN_CELERY_VISIBILITY_TIMEOUT_S": "5", "WARDEN_STARTUP_GRACE_S": "0"}
        log = var / "celery.log"
        for kind in ("approval, before claim", "approval, after claim", "run, after claim"):
            results = [trial(kind, provider, env, log, args.timeout) for _ in range(args.reps)]
            times = [r["recovered"] for r in results if r["recovered"] is not None]
            rows.append((kind, len(results), *(sum(r[k] for r in results) for k in ("duplicated", "lost", "parallel", "stuck")),
                         len(results) - len(times), statistics.median(times) if times else None, max(times) if times else None))
    finally:
        _reset(provider)
        teardown_databases(db_cfg, verbosity=0)

    head = ("fault (SIGKILL of the celery worker)", "runs", "duplicated", "lost approvals", "in parallel", "stuck",
            "not recovered", "recover p50 s", "recover max s")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for kind, n, dup, lost, par, stuck, failed, p50, mx in rows:
        fmt = lambda v: "—" if v is None else f"{v:.1f}"  # noqa: E731
        print(f"{kind} | {n} | {dup} | {lost} | {par} | {stuck} | {failed} | {fmt(p50)} | {fmt(mx)}")
    print("\ngoal: duplicated, lost approvals, in parallel, stuck and not recovered all 0 (issue 11 §3)")
    return 0 if all(r[2:7] == (0, 0, 0, 0, 0) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
