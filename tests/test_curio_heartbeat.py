"""A real Curio node heartbeats every 60 s: it is live for three heartbeats, on the database's clock.

Once, a node whose last_contact is 30 s old read as dead three-quarters of the time
because the live window was three of the demo's 5-s heartbeats.
"""

from datetime import timedelta

from django.utils import timezone

from fleet.clock import VirtualClock, use_clock
from fleet.demand import get_source, read_demand
from tests.curio_support import CURIO_DB, curio, instance, instances  # noqa: F401 (fixture)

pytestmark = CURIO_DB


def test_a_node_heartbeating_every_60_s_reads_live_running_its_task(curio):  # noqa: F811
    vast = curio.machine("vast-101", age_s=30)
    curio.task("PoRep", owner=vast)
    instance("vast-101")

    r = read_demand(instances())

    assert r.state == "ok", r.error
    assert (r.workers_live, r.workers_dead, r.running, r.queued, r.backlog) == (1, 0, 1, 0, 0)
    assert r.workers["vast-101"].live and r.workers["vast-101"].owned_tasks == 1


def test_every_sample_over_a_full_heartbeat_interval_reads_live(curio):  # noqa: F811
    vast = curio.machine("vast-101")
    curio.task("PoRep", owner=vast)
    instance("vast-101")

    samples = {}
    for age in range(0, 61, 2):  # the heartbeat's whole cycle, 0..60 s since the last update
        curio.heartbeat(vast, age)
        r = read_demand(instances())
        samples[age] = (r.workers_live, r.workers_dead, r.running, r.queued)

    wrong = {age: s for age, s in samples.items() if s != (1, 0, 1, 0)}
    assert not wrong, f"samples that read the node wrong (live, dead, running, queued): {wrong}"


def test_three_missed_heartbeats_make_it_dead_and_its_task_demand(curio):  # noqa: F811
    vast = curio.machine("vast-101")
    curio.task("PoRep", owner=vast)
    instance("vast-101")

    curio.heartbeat(vast, 179)
    assert read_demand(instances()).workers_live == 1
    curio.heartbeat(vast, 181)
    r = read_demand(instances())
    assert (r.workers_live, r.workers_dead, r.running, r.queued) == (0, 1, 0, 1)


def test_the_window_is_measured_on_the_database_clock_not_wardens(curio):  # noqa: F811
    curio.machine("vast-101", age_s=30)
    instance("vast-101", started_s_ago=3600)  # past the startup grace (Warden's own records) either way

    # Warden's clock ten minutes ahead (or behind) of the database changes nothing
    for skew in (timedelta(minutes=10), -timedelta(minutes=10)):
        with use_clock(VirtualClock(timezone.now() + skew)):
            r = get_source().read(instances())
        assert (r.workers_live, r.workers_dead) == (1, 0), skew


def test_the_demo_workers_keep_their_short_heartbeat(curio, settings):  # noqa: F811
    curio.machine("local-1", age_s=30)
    instance("local-1")

    curio_reading = get_source("curio").read(instances())
    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "local"}
    demo_reading = get_source().read(instances())

    assert get_source("curio").live_window() == timedelta(seconds=180)
    assert get_source("local").live_window() == timedelta(seconds=15)  # 3 × WARDEN_HEARTBEAT_S (5)
    assert (curio_reading.workers_live, curio_reading.workers_dead) == (1, 0)
    assert (demo_reading.workers_live, demo_reading.workers_dead) == (0, 1)
