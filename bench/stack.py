"""A throwaway Warden stack for the benches: its own PostgreSQL cluster and redis-server on their
own ports, and Warden's real processes (daphne, a Celery worker, beat) on top.

Nothing here touches a shared server: the cluster is created with ``initdb`` under a temporary
directory (as the ``postgres`` user when run as root, since initdb refuses root), started with
``pg_ctl`` on a free port, and removed at the end, as is the redis-server (no persistence). The
benches restart *these* servers; never point them at a server others use.

Usage (a context manager)::

    with Stack() as stack:          # servers up, databases migrated, an operator "bench"
        stack.start_worker(); stack.start_daphne(); stack.start_beat()
        stack.restart_postgres(); stack.restart_redis()

The bench process itself is configured (``os.environ``) for the same databases and Redis before
``django.setup()``, so it can read rows and call Warden's own functions.
"""

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"
PASSWORD = "bench-pass-1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, interval: float = 0.1):
    """Poll ``predicate`` until truthy; returns its value, or None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 — a server still starting raises; keep polling
            value = None
        if value:
            return value
        time.sleep(interval)
    return None


def destroy_local_instances():
    """Destroy every instance the local provider lists (its demo workers); returns the provider."""
    from fleet.providers.local import LocalProvider

    provider = LocalProvider()
    for pi in provider.list_instances():
        try:
            provider.destroy(pi.external_id)
        except Exception:  # noqa: BLE001 — best effort: an ending bench must not stop here
            pass
    return provider


class DbTimer:
    """``connection.execute_wrapper`` (Django) that sums the time spent inside database calls."""

    def __init__(self):
        self.seconds = 0.0

    def __call__(self, execute, sql, params, many, context):
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - t0


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise SystemExit(f"bench: {name} not found under /usr/lib/postgresql/*/bin; install the PostgreSQL server package")
    return found[-1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Proc:
    """One Warden process (its own process group), logging to ``log``."""

    def __init__(self, name: str, argv: list[str], env: dict, log: Path):
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Proc":
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=fh,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, sig: int) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, sig: int = signal.SIGTERM, wait_s: float = 20) -> None:
        """Send ``sig`` to the process group and wait; SIGKILL after ``wait_s``."""
        if not self.alive():
            return
        self.send(sig)
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.send(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


class Stack:
    """PostgreSQL + Redis of its own, Warden migrated on them, and handles on Warden's processes.

    ``env`` is the environment every Warden process gets (and the bench's own ``os.environ``).
    Raises ``SystemExit`` with one line when a server cannot be started.
    """

    def __init__(self, *, keep: bool = False, extra_env: dict | None = None):
        self.keep = keep
        self.dir = Path(tempfile.mkdtemp(prefix="warden-bench-"))
        self.pg_port, self.redis_port, self.web_port = free_port(), free_port(), free_port()
        self.pgdata = self.dir / "pg"
        self.var = self.dir / "var"
        self.logs = self.dir / "logs"
        self.redis: subprocess.Popen | None = None
        self.procs: list[Proc] = []
        self.worker: Proc | None = None
        self.daphne: Proc | None = None
        self.beat: Proc | None = None
        self.env = {
            **os.environ,
            "DATABASE_URL": f"postgres://postgres@127.0.0.1:{self.pg_port}/warden_bench",
            "HARMONY_DATABASE_URL": f"postgres://postgres@127.0.0.1:{self.pg_port}/warden_bench_harmony",
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "WARDEN_VAR_DIR": str(self.var),
            "WARDEN_CELERY_QUEUE": "warden_bench",
            "WARDEN_CHANNEL_PREFIX": "warden_bench",
            "WARDEN_SECRET_KEY": "bench-only-secret-key-" + "x" * 40,
            "WARDEN_PROVIDER": "local",
            "WARDEN_DEMAND_SOURCE": "local",
            "WARDEN_HEARTBEAT_S": "1",
            "WARDEN_PROOF_SECONDS": "1",
            "WARDEN_STARTUP_GRACE_S": "0",
            "WARDEN_STOP_GRACE_S": "3",
            "WARDEN_OBSERVE_INTERVAL_S": "10",
            "WARDEN_CELERY_VISIBILITY_TIMEOUT_S": "5",
            "WARDEN_LOG_LEVEL": "WARNING",
            **(extra_env or {}),
        }
        for name in ("WARDEN_TEST_DB_NAME", "DJANGO_SETTINGS_MODULE"):
            self.env.pop(name, None)

    # --- servers -------------------------------------------------------------------------------
    def _as_postgres(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def start_postgres(self) -> None:
        self.pgdata.mkdir(parents=True)
        (self.dir / "sock").mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            for p in (self.pgdata, self.dir / "sock"):
                shutil.chown(p, "postgres")
        subprocess.run(self._as_postgres([_pg_bin("initdb"), "-D", str(self.pgdata), "-A", "trust", "-U", "postgres",
                                          "--no-sync", "-E", "UTF8"]), check=True, capture_output=True, timeout=120)
        self._pg_ctl("start")

    def _pg_ctl(self, what: str, *extra: str) -> None:
        opts = (f"-p {self.pg_port} -k {self.dir / 'sock'} -c listen_addresses=127.0.0.1 -c fsync=off "
                f"-c synchronous_commit=off -c max_connections=200")
        subprocess.run(self._as_postgres([_pg_bin("pg_ctl"), "-D", str(self.pgdata), "-o", opts, "-l",
                                          str(self.dir / "postgres.log"), "-w", "-t", "60", what, *extra]),
                       check=True, capture_output=True, timeout=120)

    def restart_postgres(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut, the server is back when this returns."""
        self._pg_ctl("restart", "-m", "fast")

    def start_redis(self) -> None:
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        if not wait_until(lambda: _listening(self.redis_port), 15):
            raise SystemExit(f"bench: redis-server did not listen on 127.0.0.1:{self.redis_port}")

    def restart_redis(self, down_s: float = 1.0) -> None:
        """Stop the redis-server (SIGTERM, nothing saved: queued messages are lost), wait, start it."""
        self.redis.terminate()
        self.redis.wait(timeout=20)
        time.sleep(down_s)
        self.start_redis()

    # --- Warden ----------------------------------------------------------------------------------
    def manage(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "python"), "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def _proc(self, name: str, argv: list[str]) -> Proc:
        self.logs.mkdir(exist_ok=True)
        p = Proc(name, argv, self.env, self.logs / f"{name}.log").start()
        self.procs.append(p)
        return p

    def start_worker(self, name: str = "bench") -> Proc:
        """A Celery worker (``--pool solo``, as the tests run it) on the bench queue; waits for ready."""
        log_size = (self.logs / "worker.log").stat().st_size if (self.logs / "worker.log").exists() else 0
        self.worker = self._proc("worker", [str(BIN / "celery"), "-A", "console", "worker", "-Q", self.env["WARDEN_CELERY_QUEUE"],
                                            "--pool", "solo", "-l", "info", "-n", f"{name}@%h", "--without-gossip",
                                            "--without-mingle", "--without-heartbeat"])
        ok = wait_until(lambda: not self.worker.alive() or "ready." in self.worker.text()[log_size:], 60)
        if not ok or not self.worker.alive():
            raise SystemExit(f"bench: the celery worker did not start; see {self.worker.log}")
        return self.worker

    def start_daphne(self) -> Proc:
        """daphne on the bench's web port; waits until ``/healthz`` answers."""
        import httpx

        self.daphne = self._proc("daphne", [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(self.web_port),
                                            "--websocket_timeout", "-1", "console.asgi:application"])
        if not wait_until(lambda: httpx.get(f"{self.url}/healthz", timeout=2).status_code in (200, 503), 60):
            raise SystemExit(f"bench: daphne did not answer on {self.url}; see {self.daphne.log}")
        return self.daphne

    def start_beat(self) -> Proc:
        self.beat = self._proc("beat", [str(BIN / "celery"), "-A", "console", "beat", "-l", "info", "--pidfile="])
        return self.beat

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def __enter__(self) -> "Stack":
        try:
            self.start_postgres()
            self.start_redis()
            import psycopg

            with psycopg.connect(host="127.0.0.1", port=self.pg_port, user="postgres", dbname="postgres", autocommit=True) as c:
                c.execute("CREATE DATABASE warden_bench")
                c.execute("CREATE DATABASE warden_bench_harmony")
            done = self.manage("bootstrap")
            if done.returncode != 0:
                raise SystemExit(f"bench: manage.py bootstrap failed:\n{done.stderr[-2000:]}")
            os.environ.update(self.env)
            os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
            sys.path.insert(0, str(ROOT))
            import django

            django.setup()
            from django.contrib.auth.models import Group, User

            user, _ = User.objects.get_or_create(username="bench")
            user.set_password(PASSWORD)
            user.save()
            user.groups.add(Group.objects.get_or_create(name="operators")[0])
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for p in reversed(self.procs):
            p.stop()
        try:  # demo workers the local provider launched run in their own sessions
            destroy_local_instances()
        except Exception:  # noqa: BLE001 — Django may not be set up
            pass
        if self.redis is not None and self.redis.poll() is None:
            self.redis.terminate()
            self.redis.wait(timeout=20)
        if self.pgdata.exists():
            subprocess.run(self._as_postgres([_pg_bin("pg_ctl"), "-D", str(self.pgdata), "-m", "immediate", "-w", "stop"]),
                           capture_output=True, timeout=60)
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"bench: kept {self.dir}", file=sys.stderr)
