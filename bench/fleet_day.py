"""A rehearsed day at fleet scale: 10 instances × 24 h, and 1,000 instances at peak × 24 h.

Goal (docs/rehearse.md, "Speed"): on a 2-core machine the 1,000-instance day in ≤ 10 minutes and
≤ 500 MB, the query count per cycle constant in fleet size; the cost per cycle is printed by fleet
size so its growth is visible.

What runs: each day in a child process of its own (a fresh peak memory), on scratch SQLite
databases in a temporary folder migrated first — exactly what ``manage.py rehearse`` and the
console's rehearsals run (``agent.rehearse.background.child_env``); ``agent.rehearse.sim.run_day``
with the ``rules`` planner: ``run_cycle`` at every heartbeat and trigger event, the monitor every
minute, approvals answered by the day's operator. Measured in the child: wall and CPU time of
``run_day`` (migration excluded; on a loaded machine the CPU time is the steadier number), peak
resident memory (``ru_maxrss``), cycles (the result's ``cycles``: runs of
the heartbeat, events, the monitor and resumed approvals) per second, and — for every call of
``agent.runtime.loop.run_cycle`` and ``agent.runtime.monitor_runner.monitor_tick`` — its time and queries, bucketed
by the number of instances not destroyed at that moment (counted outside the measurement), with
the calls that made no tool call also counted apart (``-steady``), and the big day's cost per call
divided by the small day's from the same run (the growth with the fleet, whatever the load).

The days (built here, in the day file's schema):

- ``10x24h``: 10 RTX 4090 running at the start, 300 s a proof (12 proofs/hr a worker), a target
  of 120 proofs/hr and 110 tasks arriving every hour; caps 12 instances, $10/hr.
- ``1000x24h``: 600 running at the start and a target of 7,200 proofs/hr (600 workers); from hour
  8 the target climbs 16 workers every 6 minutes to 12,000 (1,000 workers, reached at 10.5 h) and
  back to 7,200 at hour 16; 11,760 tasks arrive an hour from 8 to 16 (6,984 outside); caps 1,000
  instances, $500/hr, 500 launches in 600 s. ``--peak N`` scales it (start 60 % of N). The climb
  is in steps of 16, the most one batch may hold (the pipeline refuses a larger batch whole,
  ``batch_too_large``, and the ``rules`` planner cuts its launches to fit; docs/rehearse.md, "Speed").

Usage::

    .venv/bin/python bench/fleet_day.py                       # both days
    .venv/bin/python bench/fleet_day.py --days 10x24h         # one
    .venv/bin/python bench/fleet_day.py --peak 200 --hours 6  # a smaller big day
    .venv/bin/python bench/fleet_day.py --days 1000x24h --hours 2 --profile 40   # where the time goes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROOF_S = 300.0
DAYS = ("10x24h", "1000x24h")
GOAL_S, GOAL_MB = 600.0, 500.0
#: fleet-size buckets of the cost table (instances not destroyed)
BUCKETS = (0, 20, 100, 300, 600, 700, 800, 900, 1000, 10**9)


def small_day(hours: float) -> dict:
    """10 instances all day (see the module docstring)."""
    return {
        "name": "bench 10 instances", "horizon_h": hours, "heartbeat_s": 300, "seed": 1,
        "market": {"offers": [{"gpu_name": "RTX 4090", "dph": 0.4, "count": 50}],
                   "loading": {"median_s": 300, "p95_s": 900}, "fleet": [{"gpu_name": "RTX 4090", "count": 10}]},
        "work": {"queued_at_start": 20, "arrivals": {"hourly": [110] * 24},
                 "proof_s": {"RTX 4090": {"median_s": PROOF_S, "spread": 0.1}}},
        "objectives": {"target_proofs_hr": 120, "max_instances": 12, "max_dph": 10},
    }


def big_day(hours: float, peak: int) -> dict:
    """600 → 1,000 → 600 instances (``peak`` scales it; see the module docstring)."""
    base = round(peak * 0.6)
    per_worker = 3600 / PROOF_S
    return {
        "name": f"bench {base} to {peak} instances", "horizon_h": hours, "heartbeat_s": 300, "seed": 1,
        "market": {"offers": [{"gpu_name": "RTX 4090", "dph": 0.4, "count": round(peak * 1.2)}],
                   "loading": {"median_s": 300, "p95_s": 900}, "fleet": [{"gpu_name": "RTX 4090", "count": base}]},
        "work": {"queued_at_start": base,
                 "arrivals": {"hourly": [round(base * per_worker * 0.97)] * 8 + [round(peak * per_worker * 0.98)] * 8
                              + [round(base * per_worker * 0.97)] * 8},
                 "proof_s": {"RTX 4090": {"median_s": PROOF_S, "spread": 0.1}}},
        # the target climbs 16 workers at a time, every 6 minutes: the rules planner proposes every missing
        # launch in one batch, and a batch of more than 16 calls is refused whole (agent.policy.tool_specs.MAX_BATCH_CALLS)
        "operator": {"target_changes": [{"at_h": round(8 + 0.1 * k, 2), "target_proofs_hr": min(peak, base + 16 * (k + 1)) * per_worker}
                                        for k in range(-(-(peak - base) // 16))]
                     + [{"at_h": 16, "target_proofs_hr": base * per_worker}]},
        "objectives": {"target_proofs_hr": base * per_worker, "max_instances": peak, "max_dph": round(peak * 0.5),
                       "launch_rate": [min(1000, max(6, peak // 2)), 600]},
    }


# --- the child: one day, measured -------------------------------------------------------------------
class Meter:
    """Time and queries of every cycle and monitor tick, by the fleet size at its start; a call
    that made no tool call (a steady cycle or tick) is also counted under ``<kind>-steady``: its
    queries are what must not grow with the fleet (each tool call adds its own)."""

    def __init__(self):
        self.queries = 0
        self.counting = True
        self.by_size: dict[str, list] = {}  # "kind bucket" → [calls, seconds, queries, least size, most size]

    def __call__(self, execute, sql, params, many, context):
        if self.counting:
            self.queries += 1
        return execute(sql, params, many, context)

    def wrap(self, fn, kind: str):
        from agent.models import Step
        from fleet.models import Instance

        def timed(*args, **kwargs):
            self.counting = False  # the meter's own reads are not counted
            size = Instance.objects.filter(killed_at__isnull=True).count()
            last_step = Step.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
            self.counting = True
            q0, t0 = self.queries, time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt, dq = time.perf_counter() - t0, self.queries - q0
                self.counting = False
                calls = Step.objects.filter(pk__gt=last_step, kind="call").count()
                self.counting = True
                bucket = max(b for b in BUCKETS if b <= size)
                for key in (kind, f"{kind}-steady") if not calls else (kind,):
                    row = self.by_size.setdefault(f"{key} {bucket}", [0, 0.0, 0, size, size])
                    row[0] += 1
                    row[1] += dt
                    row[2] += dq
                    row[3], row[4] = min(row[3], size), max(row[4], size)
        return timed


def child(name: str, hours: float, peak: int, profile: int) -> int:
    import resource

    import django
    import psutil

    django.setup()
    from celery import current_app
    from django.core.management import call_command
    from django.db import connection

    from agent.rehearse.sim import run_day
    from agent.runtime import loop, monitor_runner

    current_app.conf.broker_url = "memory://"
    call_command("migrate", verbosity=0, interactive=False)
    day = small_day(hours) if name == "10x24h" else big_day(hours, peak)
    meter = Meter()
    loop.run_cycle = meter.wrap(loop.run_cycle, "cycle")
    loop.resume_run = meter.wrap(loop.resume_run, "cycle")
    monitor_runner.monitor_tick = meter.wrap(monitor_runner.monitor_tick, "monitor")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    with connection.execute_wrapper(meter):
        t0, c0 = time.perf_counter(), time.process_time()
        if prof:
            prof.enable()
        result = run_day(day)
        if prof:
            prof.disable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if prof:
        import io
        import pstats

        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(profile)
        out.write("\n--- by own time ---\n")
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(profile)
        sys.stderr.write(out.getvalue())
    s = result["summary"]
    print(json.dumps({
        "day": name, "hours": hours, "wall_s": wall, "cpu_s": cpu, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "end_mb": psutil.Process().memory_info().rss / 2**20,
        "migrated_mb": rss0, "cycles": s["cycles"], "queries": meter.queries, "by_size": meter.by_size,
        "proofs": s["proofs_delivered"], "arrived": s["proofs_arrived"], "launches": s["launches"],
        "unsafe": s["unsafe"], "usd": s["usd_total"], "peak_live": max((h["live_capacity"] for h in result["hourly"]), default=0),
    }))
    return 0


# --- the parent: a child per day, the table ------------------------------------------------------
def run_child(name: str, hours: float, peak: int, profile: int) -> dict:
    from agent.rehearse.background import child_env

    folder = tempfile.mkdtemp(prefix=f"warden-rehearse-{os.getpid()}-")
    try:
        env = {**child_env(folder), "WARDEN_LOG_LEVEL": "WARNING"}
        env.pop("WARDEN_REHEARSE_DB_DIR")  # not the command's child: this script's
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--hours", str(hours), "--peak", str(peak),
                               "--profile", str(profile)], env=env, cwd=ROOT, capture_output=True, text=True)
        if profile:
            sys.stderr.write(proc.stderr[-60_000:])
        if proc.returncode != 0:
            raise SystemExit(f"fleet_day: {name} failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _totals(r: dict, kind: str) -> tuple[int, float, int]:
    """(calls, seconds, queries) of one call ``kind`` (``cycle``, ``monitor``, ``…-steady``) over every fleet size."""
    rows = [v for key, v in r["by_size"].items() if key.split()[0] == kind]
    return sum(v[0] for v in rows), sum(v[1] for v in rows), sum(v[2] for v in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", nargs="+", choices=DAYS, default=list(DAYS))
    ap.add_argument("--hours", type=float, default=24.0, help="the horizon of each day (default 24)")
    ap.add_argument("--peak", type=int, default=1000, help="the big day's peak fleet (default 1,000; it starts at 60 %%)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions (cProfile)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, args.hours, args.peak, args.profile)

    rows = [run_child(d, args.hours, args.peak, args.profile) for d in args.days]
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; rules planner; scratch SQLite; {args.hours:g} h days")
    print("cycles: run_cycle and resume_run calls (heartbeats, events, approvals decided); ticks: the monitor's, every minute")
    head = (f"{'day':<10} | {'wall s':>7} | {'CPU s':>7} | {'peak MB':>7} | {'end MB':>6} | {'cycles':>6} | {'ticks':>5} | "
            f"{'cycles+ticks/s':>14} | {'ms/cycle':>8} | {'ms/tick':>7} | {'queries/cycle':>13} | {'queries/tick':>12} | "
            f"{'proofs':>8} | {'launches':>8} | {'unsafe':>6} | {'peak live':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        (cy, cs, cq), (ti, ts, tq) = _totals(r, "cycle"), _totals(r, "monitor")
        print(f"{r['day']:<10} | {r['wall_s']:7.1f} | {r['cpu_s']:7.1f} | {r['peak_mb']:7.0f} | {r['end_mb']:6.0f} | {cy:>6} | "
              f"{ti:>5} | {(cy + ti) / r['wall_s']:14.2f} | {1000 * cs / max(1, cy):8.1f} | {1000 * ts / max(1, ti):7.1f} | "
              f"{cq / max(1, cy):13.1f} | {tq / max(1, ti):12.1f} | {r['proofs']:>8,} | {r['launches']:>8} | {r['unsafe']:>6} | "
              f"{r['peak_live']:>9,.0f}")
    print()
    print("cost per call by fleet size (instances not destroyed when it started); -steady: the calls that made no tool call")
    head = f"{'day':<10} | {'call':<14} | {'instances':>11} | {'calls':>6} | {'ms/call':>8} | {'queries/call':>12}"
    print(head)
    print("-" * len(head))
    for r in rows:
        for key, (calls, secs, queries, lo, hi) in sorted(r["by_size"].items(),
                                                           key=lambda kv: (kv[0].split()[0], int(kv[0].split()[1]))):
            print(f"{r['day']:<10} | {key.split()[0]:<14} | {f'{lo}–{hi}':>11} | {calls:>6} | {1000 * secs / calls:8.1f} | "
                  f"{queries / calls:12.1f}")
    by_day = {r["day"]: r for r in rows}
    if len(by_day) == 2:
        small, large = by_day["10x24h"], by_day["1000x24h"]
        print()
        print("the 1000x24h day per call ÷ the 10x24h day per call, this run (growth with the fleet; 1.0 = none)")
        for kind in ("cycle", "cycle-steady", "monitor", "monitor-steady"):
            (n1, s1, q1), (n2, s2, q2) = _totals(small, kind), _totals(large, kind)
            if n1 and n2:
                print(f"  {kind:<14}  ms ×{(s2 / n2) / (s1 / n1):5.2f} ({1000 * s1 / n1:.1f} → {1000 * s2 / n2:.1f})   "
                      f"queries ×{(q2 / n2) / max(1e-9, q1 / n1):5.2f} ({q1 / n1:.1f} → {q2 / n2:.1f})")
    big = next((r for r in rows if r["day"] == "1000x24h"), None)
    if big is not None:
        full = args.hours == 24 and args.peak == 1000
        ok = big["wall_s"] <= GOAL_S and big["peak_mb"] <= GOAL_MB
        print()
        print(f"goal (1,000 at peak × 24 h ≤ {GOAL_S / 60:.0f} min and ≤ {GOAL_MB:.0f} MB): "
              + (("met" if ok else "NOT met") if full else f"not measured at full size (peak {args.peak}, {args.hours:g} h)")
              + f"; CPU time {big['cpu_s'] / 60:.1f} min (what a busy shared machine inflates least)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
