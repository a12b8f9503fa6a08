"""Load on the console (bench/README.md): 50 websocket clients plus 20 requests/s of page partials,
for 2 minutes, on loopback. Prints p50/p95/max latency and errors (goal: 0 errors, p95 ≤ 300 ms).

The stack is the bench's own (``bench/stack.py``: a PostgreSQL cluster and redis-server started
for the run, daphne, a Celery worker and beat on them), never a shared server. Before the load
it adds demo work so the partials are not empty: queued demo tasks and a few observe cycles.

- **websocket clients**: ``--clients`` sockets on ``/ws/console/``, signed in as the bench
  operator, open for the whole run. The bench pushes a topic every second (as actions do after
  commit); an error is a socket that fails to open, closes early, or misses pushed topics.
- **partials**: an open-loop schedule of ``--rate`` GETs per second (each sent at its slot, not
  after the previous answer) cycling through the regions the console re-fetches (dashboard
  cards, runs, approvals, chat, observe-only, fleet, runs page, approvals page, alerts), each
  with ``HX-Request: true``. An error is a non-200 answer, a transport error or no answer within
  10 s. Latency is measured from sending to the full body.

Bounded: at most ``rate × seconds`` requests (``--seconds`` 1..600, ``--rate`` 1..100,
``--clients`` 1..500), loopback only.

Usage::

    .venv/bin/python bench/load.py                  # 50 clients, 20 req/s, 120 s
    .venv/bin/python bench/load.py --seconds 20     # a quick run
"""

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stack import PASSWORD, Stack, wait_until  # noqa: E402

PARTIALS = ["/?partial=cards", "/?partial=runs", "/?partial=approvals", "/?partial=chat", "/?partial=observe_only",
            "/fleet/", "/runs/", "/approvals/", "/alerts/?state=open"]
TOPIC = "bench-load"


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of ``values`` by nearest rank; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def login(stack: Stack):
    import httpx

    client = httpx.Client(base_url=stack.url, timeout=10)
    client.get("/login/")
    client.post("/login/", data={"username": "bench", "password": PASSWORD, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
                headers={"Referer": f"{stack.url}/login/"})
    if "sessionid" not in client.cookies:
        raise SystemExit("bench: could not sign in as the bench operator")
    return client


async def run_load(stack: Stack, cookies, seconds: int, rate: int, clients: int) -> dict:
    import httpx
    import websockets

    from console.broadcast import send_topics

    cookie = "; ".join(f"{k}={v}" for k, v in cookies.items())
    ws_url = f"ws://127.0.0.1:{stack.web_port}/ws/console/"
    ws_errors: list[str] = []
    received = [0] * clients
    opened = asyncio.Event()
    n_open = [0]
    stop = asyncio.Event()

    async def ws_client(i: int):
        try:
            async with websockets.connect(ws_url, additional_headers={"Cookie": cookie, "Origin": stack.url},
                                          open_timeout=10) as ws:
                n_open[0] += 1
                if n_open[0] == clients:
                    opened.set()
                while not stop.is_set():
                    try:
                        msg = await asyncio.wait_for(ws.recv(), timeout=0.5)
                    except TimeoutError:
                        continue
                    if TOPIC in msg:
                        received[i] += 1
        except Exception as exc:  # noqa: BLE001 — every failure of a socket is an error of the run
            ws_errors.append(f"socket {i}: {type(exc).__name__}: {str(exc)[:80]}")
            if not opened.is_set() and n_open[0] + len(ws_errors) >= clients:
                opened.set()

    sockets = [asyncio.create_task(ws_client(i)) for i in range(clients)]
    try:
        await asyncio.wait_for(opened.wait(), 60)
    except TimeoutError:
        ws_errors.append(f"only {n_open[0]} of {clients} sockets opened within 60 s")

    latencies: list[float] = []
    http_errors: list[str] = []
    pushed = [0]

    async def pusher():
        while not stop.is_set():
            if await asyncio.to_thread(send_topics, [TOPIC]):
                pushed[0] += 1
            await asyncio.sleep(1.0)

    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(base_url=stack.url, cookies=cookies, timeout=10, limits=limits) as http:
        async def one(path: str):
            t = time.perf_counter()
            try:
                r = await http.get(path, headers={"HX-Request": "true"})
                await r.aread()
                if r.status_code != 200:
                    http_errors.append(f"{path}: {r.status_code}")
                    return
                latencies.append((time.perf_counter() - t) * 1000)
            except Exception as exc:  # noqa: BLE001
                http_errors.append(f"{path}: {type(exc).__name__}")

        push = asyncio.create_task(pusher())
        t0 = time.perf_counter()
        requests = []
        for k in range(seconds * rate):
            delay = t0 + k / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            requests.append(asyncio.create_task(one(PARTIALS[k % len(PARTIALS)])))
        await asyncio.gather(*requests)
        elapsed = time.perf_counter() - t0
        await asyncio.sleep(1.5)  # the last pushed topic reaches every socket
        stop.set()
        await push
    await asyncio.gather(*sockets)
    short = [i for i, n in enumerate(received) if n < max(1, pushed[0] - 2)]
    if short:
        ws_errors.append(f"{len(short)} sockets missed pushed topics (got {min(received)}..{max(received)} of {pushed[0]})")
    return {"latencies": latencies, "http_errors": http_errors, "ws_errors": ws_errors, "elapsed": elapsed,
            "pushed": pushed[0], "received": received, "open": n_open[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=120, help="duration of the load (1..600)")
    ap.add_argument("--rate", type=int, default=20, help="partial GETs per second (1..100)")
    ap.add_argument("--clients", type=int, default=50, help="websocket clients (1..500)")
    args = ap.parse_args(argv)
    if not (1 <= args.seconds <= 600 and 1 <= args.rate <= 100 and 1 <= args.clients <= 500):
        ap.error("--seconds 1..600, --rate 1..100, --clients 1..500")

    with Stack() as stack:
        stack.start_worker()
        stack.start_daphne()
        stack.start_beat()
        from agent.models import Run
        from agent.tasks import observe_cycle
        from fleet import demo

        demo.enqueue(20)
        for _ in range(3):
            observe_cycle.delay("operator", None, "user:bench")
        wait_until(lambda: Run.objects.filter(status__in=("done", "parked", "halted")).count() >= 3, 90)
        http = login(stack)
        cookies = dict(http.cookies)
        http.close()
        res = asyncio.run(run_load(stack, cookies, args.seconds, args.rate, args.clients))

    lat = res["latencies"]
    errors = len(res["http_errors"]) + len(res["ws_errors"])
    rows = [
        ("duration", f"{res['elapsed']:.1f} s"),
        ("websocket clients open", f"{res['open']} of {args.clients}"),
        ("topics pushed / min received per socket", f"{res['pushed']} / {min(res['received']) if res['received'] else 0}"),
        ("partial requests answered", f"{len(lat)} of {args.seconds * args.rate} ({args.rate}/s)"),
        ("p50", f"{statistics.median(lat):.0f} ms" if lat else "-"),
        ("p95", f"{pct(lat, 95):.0f} ms" if lat else "-"),
        ("max", f"{max(lat):.0f} ms" if lat else "-"),
        ("errors (http + websocket)", f"{len(res['http_errors'])} + {len(res['ws_errors'])}"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)} | {v}")
    p95 = pct(lat, 95) if lat else float("inf")
    met = errors == 0 and p95 <= 300
    print(f"\ngoal: 0 errors and p95 ≤ 300 ms — {'met' if met else 'NOT met'}")
    for e in (res["http_errors"] + res["ws_errors"])[:10]:
        print(f"- {e}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
