"""Build time of the model's context (``agent.memory.context.build_context``) over a long session.

Goal (bench/README.md): **≤ 100 ms at 10,000 stored messages** (the default 30,000-token budget).

What runs: a throwaway PostgreSQL test database (Django's test machinery: created and dropped,
nothing of yours touched) is filled with a realistic session — runs of ten steps: an operator
message now and then, the runtime's world snapshot, agent calls singly and in batches of three
with observations of 80–1,200 characters, some refused with a reason code, a monitor action,
the run's final answer — up to 1,000, 10,000 and 100,000 stored messages (Step rows). At each
size ``build_context()`` is timed (median and best of ``--reps`` after one warm-up) with its
query count, the messages it kept, the estimated tokens and how many it folded into the summary.

Usage::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench \\
        .venv/bin/python bench/context_build.py [--sizes 1000 10000 100000] [--reps 5]
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

GOAL_MS, GOAL_AT = 100.0, 10_000


def fill(upto: int, state: dict) -> None:
    """Add Step rows (runs of ten) until ``upto`` are stored; ``state`` carries counters."""
    from datetime import UTC, datetime

    from agent.models import Run, Step

    now = datetime(2026, 6, 9, 16, 50, tzinfo=UTC)
    steps: list = []
    while state["steps"] + len(steps) < upto:
        state["runs"] += 1
        n = state["runs"]
        run = Run.objects.create(number=n, trigger="chat" if n % 7 == 0 else "beat", planner="llm", status="done",
                                 started_at=now, included_in_prompt=n % 3 != 0,
                                 final_answer=f"Run {n}: 3 queued, 2 of 2 workers live. <verdict>"
                                              '{"action": true, "state_changed": false}</verdict>')
        seq = 0

        def add(_run=run, _steps=steps, **kw):
            nonlocal seq
            seq += 1
            _steps.append(Step(run=_run, seq=seq, created_at=now, **kw))

        if n % 7 == 0:
            add(kind="message", actor="user:alice", text=f"how many workers are live on run {n}, and why?")
        add(kind="observe", actor="system", text="observation",
            observation='{"demand": {"queued": 3, "workers_live": 2}, "instances": [' + '{"id": "v-1"},' * 20 + "]}")
        for turn in range(2):
            size = 80 + (n * 37 + turn * 101) % 1100
            add(kind="call", actor="agent", turn=turn, tool="list_instances", args={"status": "running"},
                raw_arguments='{"status": "running"}', outcome="executed", ok=True,
                observation="ok: true\n" + "i" * size)
        for pos in range(3):
            refused = pos == 2 and n % 2 == 0
            add(kind="call", actor="agent", turn=2, position=pos, batch=True, tool="diagnose_instance",
                args={"instance_id": f"v-{pos}"}, raw_arguments=f'{{"instance_id": "v-{pos}"}}',
                outcome="refused" if refused else "executed", reason_code="rate_limited" if refused else "",
                detail="3 diagnoses in 10 min" if refused else "", ok=not refused,
                observation="ok: false — rate_limited" if refused else "ok: true\n" + "d" * 300)
        add(kind="call", actor="monitor", tool="destroy_instance", args={"instance_id": "v-9"},
            raw_arguments="", outcome="executed", observation="ok: true\ndestroyed")
        add(kind="text", actor="agent", turn=3, text=run.final_answer, outcome="text")
        while seq < 10:
            add(kind="text", actor="agent", turn=4, text="thinking about the queue", outcome="text")
        if len(steps) >= 5000:
            Step.objects.bulk_create(steps)
            state["steps"] += len(steps)
            steps = []
    Step.objects.bulk_create(steps)
    state["steps"] += len(steps)


def measure(reps: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agent.memory.context import build_context

    build_context()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ctx = build_context()
        times.append((time.perf_counter() - t0) * 1000)
    with CaptureQueriesContext(connection) as q:
        build_context()
    return {"median": statistics.median(times), "best": min(times), "queries": len(q.captured_queries),
            "messages": len(ctx.messages), "tokens": ctx.tokens, "omitted": ctx.omitted}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)

    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    from agent.memory.context import DEFAULT_BUDGET_TOKENS

    cfg = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    try:
        state = {"runs": 0, "steps": 0}
        print(f"PostgreSQL {connection.pg_version // 10000}; budget {DEFAULT_BUDGET_TOKENS:,} tokens; "
              f"median and best of {args.reps}")
        head = f"{'stored':>8} | {'median ms':>9} | {'best ms':>7} | {'queries':>7} | {'kept msgs':>9} | " \
               f"{'tokens':>6} | {'folded':>6} | goal"
        print(head)
        print("-" * len(head))
        for size in sorted(args.sizes):
            fill(size, state)
            with connection.cursor() as cur:
                cur.execute("ANALYZE")
            r = measure(args.reps)
            goal = (f"≤ {GOAL_MS:g} ms: {'met' if r['median'] <= GOAL_MS else 'NOT met'}"
                    if size == GOAL_AT else "")
            print(f"{state['steps']:>8,} | {r['median']:>9.1f} | {r['best']:>7.1f} | {r['queries']:>7} | "
                  f"{r['messages']:>9} | {r['tokens']:>6,} | {r['omitted']:>6} | {goal}")
    finally:
        teardown_databases(cfg, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
