"""The HarmonyDB demand reader: queued, running, workers live/dead/cordoned, proofs/hr, unknown on failure."""

import contextlib
from datetime import timedelta

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import demo
from fleet.clock import VirtualClock, use_clock
from fleet.demand import read_demand, set_override
from fleet.demand.base import DemandError
from fleet.demand.curio import HarmonyDemandSource, forget_probes
from fleet.harmony import HarmonyMachine, HarmonyMachineDetails, HarmonyTask, HarmonyTaskHistory
from fleet.models import Instance
from fleet.sync import sync_instances
from tests import fleet_support
from tests.fleet_support import FLEET_DB, clear_harmony, machine_of, wait_for

pytestmark = FLEET_DB
local_fleet = fleet_support.local_fleet


@pytest.fixture
def knobs(settings):
    settings.WARDEN = {
        **settings.WARDEN,
        "HEARTBEAT_S": 5,
        "STARTUP_GRACE_S": 60,
        "TASK_NAMES": ["PoRep", "UpdateProve", "PSProve"],
        "DEMAND_SOURCE": "local",
    }
    set_override(None)
    forget_probes()
    clear_harmony()
    yield settings.WARDEN
    clear_harmony()
    forget_probes()


def machine(name, *, age_s=0.0, cordoned=False):
    m = HarmonyMachine.objects.create(
        last_contact=timezone.now() - timedelta(seconds=age_s), host_and_port=f"{name}:12300", unschedulable=cordoned
    )
    HarmonyMachineDetails.objects.create(machine=m, tasks="PoRep,UpdateProve", machine_name=name)
    return m


def task(name="PoRep", owner=None, age_s=0.0):
    t = timezone.now() - timedelta(seconds=age_s)
    return HarmonyTask.objects.create(name=name, owner=owner, posted_time=t, update_time=t)


def instance(name, *, status="running", started_s_ago=600):
    now = timezone.now()
    return Instance.objects.create(
        provider="local",
        external_id=name,
        worker_name=name,
        status=status,
        status_since=now - timedelta(seconds=started_s_ago),
        started_at=now - timedelta(seconds=started_s_ago),
        created_at=now - timedelta(seconds=started_s_ago),
    )


def test_it_counts_unowned_and_dead_owned_tasks_as_queued_and_live_owned_as_running(knobs):
    live, dead = machine("w-live"), machine("w-dead", age_s=60)
    task(age_s=30)
    task(owner=dead, age_s=90)
    task(owner=live)
    task(owner=live, name="UpdateProve")
    task(name="SDR", age_s=999)  # not a proving task

    r = HarmonyDemandSource().read([])

    assert (r.state, r.queued, r.running) == ("ok", 2, 2)
    assert 89 <= r.oldest_queued_s < 100
    assert r.workers["w-live"].owned_tasks == 2 and r.workers["w-live"].live
    assert r.workers["w-dead"].owned_tasks == 1 and not r.workers["w-dead"].live


def test_an_empty_queue_reads_zero_not_unknown(knobs):
    r = HarmonyDemandSource().read([])

    assert (r.state, r.queued, r.running, r.oldest_queued_s) == ("ok", 0, 0, None)


def test_it_expects_only_running_instances_past_the_startup_grace(knobs):
    machine("a")
    instance("a")
    instance("young", started_s_ago=10)
    instance("off", status="stopped")

    r = HarmonyDemandSource().read(list(Instance.objects.all()))

    assert (r.workers_expected, r.workers_live, r.workers_dead) == (1, 1, 0)


def test_a_missing_row_and_a_stale_heartbeat_are_dead_and_a_cordoned_worker_is_not(knobs):
    machine("live")
    machine("stale", age_s=16)  # more than 3 heartbeats of 5 s
    machine("cordoned", cordoned=True)
    for name in ("live", "stale", "cordoned", "norow"):
        instance(name)

    r = HarmonyDemandSource().read(list(Instance.objects.all()))

    assert (r.workers_expected, r.workers_live, r.workers_cordoned, r.workers_dead) == (4, 1, 1, 2)
    assert r.workers["norow"].live is False and r.workers["norow"].machine_id is None


def test_it_judges_liveness_by_the_database_clock_not_wardens(knobs):
    machine("a")
    instance("a")

    # Warden's clock five minutes ahead does not age the heartbeat: now() in the query does
    with use_clock(VirtualClock(timezone.now() + timedelta(minutes=5))):
        r = HarmonyDemandSource().read(list(Instance.objects.all()))

    assert (r.workers_live, r.workers_dead) == (1, 0)


def test_the_current_rate_counts_successful_proofs_of_the_last_15_minutes_per_hour_covered(knobs):
    now = timezone.now()

    def hist(name="PoRep", result=True, ago_min=5):
        end = now - timedelta(minutes=ago_min)
        HarmonyTaskHistory.objects.create(
            task_id=1,
            name=name,
            posted=end,
            work_start=end,
            work_end=end,
            result=result,
            completed_by_host_and_port="x",
        )

    for _ in range(3):
        hist()
    hist(result=False)
    hist(ago_min=16)  # outside the 15-minute window
    hist(name="SDR")

    r = HarmonyDemandSource().read([])
    assert r.proofs_hr == 36.0  # 3 proofs over the 5 minutes since the first began
    assert r.rate_window_s == 900


def test_its_query_count_does_not_grow_with_the_fleet(knobs):
    HarmonyDemandSource().read([])  # the schema probe runs once, before the first read
    counts = []
    for n in (2, 20):
        for i in range(n):
            machine(f"m{n}-{i}")
            instance(f"m{n}-{i}")
        with CaptureQueriesContext(connections["harmony"]) as q:
            HarmonyDemandSource().read(list(Instance.objects.all()))
        counts.append(len(q))
    # one per table (history three times: rate, proof times, new proofs to credit; the sealing
    # pipeline twice: the database's clock for the chain head, then the sectors): a lost grant
    # loses only its fields
    assert counts[0] == counts[1] == 9


@contextlib.contextmanager
def harmony_task_table_missing():
    with connections["harmony"].cursor() as c:
        c.execute("ALTER TABLE harmony_task RENAME TO harmony_task_gone")
    try:
        yield
    finally:
        with connections["harmony"].cursor() as c:
            c.execute("ALTER TABLE harmony_task_gone RENAME TO harmony_task")


def test_a_missing_demo_table_is_an_error_saying_what_to_run_never_zeros(knobs):
    HarmonyDemandSource().read([])  # probed while the table exists: the failed read probes again
    with harmony_task_table_missing():
        with pytest.raises(DemandError) as err:
            HarmonyDemandSource().read([])
        reading = read_demand([])

    assert "harmony_task" in str(err.value) and "demo prepare" in str(err.value) and "\n" not in str(err.value)
    assert reading.state == "unknown"
    assert (reading.queued, reading.running, reading.workers_live, reading.proofs_hr) == (None, None, None, None)
    assert "harmony_task" in reading.error


def test_an_unreachable_demo_database_names_the_setting(knobs):
    from django.db import connections

    conn = connections["harmony"]
    saved = dict(conn.settings_dict)
    conn.close()
    conn.settings_dict.update(PORT=1, OPTIONS={**saved["OPTIONS"], "connect_timeout": 1})
    try:
        reading = read_demand([])
    finally:
        conn.close()
        conn.settings_dict.clear()
        conn.settings_dict.update(saved)

    assert reading.state == "unknown" and reading.queued is None
    assert "HARMONY_DATABASE_URL" in reading.error and "demo prepare" in reading.error


def test_it_reads_real_workers_and_sees_one_die(local_fleet, settings):
    settings.WARDEN = {**settings.WARDEN, "PROOF_SECONDS": 60.0}
    a, b = local_fleet.launch(), local_fleet.launch()
    wait_for(lambda: machine_of(a.worker_name) and machine_of(b.worker_name), what="registration")
    demo.enqueue(3)
    wait_for(lambda: HarmonyTask.objects.filter(owner__isnull=False).count() == 2, what="two claims")
    instances = sync_instances(local_fleet)

    r = HarmonyDemandSource().read(instances)
    assert (r.queued, r.running, r.workers_expected, r.workers_live, r.workers_dead) == (1, 2, 2, 2, 0)

    killed = demo.kill_one_worker()
    assert killed is not None and killed.status == "exited" and killed.exit_code == -9
    # read with the rows as they were (still "running"): after 3 missed heartbeats the worker is
    # dead, and the task it held still counts as demand
    r = wait_for(
        lambda: (r := HarmonyDemandSource().read(instances)).workers_dead == 1 and r, timeout=10, what="stale heartbeat"
    )
    assert (r.queued, r.running, r.workers_expected, r.workers_live) == (2, 1, 2, 1)
    assert r.workers[killed.worker_name].live is False

    # synced, the killed instance is exited: no longer expected (it is terminal: replaced), still visible
    r = HarmonyDemandSource().read(sync_instances(local_fleet))
    assert (r.workers_expected, r.workers_live, r.workers_dead) == (1, 1, 0)
