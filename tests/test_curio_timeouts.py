"""A Curio read cannot hang the cycle: a lock held on a table, a slow statement and a frozen
backend each end the read in bounded time as demand ``unknown`` with the reason (server-side
``lock_timeout``/``statement_timeout`` on the harmony connection, TCP keepalives, and Warden's own
read deadline); Celery's time limits on the cycle tasks are the last net."""

import contextlib
import socket
import threading

import psycopg
from django.db import connections

from fleet.demand import read_demand
from tests.curio_support import CURIO_DB, curio, instance, instances  # noqa: F401 (fixture)

pytestmark = CURIO_DB


def harmony_options(**servers) -> None:
    """Reconnect the harmony alias with these server options (``-c name=value``) replaced."""
    conn = connections["harmony"]
    conn.close()
    opts = dict(conn.settings_dict["OPTIONS"])
    parts = [p for p in opts.get("options", "").split("-c ") if p.strip() and p.split("=")[0].strip() not in servers]
    opts["options"] = " ".join(f"-c {p.strip()}" for p in parts) + "".join(f" -c {k}={v}" for k, v in servers.items())
    conn.settings_dict["OPTIONS"] = opts


def dsn() -> str:
    cfg = connections["harmony"].settings_dict
    return f"host={cfg['HOST']} port={cfg['PORT']} dbname={cfg['NAME']} user={cfg['USER']}" + (
        f" password={cfg['PASSWORD']}" if cfg.get("PASSWORD") else "")


@contextlib.contextmanager
def table_locked(table: str):
    """Another session holds ACCESS EXCLUSIVE on ``curio.table`` (what a migration's ALTER TABLE takes)."""
    other = psycopg.connect(dsn())
    try:
        other.execute(f"LOCK TABLE curio.{table} IN ACCESS EXCLUSIVE MODE")
        yield
    finally:
        other.rollback()
        other.close()


def test_a_lock_held_on_harmony_task_is_unknown_with_the_reason_not_a_hang(curio):  # noqa: F811
    harmony_options(lock_timeout=300)
    curio.task("PoRep")
    assert read_demand([]).state == "ok"  # probed, connected

    with table_locked("harmony_task"):
        r = read_demand([])

    assert r.state == "unknown" and r.queued is None
    assert "reading harmony_task failed" in r.error and "lock timeout" in r.error
    assert "SQLSTATE 55P03" in r.error and "Curio migration" in r.error
    # twin: once the lock is gone the next read counts again
    again = read_demand([])
    assert again.state == "ok" and again.queued == 1


def test_a_lock_on_a_secondary_table_loses_only_its_fields(curio):  # noqa: F811
    harmony_options(lock_timeout=300)
    curio.history(40)
    curio.task("PoRep")

    with table_locked("harmony_task_history"):
        r = read_demand([])

    assert r.state == "ok" and r.queued == 1 and r.proofs_hr is None
    assert "lock timeout" in r.unreadable["proofs_hr"]


def test_a_slow_statement_ends_at_the_statement_timeout(curio):  # noqa: F811
    harmony_options(statement_timeout=300)
    curio.sql("CREATE FUNCTION curio.slow() RETURNS boolean LANGUAGE plpgsql VOLATILE AS "
              "$$ BEGIN PERFORM pg_sleep(5); RETURN true; END $$")
    curio.sql("ALTER TABLE curio.harmony_machine_details ENABLE ROW LEVEL SECURITY")
    curio.sql("CREATE POLICY slow ON curio.harmony_machine_details FOR SELECT USING (curio.slow())")
    curio.machine("vast-101", age_s=5)
    instance("vast-101")
    grants = [f"GRANT SELECT ON curio.{t} TO {{role}}" for t in (
        "harmony_machines", "harmony_machine_details", "harmony_task", "harmony_task_history",
        "sectors_snap_pipeline", "sectors_sdr_pipeline")] + ["GRANT EXECUTE ON FUNCTION curio.slow() TO {role}"]

    with curio.as_role(grants):
        r = read_demand(instances())

    assert r.state == "ok" and r.workers_live is None
    assert "statement timeout" in r.unreadable["workers_live"] and "SQLSTATE 57014" in r.unreadable["workers_live"]


class FreezingProxy:
    """A TCP proxy to PostgreSQL on loopback that can stop forwarding (a frozen backend or network:
    the connection stays open, nothing comes back)."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.frozen = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            while self.frozen.is_set():  # hold the bytes: nothing is forwarded while frozen
                if self.frozen.wait(0.05) and not self.frozen.is_set():
                    break
                threading.Event().wait(0.05)
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self):
        self.listener.close()
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


def test_a_frozen_backend_is_unknown_within_the_read_deadline(curio, settings):  # noqa: F811
    cfg = connections["harmony"].settings_dict
    proxy = FreezingProxy(cfg["HOST"] or "127.0.0.1", int(cfg["PORT"] or 5432))
    saved = (cfg["HOST"], cfg["PORT"])
    connections["harmony"].close()
    cfg["HOST"], cfg["PORT"] = "127.0.0.1", proxy.port
    settings.WARDEN = {**settings.WARDEN, "CURIO_READ_DEADLINE_S": 1.0}
    try:
        curio.task("PoRep")
        assert read_demand([]).queued == 1  # through the proxy
        proxy.frozen.set()
        r = read_demand([])
        proxy.frozen.clear()
        again = read_demand([])
    finally:
        connections["harmony"].close()
        cfg["HOST"], cfg["PORT"] = saved
        proxy.close()
        # the session the proxy held open on the server ends with it (the test database is dropped next)
        curio.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE datname = current_database() AND pid <> pg_backend_pid()")

    assert r.state == "unknown" and r.queued is None
    assert "timed out: no answer within 1 s" in r.error and "WARDEN_CURIO_READ_DEADLINE_S" in r.error
    assert again.state == "ok" and again.queued == 1  # the next read connects afresh


def test_the_cycle_tasks_carry_celery_time_limits_inside_the_run_lock(settings):
    from agent import tasks

    for task in (tasks.observe_cycle, tasks.triggered_cycle, tasks.resume, tasks.monitor_tick):
        assert task.soft_time_limit == settings.WARDEN["CYCLE_SOFT_TIME_LIMIT_S"], task.name
        assert task.soft_time_limit < task.time_limit < settings.WARDEN["RUN_LOCK_TTL_S"], task.name


def test_the_harmony_connection_has_keepalives_and_server_timeouts():
    from console.settings import DATABASES

    opts = DATABASES["harmony"]["OPTIONS"]
    assert (opts["keepalives"], opts["keepalives_idle"], opts["keepalives_interval"], opts["keepalives_count"]) == (1, 10, 5, 3)
    assert "-c statement_timeout=10000" in opts["options"] and "-c lock_timeout=5000" in opts["options"]
    assert opts["connect_timeout"] == 5
