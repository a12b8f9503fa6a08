"""One observe cycle with no planner turns at 10, 100 and 1,000 instances: time and queries.

Goals (bench/README.md): ≤ 50 ms at 100 instances, ≤ 300 ms at
1,000, and the same number of queries at every size (query count per cycle constant in fleet
size).

What runs (one process; throwaway test databases made and dropped by Django's test machinery, so
yours are not touched; change broadcasts detached, no Redis): ``agent.runtime.loop.run_cycle`` with a
planner that proposes nothing (no planner turn), against the in-memory ``scenario`` provider
listing N running instances with live, busy workers and demand ``ok``. The cycle is everything
but the model: the run lock, the claim, the provider re-list and sync of N ``Instance`` rows,
demand, lifecycle alerts, the monitor's rules, the observation step, the honest final report and
memory upkeep. The first cycle at each size adopts the N instances (a one-off); the steady state
is measured after it: median of ``--reps``, queries counted on one more cycle.

Usage::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench \\
        .venv/bin/python bench/observe_cycle.py [--sizes 10 100 1000] [--reps 5]
"""

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.stack import DbTimer  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
os.environ.setdefault("WARDEN_LOG_LEVEL", "WARNING")

GOALS_MS = {100: 50.0, 1000: 300.0}


class NoTurns:
    """A planner with nothing to say: the cycle ends after the monitor, with no planner turn."""

    name = "bench"

    def next_turn(self, ctx):
        return None

    def exhausted(self, ctx) -> bool:
        return True


def _world(n: int) -> None:
    from fleet import demand as demand_mod
    from fleet import providers as providers_mod
    from fleet.demand.scenario import ScenarioDemandSource
    from fleet.events import changed
    from fleet.providers.scenario import ScenarioProvider

    fleet = [{"id": f"b-{i}", "actual_status": "running", "gpu_name": "RTX 4090", "dph": 0.4,
              "worker": {"live": True, "unschedulable": False, "owned_tasks": 1}} for i in range(1, n + 1)]
    providers_mod.set_override(ScenarioProvider(fleet, []))
    demand_mod.set_override(ScenarioDemandSource(
        {"state": "ok", "queued": n, "running": n, "workers_expected": n, "workers_live": n}, fleet))
    changed.receivers = []
    changed.sender_receivers_cache.clear()


def _reset_db() -> None:
    from agent.models import Run, SessionState
    from fleet.models import Alert, Instance

    Run.objects.all().delete()
    Instance.objects.all().delete()
    Alert.objects.all().delete()
    state = SessionState.get()
    state.target_proofs_hr = 0
    state.save()


def _cycle(count_queries=False):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agent.runtime.loop import run_cycle

    if count_queries:
        with CaptureQueriesContext(connection) as q:
            run = run_cycle("bench", planner=NoTurns())
        return run, q.captured_queries
    timer = DbTimer()
    with connection.execute_wrapper(timer):
        t0 = time.perf_counter()
        run = run_cycle("bench", planner=NoTurns())
        dt = time.perf_counter() - t0
    return run, (dt, timer.seconds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--show-queries", action="store_true", help="print the query mix of the largest size")
    args = ap.parse_args(argv)

    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    from fleet.harmony import ensure_schema

    db_cfg = setup_databases(verbosity=0, interactive=False, aliases={"default", "harmony"})
    rows = []
    try:
        ensure_schema("harmony")
        for n in args.sizes:
            _reset_db()
            _world(n)
            first, _ = _cycle()  # adopts the N instances
            assert first is not None and first.status == "done", (first and first.status, first and first.halt_detail)
            times, db = [], []
            for _ in range(args.reps):
                run, (dt, in_db) = _cycle()
                assert run is not None and run.status == "done", (run.status, run.halt_detail)
                times.append(dt)
                db.append(in_db)
            run, queries = _cycle(count_queries=True)
            report_line = next(line for line in run.final_report.splitlines() if line.startswith("Fleet now"))
            rows.append((n, statistics.median(times) * 1000, min(times) * 1000, statistics.median(db) * 1000,
                         len(queries), report_line, queries))
        print(f"PostgreSQL {connection.pg_version // 10000}; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
              f"median of {args.reps} steady cycles (no planner turn)")
        head = (f"{'instances':>9} | {'ms/cycle':>8} | {'best ms':>8} | {'in db ms':>8} | {'queries':>7} | {'goal ms':>7} | "
                f"{'within':>6}")
        print(head)
        print("-" * len(head))
        for n, med, best, in_db, q, _line, _ in rows:
            goal = GOALS_MS.get(n)
            within = ("yes" if med <= goal else "NO") if goal else ""
            print(f"{n:>9} | {med:8.1f} | {best:8.1f} | {in_db:8.1f} | {q:>7} | {goal if goal else '':>7} | {within:>6}")
        print()
        print("same query count at every size:", "yes" if len({r[4] for r in rows}) == 1 else
              f"NO ({', '.join(f'{r[0]}: {r[4]}' for r in rows)})")
        for n, *_x, line, _q in rows:
            print(f"final report at {n:>5}: {line[:160]}{'…' if len(line) > 160 else ''}")
        if args.show_queries:
            mix = Counter(" ".join(q["sql"].split()[:6]) for q in rows[-1][6])
            print()
            for sql, k in mix.most_common():
                print(f"{k:>4}  {sql[:110]}")
    finally:
        teardown_databases(db_cfg, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
