# Over 500 lines on purpose: each fault of docs/faults.md on one shared real stack, one table.
"""Faults against the real stack, several times each; prints one table (docs/faults.md, bench/README.md).

Every run starts its own PostgreSQL cluster and redis-server (``bench/stack.py``: initdb +
pg_ctl on a free port, as the ``postgres`` user when run as root; redis-server with no
persistence) and Warden's real processes on them: daphne, one Celery worker (``--pool solo``) and
beat (monitor every 5 s, heartbeat cycle every 10 s). The servers it restarts are its own; it
never touches a shared PostgreSQL or Redis. Demand is the local demo queue, the provider the
local one (a real worker process per launched instance), so every provider-side effect is
countable: one state file per launched instance, carrying the label derived from the call's
idempotency key.

Columns, per fault (summed over the repetitions; every count's goal is 0):

- ``dup effects``: provider-side effects beyond one per idempotency key (instances sharing a
  launch label; launches the stand-in cloud received more than once for one key).
- ``lost appr.``: approvals the operator approved that did not end ``executed`` (voided as
  ``duplicate``, or still approved/waiting) once recovered — an approval sent back to the
  operator by a ``stale_claim`` is re-approved, as an operator would, and must then execute.
- ``parallel``: the most runs ``running`` at once among runs started after the fault, minus 1
  (sampled every 0.1 s; the killed run's own orphan row is not counted).
- ``stuck``: after recovery (or its timeout), runs still ``running``/``queued``, claims still
  ``claimed`` and approvals still ``approved``.
- ``recover s``: median seconds from the fault to the recovered state each row names.

Faults: an operator's approval while Redis is SIGKILLed (``redis-approval``) and a worker SIGKILLed
0.25 s after an approval (``worker-approval``, restarted with the production visibility timeout): the
monitor's sweep must dispatch both; Celery worker SIGKILL mid-run (inside a P0 launch, after the claim) and mid-approval
(inside an approved P1 launch, after the claim); Redis restart; PostgreSQL restart; daphne
restart with websocket clients connected (they reconnect, resync over HTTP and get the next
pushed topic); SSH hosts that refuse, hang or are slow (a real sshd on loopback, ``tests/sshd.py``);
provider 429/410/500/empty/HTML on a launch (the stand-in cloud of ``tests/rented_cloud.py``,
as the suite does providers — Warden has no HTTP provider client yet). Model timeout/429/truncated
JSON: the ``llm`` planner against a local OpenAI-compatible stand-in. A process death under
``make run`` (``--only makerun``): daphne, the worker and beat under supervisor as ``make run``
starts them, each SIGKILLed in turn; the console keeps answering and the dead one is back within 30 s.

Usage::

    .venv/bin/python bench/faults.py                 # every fault, 3 times
    .venv/bin/python bench/faults.py --reps 1 --only worker redis
    .venv/bin/python bench/faults.py --reps 1 --only redis-approval worker-approval
"""

import argparse
import asyncio
import fcntl
import json
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stack import PASSWORD, Stack, destroy_local_instances, free_port, wait_until  # noqa: E402

RECOVER_TIMEOUT_S = 120
#: close codes after which a console tab reconnects: htmx 2's ws extension retries 1006, 1011,
#: 1012 and 1013, and static/console.js reconnects after 1000 and 1001 (4401 means signed out)
BROWSER_RECONNECTS = {1000, 1001, 1006, 1011, 1012, 1013}


class Row:
    """One fault's figures, summed over repetitions."""

    def __init__(self, fault: str, recovered_when: str):
        self.fault, self.recovered_when = fault, recovered_when
        self.dup = self.lost = self.parallel = self.stuck = 0
        self.times: list[float] = []
        self.failed = 0  # repetitions that did not recover in time
        self.notes: list[str] = []

    def cells(self) -> list[str]:
        t = f"{statistics.median(self.times):.1f}" if self.times else "-"
        if self.failed:
            t += f" ({self.failed} not recovered)"
        return [self.fault, str(len(self.times) + self.failed), str(self.dup), str(self.lost), str(self.parallel),
                str(self.stuck), t, self.recovered_when]


# --- measurements ------------------------------------------------------------------------------
class ParallelSampler(threading.Thread):
    """Samples the number of ``running`` runs started after ``since`` every 0.1 s."""

    def __init__(self, since):
        super().__init__(daemon=True)
        self.since, self.most, self.stop_flag = since, 0, False

    def run(self):
        from django.db import connection

        from agent.models import Run

        while not self.stop_flag:
            try:
                self.most = max(self.most, Run.objects.filter(status="running", started_at__gt=self.since).count())
            except Exception:  # noqa: BLE001 — the database may be restarting
                connection.close()
            time.sleep(0.1)
        connection.close()

    def parallel(self) -> int:
        self.stop_flag = True
        self.join(5)
        return max(0, self.most - 1)


def db_reset():
    from django.db import connections

    connections.close_all()


def _open_now() -> set[str]:
    from agent.models import Approval, Run, SideEffect

    db_reset()
    return ({f"run {n} {st}" for n, st in Run.objects.filter(status__in=("running", "queued")).values_list("number", "status")}
            | {f"claim {k}" for k in SideEffect.objects.filter(status="claimed").values_list("key", flat=True)}
            | {f"approval {pk} approved" for pk in Approval.objects.filter(status="approved").values_list("pk", flat=True)})


STUCK_SETTLE_S = 8  # a run, claim or approval still open this long after recovery is stuck


def stuck_now(notes: list | None = None) -> int:
    """Runs ``running``/``queued``, claims ``claimed`` and approvals ``approved`` that are open now
    and still open :data:`STUCK_SETTLE_S` later (a heartbeat cycle that happens to be running when
    the bench looks is not stuck). Names them in ``notes``."""
    first = _open_now()
    if not first:
        return 0
    time.sleep(STUCK_SETTLE_S)
    still = first & _open_now()
    if still and notes is not None:
        notes.append(f"stuck: {', '.join(sorted(still))}")
    return len(still)


def local_launches() -> dict[str, int]:
    """Launch label -> instances the local provider created with it (state files, live or not)."""
    import json

    from fleet.providers.local import LocalProvider

    counts: dict[str, int] = {}
    for p in Path(LocalProvider().root).glob("local-*.json"):
        if p.name.endswith(".run.json"):
            continue
        try:
            label = json.loads(p.read_text()).get("label", "")
        except (OSError, ValueError):
            continue
        counts[label] = counts.get(label, 0) + 1
    return counts


def dup_launches() -> int:
    return sum(n - 1 for label, n in local_launches().items() if label)


def now():
    from django.utils import timezone

    return timezone.now()


def clean_fleet():
    """Destroy every local instance and empty the demo queue (between repetitions)."""
    from fleet.harmony import HarmonyMachine, HarmonyMachineDetails, HarmonyTask, HarmonyTaskHistory
    from fleet.models import Instance

    provider = destroy_local_instances()
    for p in Path(provider.root).glob("local-*.json"):
        p.unlink(missing_ok=True)
    Instance.objects.filter(provider="local").delete()
    for model in (HarmonyTaskHistory, HarmonyTask, HarmonyMachineDetails, HarmonyMachine):
        model.objects.using("harmony").all().delete()


# --- faults ------------------------------------------------------------------------------------
def counter_lock():
    """Hold the local provider's id counter lock: a launch claims, then blocks inside the provider call."""
    from fleet.providers.local import LocalProvider

    root = Path(LocalProvider().root)
    root.mkdir(parents=True, exist_ok=True)
    fh = open(root / "counter", "a+")  # noqa: SIM115 — held across the kill
    fcntl.flock(fh, fcntl.LOCK_EX)
    return fh


def kill_worker_mid_approval(stack: Stack, row: Row, user) -> None:
    from agent.models import Approval, SideEffect
    from agent.planners.script import ScriptPlanner
    from agent.runtime.approvals import do_decide
    from agent.tasks import start_resume

    clean_fleet()
    run = cycle_here(ScriptPlanner([
        {"tool": "launch_instance", "args": {"gpu_name": "local-cpu", "launch_priority": "P1", "reason": f"bench {time.time()}"}}]))
    approval = Approval.objects.get(run=run)
    before = dup_launches()
    lock = counter_lock()
    try:
        do_decide(approval, "approve", "user:bench", user=user)
        start_resume(run.pk)
        if not wait_until(lambda: SideEffect.objects.filter(key=approval.idempotency_key).exists(), 60):
            row.notes.append("mid-approval: the worker never claimed the launch")
        time.sleep(0.3)  # inside the provider call now
        t0, since = time.monotonic(), now()
        stack.worker.stop(signal.SIGKILL)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    sampler = ParallelSampler(since)
    sampler.start()
    stack.start_worker()

    def recovered():
        a = Approval.objects.get(pk=approval.pk)
        if a.status == "waiting":  # sent back by stale_claim: the operator approves again
            do_decide(a, "approve", "user:bench", user=user)
            start_resume(a.run_id)
            return False
        return a.status == "executed" and not SideEffect.objects.filter(status="claimed").exists()

    ok = wait_until(recovered, RECOVER_TIMEOUT_S, interval=0.5)
    _finish(row, ok, t0, sampler)
    a = Approval.objects.get(pk=approval.pk)
    row.lost += int(a.status != "executed")
    row.dup += dup_launches() - before


def kill_worker_mid_run(stack: Stack, row: Row, user) -> None:
    from agent.actions.runs import do_queue_cycle
    from agent.models import SideEffect
    from agent.tasks import start_cycle
    from fleet import demo

    clean_fleet()
    before = dup_launches()
    demo.enqueue(5)
    lock = counter_lock()
    try:
        do_queue_cycle("user:bench")
        start_cycle("operator", actor="user:bench")
        claimed = wait_until(lambda: SideEffect.objects.filter(tool="launch_instance", status="claimed").first(), 60)
        if not claimed:
            row.notes.append("mid-run: the cycle never claimed a launch")
        time.sleep(0.3)
        t0, since = time.monotonic(), now()
        stack.worker.stop(signal.SIGKILL)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    sampler = ParallelSampler(since)
    sampler.start()
    stack.start_worker()

    def recovered():
        done = SideEffect.objects.filter(tool="launch_instance", status="done", claimed_at__gte=since).exists()
        return done and not _open_now()

    ok = wait_until(recovered, RECOVER_TIMEOUT_S, interval=0.5)
    _finish(row, ok, t0, sampler)
    row.dup += dup_launches() - before


def cycle_here(planner):
    """``run_cycle`` in the bench process with ``planner``; waits (up to 60 s) while a cycle of the
    stack's worker holds the run lock (``run_cycle`` returns None then)."""
    from agent.runtime.loop import run_cycle

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run = run_cycle("bench", planner=planner)
        if run is not None:
            return run
        time.sleep(0.5)
    raise RuntimeError("the run lock stayed busy for 60 s")


def _finish(row: Row, ok, t0: float, sampler: ParallelSampler) -> None:
    if ok:
        row.times.append(time.monotonic() - t0)
    else:
        row.failed += 1
    row.parallel += sampler.parallel()
    row.stuck += stuck_now(row.notes)


def _login(stack: Stack):
    import httpx

    client = httpx.Client(base_url=stack.url, timeout=10)
    page = client.get("/login/")
    token = client.cookies["csrftoken"]
    resp = client.post("/login/", data={"username": "bench", "password": PASSWORD, "csrfmiddlewaretoken": token},
                       headers={"Referer": f"{stack.url}/login/"})
    assert resp.status_code in (200, 302) and "sessionid" in client.cookies, page.status_code
    return client


def _trigger_over_http(client, said: list | None = None) -> int:
    """POST "Trigger observe cycle now" as the operator; returns the HTTP status (0: no answer)
    and appends what the console said to ``said``."""
    import re

    try:
        resp = client.post("/actions/observe/", headers={"X-CSRFToken": client.cookies["csrftoken"], "HX-Request": "true"})
    except Exception as exc:  # noqa: BLE001 — daphne or a server may be down
        if said is not None:
            said.append(f"no answer: {type(exc).__name__}")
        return 0
    if said is not None:
        text = re.sub(r"<[^>]+>", " ", resp.text)
        said.append(f"{resp.status_code} {' '.join(text.split())[:160]}")
    return resp.status_code


def _server_restart(stack: Stack, row: Row, which: str) -> None:
    """Restart ``which`` (redis | postgres) under a live console and worker; an operator triggers an
    observe cycle right after. Recovered: /healthz 200 and that cycle done, nothing stuck."""
    import httpx

    from agent.models import Run

    client = _login(stack)
    db_reset()
    since = now()
    sampler = ParallelSampler(since)
    sampler.start()
    t0 = time.monotonic()
    if which == "redis":
        stack.restart_redis()
    else:
        stack.restart_postgres()
    db_reset()
    said: list[str] = []
    status = wait_until(lambda: _trigger_over_http(client, said) == 200 or None, 60, interval=0.5)
    if not status:
        row.notes.append(f"{which}: the trigger was not accepted within 60 s")
    row.notes.append(f"{which}: trigger answered after {time.monotonic() - t0:.1f} s: {said[-1] if said else '-'}")

    first: dict[str, float] = {}

    def recovered():
        health = httpx.get(f"{stack.url}/healthz", timeout=3)
        conds = {"healthz 200": health.status_code == 200,
                 # ran to its end: done, or parked on an approval it asked for (an idle worker's stop)
                 "cycle done": Run.objects.filter(trigger="operator", status__in=("done", "parked", "halted"),
                                                  started_at__gt=since).exists(),
                 "nothing stuck": not _open_now()}
        for name, met in conds.items():
            if met:
                first.setdefault(name, time.monotonic() - t0)
        return conds["cycle done"] and conds["nothing stuck"] and (conds["healthz 200"] or time.monotonic() - t0 > 90)

    ok = wait_until(recovered, RECOVER_TIMEOUT_S, interval=0.5)
    _finish(row, ok, t0, sampler)
    ended = list(Run.objects.filter(trigger="operator", started_at__gt=since).values_list("status", flat=True))
    row.notes.append(f"{which}: operator's cycle ({', '.join(ended) or 'none'}) ended after {first.get('cycle done', -1):.1f} s, /healthz 200 after "
                     f"{first.get('healthz 200', -1):.1f} s")
    client.close()


def restart_daphne(stack: Stack, row: Row, clients: int) -> None:
    """``clients`` websocket clients connected; daphne restarted (SIGTERM, start). Each client
    reconnects like console.js (backoff), resyncs (GETs a region partial) and must receive the
    next pushed topic. Recovered: every client did all three."""
    import httpx
    import websockets

    from console.broadcast import send_topics

    http = _login(stack)
    cookie = f"sessionid={http.cookies['sessionid']}; csrftoken={http.cookies['csrftoken']}"
    ws_url = f"ws://127.0.0.1:{stack.web_port}/ws/console/"
    done: dict[int, float] = {}
    errors: list[str] = []
    codes: dict[int, int] = {}  # close codes the clients saw when daphne went away
    async def client(i: int, gate: asyncio.Event, t0_box: list):
        connected_once = False
        while True:
            try:
                async with websockets.connect(ws_url, additional_headers={"Cookie": cookie, "Origin": stack.url},
                                              open_timeout=5) as ws:
                    if connected_once:  # a reconnect: resync every region, then wait for a pushed topic
                        async with httpx.AsyncClient(base_url=stack.url, cookies=http.cookies, timeout=10) as ac:
                            r = await ac.get("/fleet/", headers={"HX-Request": "true"})
                            if r.status_code != 200:
                                errors.append(f"resync {r.status_code}")
                        while True:
                            msg = await asyncio.wait_for(ws.recv(), timeout=60)
                            if "bench-resync" in msg:
                                done[i] = time.monotonic() - t0_box[0]
                                return
                    connected_once = True
                    gate.set()
                    await ws.recv()  # until daphne goes away
            except Exception as exc:  # noqa: BLE001 — refused, half-open, bad handshake: a browser retries
                if not connected_once:
                    errors.append(f"first connect: {exc}")
                    return
                if isinstance(exc, websockets.ConnectionClosed):
                    code = exc.rcvd.code if exc.rcvd is not None else 1006
                    codes[code] = codes.get(code, 0) + 1
                    if code not in BROWSER_RECONNECTS:
                        errors.append(f"closed with {code}: a browser would not reconnect")
                        return
                await asyncio.sleep(0.5 + (i % 10) * 0.2)  # console.js backs off 0.5–2.5 s

    async def main():
        t0_box = [0.0]
        gates = [asyncio.Event() for _ in range(clients)]
        tasks = [asyncio.create_task(client(i, gates[i], t0_box)) for i in range(clients)]
        await asyncio.wait_for(asyncio.gather(*(g.wait() for g in gates)), 30)
        t0_box[0] = time.monotonic()
        await asyncio.to_thread(stack.daphne.stop, signal.SIGTERM)
        await asyncio.to_thread(stack.start_daphne)

        async def pusher():
            while len(done) < clients:
                await asyncio.to_thread(send_topics, ["bench-resync"])
                await asyncio.sleep(0.5)

        push = asyncio.create_task(pusher())
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), RECOVER_TIMEOUT_S)
        except TimeoutError:
            pass
        push.cancel()
        return t0_box[0]

    since = now()
    sampler = ParallelSampler(since)
    sampler.start()
    asyncio.run(main())
    if len(done) == clients:
        row.times.append(max(done.values()))
    else:
        row.failed += 1
        row.notes.append(f"daphne: {clients - len(done)} of {clients} clients did not resync; {errors[:3]}")
    row.parallel += sampler.parallel()
    row.stuck += stuck_now(row.notes)
    row.notes.append(f"daphne: close codes seen {dict(sorted(codes.items()))}")
    if errors:
        row.notes.append(f"daphne: errors {errors[:3]}")
    http.close()


def ssh_faults(rows: dict, reps: int) -> None:
    """Diagnose an instance whose SSH host refuses, hangs (accepts, never speaks) or is slow
    (a real sshd whose nvidia-smi takes 3 s). Recovered: a stored verdict; nothing acted on."""
    import socket

    from django.conf import settings

    from agent.models import SideEffect
    from fleet.diagnostics import diagnose
    from fleet.models import Instance
    from fleet.providers import set_override
    from fleet.providers.base import Provider, ProviderInstance
    from tests.sshd import HEALTHY_L, SSHServer

    class Owned(Provider):
        name = "bench-ssh"

        def __init__(self):
            self.instances: list[ProviderInstance] = []

        def list_instances(self):
            return list(self.instances)

    import logging

    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # the hung banner's traceback is expected
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)  # accepts (kernel backlog), never sends a banner
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="warden-bench-sshd-"))
    with SSHServer(tmp) as sshd:
        settings.WARDEN["SSH_USER"] = sshd.user
        settings.WARDEN["SSH_KEY_FILE"] = str(sshd.key_file)
        sshd.fake("nvidia-smi", HEALTHY_L, sleep_s=3)
        provider = Owned()
        set_override(provider)
        try:
            for kind, port in (("refuses", free_port()), ("hangs", hang.getsockname()[1]), ("slow", sshd.port)):
                row = rows[f"ssh {kind}"]
                for _ in range(reps):
                    ext = f"ssh-{kind}-{time.monotonic_ns()}"
                    inst = Instance.objects.create(provider="bench-ssh", external_id=ext, status="running", gpu_name="H200",
                                                   dph=1.0, ssh_host="127.0.0.1", ssh_port=port, created_at=now(), status_since=now())
                    provider.instances = [ProviderInstance(ext, "running", ssh_host="127.0.0.1", ssh_port=port)]
                    since = now()
                    sampler = ParallelSampler(since)
                    sampler.start()
                    t0 = time.monotonic()
                    d = diagnose(inst, timeout_s=10)
                    row.times.append(time.monotonic() - t0)
                    row.parallel += sampler.parallel()
                    row.stuck += stuck_now(row.notes)
                    row.dup += SideEffect.objects.filter(claimed_at__gte=since).count()  # a diagnosis acts on nothing
                    row.notes.append(f"ssh {kind}: {d.health}/{d.fault_class} via {d.source}")
        finally:
            set_override(None)
            hang.close()


def provider_faults(rows: dict, reps: int) -> None:
    """A P0 launch whose request fails with 429 / 410 / 500 / empty body / HTML body, before and
    after taking effect (the stand-in cloud of tests/rented_cloud.py). Recovered: the run ended,
    no claim open, and the cloud holds at most one instance per launch key."""
    from agent.models import SessionState, SideEffect
    from agent.planners.script import ScriptPlanner
    from fleet.models import Instance
    from fleet.providers import set_override
    from fleet.providers.base import ProviderError
    from tests.rented_cloud import RentedProvider

    state = SessionState.get()
    cases = [("429", "http_429", "transient", False), ("410", "http_410", "permanent", False),
             ("500", "http_500", "transient", True), ("empty", "empty_body", "semantic", True),
             ("HTML", "html_body", "semantic", True)]
    for name, code, kind, after in cases:
        row = rows[f"provider {name}"]
        for rep in range(reps):
            Instance.objects.filter(provider="rented").delete()  # each repetition on an empty cloud
            cloud = RentedProvider(name="rented")
            cloud.faults["launch"] = [(ProviderError(f"rented: launch: {code}", kind=kind, code=code), after)]
            set_override(cloud)
            state.refresh_from_db()
            state.overrides = {"policy": {"launch_instance": "auto"}, "limits": {"launch_rate": [100, 600]}}
            state.save()
            since = now()
            sampler = ParallelSampler(since)
            sampler.start()
            t0 = time.monotonic()
            try:
                run = cycle_here(ScriptPlanner([
                    {"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "launch_priority": "P0",
                                         "reason": f"bench: provider {name}, repetition {rep + 1}"}}]))
            finally:
                set_override(None)
            labels = [pi.label for pi in cloud.listed.values()]
            row.dup += len(labels) - len(set(labels))
            keys = SideEffect.objects.filter(claimed_at__gte=since, tool="launch_instance").values_list("key", flat=True)
            row.dup += max(0, cloud.sent("launch") - len(set(keys)) - (1 if code == "http_429" else 0))
            run.refresh_from_db()
            if run.status in ("done", "halted", "failed"):
                row.times.append(time.monotonic() - t0)
            else:
                row.failed += 1
            row.parallel += sampler.parallel()
            row.stuck += stuck_now(row.notes)
            outcome = SideEffect.objects.filter(claimed_at__gte=since).values_list("status", "code").first()
            step = run.steps.filter(tool="launch_instance").values_list("outcome", "detail").first()
            row.notes.append(f"provider {name}: sent {cloud.sent('launch')}, listed {len(labels)}, claim {outcome}, "
                             f"run {run.status}, step {step[0] if step else '-'}: {(step[1] if step else '')[:90]}")
            if cloud.sent("launch") == 0:
                row.notes.append(f"provider {name}: the launch never reached the cloud (the fault was not exercised)")
                row.failed += 1
    state.refresh_from_db()
    state.overrides = {}
    state.save()


def model_faults(rows: dict, reps: int) -> None:
    """The ``llm`` planner against a local OpenAI-compatible stand-in (agent/model/model_standin.py) whose
    first answer is a timeout, a 429, or a tool call with truncated argument JSON; then the model asks
    for one P0 launch and answers. Recovered: the run ended with exactly one launch at the cloud
    (the model's retry or its corrected call is never a second rented machine), nothing stuck."""
    from agent.model.model_client import ModelConfig
    from agent.model.model_standin import StandIn
    from agent.models import SessionState
    from agent.planners.llm import LlmPlanner
    from fleet.models import Instance
    from fleet.providers import set_override
    from tests.rented_cloud import RentedProvider

    def reply(content=None, calls=()):
        msg = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = [{"id": f"call_{n}", "type": "function", "function": {"name": t, "arguments": a}}
                                 for n, (t, a) in enumerate(calls)]
        return {"id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "bench",
                "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}

    launch = ("launch_instance", json.dumps({"gpu_name": "RTX 4090", "launch_priority": "P0", "reason": "bench: model fault"}))
    done = reply('Launched one worker. <verdict>{"action": true, "state_changed": true}</verdict>')
    cases = {
        "model timeout": [{"timeout": True}, reply(calls=[launch]), done],
        "model 429": [{"http_status": 429, "body": {"error": {"message": "rate limited", "type": "rate_limit"}}},
                      reply(calls=[launch]), done],
        "model truncated JSON": [reply(calls=[("launch_instance", launch[1][:30])]), reply(calls=[launch]), done],
    }
    state = SessionState.get()
    for name, responses in cases.items():
        row = rows[name]
        for _rep in range(reps):
            Instance.objects.filter(provider="rented").delete()
            cloud = RentedProvider(name="rented")
            set_override(cloud)
            state.refresh_from_db()
            state.overrides = {"policy": {"launch_instance": "auto"}, "limits": {"launch_rate": [100, 600]}}
            state.save()
            since = now()
            sampler = ParallelSampler(since)
            sampler.start()
            t0 = time.monotonic()
            try:
                with StandIn(responses) as standin:
                    planner = LlmPlanner(config=ModelConfig(base_url=standin.base_url, model="bench", timeout_s=1.0))
                    run = cycle_here(planner)
            finally:
                set_override(None)
            row.dup += max(0, cloud.sent("launch") - 1)
            run.refresh_from_db()
            ok = run.status in ("done", "halted") and cloud.sent("launch") == 1
            halted = f" ({run.halt_reason})" if run.halt_reason else ""
            row.notes.append(f"{name}: run {run.status}{halted}, launches sent {cloud.sent('launch')}, "
                             f"model requests {len(standin.requests)}")
            _finish(row, ok, t0, sampler)
    state.refresh_from_db()
    state.overrides = {}
    state.save()


# --- a process death under make run (supervisor) ----------------------------------------------------
MAKE_RUN_BACK_S = 30  # the dead process must be RUNNING again (and /healthz 200) within this
MAKE_RUN_ROWS = [
    ("make run: worker SIGKILL", f"console answered throughout; worker back (new pid, /healthz 200) ≤ {MAKE_RUN_BACK_S} s"),
    ("make run: beat SIGKILL", f"console answered throughout; beat back (new pid, /healthz 200) ≤ {MAKE_RUN_BACK_S} s"),
    ("make run: web SIGKILL", f"daphne back (new pid, /healthz 200) ≤ {MAKE_RUN_BACK_S} s; worker and beat untouched"),
]


def make_run_faults(stack: Stack, rows: dict, reps: int) -> None:
    """The stack's three processes run as ``make run`` runs them — ``supervisord -c supervisord.conf``
    with the stack's servers — and each in turn (worker, beat, daphne) is SIGKILLed. Recovered: the
    same program RUNNING again with a new pid and /healthz 200 within :data:`MAKE_RUN_BACK_S`; for the
    worker and beat, the console (``/login/``) answered every request meanwhile. A repetition where
    it did not is a failed one, with a note. The stack's own processes are stopped for this and
    started again after."""
    import os

    import httpx

    from bench.stack import BIN, ROOT, Proc
    from console.health import supervised_processes

    for proc in (stack.worker, stack.daphne, stack.beat):
        if proc is not None:
            proc.stop()
    port = free_port()
    (stack.var / "supervisor").mkdir(parents=True, exist_ok=True)
    env = {**stack.env, "WARDEN_PORT": str(port), "WARDEN_VAR_DIR": str(stack.var),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    sup = Proc("supervisord", [str(BIN / "supervisord"), "-c", str(ROOT / "supervisord.conf")], env,
               stack.logs / "supervisord.log").start()
    sock, url = f"unix://{stack.var}/supervisor/supervisor.sock", f"http://127.0.0.1:{port}"

    def healthz() -> int:
        return httpx.get(f"{url}/healthz", timeout=3).status_code

    def programs() -> dict:
        return {p["name"]: p for p in supervised_processes(sock) or []}

    try:
        if not wait_until(lambda: healthz() == 200, 180, interval=0.5):
            for name, _ in MAKE_RUN_ROWS:
                rows[name].failed += 1
                rows[name].notes.append(f"{name}: supervisor's stack never answered /healthz 200 (see {sup.log})")
            return
        for _rep in range(reps):
            for name in ("worker", "beat", "web"):
                row = rows[f"make run: {name} SIGKILL"]
                before = programs()[name]
                others = {n: p["pid"] for n, p in programs().items() if n != name}
                since = now()
                sampler = ParallelSampler(since)
                sampler.start()
                os.kill(before["pid"], signal.SIGKILL)
                t0 = time.monotonic()
                unanswered, back = 0, False
                while time.monotonic() - t0 < MAKE_RUN_BACK_S:
                    if name != "web":
                        try:
                            unanswered += httpx.get(f"{url}/login/", timeout=3).status_code != 200
                        except httpx.HTTPError:
                            unanswered += 1
                    info = programs().get(name, {})
                    if info.get("statename") == "RUNNING" and info.get("pid") not in (None, before["pid"]):
                        try:
                            back = healthz() == 200
                        except httpx.HTTPError:
                            back = False
                        if back:
                            break
                    time.sleep(0.3)
                if unanswered:
                    row.notes.append(f"{row.fault}: the console did not answer {unanswered} request(s) meanwhile")
                if not back:
                    row.notes.append(f"{row.fault}: not back within {MAKE_RUN_BACK_S} s: {programs().get(name)}")
                moved = {n for n, pid in others.items() if programs().get(n, {}).get("pid") != pid}
                if moved:
                    row.notes.append(f"{row.fault}: {', '.join(sorted(moved))} restarted too")
                _finish(row, back and not unanswered and not moved, t0, sampler)
    finally:
        sup.stop(signal.SIGTERM)  # supervisord stops its programs (stopwaitsecs, then SIGKILL)
        stack.start_worker()
        stack.start_daphne()
        stack.start_beat()


# --- an operator's decision during an outage (agent/runtime/sweep.py) ------------------------------------
def _park_p1_launch():
    from agent.models import Approval, SessionState
    from agent.planners.script import ScriptPlanner
    from fleet import demo

    clean_fleet()
    demo.enqueue(1)  # the launch is still needed when it is dispatched
    # every launch waits for an operator meanwhile: the heartbeat's own P0 launch (no live worker)
    # would otherwise meet the queue first and make the approved one no_longer_needed
    state = SessionState.get()
    state.overrides = {"policy": {"launch_instance:P0": "approval", "launch_instance:monitor": "approval"}}
    state.save()
    run = cycle_here(ScriptPlanner([
        {"tool": "launch_instance", "args": {"gpu_name": "local-cpu", "launch_priority": "P1", "reason": f"bench {time.time()}"}}]))
    return Approval.objects.get(run=run)


def _approval_fault_done() -> None:
    """Back to the default policy; launches the heartbeat parked meanwhile are rejected."""
    from agent.models import Approval, SessionState
    from agent.runtime.approvals import DecisionError, do_decide

    state = SessionState.get()
    state.overrides = {}
    state.save()
    for a in Approval.objects.filter(status="waiting"):
        try:
            do_decide(a, "reject", "user:bench", "bench: parked by a heartbeat during the fault")
        except DecisionError:
            pass


def _executed_once(approval, user) -> bool:
    """The approved launch executed and nothing left claimed; one sent back to ``waiting`` by a
    ``stale_claim`` is approved again, as an operator would."""
    from agent.models import Approval, SideEffect
    from agent.runtime.approvals import do_decide
    from agent.tasks import start_resume

    a = Approval.objects.get(pk=approval.pk)
    if a.status == "waiting":
        do_decide(a, "approve", "user:bench", user=user)
        start_resume(a.run_id)
        return False
    return a.status == "executed" and not SideEffect.objects.filter(status="claimed").exists()


def _stalled_note(row: Row, approval) -> None:
    from agent.models import Approval
    from fleet.models import Alert

    a = Approval.objects.get(pk=approval.pk)
    row.notes.append(f"{row.fault}: approval {a.status}: {a.outcome_detail[:200]}")
    alert = Alert.objects.filter(kind="approval_stalled", key=f"approval_stalled:{approval.pk}").first()
    row.notes.append(f"{row.fault}: alert: {alert.message[-300:]}" if alert else f"{row.fault}: no approval_stalled alert")


def redis_down_approval(stack: Stack, row: Row, user) -> None:
    """A P1 launch waits; the broker's Redis is SIGKILLed; the operator approves over HTTP; Redis
    starts again, empty. Recovered: the launch executed once (the monitor's sweep dispatches it),
    nothing stuck. A card that says "nothing was lost" counts as a failure (it is not known)."""
    import re

    from agent.models import Approval

    approval = _park_p1_launch()
    before = dup_launches()
    client = _login(stack)
    since = now()
    sampler = ParallelSampler(since)
    sampler.start()
    stack.redis.kill()  # kill -9
    stack.redis.wait(timeout=20)
    t0 = time.monotonic()
    try:
        resp = client.post(f"/approvals/{approval.pk}/decide/", data={"decision": "approve"},
                           headers={"X-CSRFToken": client.cookies["csrftoken"], "HX-Request": "true"}, timeout=60)
        card = " ".join(re.sub(r"<[^>]+>", " ", resp.text).split())
    except Exception as exc:  # noqa: BLE001 — reported, never hidden
        card = f"no answer: {type(exc).__name__}: {exc}"
    said = card[card.find("approved and stored"):][:240] if "approved and stored" in card else card[-240:]
    row.notes.append(f"redis-down approval: the card said: {said}")
    if "nothing was lost" in card:
        row.failed += 1
        row.notes.append("redis-down approval: the card claimed nothing was lost")
    time.sleep(2)
    stack.start_redis()
    client.close()
    if stack.worker is None or not stack.worker.alive():
        row.notes.append("redis-down approval: the worker exited during the outage (restarted)")
        stack.start_worker()
    ok = wait_until(lambda: _executed_once(approval, user), RECOVER_TIMEOUT_S, interval=0.5)
    _finish(row, ok, t0, sampler)
    row.lost += int(Approval.objects.get(pk=approval.pk).status != "executed")
    row.dup += dup_launches() - before
    _stalled_note(row, approval)
    _approval_fault_done()


def kill_worker_after_approval(stack: Stack, row: Row, user) -> None:
    """A P1 launch approved; the worker SIGKILLed 0.25 s later, restarted with the production
    visibility timeout (900 s), so only the monitor's sweep can bring the resume back in time.
    Recovered: the launch executed once, nothing stuck."""
    from agent.models import Approval
    from agent.runtime.approvals import do_decide
    from agent.tasks import start_resume

    approval = _park_p1_launch()
    before = dup_launches()
    saved = stack.env["WARDEN_CELERY_VISIBILITY_TIMEOUT_S"]
    stack.env["WARDEN_CELERY_VISIBILITY_TIMEOUT_S"] = "900"
    try:
        stack.worker.stop()
        stack.start_worker()
        do_decide(approval, "approve", "user:bench", user=user)
        start_resume(approval.run_id)
        time.sleep(0.25)
        t0, since = time.monotonic(), now()
        stack.worker.stop(signal.SIGKILL)
        sampler = ParallelSampler(since)
        sampler.start()
        stack.start_worker()
        ok = wait_until(lambda: _executed_once(approval, user), RECOVER_TIMEOUT_S, interval=0.5)
        _finish(row, ok, t0, sampler)
    finally:
        stack.env["WARDEN_CELERY_VISIBILITY_TIMEOUT_S"] = saved
        stack.worker.stop()
        stack.start_worker()
    row.lost += int(Approval.objects.get(pk=approval.pk).status != "executed")
    row.dup += dup_launches() - before
    _stalled_note(row, approval)
    _approval_fault_done()


#: the decision faults: ``--only`` name → (row name, what "recovered" means, function)
APPROVAL_FAULTS = {
    "redis-approval": ("Redis SIGKILL, then approval", "the approved launch executed once (the sweep), nothing stuck",
                       redis_down_approval),
    "worker-approval": ("worker SIGKILL 0.25 s after approval", "the approved launch executed once within the sweep, "
                        "not the 900 s visibility timeout", kill_worker_after_approval),
}


# --- main --------------------------------------------------------------------------------------
#: ``makerun`` is make_run_faults: a process death under make run
FAULTS = ["worker", "redis", "postgres", "daphne", "ssh", "provider", "model", "makerun", *APPROVAL_FAULTS]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions per fault (1..10)")
    ap.add_argument("--clients", type=int, default=20, help="websocket clients during the daphne restart (1..200)")
    ap.add_argument("--only", nargs="*", choices=FAULTS, default=FAULTS)
    ap.add_argument("--keep", action="store_true", help="keep the temporary stack directory (logs)")
    args = ap.parse_args(argv)
    if not 1 <= args.reps <= 10 or not 1 <= args.clients <= 200:
        ap.error("--reps must be 1..10 and --clients 1..200")

    rows = {name: Row(name, when) for name, when in [
        ("worker SIGKILL mid-run", "the launch done once, nothing claimed/running/queued"),
        ("worker SIGKILL mid-approval", "stale_claim → re-approved → executed once"),
        ("redis restart", "the operator's cycle done and /healthz 200 (see notes)"),
        ("postgres restart", "the operator's cycle done and /healthz 200 (see notes)"),
        ("daphne restart", f"all {args.clients} websocket clients reconnected, resynced, got the next topic"),
        ("ssh refuses", "verdict stored (seconds to verdict)"),
        ("ssh hangs", "verdict stored (seconds to verdict)"),
        ("ssh slow", "verdict stored (seconds to verdict)"),
        ("provider 429", "run ended (429: not sent, retried)"),
        ("provider 410", "run ended (permanent: not retried)"),
        ("provider 500", "run ended (outcome_unknown: looked up, not re-sent)"),
        ("provider empty", "run ended (outcome_unknown: looked up, not re-sent)"),
        ("provider HTML", "run ended (outcome_unknown: looked up, not re-sent)"),
        ("model timeout", "run ended, one launch (the timed-out request retried)"),
        ("model 429", "run ended, one launch (the 429 retried)"),
        ("model truncated JSON", "run ended, one launch (invalid_args seen, call corrected)"),
    ]}
    rows.update({name: Row(name, when) for name, when in MAKE_RUN_ROWS})


    rows.update({label: Row(label, when) for label, when, _ in APPROVAL_FAULTS.values()})
    with Stack(keep=args.keep, extra_env={"WARDEN_DWELL_MIN": "0", "WARDEN_HOLD_OFF_MIN": "0",
                                          "WARDEN_TARGET_PROOFS_HR": "60"}) as stack:
        from django.contrib.auth.models import User
        from django_celery_beat.models import IntervalSchedule, PeriodicTask

        every5, _ = IntervalSchedule.objects.get_or_create(every=5, period=IntervalSchedule.SECONDS)
        PeriodicTask.objects.filter(task="agent.tasks.monitor_tick").update(interval=every5)
        user = User.objects.get(username="bench")
        stack.start_worker()
        stack.start_daphne()
        stack.start_beat()
        print(f"bench: stack in {stack.dir} (PostgreSQL :{stack.pg_port}, Redis :{stack.redis_port}, web :{stack.web_port})",
              file=sys.stderr)
        def attempt(row: Row, fn, *fn_args):
            """Run one fault; a crash of the bench itself is a failed repetition with its reason."""
            try:
                fn(*fn_args)
            except Exception as exc:  # noqa: BLE001 — reported in the table, never hidden
                row.failed += 1
                row.notes.append(f"{row.fault}: the bench failed: {type(exc).__name__}: {str(exc)[:200]}")
                db_reset()
                if stack.worker is None or not stack.worker.alive():
                    stack.start_worker()

        for rep in range(args.reps):
            if "worker" in args.only:
                attempt(rows["worker SIGKILL mid-run"], kill_worker_mid_run, stack, rows["worker SIGKILL mid-run"], user)
                attempt(rows["worker SIGKILL mid-approval"], kill_worker_mid_approval, stack,
                        rows["worker SIGKILL mid-approval"], user)
            if "redis" in args.only:
                attempt(rows["redis restart"], _server_restart, stack, rows["redis restart"], "redis")
            if "postgres" in args.only:
                attempt(rows["postgres restart"], _server_restart, stack, rows["postgres restart"], "postgres")
            if "daphne" in args.only:
                attempt(rows["daphne restart"], restart_daphne, stack, rows["daphne restart"], args.clients)
            for name, (label, _, fn) in APPROVAL_FAULTS.items():
                if name in args.only:
                    attempt(rows[label], fn, stack, rows[label], user)
            print(f"bench: repetition {rep + 1} of {args.reps} done", file=sys.stderr)
        if "makerun" in args.only:
            attempt(rows["make run: worker SIGKILL"], make_run_faults, stack, rows, args.reps)
        clean_fleet()  # the in-process faults below start from an empty fleet and queue
        if "ssh" in args.only:
            attempt(rows["ssh refuses"], ssh_faults, rows, args.reps)
        if "provider" in args.only:
            attempt(rows["provider 429"], provider_faults, rows, args.reps)
        if "model" in args.only:
            attempt(rows["model timeout"], model_faults, rows, args.reps)
        clean_fleet()

    header = ["fault", "runs", "dup effects", "lost appr.", "parallel", "stuck", "recover s", "recovered when"]
    table = [r.cells() for r in rows.values() if r.times or r.failed]
    widths = [max(len(str(x[i])) for x in [header, *table]) for i in range(len(header))]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for r in table:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    total = sum(r.dup + r.lost + r.parallel + r.stuck + r.failed for r in rows.values())
    print(f"\ngoal: every count 0 and every fault recovered — {'met' if total == 0 else 'NOT met'}")
    notes: dict[str, int] = {}
    for n in (n for r in rows.values() for n in r.notes):
        notes[n] = notes.get(n, 0) + 1
    if notes:
        print("\nnotes:")
        for n, times in notes.items():
            print(f"- {n}" + (f" (×{times})" if times > 1 else ""))
    return 0 if total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
