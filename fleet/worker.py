"""The demo proving worker: a tiny Curio node that speaks HarmonyDB's queue protocol.

Run as ``python -m fleet.worker --name local-1 [--proof-seconds S] [--heartbeat S]``. It sets up
Django itself (``console.settings``; DATABASE_URL / HARMONY_DATABASE_URL / WARDEN_VAR_DIR come
from the environment it inherits) and uses the ORM on alias ``harmony`` (docs/curio.md):

- registers a ``harmony_machines`` row (reusing the row of its own ``machine_name`` after a
  restart) and a ``harmony_machine_details`` row with its task names and ``machine_name``;
  like Curio's ``Register`` it first cleans up machines silent for 10 minutes (their tasks go
  back to the queue);
- a heartbeat thread of its own updates ``last_contact`` every ``WARDEN_HEARTBEAT_S`` seconds;
- the main thread drops to a lower scheduling priority (``os.nice``; on Linux this is per
  thread, so the heartbeat keeps normal priority) and claims one unowned task at a time: a
  conditional ``UPDATE ... SET owner_id`` (``SELECT ... FOR UPDATE SKIP LOCKED`` first on
  PostgreSQL); a cordoned (``unschedulable``) node claims nothing;
- proves for ``--proof-seconds`` of CPU-bound hashing, then deletes the task and writes a
  ``harmony_task_history`` row with ``result = true``.

On SIGTERM it stops claiming, puts its in-flight task back (``owner_id = NULL``) and exits 0.
It leaves its machine row behind, as Curio does: the row goes stale and Curio's (and our)
cleanup removes it after 10 minutes.

Supervisor mode (``--supervise --state FILE``) is what the local provider launches: it starts
the worker as its child, writes the worker's pid to the JSON state file and, when the worker
ends, its exit code (negative signal number when killed by a signal), so the provider can
report "exited with code N" even when the process that launched it is gone.
"""

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import django
import psutil
from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

#: an idle worker also cleans up dead machines at least this often, seconds (more often when the
#: looks-dead time, ``settings.WARDEN["LOOKS_DEAD_S"]`` from WARDEN_LOOKS_DEAD_S, is shorter)
CLEANUP_EVERY_S = 60


def _write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` atomically (temp file + rename)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


# --- supervisor --------------------------------------------------------------------------------
def supervise(state: Path, worker_args: list[str]) -> int:
    """Start the worker, record its pid, wait, record its exit code; returns the worker's code."""
    proc = subprocess.Popen([sys.executable, "-m", "fleet.worker", *worker_args], stdin=subprocess.DEVNULL)
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        create_time = None
    record = {
        "supervisor_pid": os.getpid(),
        "worker_pid": proc.pid,
        "worker_create_time": create_time,
        "started_at": datetime.now(UTC).isoformat(),
        "exit_code": None,
        "ended_at": None,
    }
    _write_json(state, record)

    def forward(signum, frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            code = proc.wait()
            break
        except InterruptedError:
            continue
    record.update(exit_code=code, ended_at=datetime.now(UTC).isoformat())
    _write_json(state, record)
    print(f"supervisor: worker {proc.pid} exited with code {code}", flush=True)
    return 0


# --- the worker --------------------------------------------------------------------------------
class Worker:
    """One demo Curio node named ``name`` (its ``machine_name``)."""

    def __init__(self, name: str, *, proof_seconds: float, heartbeat_s: float, task_names: list[str], cordoned: bool = False,
                 looks_dead_s: int = 600):
        self.name = name
        self.looks_dead_s = looks_dead_s  # Curio's LOOKS_DEAD_TIMEOUT: a machine silent this long is dead
        self.cordoned = cordoned  # Warden's cordon: the node registers unschedulable
        self.proof_seconds = proof_seconds
        self.heartbeat_s = heartbeat_s
        self.task_names = task_names
        self.host_and_port = f"{socket.gethostname()}:{os.getpid()}"
        self.machine_id: int | None = None
        self.stopping = threading.Event()

    def log(self, msg: str) -> None:
        print(f"{datetime.now(UTC).isoformat(timespec='seconds')} worker {self.name}: {msg}", flush=True)

    def _now(self):
        return timezone.now()

    def register(self) -> int:
        """Clean up long-dead machines, then create (or reuse) our machine row; returns its id."""
        # inside: models load only once main() has called django.setup() (python -m fleet.worker)
        from fleet.harmony import HARMONY_ALIAS, HarmonyMachine, HarmonyMachineDetails, HarmonyTask

        now = self._now()
        with transaction.atomic(using=HARMONY_ALIAS):
            self.cleanup_dead(now)
            mine = (
                HarmonyMachineDetails.objects.filter(machine_name=self.name)
                .order_by("-machine__last_contact")
                .values_list("machine_id", flat=True)
                .first()
            )
            fields = dict(
                last_contact=now,
                host_and_port=self.host_and_port,
                cpu=os.cpu_count() or 1,
                ram=0,
                gpu=1.0,
                unschedulable=self.cordoned,
                restart_request=None,
            )
            if mine is not None:
                HarmonyMachine.objects.filter(id=mine).update(**fields)
                # a restarted node drops whatever it owned before
                HarmonyTask.objects.filter(owner_id=mine).update(owner=None, update_time=now)
                machine_id = mine
            else:
                machine_id = HarmonyMachine.objects.create(**fields).id
            HarmonyMachineDetails.objects.update_or_create(
                machine_id=machine_id,
                defaults=dict(
                    tasks=",".join(self.task_names),
                    layers="demo",
                    startup_time=now,
                    miners="",
                    machine_name=self.name,
                ),
            )
        self.machine_id = machine_id
        self.log(f"registered as machine {machine_id} ({self.host_and_port}); tasks {','.join(self.task_names)}")
        return machine_id

    def cleanup_dead(self, now) -> int:
        """Curio's CleanupMachines: delete machines silent past ``looks_dead_s`` and requeue their tasks.

        Curio runs it when a node registers; the demo worker also runs it while idle, so a task a
        killed worker owned is not stuck when no other worker starts. Returns machines removed.
        """
        # inside: models load only once main() has called django.setup() (python -m fleet.worker)
        from fleet.harmony import HarmonyMachine, HarmonyMachineDetails, HarmonyTask

        dead = list(
            HarmonyMachine.objects.filter(last_contact__lt=now - timedelta(seconds=self.looks_dead_s))
            .exclude(id=self.machine_id or 0)
            .values_list("id", flat=True)
        )
        if dead:
            HarmonyTask.objects.filter(owner_id__in=dead).update(owner=None, update_time=now)
            HarmonyMachineDetails.objects.filter(machine_id__in=dead).delete()
            HarmonyMachine.objects.filter(id__in=dead).delete()
            self.log(f"cleaned up {len(dead)} machine(s) silent for {self.looks_dead_s} s")
        return len(dead)

    def heartbeat_loop(self) -> None:
        """Update ``last_contact`` every ``heartbeat_s`` until stopping (runs in its own thread)."""
        # inside: models load only once main() has called django.setup() (python -m fleet.worker)
        from fleet.harmony import HarmonyMachine

        try:
            while not self.stopping.wait(self.heartbeat_s):
                try:
                    HarmonyMachine.objects.filter(id=self.machine_id).update(last_contact=self._now())
                except DatabaseError as exc:
                    self.log(f"heartbeat failed: {exc}")
        finally:
            connections.close_all()

    def schedulable(self) -> bool:
        # inside: models load only once main() has called django.setup() (python -m fleet.worker)
        from fleet.harmony import HarmonyMachine

        return not HarmonyMachine.objects.filter(id=self.machine_id, unschedulable=True).exists()

    def claim(self):
        """Claim one unowned task of our names; returns the task (now ours) or None."""
        # inside: models load only once main() has called django.setup() (python -m fleet.worker)
        from fleet.harmony import HARMONY_ALIAS, HarmonyTask

        now = self._now()
        queue = HarmonyTask.objects.filter(owner__isnull=True, name__in=self.task_names).order_by("posted_time", "id")
        if connections[HARMONY_ALIAS].vendor == "postgresql":
            with transaction.atomic(using=HARMONY_ALIAS):
                task = queue.select_for_update(skip_locked=True).first()
                if task is None:
                    return None
                HarmonyTask.objects.filter(id=task.id).update(owner_id=self.machine_id, update_time=now)
                task.owner_id = self.machine_id
                return task
        for task in queue[:8]:
            won = HarmonyTask.objects.filter(id=task.id, owner__isnull=True).update(
                owner_id=self.machine_id, update_time=now
            )
            if won == 1:
                task.owner_id = self.machine_id
                return task
        return None

    def prove(self) -> bool:
        """CPU-bound hashing for ``proof_seconds``; False if a stop request interrupted it."""
        block = os.urandom(1 << 16)
        deadline = time.monotonic() + self.proof_seconds
        digest = b""
        while time.monotonic() < deadline:
            if self.stopping.is_set():
                return False
            for _ in range(16):  # hashlib releases the GIL on large buffers
                digest = hashlib.sha256(block + digest).digest()
        return True

    def finish(self, task, work_start) -> None:
        """Delete the task we own and write its history row (result true)."""
        # inside: models load only once main() has called django.setup() (python -m fleet.worker)
        from fleet.harmony import HARMONY_ALIAS, HarmonyTask, HarmonyTaskHistory

        now = self._now()
        with transaction.atomic(using=HARMONY_ALIAS):
            deleted, _ = HarmonyTask.objects.filter(id=task.id, owner_id=self.machine_id).delete()
            if not deleted:
                self.log(f"task {task.id} was taken from us before it finished; result dropped")
                return
            HarmonyTaskHistory.objects.create(
                task_id=task.id,
                name=task.name,
                posted=task.posted_time,
                work_start=work_start,
                work_end=now,
                result=True,
                err="",
                completed_by_host_and_port=self.host_and_port,
            )
        self.log(f"proved task {task.id} ({task.name}) in {(now - work_start).total_seconds():.1f} s")

    def put_back(self, task) -> None:
        # inside: models load only once main() has called django.setup() (python -m fleet.worker)
        from fleet.harmony import HarmonyTask

        HarmonyTask.objects.filter(id=task.id, owner_id=self.machine_id).update(owner=None, update_time=self._now())
        self.log(f"stopping: put task {task.id} back in the queue")

    def run(self) -> int:
        """Register, start the heartbeat thread, then claim and prove until SIGTERM; returns 0."""
        signal.signal(signal.SIGTERM, lambda s, f: self.stopping.set())
        signal.signal(signal.SIGINT, lambda s, f: self.stopping.set())
        self.register()
        beat = threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True)
        beat.start()
        try:
            os.nice(10)  # Linux: this thread only; the heartbeat thread keeps its priority
        except OSError:
            pass
        idle_wait = min(1.0, self.heartbeat_s)
        last_cleanup = time.monotonic()
        while not self.stopping.is_set():
            task = self.claim() if self.schedulable() else None
            if task is None:
                if time.monotonic() - last_cleanup > min(CLEANUP_EVERY_S, self.looks_dead_s):
                    last_cleanup = time.monotonic()
                    try:
                        self.cleanup_dead(self._now())
                    except Exception as exc:  # noqa: BLE001 — a failed cleanup must not stop the worker
                        self.log(f"cleanup failed: {exc}")
                self.stopping.wait(idle_wait)
                continue
            work_start = self._now()
            self.log(f"claimed task {task.id} ({task.name})")
            if self.prove():
                self.finish(task, work_start)
            else:
                self.put_back(task)
        self.log("stopped (SIGTERM)")
        beat.join(timeout=self.heartbeat_s + 5)
        return 0


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m fleet.worker", description="Warden demo Curio worker")
    parser.add_argument("--name", required=True, help="machine_name to register (the instance's worker_name)")
    parser.add_argument("--proof-seconds", type=float, default=None, help="length of one proof (WARDEN_PROOF_SECONDS)")
    parser.add_argument("--heartbeat", type=float, default=None, help="heartbeat interval, s (WARDEN_HEARTBEAT_S)")
    parser.add_argument("--tasks", default=None, help="comma-separated task names (WARDEN_TASK_NAMES)")
    parser.add_argument("--cordoned", action="store_true", help="register unschedulable (Warden's cordon survives restarts)")
    parser.add_argument("--supervise", action="store_true", help="run the worker as a child and record its exit")
    parser.add_argument("--state", default=None, help="supervisor state file (JSON)")
    args, _ = parser.parse_known_args(argv)

    if args.supervise:
        if not args.state:
            parser.error("--supervise needs --state FILE")
        rest = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--supervise"]
        i = rest.index("--state")
        del rest[i : i + 2]
        return supervise(Path(args.state), rest)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

    django.setup()

    warden = settings.WARDEN
    worker = Worker(
        args.name,
        proof_seconds=args.proof_seconds if args.proof_seconds is not None else warden["PROOF_SECONDS"],
        heartbeat_s=args.heartbeat if args.heartbeat is not None else warden["HEARTBEAT_S"],
        task_names=[t for t in (args.tasks.split(",") if args.tasks else warden["TASK_NAMES"]) if t],
        cordoned=args.cordoned,
        looks_dead_s=warden["LOOKS_DEAD_S"],
    )

    try:
        return worker.run()
    except DatabaseError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(
            f"worker {args.name}: harmony database unreadable ({first}); check HARMONY_DATABASE_URL "
            "and run `python manage.py demo prepare`",
            file=sys.stderr,
            flush=True,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
