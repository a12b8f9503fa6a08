"""Curio's HarmonyDB tables as unmanaged models, read (and, by the demo worker, written) via the ORM.

Source: Curio's own migrations (``harmony/harmonydb/sql``, tables and columns at Curio HEAD 2026-08;
``tests/curio_schema.sql`` holds them as they stand; docs/curio.md says what is read).
The tables live in the database alias ``harmony``; against a real Curio point
HARMONY_DATABASE_URL at its Yugabyte/PostgreSQL with ``?search_path=curio`` (Curio's form; settings
turn it into ``?options=-csearch_path%3Dcurio``). The sealing pipeline tables are read for the
backlog of proofs Curio has not queued yet.
The demo (SQLite by default) creates them with :func:`ensure_schema`.
"""

from django.db import DatabaseError, connections, models, transaction

HARMONY_ALIAS = "harmony"


class HarmonyMachine(models.Model):
    """``harmony_machines``: one row per running Curio node; ``last_contact`` is its heartbeat."""

    last_contact = models.DateTimeField()
    host_and_port = models.CharField(max_length=300)
    cpu = models.IntegerField(default=0)
    ram = models.BigIntegerField(default=0)
    gpu = models.FloatField(default=0)
    unschedulable = models.BooleanField(default=False)
    restart_request = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = "harmony_machines"
        app_label = "fleet"


class HarmonyMachineDetails(models.Model):
    """``harmony_machine_details``: task names (comma-joined) and ``machine_name`` of a node."""

    machine = models.OneToOneField(HarmonyMachine, on_delete=models.CASCADE, db_column="machine_id")
    tasks = models.TextField(default="")
    layers = models.TextField(default="")
    startup_time = models.DateTimeField(null=True)
    miners = models.TextField(default="")
    machine_name = models.TextField(default="")

    class Meta:
        managed = False
        db_table = "harmony_machine_details"
        app_label = "fleet"


class HarmonyTask(models.Model):
    """``harmony_task``: uncompleted work. ``owner_id`` null means queued; done tasks are deleted."""

    name = models.CharField(max_length=16)
    owner = models.ForeignKey(
        HarmonyMachine, null=True, on_delete=models.SET_NULL, db_column="owner_id", db_constraint=False
    )
    posted_time = models.DateTimeField()
    update_time = models.DateTimeField()
    added_by = models.IntegerField(default=0)
    initiated_by = models.IntegerField(null=True)
    previous_task = models.IntegerField(null=True)
    retries = models.BigIntegerField(default=0)

    class Meta:
        managed = False
        db_table = "harmony_task"
        app_label = "fleet"


class HarmonyTaskHistory(models.Model):
    """``harmony_task_history``: one row per finished attempt (``result`` true on success)."""

    task_id = models.IntegerField()
    name = models.CharField(max_length=16)
    posted = models.DateTimeField()
    work_start = models.DateTimeField()
    work_end = models.DateTimeField(db_index=True)
    result = models.BooleanField()
    err = models.CharField(max_length=500, default="")
    completed_by_host_and_port = models.CharField(max_length=300)

    class Meta:
        managed = False
        db_table = "harmony_task_history"
        app_label = "fleet"


class SectorsSnapPipeline(models.Model):
    """``sectors_snap_pipeline`` (Curio migration 20240611-snap-pipeline): one SnapDeals sector.

    Only the columns the demand reader needs: a sector with ``after_encode`` and not
    ``after_prove`` and no ``task_id_prove`` waits for an UpdateProve (docs/curio.md, Demand).
    """

    pk = models.CompositePrimaryKey("sp_id", "sector_number")
    sp_id = models.BigIntegerField()
    sector_number = models.BigIntegerField()
    after_encode = models.BooleanField(default=False)
    task_id_prove = models.BigIntegerField(null=True)
    after_prove = models.BooleanField(default=False)

    class Meta:
        managed = False
        db_table = "sectors_snap_pipeline"
        app_label = "fleet"


class SectorsSdrPipeline(models.Model):
    """``sectors_sdr_pipeline`` (Curio migration 20231217-sdr-pipeline): one sector being sealed.

    A sector whose precommit landed (``after_precommit_msg_success``, ``seed_epoch`` set) with no
    ``task_id_porep``, not ``after_porep`` and not ``failed`` waits for a PoRep (docs/curio.md, Demand;
    approximate: Curio also waits for the chain to pass the seed epoch).
    """

    pk = models.CompositePrimaryKey("sp_id", "sector_number")
    sp_id = models.BigIntegerField()
    sector_number = models.BigIntegerField()
    seed_epoch = models.BigIntegerField(null=True)
    after_precommit_msg_success = models.BooleanField(default=False)
    task_id_porep = models.BigIntegerField(null=True)
    after_porep = models.BooleanField(default=False)
    failed = models.BooleanField(default=False)

    class Meta:
        managed = False
        db_table = "sectors_sdr_pipeline"
        app_label = "fleet"


HARMONY_MODELS = [
    HarmonyMachine,
    HarmonyMachineDetails,
    HarmonyTask,
    HarmonyTaskHistory,
    SectorsSnapPipeline,
    SectorsSdrPipeline,
]


class HarmonyRouter:
    """Send the harmony models to the ``harmony`` alias and nothing else there."""

    def _is_harmony(self, model) -> bool:
        return model in HARMONY_MODELS

    def db_for_read(self, model, **hints):
        return HARMONY_ALIAS if self._is_harmony(model) else None

    db_for_write = db_for_read

    def allow_relation(self, obj1, obj2, **hints):
        if self._is_harmony(type(obj1)) and self._is_harmony(type(obj2)):
            return True
        if self._is_harmony(type(obj1)) or self._is_harmony(type(obj2)):
            return False
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        # Our own tables never go to the harmony database.
        return db != HARMONY_ALIAS


def ensure_schema(alias: str = HARMONY_ALIAS) -> list[str]:
    """Create the HarmonyDB tables the demo needs on ``alias`` if they are missing.

    Returns the names of the tables created. Never touches a table that exists (so it is safe,
    and a no-op, against a real Curio database).
    """
    conn = connections[alias]
    existing = set(conn.introspection.table_names())
    created = []
    with conn.schema_editor() as editor:
        for model in HARMONY_MODELS:
            if model._meta.db_table not in existing:
                editor.create_model(model)
                created.append(model._meta.db_table)
    return created


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error (psycopg's ``sqlstate`` behind Django's wrapper), or None."""
    seen = exc
    while seen is not None:
        code = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if code:
            return code
        seen = seen.__cause__
    return None


def set_unschedulable(machine_name: str, value: bool, alias: str = HARMONY_ALIAS) -> int:
    """Cordon (``True``) or uncordon a Curio node by its ``machine_name``; returns rows changed.

    Curio's cordon bit is ``harmony_machines.unschedulable`` (docs/curio.md): the node finishes
    what it owns and takes no new work. Raises ``fleet.demand.base.DemandError`` naming the grant
    when the database role may not write it (SQLSTATE 42501, e.g. the console's read-only role).
    """
    # inside: fleet.demand's __init__ imports demand.curio, which imports fleet.harmony (a load-order circle)
    from fleet.demand.base import DemandError

    try:
        with transaction.atomic(using=alias):
            ids = list(
                HarmonyMachineDetails.objects.using(alias)
                .filter(machine_name=machine_name)
                .values_list("machine_id", flat=True)
            )
            return HarmonyMachine.objects.using(alias).filter(id__in=ids).update(unschedulable=value)
    except DatabaseError as exc:
        if sqlstate(exc) != "42501":
            raise
        with connections[alias].cursor() as cur:
            cur.execute(
                "SELECT current_user, (SELECT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                "ON n.oid = c.relnamespace WHERE c.oid = to_regclass('harmony_machines'))"
            )
            role, schema = cur.fetchone()
        schema = schema or "curio"
        if "harmony_machine_details" in str(exc):
            need = f"GRANT SELECT ON {schema}.harmony_machine_details TO {role}"
            what = "SELECT on harmony_machine_details (to find the node by name)"
        else:
            need = f"GRANT UPDATE (unschedulable) ON {schema}.harmony_machines TO {role}"
            what = "UPDATE on harmony_machines"
        raise DemandError(
            f"cordon refused by Curio's database: role {role} lacks {what}; grant it ({need}) "
            "or cordon the node in Curio's web UI"
        ) from exc
