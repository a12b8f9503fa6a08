"""A Curio-shaped HarmonyDB for tests: schema ``curio`` on the harmony test database.

The tables come from ``tests/curio_schema.sql`` (Curio's current columns, from its own migrations; docs/curio.md).
The ``curio`` fixture creates them, points alias ``harmony`` at them the way an operator would
(``HARMONY_DATABASE_URL=…?search_path=curio``, parsed by ``console.settings._db``), sets
``WARDEN_DEMAND_SOURCE=curio`` with Curio's 60-s heartbeat, and yields a :class:`CurioDB` that
writes rows the way Curio does: timestamps from the database's ``now()``.
"""

import contextlib
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connections
from django.utils import timezone

from fleet.demand import set_override
from fleet.demand.curio import forget_probes
from fleet.models import Instance

CURIO_DB = pytest.mark.django_db(transaction=True, databases=["default", "harmony"])
SCHEMA_SQL = Path(__file__).with_name("curio_schema.sql")


class CurioDB:
    """Writes to the test Curio schema (raw SQL, database clock) and reads it back."""

    def __init__(self, alias: str = "harmony"):
        self.alias = alias

    def sql(self, query: str, params=()):
        with connections[self.alias].cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else None

    def machine(self, name: str | None = "", *, age_s: float = 0.0, cordoned: bool = False,
                host: str = "10.0.0.5:12300", tasks: str = "PoRep,UpdateProve", gpu: float = 1.0) -> int:
        """A node whose heartbeat is ``age_s`` old on the database clock; ``name=None``: no details row yet."""
        (mid,), = self.sql(
            "INSERT INTO harmony_machines (last_contact, host_and_port, cpu, ram, gpu, unschedulable) "
            "VALUES (now() - make_interval(secs => %s), %s, 32, 274877906944, %s, %s) RETURNING id",
            [age_s, host, gpu, cordoned],
        )
        if name is not None:
            self.sql(
                "INSERT INTO harmony_machine_details (tasks, layers, startup_time, miners, machine_id, machine_name) "
                "VALUES (%s, 'base,gpu', now(), 'f01000', %s, %s)",
                [tasks, mid, name],
            )
        return mid

    def heartbeat(self, machine_id: int, age_s: float) -> None:
        """Set the node's ``last_contact`` to ``age_s`` before the database's now()."""
        self.sql("UPDATE harmony_machines SET last_contact = now() - make_interval(secs => %s) WHERE id = %s",
                 [age_s, machine_id])

    def task(self, name: str = "PoRep", owner: int | None = None, age_s: float = 0.0) -> int:
        (tid,), = self.sql(
            "INSERT INTO harmony_task (initiated_by, update_time, posted_time, owner_id, added_by, name) "
            "VALUES (NULL, now(), now() - make_interval(secs => %s), %s, 1, %s) RETURNING id",
            [age_s, owner, name],
        )
        return tid

    def history(self, seconds: float, *, name: str = "PoRep", ended_s_ago: float = 60.0, result: bool = True,
                host: str = "10.0.0.5:12300") -> None:
        self.sql(
            "INSERT INTO harmony_task_history (task_id, name, posted, work_start, work_end, result, err, "
            "completed_by_host_and_port) VALUES (1, %s, now() - make_interval(secs => %s), "
            "now() - make_interval(secs => %s), now() - make_interval(secs => %s), %s, '', %s)",
            [name, ended_s_ago + seconds + 5, ended_s_ago + seconds, ended_s_ago, result, host],
        )

    def snap_sector(self, number: int, *, after_encode=True, after_prove=False, task_id_prove=None) -> None:
        self.sql(
            "INSERT INTO sectors_snap_pipeline (sp_id, sector_number, upgrade_proof, after_encode, after_prove, "
            "task_id_prove) VALUES (1000, %s, 3, %s, %s, %s)",
            [number, after_encode, after_prove, task_id_prove],
        )

    def sdr_sector(self, number: int, *, precommitted=True, seed_epoch=4_200_000, task_id_porep=None,
                   after_porep=False, failed=False) -> None:
        self.sql(
            "INSERT INTO sectors_sdr_pipeline (sp_id, sector_number, reg_seal_proof, after_precommit_msg_success, "
            "seed_epoch, task_id_porep, after_porep, failed) VALUES (1000, %s, 8, %s, %s, %s, %s, %s)",
            [number, precommitted, seed_epoch, task_id_porep, after_porep, failed],
        )

    def head(self, genesis: int = 1598306400, epoch_s: int = 30) -> int:
        """The chain head epoch on the database's clock for a network with ``genesis``."""
        (epoch,), = self.sql("SELECT floor((extract(epoch FROM now()) - %s) / %s)::bigint", [genesis, epoch_s])
        return epoch

    def rename(self, machine_id: int, name: str) -> None:
        """The node behind ``machine_id``'s address (re)started as ``name``: Curio's registration
        updated the row it found by host_and_port and wrote its details afresh."""
        self.sql("UPDATE harmony_machines SET last_contact = now() WHERE id = %s", [machine_id])
        self.sql("UPDATE harmony_machine_details SET machine_name = %s, startup_time = clock_timestamp() "
                 "WHERE machine_id = %s", [name, machine_id])

    @contextlib.contextmanager
    def as_role(self, grants: list[str], usage: bool = True):
        """Read through a role holding only ``grants`` (SQL GRANT statements ending ``TO {role}``).

        The role name derives from the test database's (roles are cluster-wide). The session
        switches to it with SET ROLE, as a read-only console login would be.
        """
        name = str(connections[self.alias].settings_dict["NAME"])[:40] + "_reader"
        self.sql(f"DROP ROLE IF EXISTS {name}")
        self.sql(f"CREATE ROLE {name} NOLOGIN")
        if usage:
            self.sql(f"GRANT USAGE ON SCHEMA curio TO {name}")
        for g in grants:
            self.sql(g.format(role=name))
        self.sql(f"SET ROLE {name}")
        forget_probes()
        try:
            yield name
        finally:
            self.sql("RESET ROLE")
            forget_probes()
            self.sql(f"DROP OWNED BY {name}")
            self.sql(f"DROP ROLE {name}")


def curio_url_options(alias: str = "harmony") -> dict:
    """OPTIONS for ``alias`` parsed from Curio's own URL form (``?search_path=curio``)."""
    import os

    from console.settings import _db

    cfg = connections[alias].settings_dict
    auth = cfg["USER"] + (f":{cfg['PASSWORD']}" if cfg.get("PASSWORD") else "")
    url = f"postgres://{auth}@{cfg['HOST']}:{cfg['PORT']}/{cfg['NAME']}?search_path=curio"
    os.environ["WARDEN_TEST_CURIO_URL"] = url
    try:
        from console.settings import harmony_timeouts

        return harmony_timeouts(_db("WARDEN_TEST_CURIO_URL", Path("unused"))["OPTIONS"])
    finally:
        del os.environ["WARDEN_TEST_CURIO_URL"]


@pytest.fixture
def curio(settings):
    """Schema ``curio`` with Curio's tables on the harmony test database, read as a real Curio."""
    conn = connections["harmony"]
    db = CurioDB()
    db.sql("DROP SCHEMA IF EXISTS curio CASCADE")
    db.sql("CREATE SCHEMA curio")
    db.sql("SET search_path TO curio")
    db.sql(SCHEMA_SQL.read_text())
    saved = dict(conn.settings_dict["OPTIONS"])
    conn.close()
    conn.settings_dict["OPTIONS"] = curio_url_options()
    settings.WARDEN = {
        **settings.WARDEN,
        "DEMAND_SOURCE": "curio",
        "CURIO_HEARTBEAT_S": 60,
        "HEARTBEAT_S": 5,
        "STARTUP_GRACE_S": 60,
        "TASK_NAMES": ["PoRep", "UpdateProve", "PSProve"],
    }
    set_override(None)
    forget_probes()
    try:
        yield db
    finally:
        forget_probes()
        conn.close()
        conn.settings_dict["OPTIONS"] = saved
        db.sql("DROP SCHEMA IF EXISTS curio CASCADE")


def instance(name: str, *, status: str = "running", started_s_ago: float = 600) -> Instance:
    """An instance of ours whose worker registers as ``name`` (``CURIO_NODE_NAME``)."""
    now = timezone.now()
    return Instance.objects.create(
        provider="local", external_id=name, worker_name=name, status=status,
        status_since=now - timedelta(seconds=started_s_ago), started_at=now - timedelta(seconds=started_s_ago),
        created_at=now - timedelta(seconds=started_s_ago),
    )


def instances() -> list[Instance]:
    return list(Instance.objects.filter(killed_at__isnull=True))
