"""Diagnosis fan-out: 50 loopback hosts, 5 of them silent, the full collector; parallel vs one by one.

Goal (bench/README.md): ≤ 8 s wall for the 50 hosts, and ≥ 4× faster than the same hosts one after
another (both printed, same run); the outer budget: ≤ 10 s.

What runs (one process, throwaway test databases made and dropped by Django's test machinery):

- one real OpenSSH server (``tests.sshd.SSHServer``) listening on 45 loopback addresses
  (127.0.0.1 and 127.0.1.1 …), each a host of its own for the client (one pooled connection
  each), serving the recorded healthy H200 outputs (``tests.gpu_outputs``) and a worker log;
- 5 silent hosts (``tests.sshd.SilentHost``): TCP accepted, no byte ever sent — each costs the
  5 s connect budget (``fleet.ssh.CONNECT_TIMEOUT_S``);
- 50 ``Instance`` rows pointing at them; every diagnosis runs the full collector
  (``fleet.diagnostics.commands_for``: 10 commands) and stores a ``Diagnosis``.

Rows: ``one by one`` (``diagnose`` in a loop), ``parallel`` (``diagnose_many``, a thread pool
bounded by ``--parallel``), each from a cold pool (every connection new), and ``parallel, warm``
(the connections of the previous row reused, as a second diagnosis within 120 s is).

Usage::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench \\
    HARMONY_DATABASE_URL=postgres://postgres@127.0.0.1:5432/warden_bench_h \\
        .venv/bin/python bench/diagnose_fanout.py [--hosts 50] [--silent 5] [--parallel 32]
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
os.environ.setdefault("WARDEN_LOG_LEVEL", "WARNING")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=50)
    ap.add_argument("--silent", type=int, default=5)
    ap.add_argument("--parallel", type=int, default=None, help="thread bound (default fleet.diagnostics.MAX_PARALLEL)")
    args = ap.parse_args(argv)

    import django

    django.setup()
    import logging

    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    from django.conf import settings
    from django.test.utils import setup_databases, teardown_databases
    from django.utils import timezone

    from fleet.diagnostics import MAX_PARALLEL, commands_for, diagnose, diagnose_many
    from fleet.models import Diagnosis, Instance
    from fleet.providers import set_override
    from fleet.providers.base import Provider
    from fleet.ssh import CONNECT_TIMEOUT_S, POOL
    from tests.sshd import SilentHost, SSHServer

    class Rented(Provider):
        name = "rented"

        def list_instances(self):
            return []

    bound = args.parallel or MAX_PARALLEL
    live = args.hosts - args.silent
    db_cfg = setup_databases(verbosity=0, interactive=False, aliases={"default", "harmony"})
    servers, silent = [], []
    try:
        # sshd listens on at most 16 sockets: one server per 15 addresses, all with the same client key
        key_dir = Path(tempfile.mkdtemp(prefix="warden-fanout-"))
        servers, endpoints = [], []
        for n in range(0, live, 15):
            addrs = [f"127.0.{1 + n // 15}.{i}" for i in range(1, min(15, live - n) + 1)]
            s = SSHServer(key_dir / f"sshd{n // 15}", extra_hosts=addrs[1:])
            s.host = addrs[0]
            servers.append(s)
        for s in servers:
            if s is not servers[0]:
                s.root.mkdir(parents=True, exist_ok=True)
                s.key_file.write_bytes(servers[0].key_file.read_bytes())  # one client key for every server
            s.start()
            s.profile("healthy_h200")
            endpoints += [(h, s.port) for h in [s.host, *s.extra_hosts]]
        silent = [SilentHost() for _ in range(args.silent)]
        settings.WARDEN["SSH_USER"] = servers[0].user
        settings.WARDEN["SSH_KEY_FILE"] = str(servers[0].key_file)
        set_override(Rented())
        now = timezone.now()
        endpoints += [(s.host, s.port) for s in silent]
        # silent hosts spread through the list, as dead machines are in a real fleet
        step = max(1, len(endpoints) // max(1, args.silent))
        order = [e for e in endpoints[:live]]
        for i, e in enumerate(endpoints[live:]):
            order.insert(min(len(order), i * step), e)
        instances = [
            Instance.objects.create(provider="rented", external_id=f"h-{i:03d}", status="running", status_since=now,
                                    created_at=now, ssh_host=h, ssh_port=p, log_path=str(servers[0].root / "worker.log"))
            for i, (h, p) in enumerate(order)
        ]

        def tally(diags):
            by = {}
            for d in diags:
                key = f"{d.source}/{d.health}/{d.fault_class or 'none'}"
                by[key] = by.get(key, 0) + 1
            return ", ".join(f"{k} {v}" for k, v in sorted(by.items()))

        rows = []
        load_before = os.getloadavg()[0]
        POOL.close_all()
        t0, c0 = time.monotonic(), time.process_time()
        seq = []
        for n, inst in enumerate(instances, 1):
            seq.append(diagnose(inst))
            print(f"\rone by one: {n}/{len(instances)} ({time.monotonic() - t0:.1f} s)", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        rows.append(("one by one", time.monotonic() - t0, time.process_time() - c0, tally(seq)))
        POOL.close_all()
        t0, c0 = time.monotonic(), time.process_time()
        par = diagnose_many(instances, max_parallel=bound)
        rows.append((f"parallel ({bound} threads)", time.monotonic() - t0, time.process_time() - c0, tally(par)))
        t0, c0 = time.monotonic(), time.process_time()
        warm = diagnose_many(instances, max_parallel=bound)
        rows.append((f"parallel, warm pool ({len(POOL)} reused)", time.monotonic() - t0, time.process_time() - c0, tally(warm)))
        POOL.close_all()

        print(f"{args.hosts} loopback hosts ({live} addresses served by {len(servers)} sshd, {args.silent} silent: "
              f"TCP accepted, nothing sent); {len(commands_for(instances[0]))} commands per host; "
              f"connect budget {CONNECT_TIMEOUT_S:g} s; {os.cpu_count()} CPU(s)")
        print(f"diagnoses stored: {Diagnosis.objects.count()}")
        print()
        head = f"{'mode':<36} | {'wall s':>7} | {'client cpu s':>12} | {'vs one by one':>13} | {'goal':>22} | {'met':>4} | verdicts"
        print(head)
        print("-" * len(head))
        base = rows[0][1]
        for name, wall, cpu, verdicts in rows:
            if name == "one by one":
                goal, met, ratio = "(the peer)", "", "1.0x"
            else:
                goal = "<= 8 s and >= 4x"
                met = "yes" if wall <= 8 and base / wall >= 4 else "NO"
                ratio = f"{base / wall:.1f}x"
            print(f"{name:<36} | {wall:7.2f} | {cpu:12.2f} | {ratio:>13} | {goal:>22} | {met:>4} | {verdicts}")
        print()
        print("a silent host costs its thread the connect budget once; the others go on meanwhile.")
        print(f"machine load average (1 min): {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPU(s):")
        print("the sshd sessions, their shells and this client share those CPUs with everything else running;")
        print("'client cpu s' is this process's own CPU time (paramiko handshakes, parsing, database writes).")
    finally:
        set_override(None)
        POOL.close_all()
        for s in silent:
            s.close()
        for s in servers:
            s.stop()
        teardown_databases(db_cfg, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
