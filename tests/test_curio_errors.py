"""Errors reading a real Curio say what is wrong.

A missing column is a schema problem naming table, column and the Curio migration that added it;
a missing grant loses only the fields its table feeds; a read restart (SQLSTATE 40001) is
retried; Curio's own URL form is accepted; a cordon through a read-only role names the grant;
no demo hint is shown for a real Curio.
"""

import pytest
from django.db import connections

from agent.actions.instances import do_cordon
from agent.policy.guards import check
from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import World, read_and_record_demand
from console.views.instances import run_instance_action
from fleet.demand import read_demand
from fleet.demand.base import DemandError
from fleet.demand.curio import READ_ATTEMPTS
from tests.curio_support import CURIO_DB, curio, curio_url_options, instance, instances  # noqa: F401 (fixture)

pytestmark = CURIO_DB

ALL_TABLES = ("harmony_machines", "harmony_machine_details", "harmony_task", "harmony_task_history",
              "sectors_snap_pipeline", "sectors_sdr_pipeline")


def select_on(*tables: str) -> list[str]:
    return [f"GRANT SELECT ON curio.{t} TO {{role}}" for t in tables]


def no_demo_hint(text: str) -> bool:
    return "demo" not in text and "check HARMONY_DATABASE_URL" not in text


# -- schema ---------------------------------------------------------------------------------------
def test_a_missing_column_at_start_says_schema_table_column_and_the_migration(curio):  # noqa: F811
    curio.sql("ALTER TABLE curio.harmony_machines DROP COLUMN unschedulable")  # a Curio before 20250111

    r = read_demand([])

    assert r.state == "unknown" and r.queued is None
    assert r.error.startswith("schema: curio.harmony_machines has no column unschedulable")
    assert "20250111-machine-maintenance" in r.error and no_demo_hint(r.error)


def test_a_column_gone_after_start_is_found_by_probing_again_on_the_failure(curio):  # noqa: F811
    assert read_demand([]).state == "ok"  # probed: all there
    curio.sql("ALTER TABLE curio.harmony_task DROP COLUMN posted_time")

    r = read_demand([])

    assert r.state == "unknown"
    assert "schema: curio.harmony_task has no column posted_time" in r.error
    assert "a newer Curio" in r.error or "expects a newer Curio" in r.error
    assert no_demo_hint(r.error)


def test_a_missing_column_of_a_secondary_table_loses_only_its_fields(curio):  # noqa: F811
    curio.sql("ALTER TABLE curio.harmony_machine_details DROP COLUMN machine_name")
    vast = curio.machine(None, age_s=5)
    curio.task("PoRep", owner=vast)
    curio.task("PoRep")
    instance("vast-101")

    r = read_demand(instances())

    assert r.state == "ok"
    assert (r.queued, r.running, r.workers_expected) == (1, 1, 1)
    assert (r.workers_live, r.workers_dead, r.workers_cordoned, r.unmatched) == (None, None, None, None)
    assert "harmony_machine_details has no column machine_name" in r.unreadable["workers_live"]
    assert "20240527-machine_name" in r.error


def test_tables_outside_the_search_path_say_how_to_reach_schema_curio(curio):  # noqa: F811
    conn = connections["harmony"]
    conn.close()
    conn.settings_dict["OPTIONS"] = {**conn.settings_dict["OPTIONS"], "options": "-c search_path=nowhere"}

    r = read_demand([])

    assert r.state == "unknown"
    assert "schema: no table harmony_machines on search_path 'nowhere'" in r.error
    assert "?search_path=curio" in r.error and "?options=-csearch_path%3Dcurio" in r.error


# -- grants ---------------------------------------------------------------------------------------
def test_an_unreadable_history_makes_only_proofs_unknown(curio):  # noqa: F811
    vast = curio.machine("vast-101", age_s=10)
    curio.task("PoRep", owner=vast)
    curio.history(40)
    curio.snap_sector(1)
    instance("vast-101")
    tables = [t for t in ALL_TABLES if t != "harmony_task_history"]

    with curio.as_role(select_on(*tables)) as role:
        r = read_demand(instances())

    assert r.state == "ok"
    assert (r.queued, r.running, r.backlog, r.workers_live, r.workers_dead) == (0, 1, 1, 1, 0)
    assert (r.proofs_hr, r.proof_s) == (None, None)
    assert set(r.unreadable) == {"proofs_hr", "proof_s", "proof_s_by_worker", "proof_s_by_gpu"}
    assert f"GRANT SELECT ON curio.harmony_task_history TO {role}" in r.unreadable["proofs_hr"]


def test_a_grant_revoked_after_start_is_found_on_the_failure(curio):  # noqa: F811
    curio.history(40)
    with curio.as_role(select_on(*ALL_TABLES)) as role:
        assert read_demand([]).proofs_hr == pytest.approx(36, abs=0.5)  # one 40-s proof that ended 60 s ago: 1 per 100 s
        curio.sql("RESET ROLE")
        curio.sql(f"REVOKE SELECT ON curio.harmony_task_history FROM {role}")
        curio.sql(f"SET ROLE {role}")
        r = read_demand([])

    assert r.state == "ok" and r.queued == 0 and r.proofs_hr is None
    assert f"grant: role {role} may not read curio.harmony_task_history" in r.error


def test_an_unreadable_pipeline_keeps_the_backlog_unknown_and_refuses_a_stop(curio):  # noqa: F811
    curio.machine("vast-101", age_s=10)
    instance("vast-101")
    tables = [t for t in ALL_TABLES if t != "sectors_snap_pipeline"]

    with curio.as_role(select_on(*tables)):
        insts = instances()
        w = World(insts, read_and_record_demand(insts), effective_limits(), effective_policy())
        refusal = check("stop_instance", {"instance_id": "vast-101", "reason": "idle"}, "key-1", w)

    assert w.demand.state == "ok" and w.demand.queued == 0 and w.demand.backlog is None
    assert refusal is not None and refusal.code == "demand_guard"
    assert "backlog is unknown" in refusal.detail and "sectors_snap_pipeline" in refusal.detail


def test_an_unreadable_queue_is_unknown_demand_naming_the_grant(curio):  # noqa: F811
    tables = [t for t in ALL_TABLES if t != "harmony_task"]
    with curio.as_role(select_on(*tables)) as role:
        r = read_demand([])

    assert r.state == "unknown" and r.queued is None
    assert f"GRANT SELECT ON curio.harmony_task TO {role}" in r.error and no_demo_hint(r.error)


# -- read restarts ----------------------------------------------------------------------------------
def flaky_queue(curio, failures: int) -> None:  # noqa: F811
    """Reading harmony_task raises SQLSTATE 40001 (as Yugabyte does on a read restart) ``failures`` times."""
    curio.sql("CREATE SEQUENCE curio.restarts")
    curio.sql(
        "CREATE FUNCTION curio.restart_read() RETURNS boolean LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$ "
        f"BEGIN IF nextval('curio.restarts') <= {int(failures)} THEN "
        "RAISE EXCEPTION 'Restart read required' USING ERRCODE = '40001'; END IF; RETURN true; END $$"
    )
    curio.sql("ALTER TABLE curio.harmony_task ENABLE ROW LEVEL SECURITY")
    curio.sql("CREATE POLICY restart ON curio.harmony_task FOR SELECT USING (curio.restart_read())")


def restarts_seen(curio) -> int:  # noqa: F811
    return curio.sql("SELECT last_value FROM curio.restarts")[0][0]


def test_a_read_restart_is_retried_before_it_counts(curio):  # noqa: F811
    curio.task("PoRep")
    flaky_queue(curio, failures=2)

    with curio.as_role(select_on(*ALL_TABLES)):
        r = read_demand([])

    assert r.state == "ok" and r.queued == 1
    assert restarts_seen(curio) == 3  # two restarts, then the read that counted


def test_read_restarts_that_do_not_stop_are_unknown_saying_so(curio):  # noqa: F811
    curio.task("PoRep")
    flaky_queue(curio, failures=100)

    with curio.as_role(select_on(*ALL_TABLES)):
        r = read_demand([])

    assert r.state == "unknown" and r.queued is None
    assert "SQLSTATE 40001" in r.error and f"after {READ_ATTEMPTS} attempts" in r.error
    assert restarts_seen(curio) == READ_ATTEMPTS


# -- the URL, the role, the hints -------------------------------------------------------------------
def test_curios_search_path_url_form_is_accepted(curio):  # noqa: F811
    options = curio_url_options()

    assert options["options"].startswith("-c search_path=curio ")
    assert "-c statement_timeout=10000" in options["options"] and "-c lock_timeout=5000" in options["options"]
    assert curio.sql("SHOW search_path") == [("curio",)]  # the fixture connected with that URL


def test_a_search_path_joins_other_server_options_and_junk_names_the_working_form(monkeypatch):
    from pathlib import Path

    from console.settings import _db

    monkeypatch.setenv("X_URL", "postgres://ro@db:5433/yugabyte?search_path=curio&options=-cstatement_timeout%3D5000")
    assert _db("X_URL", Path("unused"))["OPTIONS"]["options"] == "-cstatement_timeout=5000 -c search_path=curio"

    monkeypatch.setenv("X_URL", "postgres://ro@db:5433/yugabyte?search_path=curio%3Bdrop")
    with pytest.raises(SystemExit) as err:
        _db("X_URL", Path("unused"))
    assert "X_URL" in str(err.value) and "?options=-csearch_path%3Dcurio" in str(err.value)


def test_cordoning_through_a_read_only_role_names_the_grant_it_needs(curio):  # noqa: F811
    curio.machine("vast-101", age_s=10)
    inst = instance("vast-101")

    with curio.as_role(select_on(*ALL_TABLES)) as role:
        with pytest.raises(DemandError) as err:
            do_cordon(inst, True, actor="user:alice", reason="drain")
        status, code, detail = run_instance_action(inst, "cordon", actor="user:alice", reason="drain")

    assert "UPDATE on harmony_machines" in str(err.value)
    assert f"GRANT UPDATE (unschedulable) ON curio.harmony_machines TO {role}" in str(err.value)
    assert (status, code) == (503, "harmony_error") and "UPDATE on harmony_machines" in detail
    assert curio.sql("SELECT unschedulable FROM curio.harmony_machines") == [(False,)]


def test_cordoning_works_once_the_grant_is_given(curio):  # noqa: F811
    curio.machine("vast-101", age_s=10)
    inst = instance("vast-101")

    grants = select_on(*ALL_TABLES) + ["GRANT UPDATE (unschedulable) ON curio.harmony_machines TO {role}"]
    with curio.as_role(grants):
        assert do_cordon(inst, True, actor="user:alice", reason="drain") == 1

    assert curio.sql("SELECT unschedulable FROM curio.harmony_machines") == [(True,)]


def test_an_unreachable_curio_names_the_setting_without_the_demo_hint(curio):  # noqa: F811
    conn = connections["harmony"]
    conn.close()
    conn.settings_dict["PORT"], saved_port = 1, conn.settings_dict["PORT"]
    conn.settings_dict["OPTIONS"] = {**conn.settings_dict["OPTIONS"], "connect_timeout": 1}
    try:
        r = read_demand([])
    finally:
        conn.close()
        conn.settings_dict["PORT"] = saved_port

    assert r.state == "unknown" and r.queued is None
    assert "Curio's database" in r.error and "HARMONY_DATABASE_URL" in r.error
    assert no_demo_hint(r.error)


# -- at start -----------------------------------------------------------------------------------------
def test_bootstrap_checks_a_real_curio_and_creates_nothing_in_it(curio):  # noqa: F811
    from console.management.commands.bootstrap import prepare_demo

    curio.sql("ALTER TABLE curio.harmony_machines DROP COLUMN unschedulable")
    assert prepare_demo() == (
        "warden: Curio's database: schema: curio.harmony_machines has no column unschedulable "
        "(added by Curio migration 20250111-machine-maintenance: upgrade Curio)"
    )

    curio.sql("CREATE SCHEMA elsewhere")
    conn = connections["harmony"]
    conn.close()
    conn.settings_dict["OPTIONS"] = {**conn.settings_dict["OPTIONS"], "options": "-c search_path=elsewhere"}
    try:
        message = prepare_demo()
        created = curio.sql("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'elsewhere'")
    finally:
        curio.sql("DROP SCHEMA elsewhere CASCADE")
    assert "no table harmony_machines on search_path 'elsewhere'" in message and "?search_path=curio" in message
    assert created == [(0,)]  # empty demo tables beside Curio's would read as "no demand"


def test_unknown_worker_counts_do_not_resolve_a_workers_dead_alert(curio):  # noqa: F811
    from fleet.models import Alert

    instance("vast-101")  # no row: dead
    read_and_record_demand(instances())
    assert Alert.objects.get(kind="workers_dead").state == "firing"

    curio.sql("ALTER TABLE curio.harmony_machine_details DROP COLUMN machine_name")
    r = read_and_record_demand(instances())

    assert r.state == "ok" and r.workers_dead is None
    assert Alert.objects.get(kind="workers_dead").state == "firing"


# -- column and schema privileges (issue: a read-only role granted exactly what Warden reads) ----------
def column_grants(skip: tuple[tuple[str, str], ...] = ()) -> list[str]:
    """Column-level SELECT on exactly the columns Warden reads, table by table (less ``skip``)."""
    from fleet.demand.curio import NEEDED

    return [f"GRANT SELECT ({', '.join(c for c in cols if (t, c) not in skip)}) ON curio.{t} TO {{role}}"
            for t, cols in NEEDED.items()]


def test_column_level_select_on_exactly_the_columns_read_is_enough(curio):  # noqa: F811
    vast = curio.machine("vast-101", age_s=10)
    curio.task("PoRep", owner=vast)
    curio.task("PoRep")
    curio.history(40)
    curio.snap_sector(1)
    curio.sdr_sector(10)
    instance("vast-101")

    with curio.as_role(column_grants()):
        r = read_demand(instances())

    assert r.state == "ok" and r.error == "" and r.unreadable == {}
    assert (r.queued, r.running, r.backlog, r.workers_live, r.workers_dead) == (1, 1, 2, 1, 0)
    assert r.proofs_hr is not None and r.proof_s == 40.0


def test_the_rate_needs_task_id_and_a_missing_column_grant_names_the_exact_grant(curio):  # noqa: F811
    curio.history(40)

    with curio.as_role(column_grants(skip=(("harmony_task_history", "task_id"),))) as role:
        r = read_demand([])

    assert r.state == "ok" and r.queued == 0 and r.proofs_hr is None
    assert (f"grant: role {role} may not read curio.harmony_task_history column(s) task_id "
            f"(GRANT SELECT (task_id) ON curio.harmony_task_history TO {role}") in r.unreadable["proofs_hr"]


def test_select_without_usage_on_schema_curio_names_the_usage_grant_not_the_search_path(curio):  # noqa: F811
    with curio.as_role(select_on(*ALL_TABLES), usage=False) as role:
        r = read_demand([])

    assert r.state == "unknown"
    assert f"grant: role {role} lacks USAGE on schema curio" in r.error
    assert f"GRANT USAGE ON SCHEMA curio TO {role}" in r.error
    assert "search_path" not in r.error


# -- the first error, not the re-probe's -------------------------------------------------------------
def test_a_server_restart_mid_read_reports_what_failed_first(curio):  # noqa: F811
    import psycopg

    assert read_demand([]).state == "ok"
    conn = connections["harmony"]
    (pid,), = curio.sql("SELECT pg_backend_pid()")
    cfg = conn.settings_dict
    with psycopg.connect(host=cfg["HOST"], port=cfg["PORT"], dbname=cfg["NAME"], user=cfg["USER"],
                         password=cfg.get("PASSWORD") or None, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])  # what a server restart does to the session

    r = read_demand([])
    conn.close()

    assert r.state == "unknown"
    assert "reading harmony_machines failed" in r.error, r.error
    assert "the connection is closed" not in r.error
    assert read_demand([]).state == "ok"  # and the next read reconnects
