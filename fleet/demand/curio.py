# Over 500 lines on purpose: queue, backlog, workers and rates read from one snapshot of Curio's tables.
"""Demand from Curio's HarmonyDB tables (a real Curio, or the local demo queue).

Reads the unmanaged models of ``fleet.harmony`` through the ORM on alias ``harmony``, so the
same code reads the SQLite demo and a real Curio on PostgreSQL or Yugabyte (docs/curio.md).
A constant number of queries whatever the fleet size, one per table so that a table the role
may not read loses only the fields it feeds. Ages (heartbeats, queued tasks, the proof window)
are measured on the database's clock (``now()`` in the same query), never on Warden's.

Before the first read, and again after any failed read, the tables and columns Warden needs are
probed (``information_schema`` on PostgreSQL, Django's introspection on SQLite): a missing column
is reported as a schema problem naming the table, the column and the Curio migration that added
it; a table the role cannot read as a missing grant.
"""

import contextlib
import math
import os
import socket
import statistics
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.db import Error as DbError
from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, Min, Q
from django.db.models.functions import Now
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from fleet.clock import clock
from fleet.demand.base import DemandError, DemandReading, WorkerView, count_workers, in_startup_grace
from fleet.harmony import (
    HARMONY_ALIAS,
    HarmonyMachine,
    HarmonyMachineDetails,
    HarmonyTask,
    HarmonyTaskHistory,
    SectorsSdrPipeline,
    SectorsSnapPipeline,
    sqlstate,
)
from fleet.models import CurioNodeSeen, Instance, ProofCredit, StatusChange

#: a worker is live while its heartbeat is younger than this many heartbeat intervals
#: (docs/curio.md, Workers: 3 missed 60-s heartbeats; Curio itself deletes a row only after 10 min)
LIVE_HEARTBEATS = 3
#: ``proofs_hr`` is the current rate: successful proofs that ended in this window, per hour of it
#: (the dashboard names it: "last 15 min")
RATE_WINDOW = timedelta(minutes=15)
#: ``proof_s`` is the median over the newest successful proofs of this window …
PROOF_WINDOW = timedelta(hours=24)
#: … at most this many of them
PROOF_SAMPLE = 200
#: a read failing with SQLSTATE 40001 (Yugabyte's read restart) is tried this many times
READ_ATTEMPTS = 4

#: the columns Warden reads: table -> {column: Curio migration that added it (None: the table's own)}
NEEDED: dict[str, dict[str, str | None]] = {
    "harmony_machines": {"id": None, "last_contact": None, "host_and_port": None,
                         "unschedulable": "20250111-machine-maintenance"},
    "harmony_machine_details": {"machine_id": None, "tasks": None, "startup_time": None,
                                "machine_name": "20240527-machine_name"},
    "harmony_task": {"id": None, "name": None, "owner_id": None, "posted_time": None},
    "harmony_task_history": {"id": None, "task_id": None, "name": None, "work_start": None, "work_end": None,
                             "result": None, "completed_by_host_and_port": None},
    "sectors_snap_pipeline": {"after_encode": None, "task_id_prove": None, "after_prove": None},
    "sectors_sdr_pipeline": {"after_precommit_msg_success": None, "seed_epoch": None, "task_id_porep": None,
                             "after_porep": None, "failed": None},
}
#: the Curio migration that created each table (harmony/harmonydb/sql/)
TABLE_ADDED = {
    "harmony_machines": "20230719-harmony",
    "harmony_task": "20230719-harmony",
    "harmony_task_history": "20230719-harmony",
    "harmony_machine_details": "20240404-machine_detail",
    "sectors_snap_pipeline": "20240611-snap-pipeline",
    "sectors_sdr_pipeline": "20231217-sdr-pipeline",
}
#: the reading's fields each table feeds; without the first two there is no reading at all
ESSENTIAL = ("harmony_machines", "harmony_task")
FEEDS = {
    "harmony_machine_details": ("workers_live", "workers_dead", "workers_cordoned", "unmatched",
                                "workers_unmatched_live"),
    "harmony_task_history": ("proofs_hr", "proof_s", "proof_s_by_worker", "proof_s_by_gpu"),
    "sectors_snap_pipeline": ("backlog",),
    "sectors_sdr_pipeline": ("backlog", "backlog_not_due"),
}

#: PoRep becomes due this many epochs after the sector's seed epoch: Curio's seal poller creates
#: the PoRep task only once the chain head reaches ``seed_epoch + seedEpochConfidence``
#: (filecoin-project/curio ``tasks/seal/poller.go``: ``seedEpochConfidence = 3``)
SEED_CONFIDENCE = 3
#: a row whose name changed, or whose startup_time changed twice, within this window is changing
#: hands (two nodes behind one host_and_port: Curio's registration upserts by it)
IDENTITY_WINDOW = timedelta(hours=6)

# One row per table: found? (to_regclass on the search_path; else a schema named in the
# search_path holding a table of that name, which a role without USAGE on the schema cannot
# resolve), its schema, USAGE on that schema, its columns (pg_attribute: every column,
# whatever the role may read) and the columns the role may SELECT (table or column privilege).
_PG_PROBE = """
SELECT r.name, c.oid IS NOT NULL, n.nspname,
       COALESCE(has_schema_privilege(n.oid, 'USAGE'), false),
       ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a
             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
       ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a
             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
               AND has_column_privilege(c.oid, a.attnum, 'SELECT')),
       current_user, current_setting('search_path')
FROM unnest(%s::text[]) AS r(name)
LEFT JOIN LATERAL (
    SELECT COALESCE(to_regclass(r.name), (
        SELECT k.oid FROM pg_catalog.pg_class k JOIN pg_catalog.pg_namespace kn ON kn.oid = k.relnamespace
        WHERE k.relname = r.name AND k.relkind IN ('r', 'p', 'v')
          AND kn.nspname = ANY(string_to_array(replace(current_setting('search_path'), ' ', ''), ','))
        LIMIT 1)) AS oid
) found ON true
LEFT JOIN pg_catalog.pg_class c ON c.oid = found.oid
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
"""


@dataclass
class Probe:
    """What the schema probe found: ``problems`` maps a table to one-line problems (empty: all
    well); ``schemas`` where each table was found; the database ``role`` and ``search_path``."""

    problems: dict[str, list[str]] = field(default_factory=dict)
    schemas: dict[str, str] = field(default_factory=dict)
    role: str = ""
    search_path: str = ""


_probes: dict[tuple[str, str], Probe] = {}  # (alias, kind) -> the newest probe


def forget_probes() -> None:
    """Drop the cached schema probes (the next read probes again)."""
    _probes.clear()


def _where(alias: str) -> str:
    cfg = connections[alias].settings_dict
    where = str(cfg.get("NAME", "?"))
    if cfg.get("HOST"):
        where = f"{cfg['HOST']}:{cfg.get('PORT') or ''}/{where}"
    return where


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def harmony_unreadable(exc: Exception, alias: str = HARMONY_ALIAS) -> str:
    """One line for an error reading the demo's queue: the setting and what to do."""
    return (
        f"harmony database unreadable ({_where(alias)}: {_first_line(exc)}); check HARMONY_DATABASE_URL "
        "(for the demo run `python manage.py demo prepare`)"
    )


def curio_unreadable(exc: Exception, alias: str = HARMONY_ALIAS, table: str = "", timed_out: float | None = None) -> str:
    """One line for an error reading a real Curio's database (no demo hints). ``timed_out``: the
    read's deadline (seconds) passed and ended it."""
    what = f"reading {table}" if table else "connecting"
    if timed_out is not None:
        return (f"Curio's database at {_where(alias)} (HARMONY_DATABASE_URL): {what} timed out: no answer within "
                f"{timed_out:g} s (WARDEN_CURIO_READ_DEADLINE_S); a frozen server or network")
    line = f"Curio's database at {_where(alias)} (HARMONY_DATABASE_URL): {what} failed: {_first_line(exc)}"
    if sqlstate(exc) == "40001":
        line += f" (SQLSTATE 40001, a read restart: still failing after {READ_ATTEMPTS} attempts)"
    return line + _timeout_note(exc)


#: SQLSTATEs of the harmony connection's own timeouts, and what each means
_TIMEOUTS = {"57014": "statement_timeout", "55P03": "lock_timeout"}


def _timeout_note(exc: Exception) -> str:
    """What a server-side timeout means ('' for any other error)."""
    kind = _TIMEOUTS.get(sqlstate(exc) or "")
    if kind == "lock_timeout":
        return (f" (SQLSTATE 55P03: a lock held longer than lock_timeout "
                f"{settings.WARDEN['CURIO_LOCK_TIMEOUT_S']:g} s, e.g. a Curio migration's ALTER TABLE)")
    if kind == "statement_timeout":
        return f" (SQLSTATE 57014: longer than statement_timeout {settings.WARDEN['CURIO_STATEMENT_TIMEOUT_S']:g} s)"
    return ""


@contextlib.contextmanager
def read_deadline(alias: str, seconds: float):
    """Bound a read on ``alias`` to ``seconds`` of wall clock, whatever the server or network does.

    The server-side ``statement_timeout`` and ``lock_timeout`` (set on the connection by
    ``console.settings.harmony_timeouts``) and the TCP keepalives end most stuck reads; a frozen
    backend or a proxy that stops forwarding answers neither. When the deadline passes, a timer
    thread shuts the connection's socket down (the blocked call then fails at once) and the
    yielded event is set; the connection is closed afterwards so the next read connects afresh.
    PostgreSQL only (SQLite, the demo queue, is a local file)."""
    wrapper = connections[alias]
    fired = threading.Event()

    def fire():
        fired.set()
        raw = wrapper.connection
        if raw is None or wrapper.vendor != "postgresql":
            return
        try:
            dup = socket.socket(fileno=os.dup(raw.fileno()))
        except (OSError, ValueError, AttributeError):
            return
        try:
            dup.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            dup.close()

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield fired
    finally:
        timer.cancel()
        if fired.is_set():
            with contextlib.suppress(Exception):
                wrapper.close()


def _is_read_restart(exc: BaseException) -> bool:
    return isinstance(exc, DatabaseError) and sqlstate(exc) == "40001"


def _age(column: str) -> ExpressionWrapper:
    """``now() - column`` on the database's clock."""
    return ExpressionWrapper(Now() - F(column), output_field=DurationField())


#: at most this many new proofs are credited per read (the rest on the next)
CREDIT_BATCH = 5000
#: history ids this far below the newest credited one are looked at again (a row committed late)
CREDIT_LOOKBACK = 200
#: the newest launches whose loading time is measured
LOADING_SAMPLE = 20


def chain_epoch(unix_s: float) -> int:
    """The Filecoin chain head epoch at ``unix_s`` (seconds): ``floor((t - genesis) / epoch)``
    with ``WARDEN["CURIO_GENESIS_UNIX"]`` (mainnet 1598306400 by default) and
    ``WARDEN["CURIO_EPOCH_S"]`` (30). Filecoin produces one tipset per epoch at genesis + n × 30 s."""
    w = settings.WARDEN
    return math.floor((unix_s - w["CURIO_GENESIS_UNIX"]) / w["CURIO_EPOCH_S"])


def epoch_time(epoch: int) -> datetime:
    """When ``epoch`` begins (aware UTC): genesis + epoch × epoch length."""
    w = settings.WARDEN
    return datetime.fromtimestamp(w["CURIO_GENESIS_UNIX"] + epoch * w["CURIO_EPOCH_S"], UTC)


#: node clock offsets are estimated from the credits of this long
OFFSET_WINDOW = timedelta(hours=24)
#: offsets beyond this are not corrected (a clock that wrong is a node to fix, not to model)
OFFSET_LIMIT_S = 3600.0


def node_clock_offsets() -> dict[str, float]:
    """Each node's clock offset, seconds (node minus database), by ``host_and_port``, from the
    proofs credited over ``OFFSET_WINDOW`` (``fleet.models.ProofCredit``).

    A proof credited at read ``seen_at`` and not yet at the read before (``seen_after``) ended, on
    the database's clock, between the two, so the node's offset lies in ``[work_end - seen_at,
    work_end - seen_after)``; the intersection over its proofs narrows as proofs end at different
    moments between reads. A node whose intersection holds 0 is taken as right (0); otherwise the
    bound nearest 0 is its offset (the least correction the evidence demands). One aggregate query
    on Warden's database."""
    since = clock.now() - OFFSET_WINDOW
    rows = (ProofCredit.objects.filter(seen_at__gte=since, work_end__isnull=False).exclude(host_and_port="")
            .values("host_and_port")
            .annotate(lo=Max(ExpressionWrapper(F("work_end") - F("seen_at"), output_field=DurationField())),
                      hi=Min(ExpressionWrapper(F("work_end") - F("seen_after"), output_field=DurationField())))
            .order_by())
    out = {}
    for r in rows:
        lo = r["lo"].total_seconds() if r["lo"] is not None else None
        hi = r["hi"].total_seconds() if r["hi"] is not None else None
        offset = 0.0
        if lo is not None and lo > 0:
            offset = lo
        elif hi is not None and hi < 0:
            offset = hi
        if offset and abs(offset) <= OFFSET_LIMIT_S:
            out[r["host_and_port"]] = offset
    return out


def measured_loading_s() -> float:
    """Seconds from a launch to a live worker: the median, over the ``LOADING_SAMPLE`` newest
    instances that reached ``running`` (not adopted ones), of ``created_at`` to their first
    ``running`` status change (``fleet.models.StatusChange``), plus the startup grace a worker has
    to heartbeat (``WARDEN["STARTUP_GRACE_S"]``). Until one has been measured:
    ``WARDEN["CURIO_LOADING_S"]``. One query on Warden's database."""
    rows = list(
        StatusChange.objects.filter(status="running", instance__adopted_at__isnull=True)
        .values("instance_id", "instance__created_at").annotate(first=Min("at")).order_by("-first")[:LOADING_SAMPLE]
    )
    spans = [max(0.0, (r["first"] - r["instance__created_at"]).total_seconds()) for r in rows]
    if not spans:
        return float(settings.WARDEN["CURIO_LOADING_S"])
    return statistics.median(spans) + settings.WARDEN["STARTUP_GRACE_S"]


class HarmonyDemandSource:
    """Reads demand from HarmonyDB on database alias ``using`` (default ``harmony``).

    ``kind``: ``curio`` (a real Curio: workers heartbeat every ``WARDEN["CURIO_HEARTBEAT_S"]``,
    default 60 s, docs/curio.md) or ``local`` (the demo's workers: ``WARDEN["HEARTBEAT_S"]``).

    Definitions (docs/curio.md, Workers and Demand; docs/safety.md invariant 1):

    - a machine is live when ``now() - last_contact`` (database clock) is at most
      ``LIVE_HEARTBEATS`` heartbeats of the source;
    - ``queued``: proving tasks (``WARDEN["TASK_NAMES"]``) with no owner, plus those owned by a
      machine that is not live (Curio has not requeued them yet: they are still demand);
    - ``running``: proving tasks owned by a live machine;
    - ``backlog``: sectors waiting for UpdateProve in ``sectors_snap_pipeline`` (encoded, not
      proved, no prove task) when UpdateProve is a task name, plus sectors waiting for PoRep in
      ``sectors_sdr_pipeline`` (precommit landed, seed epoch set, no PoRep task, not proved, not
      failed) when PoRep is — work Curio has not queued because no node that runs it is alive;
    - ``workers_expected``: instances with status ``running`` whose worker heartbeats, or that
      started more than ``WARDEN["STARTUP_GRACE_S"]`` ago (``started_at``, else ``status_since``):
      the grace only excuses a worker that is not heartbeating yet;
    - ``workers_starting``: running instances inside the grace whose worker is not live yet;
    - instances map to rows by ``machine_name`` (``CURIO_NODE_NAME``), never ``host_and_port``;
    - ``workers_live``: expected instances whose row is live and not cordoned;
      ``workers_cordoned``: live and ``unschedulable`` (draining, not dead);
    - ``unmatched``: proving-capable rows (their ``tasks`` name a proving task, or no details
      row yet) whose ``machine_name`` is empty or names none of ``instances``. An expected
      instance without a row of its own may be one of the live *unnamed* rows: up to that many
      of them stand in for such instances — a cordoned one counts as cordoned, the others keep
      the instance out of ``workers_dead`` (they are never folded into "dead");
    - ``workers_dead``: the rest of the expected — stale heartbeat or no row at all;
    - ``workers`` has a :class:`WorkerView` for every named row (the newest per name) and one with
      ``live=False`` for every expected instance without a row; while live unnamed rows own tasks,
      each instance without a row is shown owning them (it may be one of those rows), so no stop
      or destroy of it passes ``owned_tasks`` without an operator;
    - ``proofs_hr``: the current rate — successful history rows of proving tasks with ``work_end``
      in the last ``RATE_WINDOW`` (15 min), per hour of the time they cover: from the earliest
      ``work_start`` among them (or the window's start, if later) to now. Proving that began 3
      minutes ago at 360/hr reads 360, not the 18 a trailing-hour count would say (docs/curio.md, Proof rates);
      ``rate_window_s`` names the window;
      ``proof_s``: median ``work_end - work_start`` of the newest ``PROOF_SAMPLE`` successful ones
      within ``PROOF_WINDOW`` (None when there are none), seconds per proof per worker;
    - ``oldest_queued_s``: age of the oldest queued task, seconds (None when none is queued).

    ``read`` raises :class:`DemandError` (one line) when ``harmony_machines`` or ``harmony_task``
    cannot be read — the connection, the schema, the grant, or a read restart after
    ``READ_ATTEMPTS`` tries; ``fleet.demand.read_demand`` turns that into ``state="unknown"``.
    Any other table that cannot be read leaves only its fields None, named in ``unreadable``.
    """

    def __init__(self, using: str = HARMONY_ALIAS, kind: str = "local"):
        self.using = using
        self.kind = kind

    # -- the window ---------------------------------------------------------------------------
    def heartbeat_s(self) -> float:
        """The source's heartbeat interval, seconds."""
        key = "CURIO_HEARTBEAT_S" if self.kind == "curio" else "HEARTBEAT_S"
        return float(settings.WARDEN[key])

    def live_window(self) -> timedelta:
        """How old a heartbeat may be for its worker to be live."""
        return timedelta(seconds=LIVE_HEARTBEATS * self.heartbeat_s())

    # -- the probe ----------------------------------------------------------------------------
    def probe(self, force: bool = False) -> Probe:
        """The tables and columns Warden needs, checked; cached until a read fails or a problem shows."""
        cached = _probes.get((self.using, self.kind))
        if cached is not None and not cached.problems and not force:
            return cached
        try:
            found = self._retrying(self._probe_once)
        except DbError as exc:
            raise DemandError(self._unreadable(exc)) from exc
        _probes[(self.using, self.kind)] = found
        return found

    def _probe_once(self) -> Probe:
        conn = connections[self.using]
        if conn.vendor == "postgresql":
            with conn.cursor() as cur:
                cur.execute(_PG_PROBE, [list(NEEDED)])
                rows = cur.fetchall()
            found = Probe(role=rows[0][6], search_path=rows[0][7])
            tables = {r[0]: r for r in rows}
        else:
            found = Probe(role="", search_path="")
            existing = set(conn.introspection.table_names())
            tables = {}
            with conn.cursor() as cur:
                for t in NEEDED:
                    cols = [c.name for c in conn.introspection.get_table_description(cur, t)] if t in existing else []
                    tables[t] = (t, t in existing, "main", True, cols, cols)
        for table, cols_needed in NEEDED.items():
            _, exists, schema, usage, columns, readable = tables[table][:6]
            if not exists:
                found.problems[table] = [self._missing_table(table, found)]
                continue
            found.schemas[table] = schema
            role = found.role
            if not usage:
                found.problems[table] = [
                    f"grant: role {role} lacks USAGE on schema {schema}, which holds {table} "
                    f"(GRANT USAGE ON SCHEMA {schema} TO {role})"
                ]
                continue
            missing = [c for c in cols_needed if c not in set(columns)]
            if missing:
                found.problems[table] = [self._missing_column(table, schema, c, cols_needed[c]) for c in missing]
                continue
            # column-level SELECT is enough (has_table_privilege is false then): check each column
            refused = [c for c in cols_needed if c not in set(readable)]
            if refused:
                fq = f"{schema}.{table}"
                found.problems[table] = [
                    f"grant: role {role} may not read {fq} column(s) {', '.join(refused)} "
                    f"(GRANT SELECT ({', '.join(refused)}) ON {fq} TO {role}; or GRANT SELECT ON {fq} TO {role})"
                ]
        return found

    def _missing_table(self, table: str, found: Probe) -> str:
        if self.kind != "curio":
            return f"schema: the demo queue has no table {table}; run `python manage.py demo prepare`"
        where = f" on search_path {found.search_path!r}" if found.search_path else ""
        line = f"schema: no table {table}{where} (Curio migration {TABLE_ADDED[table]} creates it"
        if table in ESSENTIAL or table == "harmony_machine_details":
            return line + "); Curio keeps its tables in schema curio: end HARMONY_DATABASE_URL with " \
                "?search_path=curio or ?options=-csearch_path%3Dcurio"
        return line + "; a newer Curio)"

    def _missing_column(self, table: str, schema: str, column: str, migration: str | None) -> str:
        if self.kind != "curio":
            return f"schema: the demo queue's {table} has no column {column}; run `python manage.py demo prepare`"
        fq = f"{schema}.{table}"
        added = f"added by Curio migration {migration}: upgrade Curio" if migration else "Warden expects a newer Curio"
        return f"schema: {fq} has no column {column} ({added})"

    # -- reads --------------------------------------------------------------------------------
    def _retrying(self, fn):
        retrying = Retrying(
            stop=stop_after_attempt(READ_ATTEMPTS),
            wait=wait_exponential(multiplier=0.05, max=1),
            retry=retry_if_exception(_is_read_restart),
            reraise=True,
        )
        return retrying(fn)

    def _unreadable(self, exc: Exception, table: str = "") -> str:
        fired = getattr(self, "_deadline", None)
        timed_out = settings.WARDEN["CURIO_READ_DEADLINE_S"] if fired is not None and fired.is_set() else None
        if self.kind == "curio":
            return curio_unreadable(exc, self.using, table, timed_out)
        if timed_out is not None:
            return f"harmony database unreadable ({_where(self.using)}: no answer within {timed_out:g} s); check HARMONY_DATABASE_URL"
        return harmony_unreadable(exc, self.using) + _timeout_note(exc)

    def _fetch(self, table: str, fn, probe: Probe, unreadable: dict[str, str]):
        """``fn()`` (in a savepoint, retried on read restarts), or None with the table's fields
        marked unreadable; raises :class:`DemandError` for an essential table."""
        problems = probe.problems.get(table)
        if not problems:
            def attempt():
                if not connections[self.using].in_atomic_block:
                    return fn()  # autocommit: a failed statement poisons nothing
                with transaction.atomic(using=self.using):  # a savepoint keeps the caller's transaction usable
                    return fn()
            try:
                return self._retrying(attempt)
            except DbError as exc:
                fired = getattr(self, "_deadline", None)
                if fired is not None and fired.is_set():  # the connection is gone: no probe, no more reads
                    raise DemandError(self._unreadable(exc, table)) from exc
                try:
                    problems = self.probe(force=True).problems.get(table) or [self._unreadable(exc, table)]
                except DemandError:  # the probe failed too (the server went away): say what failed first
                    raise DemandError(self._unreadable(exc, table)) from exc
        why = "; ".join(problems)
        if table in ESSENTIAL:
            raise DemandError(why)
        for name in FEEDS[table]:
            unreadable[name] = f"{unreadable[name]}; {why}" if name in unreadable else why
        return None

    def read(self, instances) -> DemandReading:
        """Read demand for our non-killed ``instances`` (``fleet.models.Instance`` rows), within
        ``WARDEN["CURIO_READ_DEADLINE_S"]`` (:func:`read_deadline`): a read that does not finish
        in time raises :class:`DemandError` saying so."""
        with read_deadline(self.using, settings.WARDEN["CURIO_READ_DEADLINE_S"]) as fired:
            self._deadline, self._now = fired, None
            try:
                return self._read(instances)
            except DbError as exc:  # a failure outside the per-table reads
                raise DemandError(self._unreadable(exc)) from exc
            finally:
                self._deadline = None

    def _read(self, instances) -> DemandReading:
        warden = settings.WARDEN
        names = list(warden["TASK_NAMES"])
        window = self.live_window()
        u = self.using
        probe = self.probe()
        unreadable: dict[str, str] = {}

        machines = self._fetch("harmony_machines", lambda: list(
            HarmonyMachine.objects.using(u).annotate(age=_age("last_contact"))
            .values("id", "host_and_port", "unschedulable", "last_contact", "age").order_by("id")
        ), probe, unreadable)
        task_groups = self._fetch("harmony_task", lambda: list(
            HarmonyTask.objects.using(u).values("owner_id", "name")
            .annotate(n=Count("id"), oldest=Max(_age("posted_time"))).order_by()
        ), probe, unreadable)
        details = self._fetch("harmony_machine_details", lambda: list(
            HarmonyMachineDetails.objects.using(u).values("machine_id", "machine_name", "tasks", "startup_time")
        ), probe, unreadable)
        history = self._fetch("harmony_task_history", lambda: self._history(names), probe, unreadable)
        backlog_parts = []
        if "UpdateProve" in names:
            backlog_parts.append(self._fetch("sectors_snap_pipeline", lambda: SectorsSnapPipeline.objects.using(u).filter(
                after_encode=True, after_prove=False, task_id_prove__isnull=True).count(), probe, unreadable))
        sdr = None
        loading = None
        if "PoRep" in names:
            loading = measured_loading_s()
            sdr = self._fetch("sectors_sdr_pipeline", lambda: self._sdr_backlog(loading), probe, unreadable)
            backlog_parts.append(None if sdr is None else sdr["due"] + sdr["soon"])
        backlog = None if None in backlog_parts else sum(backlog_parts)

        live_ids = {m["id"] for m in machines if m["age"] <= window}
        owned: dict[int, int] = {}
        queued = running = 0
        oldest = None
        for g in task_groups:
            owner = g["owner_id"]
            if owner is not None:
                owned[owner] = owned.get(owner, 0) + g["n"]
            if g["name"] not in names:
                continue
            if owner is not None and owner in live_ids:
                running += g["n"]
            else:
                queued += g["n"]
                if g["oldest"] is not None and (oldest is None or g["oldest"] > oldest):
                    oldest = g["oldest"]

        hosts: dict[str, list[int]] = {}
        for m in machines:
            hosts.setdefault(m["host_and_port"] or "", []).append(m["id"])
        shared = {hp: ids for hp, ids in hosts.items() if len(ids) > 1}

        counts = self._workers(instances, machines, details, live_ids, owned, names)
        proofs_hr = proof_s = by_worker = by_gpu = None
        if history is not None:
            proofs_hr, proof_s, spans = history[:3]
            by_worker, by_gpu = _per_worker(spans, machines, details, shared, instances)
        new_proofs = []
        if history is not None:
            new_proofs = _name_proofs(history[3], machines, details, shared)
        return DemandReading(
            state="ok",
            queued=queued,
            running=running,
            backlog=backlog,
            backlog_not_due=None if sdr is None else sdr["soon"] + sdr["later"],
            backlog_soon=None if sdr is None else sdr["soon"],
            backlog_next_due_at=None if sdr is None else sdr["next_due_at"],
            chain_epoch=None if sdr is None else sdr["epoch"],
            loading_s=loading,
            new_proofs=new_proofs,
            history_at=history[4] if history is not None else None,
            proofs_hr=proofs_hr,
            proof_s=proof_s,
            proof_s_by_worker=by_worker,
            proof_s_by_gpu=by_gpu,
            rate_window_s=RATE_WINDOW.total_seconds(),
            oldest_queued_s=oldest.total_seconds() if oldest is not None else None,
            taken_at=clock.now(),
            shared_hosts=shared,
            unreadable=unreadable,
            error="; ".join(dict.fromkeys(unreadable.values())),
            **counts,
        )

    def _history(self, names: list[str]) -> tuple[float, float | None, list[tuple[str, float]], list[dict], datetime]:
        """(current proofs per hour over ``RATE_WINDOW``, median seconds per proof or None, the
        ``(completed_by_host_and_port, seconds)`` of each proof in the sample, the successful proofs
        recorded after the newest one Warden has credited, and the database's now).

        The rate's window is on the database's clock: ``work_start``/``work_end`` are written on
        each node's clock, so each node's proofs are shifted by its clock offset
        (:func:`node_clock_offsets`, from the credits of earlier reads) before they are windowed.
        Without an estimate (a node never seen before) the node's clock is taken as right."""
        now = self._db_now()
        ok = HarmonyTaskHistory.objects.using(self.using).filter(result=True, name__in=names)
        offsets = node_clock_offsets()
        slack = max([abs(o) for o in offsets.values()] + [0.0])
        rows = list(ok.filter(work_end__gte=Now() - RATE_WINDOW - timedelta(seconds=slack),
                              work_end__lte=Now() + timedelta(seconds=slack))
                    .values_list("completed_by_host_and_port", "work_start", "work_end")[:CREDIT_BATCH])
        start_of_window = now - RATE_WINDOW
        n, oldest = 0, None
        for hp, start, end in rows:
            shift = timedelta(seconds=offsets.get(hp or "", 0.0))
            end, start = end - shift, start - shift
            if not start_of_window <= end <= now:
                continue
            n += 1
            oldest = start if oldest is None or start < oldest else oldest
        rate = 0.0
        if n:
            covered = min(RATE_WINDOW, now - oldest if oldest is not None else RATE_WINDOW).total_seconds()
            rate = n * 3600.0 / max(1.0, covered)
        spans = list(
            ok.filter(work_end__gte=Now() - PROOF_WINDOW, work_end__lte=Now() + timedelta(seconds=slack))
            .annotate(span=ExpressionWrapper(F("work_end") - F("work_start"), output_field=DurationField()))
            .order_by("-work_end")
            .values_list("completed_by_host_and_port", "span")[:PROOF_SAMPLE]
        )
        spans = [(hp or "", s.total_seconds()) for hp, s in spans if s is not None and s.total_seconds() > 0]
        seconds = [x for _, x in spans]
        return round(rate, 1), (statistics.median(seconds) if seconds else None), spans, self._new_proofs(names, now), now

    def _new_proofs(self, names: list[str], now: datetime | None = None) -> list[dict]:
        """Successful proofs with a history ``id`` above the newest credited one (the first read:
        those of the last ``PROOF_WINDOW``), oldest first, at most ``CREDIT_BATCH``; each with
        ``seen_at`` = ``now`` (the database's clock; read here when not given). History ids are
        assigned by the database in insertion order, so no node's clock decides which rows are new."""
        now = now or self._db_now()
        last = ProofCredit.objects.aggregate(m=Max("history_id"))["m"]
        rows = HarmonyTaskHistory.objects.using(self.using).filter(result=True, name__in=names)
        # ids are taken at insert but committed in any order across nodes: look back a little (the
        # same queries whether or not anything was credited yet: the count does not depend on it)
        floor = (last if last is not None else 0) - CREDIT_LOOKBACK
        done = set(ProofCredit.objects.filter(history_id__gt=floor).values_list("history_id", flat=True))
        rows = rows.filter(id__gt=floor) if last is not None else rows.filter(work_end__gte=Now() - PROOF_WINDOW)
        return [
            {"history_id": r["id"], "task_id": r["task_id"], "name": r["name"],
             "host_and_port": r["completed_by_host_and_port"] or "", "work_start": r["work_start"],
             "work_end": r["work_end"], "seen_at": now}
            for r in rows.order_by("id").values(
                "id", "task_id", "name", "completed_by_host_and_port", "work_start", "work_end")[:CREDIT_BATCH + len(done)]
            if r["id"] not in done
        ][:CREDIT_BATCH]

    def _db_now(self) -> datetime:
        """The database's clock (``CURRENT_TIMESTAMP``), aware UTC; read once per read."""
        cached = getattr(self, "_now", None)
        if cached is not None and getattr(self, "_deadline", None) is not None:
            return cached
        with connections[self.using].cursor() as cur:
            cur.execute("SELECT CURRENT_TIMESTAMP")
            value = cur.fetchone()[0]
        if isinstance(value, str):  # SQLite: 'YYYY-MM-DD HH:MM:SS' in UTC
            value = datetime.fromisoformat(value)
        self._now = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return self._now

    def _sdr_backlog(self, loading_s: float) -> dict:
        """Sectors waiting for PoRep in ``sectors_sdr_pipeline`` (precommit landed, seed epoch set,
        no PoRep task, not proved, not failed), split by when Curio will queue their PoRep: at chain
        head ``seed_epoch + SEED_CONFIDENCE`` (Curio ``tasks/seal/poller.go``). The head is
        :func:`chain_epoch` of the database's clock. Returns ``{"due": provable now, "soon": due
        within ``loading_s`` seconds, "later": due after that, "next_due_at": when the first
        not-yet-due one becomes due (aware UTC) or None, "epoch": the head}``."""
        now = self._db_now().timestamp()
        head = chain_epoch(now)
        due_max = head - SEED_CONFIDENCE
        soon_max = chain_epoch(now + loading_s) - SEED_CONFIDENCE
        agg = SectorsSdrPipeline.objects.using(self.using).filter(
            after_precommit_msg_success=True, seed_epoch__isnull=False, task_id_porep__isnull=True,
            after_porep=False, failed=False,
        ).aggregate(
            due=Count("seed_epoch", filter=Q(seed_epoch__lte=due_max)),
            soon=Count("seed_epoch", filter=Q(seed_epoch__gt=due_max, seed_epoch__lte=soon_max)),
            later=Count("seed_epoch", filter=Q(seed_epoch__gt=soon_max)),
            first=Min("seed_epoch", filter=Q(seed_epoch__gt=due_max)),
        )
        first = agg["first"]
        return {"due": agg["due"], "soon": agg["soon"], "later": agg["later"], "epoch": head,
                "next_due_at": None if first is None else epoch_time(first + SEED_CONFIDENCE)}

    def _workers(self, instances, machines, details, live_ids, owned, names) -> dict:
        """The worker fields of the reading (see the class docstring)."""
        grace = timedelta(seconds=settings.WARDEN["STARTUP_GRACE_S"])
        now = clock.now()

        def in_grace(inst) -> bool:
            return in_startup_grace(inst, now, grace)

        if details is None:  # names unknown: no instance can be matched to a row
            c = count_workers(instances, {}, now=now)
            return {"workers_expected": c.expected, "workers_live": None, "workers_dead": None,
                    "workers_cordoned": None, "workers_starting": c.starting, "workers": {}, "unmatched": None}

        detail_of = {d["machine_id"]: d for d in details}
        workers: dict[str, WorkerView] = {}
        for m in sorted(machines, key=lambda m: m["age"], reverse=True):  # newest row per name wins
            name = (detail_of.get(m["id"]) or {}).get("machine_name")
            if not name:
                continue
            workers[name] = WorkerView(
                name=name,
                live=m["id"] in live_ids,
                unschedulable=bool(m["unschedulable"]),
                owned_tasks=owned.get(m["id"], 0),
                machine_id=m["id"],
                last_contact=m["last_contact"],
            )

        ours = {i.worker_name or i.external_id for i in instances if getattr(i, "killed_at", None) is None}
        wanted = set(names)
        unmatched = []
        for m in machines:
            d = detail_of.get(m["id"])
            name = (d or {}).get("machine_name") or ""
            if name in ours:
                continue
            if d is not None and not wanted & {t.strip() for t in (d.get("tasks") or "").split(",")}:
                continue  # a node that runs no proving task is not a worker of ours
            unmatched.append({
                "machine_id": m["id"],
                "host_and_port": m["host_and_port"] or "",
                "name": name,
                "live": m["id"] in live_ids,
                "cordoned": bool(m["unschedulable"]),
                "owned_tasks": owned.get(m["id"], 0),
            })

        # a destroyed instance's row stays in harmony_machines until Curio prunes it (cordoned,
        # then stale): it is history, not an unknown node to name with CURIO_NODE_NAME
        named = {x["name"] for x in unmatched if x["name"]}
        if named:
            gone = destroyed_worker_names(named) - ours
            unmatched = [x for x in unmatched if x["name"] not in gone]

        # instances we want running whose name is on no row: a node may be working under another's row
        rowless = {i.worker_name or i.external_id for i in instances
                   if getattr(i, "killed_at", None) is None and (getattr(i, "intended_status", "") or "running") == "running"
                   and not in_grace(i) and (i.worker_name or i.external_id) not in workers}
        doubts = _identity_doubts(machines, detail_of, ours, rowless)
        # the one count (fleet.demand.base.count_workers); a row-less expected worker whose node
        # identity is in doubt has unknown liveness, not dead
        c = count_workers(instances, workers, now=now)
        expected, live, cordoned, starting = c.expected, c.live, c.cordoned, c.starting
        doubted = 0
        for name in c.rowless:
            if name in doubts:
                workers[name].identity = doubts[name]["why"]
                doubted += 1  # liveness unknown: another node may be working under its row
        norow = len(c.rowless) - doubted
        for name, d in doubts.items():  # the row's owner too, and one the provider shows exited: in doubt
            workers.setdefault(name, WorkerView(name=name, live=False, identity=d["why"])).identity = d["why"]
        # an instance without a row of its own may be an unnamed live row (CURIO_NODE_NAME unset)
        stand_ins = sorted(
            (x for x in unmatched if not x["name"] and x["live"]), key=lambda x: (not x["cordoned"], x["machine_id"])
        )[:norow]
        cordoned += sum(1 for x in stand_ins if x["cordoned"])
        unnamed_live = sum(1 for x in stand_ins if not x["cordoned"])
        # every live unnamed proving row is a worker proving our queue: live, and capacity
        unmatched_live = sum(1 for x in unmatched if not x["name"] and x["live"] and not x["cordoned"])
        # which instance an unnamed row is cannot be known: each row-less instance may own its tasks
        maybe_owned = sum(x["owned_tasks"] for x in unmatched if not x["name"] and x["live"])
        if maybe_owned:
            for inst in instances:
                view = workers.get(inst.worker_name or inst.external_id)
                if view is not None and view.machine_id is None:
                    view.owned_tasks = maybe_owned
        return {
            "workers_expected": expected,
            "workers_live": live + unmatched_live,
            "workers_unmatched_live": unmatched_live,
            "workers_cordoned": cordoned,
            "workers_dead": expected - live - cordoned - unnamed_live - doubted,
            "workers_starting": starting,
            "workers": workers,
            "unmatched": unmatched,
            "node_identity": [{"instance": n, **d} for n, d in sorted(doubts.items())],
        }


def _identity_doubts(machines, detail_of: dict, ours: set[str], rowless: set[str]) -> dict[str, dict]:
    """Our instances whose Curio node cannot be told apart from another's: ``{worker name:
    {"machine_id", "why"}}``.

    Curio's registration updates whatever ``harmony_machines`` row has the node's ``host_and_port``
    and inserts only when none does (filecoin-project/curio ``harmony/resources/resources.go``,
    ``Register``), then writes the details row with its name and ``startup_time``. Two nodes
    behind one address (a Docker bridge address such as 172.17.0.2:12300) therefore share one row,
    which carries the name of whichever started last. Seen from here: an expected instance with no
    row (``rowless``) while a row's name has changed, or its ``startup_time`` changed twice, within
    ``IDENTITY_WINDOW`` — or while a row once named after it now carries another name. Both that
    instance and the one the row is named after are in doubt. The rows' names and startup times
    are kept in ``fleet.models.CurioNodeSeen`` (updated here, one read and at most two bulk writes
    on Warden's database)."""
    now = clock.now()
    seen = {r.machine_id: r for r in CurioNodeSeen.objects.filter(machine_id__in=[m["id"] for m in machines])}
    new, changed = [], []
    for m in machines:
        d = detail_of.get(m["id"])
        if d is None:
            continue
        name, started = d.get("machine_name") or "", d.get("startup_time")
        row = seen.get(m["id"])
        if row is None:
            row = CurioNodeSeen(machine_id=m["id"], host_and_port=m["host_and_port"] or "", machine_name=name,
                                startup_time=started, names=[name] if name else [], first_seen=now, startups=[])
            seen[m["id"]] = row
            new.append(row)
            continue
        if row.machine_name != name or row.startup_time != started:
            if row.machine_name != name:
                row.name_changed_at = now
                if name and name not in row.names:
                    row.names = [*row.names, name][-20:]
            if row.startup_time != started:
                row.startups = [t for t in [*row.startups, now.isoformat()][-10:]]
            row.machine_name, row.startup_time, row.host_and_port = name, started, m["host_and_port"] or ""
            changed.append(row)
    if new:
        CurioNodeSeen.objects.bulk_create(new, ignore_conflicts=True)
    if changed:
        CurioNodeSeen.objects.bulk_update(changed, ["machine_name", "startup_time", "host_and_port", "names",
                                                    "name_changed_at", "startups"])
    if not rowless:
        return {}
    since = now - IDENTITY_WINDOW
    doubts: dict[str, dict] = {}
    for row in seen.values():
        if row.machine_id not in detail_of:
            continue
        host = row.host_and_port or "no host:port"
        starts = [t for t in row.startups if datetime.fromisoformat(t) >= since]
        hands = (row.name_changed_at is not None and row.name_changed_at >= since) or len(starts) >= 2
        formerly = [n for n in row.names if n != row.machine_name and n in rowless]
        if not (hands or formerly):
            continue
        what = (f"Curio row {row.machine_id} ({host}) was named {', '.join(formerly)} and now carries "
                f"{row.machine_name or 'no name'}" if formerly else
                f"Curio row {row.machine_id} ({host}) keeps changing hands (now {row.machine_name or 'no name'}, "
                f"{len(starts)} restarts in {IDENTITY_WINDOW.total_seconds() / 3600:g} h)")
        why = f"{what}: two nodes may share it behind one host_and_port; give each node a unique listen address"
        for n in (formerly or sorted(rowless)):
            doubts.setdefault(n, {"machine_id": row.machine_id, "why": why})
        if row.machine_name in ours:
            doubts.setdefault(row.machine_name, {"machine_id": row.machine_id, "why": why})
    return doubts


def _name_proofs(proofs: list[dict], machines, details, shared) -> list[dict]:
    """``proofs`` (``_new_proofs``) with ``worker``: the ``machine_name`` of the one row with their
    ``completed_by_host_and_port`` ('' when no row, several rows or no name has it: Curio's history
    names the node's address, not the node) and ``seconds``."""
    name_of_id = {d["machine_id"]: d.get("machine_name") or "" for d in (details or [])}
    name_of_host = {}
    for m in machines:
        hp = m["host_and_port"] or ""
        if hp and hp not in shared and name_of_id.get(m["id"]):
            name_of_host[hp] = name_of_id[m["id"]]
    out = []
    for p in proofs:
        span = (p["work_end"] - p["work_start"]).total_seconds() if p["work_end"] and p["work_start"] else None
        out.append({**p, "worker": name_of_host.get(p["host_and_port"], ""), "seconds": span})
    return out


def _per_worker(spans, machines, details, shared, instances) -> tuple[dict | None, dict | None]:
    """Median seconds per proof per worker name and per GPU model (``gpu_name`` of our instance
    with that worker name) from the sampled proofs' ``completed_by_host_and_port`` (Curio's
    history names the host, not the machine). A proof is attributed to a worker only when exactly
    one machine row has its ``host_and_port`` and that row has a ``machine_name``; proofs of
    shared or unknown hosts count in the fleet median only. (None, None) when details are unknown."""
    if details is None:
        return None, None
    name_of_id = {d["machine_id"]: d.get("machine_name") or "" for d in details}
    name_of_host = {}
    for m in machines:
        hp = m["host_and_port"] or ""
        if hp and hp not in shared and name_of_id.get(m["id"]):
            name_of_host[hp] = name_of_id[m["id"]]
    gpu_of = {i.worker_name or i.external_id: i.gpu_name for i in instances if getattr(i, "gpu_name", "")}
    per_worker: dict[str, list[float]] = {}
    per_gpu: dict[str, list[float]] = {}
    for hp, seconds in spans:
        name = name_of_host.get(hp)
        if not name:
            continue
        per_worker.setdefault(name, []).append(seconds)
        if gpu_of.get(name):
            per_gpu.setdefault(gpu_of[name], []).append(seconds)
    return ({k: statistics.median(v) for k, v in sorted(per_worker.items())},
            {k: statistics.median(v) for k, v in sorted(per_gpu.items())})


def destroyed_worker_names(names: set[str]) -> set[str]:
    """Which of ``names`` (Curio ``machine_name`` values) name the worker of an instance we
    destroyed (``Instance.killed_at`` set; matched by ``worker_name``, else ``external_id``, as
    live instances are). One query on Warden's database."""
    rows = Instance.objects.filter(killed_at__isnull=False).filter(
        Q(worker_name__in=names) | Q(worker_name="", external_id__in=names)
    ).values_list("worker_name", "external_id")
    return {w or e for w, e in rows} & names
