"""Server time and query count of the console's list pages as the fleet and history grow.

Goal (bench/README.md): the dashboard, fleet, runs and approvals pages in **≤ 200 ms each with 1,000
instances and 10,000 runs**, with a **constant query count** (the same at every size).

What runs: a throwaway PostgreSQL test database (Django's test machinery: created and dropped,
nothing of yours touched) is filled to each size — instances (a third stopped, a tenth killed),
runs of three steps each, a demand sample, 20 waiting approvals and 100 decided ones — and each
page is fetched by Django's test client as a signed-in operator (URL routing, middleware, view,
templates: everything but the socket). Median and best of ``--reps`` after one warm-up (wall
time), the median CPU time of this process (the part machine load inflates least: on a shared
machine wall time includes waiting for a core), and the queries of one fetch.

Usage::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench \\
        .venv/bin/python bench/pages.py [--sizes 10:100 100:1000 1000:10000] [--reps 5]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
os.environ.setdefault("WARDEN_LOG_LEVEL", "WARNING")

GOAL_MS = 200.0
GOAL_AT = (1_000, 10_000)
PAGES = ("/", "/fleet/", "/runs/", "/approvals/")
WAITING, DECIDED = 20, 100


def fill(instances: int, runs: int, state: dict) -> None:
    """Add instances, runs (three steps each) and, once, the approvals, up to the given counts."""
    from datetime import timedelta

    from agent.models import Approval, Run, Step
    from fleet.clock import clock
    from fleet.models import DemandSample, Instance

    now = clock.now()
    batch = []
    for i in range(state["instances"], instances):
        killed = now if i % 10 == 9 else None
        batch.append(Instance(provider="local", external_id=f"local-{i}", label="warden", worker_name=f"local-{i}",
                              status="stopped" if i % 3 == 2 else "running", gpu_name="local-cpu", dph=0.1,
                              pid=10_000 + i, status_since=now, created_at=now - timedelta(seconds=i),
                              killed_at=killed, killed_by="agent" if killed else "", kill_reason="bench" if killed else ""))
    Instance.objects.bulk_create(batch, batch_size=2000)
    state["instances"] = instances
    run_rows = [Run(number=n, trigger="beat" if n % 5 else "chat", planner="rules", status="done",
                    verdict_action=n % 4 == 0, verdict_state_changed=n % 4 == 0, included_in_prompt=n % 4 == 0,
                    started_at=now - timedelta(seconds=runs - n), ended_at=now,
                    final_report=f"Run {n} (beat) — done") for n in range(state["runs"] + 1, runs + 1)]
    Run.objects.bulk_create(run_rows, batch_size=2000)
    created = {r.number: r.pk for r in Run.objects.filter(number__gt=state["runs"]).only("pk", "number")}
    steps = []
    for pk in created.values():
        steps += [Step(run_id=pk, seq=1, kind="observe", observation='{"demand": {"queued": 0}}', created_at=now),
                  Step(run_id=pk, seq=2, kind="call", tool="get_demand", args={}, outcome="executed", created_at=now),
                  Step(run_id=pk, seq=3, kind="text", text="No fleet change needed.", created_at=now)]
    Step.objects.bulk_create(steps, batch_size=5000)
    state["runs"] = runs
    if not state["approvals"]:
        DemandSample.objects.create(taken_at=now, state="ok", queued=0, running=0, workers_live=2, workers_expected=2,
                                    workers_dead=0, proofs_hr=0.0, active=False)
        first = Run.objects.order_by("number").first()
        for k in range(WAITING + DECIDED):
            step = Step.objects.create(run=first, seq=100 + k, kind="call", tool="stop_instance", outcome="parked",
                                       args={"instance_id": f"local-{k}", "reason": "idle"}, created_at=now)
            Approval.objects.create(run=first, step=step, tool="stop_instance",
                                    args={"instance_id": f"local-{k}", "reason": "idle"}, idempotency_key=f"bench-{k}",
                                    status="waiting" if k < WAITING else "approved", created_at=now,
                                    decided_at=None if k < WAITING else now,
                                    expires_at=now + timedelta(minutes=30), situation={"demand": "ok", "queued": 0})
        state["approvals"] = True


def measure(client, url: str, reps: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    resp = client.get(url)  # warm-up (templates compiled, caches filled)
    assert resp.status_code == 200, (url, resp.status_code, resp.content[:300])
    times, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        client.get(url)
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    with CaptureQueriesContext(connection) as q:
        client.get(url)
    return {"median": statistics.median(times), "best": min(times), "cpu": statistics.median(cpu),
            "queries": len(q.captured_queries), "kb": len(resp.content) / 1024}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["10:100", "100:1000", "1000:10000"],
                    help="instances:runs pairs, ascending")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    sizes = sorted(tuple(int(x) for x in s.split(":")) for s in args.sizes)

    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_databases, teardown_databases

    # the test client's host; not setup_test_environment(), whose template instrumentation costs time
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    cfg = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    try:
        alice = User.objects.create_user("alice")
        alice.groups.add(Group.objects.get_or_create(name="operators")[0])
        client = Client()
        client.force_login(alice)
        state = {"instances": 0, "runs": 0, "approvals": False}
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"{os.cpu_count()} cores, load average {load} (wall time includes waiting for a core; cpu ms does not)")
        print(f"PostgreSQL {connection.pg_version // 10000}; median and best of {args.reps}; "
              f"{WAITING} waiting and {DECIDED} decided approvals; goal ≤ {GOAL_MS:g} ms at "
              f"{GOAL_AT[0]:,} instances and {GOAL_AT[1]:,} runs, same queries at every size")
        head = f"{'page':<12} | {'instances':>9} | {'runs':>6} | {'median ms':>9} | {'best ms':>7} | " \
               f"{'cpu ms':>6} | {'queries':>7} | {'KB':>5} | goal"
        print(head)
        print("-" * len(head))
        first_queries: dict[str, int] = {}
        for n_inst, n_runs in sizes:
            fill(n_inst, n_runs, state)
            with connection.cursor() as cur:
                cur.execute("ANALYZE")
            for url in PAGES:
                r = measure(client, url, args.reps)
                first_queries.setdefault(url, r["queries"])
                same = "same queries" if r["queries"] == first_queries[url] else \
                    f"queries {first_queries[url]} → {r['queries']}"
                goal = ""
                if (n_inst, n_runs) == GOAL_AT:
                    goal = f"≤ {GOAL_MS:g} ms: {'met' if r['median'] <= GOAL_MS else 'NOT met'}; {same}"
                elif r["queries"] != first_queries[url]:
                    goal = same
                print(f"{url:<12} | {n_inst:>9,} | {n_runs:>6,} | {r['median']:>9.1f} | {r['best']:>7.1f} | "
                      f"{r['cpu']:>6.1f} | {r['queries']:>7} | {r['kb']:>5.0f} | {goal}")
    finally:
        teardown_databases(cfg, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
