"""Per-step overhead of Warden's loop, with LangGraph's StateGraph + PostgresSaver side by side.

Budget (bench/README.md): per loop step, ≤ 2 ms plus one database round trip.

What runs (one process, one throwaway PostgreSQL database created and dropped by Django's test
database machinery, so nothing of yours is touched):

- **Warden**: ``agent.runtime.loop.run_cycle`` with a ``ScriptPlanner`` proposing N calls of a no-op tool
  (``noop``, registered for the bench only; different ``i`` each step so ``identical_args`` stays
  quiet), against the in-memory ``scenario`` provider and demand source. Every step goes through
  the breakers, the pipeline (allowlist, schema, guards, policy, execution, observation) and is
  persisted as a Step row. Change broadcasts are detached (no Redis). The cycle's fixed cost
  (lock, observe, monitor, report) is measured with 0 steps and subtracted:
  ``per step = (T(N) − T(0)) / N``; queries per step the same way.
- **LangGraph**: a ``StateGraph`` with one node that runs the same no-op and loops to itself N
  times, compiled with ``PostgresSaver`` on the same database, ``durability="sync"`` (each
  step's checkpoint written before the next, as Warden writes each step). Its fixed cost is
  measured the same way (N = 0 → one pass that ends at once).

Prints one table per N (median of ``--reps``), the database round trip (median ``SELECT 1``),
the budget check, and the Warden / LangGraph ratio. When LangGraph is not installed the peer
columns say so; nothing is made up.

Usage::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench \\
        .venv/bin/python bench/step_overhead.py [--steps 10 100 1000] [--reps 3] [--no-peer]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.stack import DbTimer  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
os.environ.setdefault("WARDEN_LOG_LEVEL", "WARNING")


def _setup_django():
    import django

    django.setup()


# --- Warden ---------------------------------------------------------------------------------------
def _install_noop():
    from agent.policy.table import DEFAULT_POLICY
    from agent.runtime import tools

    class NoopArgs(tools._Args):
        i: int

    def noop(ctx, args):
        return {"i": args["i"], "ok": True}

    tools.TOOLS["noop"] = tools.Tool("noop", NoopArgs, noop)
    tools.PUBLIC_TOOLS.append("noop")
    DEFAULT_POLICY["noop"] = "auto"


def _world():
    from fleet import demand as demand_mod
    from fleet import providers as providers_mod
    from fleet.demand.scenario import ScenarioDemandSource
    from fleet.events import changed
    from fleet.providers.scenario import ScenarioProvider

    fleet = [{"id": "b-1", "actual_status": "running", "gpu_name": "RTX 4090", "dph": 0.4,
              "worker": {"live": True, "unschedulable": False, "owned_tasks": 0}}]
    providers_mod.set_override(ScenarioProvider(fleet, []))
    demand_mod.set_override(ScenarioDemandSource(
        {"state": "ok", "queued": 0, "running": 1, "workers_expected": 1, "workers_live": 1}, fleet))
    changed.receivers = []
    changed.sender_receivers_cache.clear()


def _limits_for(n: int):
    from agent.models import SessionState

    state = SessionState.get()
    state.overrides = {"limits": {"max_steps": n + 5, "wall_clock_s": 10**9, "token_budget": 10**12},
                       "policy": {"noop": "auto"}}
    state.save()


def _warden_cycle(n: int, *, count_queries=False) -> tuple[float, int, float]:
    """One run of ``n`` no-op steps; (seconds, queries or -1, seconds inside the database)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agent.planners.script import ScriptPlanner
    from agent.runtime.loop import run_cycle

    steps = [{"tool": "noop", "args": {"i": i}} for i in range(n)]
    steps.append({"text": 'done <verdict>{"action": false, "state_changed": false}</verdict>'})
    planner = ScriptPlanner(steps)
    if count_queries:
        with CaptureQueriesContext(connection) as q:
            run = run_cycle("bench", planner=planner)
        assert run is not None and run.status == "done", (run and run.status, run and run.halt_reason)
        return 0.0, len(q.captured_queries), 0.0
    timer = DbTimer()
    with connection.execute_wrapper(timer):
        t0 = time.perf_counter()
        run = run_cycle("bench", planner=planner)
        dt = time.perf_counter() - t0
    assert run is not None and run.status == "done", (run and run.status, run and run.halt_reason)
    assert run.steps.filter(kind="call", outcome="executed").count() == n
    return dt, -1, timer.seconds


def _rtt_ms(samples=300) -> float:
    from django.db import connection

    times = []
    with connection.cursor() as cur:
        for _ in range(samples):
            t0 = time.perf_counter()
            cur.execute("SELECT 1")
            cur.fetchone()
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


# --- LangGraph ------------------------------------------------------------------------------------
def _peer_available() -> str:
    try:
        import langgraph  # noqa: F401
        from langgraph.checkpoint.postgres import PostgresSaver  # noqa: F401
    except ImportError as exc:
        return f"unavailable ({exc.name or exc} not installed; pip install -r requirements-dev.txt)"
    return ""


def _conninfo() -> str:
    from django.db import connection
    from psycopg.conninfo import make_conninfo

    s = connection.settings_dict
    parts = {"dbname": s["NAME"], "user": s.get("USER") or None, "password": s.get("PASSWORD") or None,
             "host": s.get("HOST") or None, "port": str(s["PORT"]) if s.get("PORT") else None}
    return make_conninfo(**{k: v for k, v in parts.items() if v})


class Peer:
    """LangGraph StateGraph looping one no-op node N times, checkpointed to PostgreSQL."""

    def __init__(self, conninfo: str):
        from typing import TypedDict

        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph

        self._cm = PostgresSaver.from_conn_string(conninfo)
        self.saver = self._cm.__enter__()
        self.saver.setup()

        class S(TypedDict):
            i: int
            n: int
            last: dict

        def step(state: S) -> dict:
            if state["i"] >= state["n"]:
                return {}
            return {"i": state["i"] + 1, "last": {"i": state["i"], "ok": True}}

        def route(state: S) -> str:
            return "step" if state["i"] < state["n"] else END

        g = StateGraph(S)
        g.add_node("step", step)
        g.add_edge(START, "step")
        g.add_conditional_edges("step", route)
        self.app = g.compile(checkpointer=self.saver)
        self._thread = 0

    def run(self, n: int) -> float:
        self._thread += 1
        cfg = {"configurable": {"thread_id": f"bench-{os.getpid()}-{self._thread}"}, "recursion_limit": n + 10}
        t0 = time.perf_counter()
        out = self.app.invoke({"i": 0, "n": n, "last": {}}, cfg, durability="sync")
        dt = time.perf_counter() - t0
        assert out["i"] == n
        return dt

    def close(self):
        self._cm.__exit__(None, None, None)


# --- main -----------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true", help="skip the LangGraph peer")
    args = ap.parse_args(argv)

    _setup_django()
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    from fleet.harmony import ensure_schema

    db_cfg = setup_databases(verbosity=0, interactive=False, aliases={"default", "harmony"})
    peer = None
    try:
        ensure_schema("harmony")
        _install_noop()
        _world()
        rtt = _rtt_ms()
        peer_note = "skipped (--no-peer)" if args.no_peer else _peer_available()
        if not peer_note:
            try:
                peer = Peer(_conninfo())
            except Exception as exc:  # noqa: BLE001 — report, don't invent numbers
                peer_note = f"unavailable ({type(exc).__name__}: {exc})"

        # warm up both (imports, prepared plans, connection)
        _limits_for(max(args.steps))
        _warden_cycle(5)
        if peer:
            peer.run(5)

        base_runs = [_warden_cycle(0) for _ in range(args.reps)]
        base = statistics.median(r[0] for r in base_runs)
        base_db = statistics.median(r[2] for r in base_runs)
        base_q = _warden_cycle(0, count_queries=True)[1]
        peer_base = statistics.median(peer.run(0) for _ in range(args.reps)) if peer else None

        print(f"PostgreSQL {connection.pg_version // 10000} at {connection.settings_dict.get('HOST') or 'local socket'}; "
              f"round trip (median SELECT 1): {rtt:.3f} ms")
        print(f"Warden fixed cost per cycle (0 steps: lock, observe, monitor, report): {base * 1000:.1f} ms, {base_q} queries")
        if peer:
            print(f"LangGraph fixed cost per invoke (0 steps): {peer_base * 1000:.1f} ms  "
                  f"(langgraph StateGraph + PostgresSaver, durability=sync)")
        else:
            print(f"LangGraph peer: {peer_note}")
        print()
        head = f"{'steps':>6} | {'warden ms/step':>14} | {'in db':>6} | {'outside db':>10} | {'queries/step':>12} | " \
               f"{'budget ms/step':>14} | {'within':>6} | {'langgraph ms/step':>17} | {'warden/langgraph':>16}"
        print(head)
        print("-" * len(head))
        for n in args.steps:
            _limits_for(n)
            runs = [_warden_cycle(n) for _ in range(args.reps)]
            total = statistics.median(r[0] for r in runs)
            db = statistics.median(r[2] for r in runs)
            q = _warden_cycle(n, count_queries=True)[1]
            per = (total - base) / n * 1000
            per_db = (db - base_db) / n * 1000
            qps = (q - base_q) / n
            budget = 2.0 + rtt
            if peer:
                ptotal = statistics.median(peer.run(n) for _ in range(args.reps))
                pper = (ptotal - peer_base) / n * 1000
                pcol, ratio = f"{pper:17.3f}", f"{per / pper:16.2f}" if pper > 0 else f"{'n/a':>16}"
            else:
                pcol, ratio = f"{'unavailable':>17}", f"{'n/a':>16}"
            print(f"{n:>6} | {per:14.3f} | {per_db:6.3f} | {per - per_db:10.3f} | {qps:12.1f} | {budget:14.3f} | {'yes' if per <= budget else 'NO':>6} | {pcol} | {ratio}")
        print()
        print("budget: 2 ms + one round trip per step (bench/README.md); 'in db' is time inside database calls (commits")
        print("included), 'outside db' the loop's own Python; warden/langgraph < 1 means Warden is faster per step.")
    finally:
        if peer:
            peer.close()
        teardown_databases(db_cfg, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
