"""Only proving work that is due counts (Curio's seal poller queues a PoRep once the chain head
reaches the sector's seed_epoch + 3): the chain head is computed on the database's clock from the
network's genesis; sectors not due yet are reported apart, and those due within the measured
loading time count as waiting work for the sizing and for ``demand_guard``."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.planners.rules import RulesPlanner
from agent.policy.guards import check
from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import World, read_and_record_demand
from fleet.clock import VirtualClock, use_clock
from fleet.demand import read_demand
from fleet.demand.curio import epoch_time, measured_loading_s
from fleet.models import DemandSample, Instance
from tests.curio_support import CURIO_DB, curio, instance, instances  # noqa: F401 (fixture)

pytestmark = CURIO_DB


def world() -> World:
    insts = instances()
    return World(insts, read_and_record_demand(insts), effective_limits(), effective_policy())


def pipeline(curio, *, due: int, later: int = 0, snap: int = 0, soon: int = 0) -> int:  # noqa: F811
    """Sectors whose PoRep is due (seed epoch 10 epochs ago), due within 4 minutes (``soon``) and
    due in about 100 minutes (``later``); returns the head epoch."""
    head = curio.head()
    n = 0
    for k in range(snap):
        curio.snap_sector(k + 1)
    for seed, count in ((head - 10, due), (head + 5, soon), (head + 200, later)):
        for _ in range(count):
            n += 1
            curio.sdr_sector(100 + n, seed_epoch=seed)
    return head


def test_only_due_sectors_count_and_the_others_are_reported_apart(curio):  # noqa: F811
    head = pipeline(curio, snap=5, due=3, later=7)

    r = read_demand([])

    assert r.state == "ok", r.error
    assert (r.backlog, r.backlog_not_due, r.backlog_soon) == (8, 7, 0)
    assert r.chain_epoch in (head, head + 1)
    assert r.backlog_next_due_at == epoch_time(head + 200 + 3)


def test_the_sample_and_the_dashboard_show_the_sectors_not_due_yet(curio, client):  # noqa: F811
    from django.contrib.auth.models import User

    head = pipeline(curio, due=1, later=2)
    read_and_record_demand([])
    detail = DemandSample.objects.latest("taken_at").detail
    assert (detail["backlog_not_due"], detail["backlog_soon"]) == (2, 0)
    assert detail["backlog_next_due_at"] == epoch_time(head + 203).isoformat()

    client.force_login(User.objects.create_user("op", password="x" * 12, is_staff=True))
    page = client.get("/?partial=cards").content.decode()
    assert "2 not due yet" in page and f"first due {epoch_time(head + 203):%H:%M} UTC" in page


def test_sectors_not_due_yet_do_not_block_a_scale_down_nor_launch(curio):  # noqa: F811
    pipeline(curio, due=0, later=7)
    curio.machine("vast-101", age_s=10)
    instance("vast-101")
    w = world()

    refusal = check("stop_instance", {"instance_id": "vast-101", "reason": "idle"}, "key-1", w)
    launches = [p for p in RulesPlanner().first_turn(w).calls if p.tool == "launch_instance"]

    assert (w.demand.queued, w.demand.backlog, w.demand.backlog_not_due) == (0, 0, 7)
    assert refusal is None or refusal.code != "demand_guard", refusal
    assert launches == []


def test_twin_due_sectors_still_count_and_still_block_a_scale_down(curio):  # noqa: F811
    pipeline(curio, due=3, later=7)
    curio.machine("vast-101", age_s=10)
    instance("vast-101")
    w = world()

    refusal = check("stop_instance", {"instance_id": "vast-101", "reason": "idle"}, "key-1", w)

    assert w.demand.backlog == 3
    assert refusal is not None and refusal.code == "demand_guard" and "3 in the backlog" in refusal.detail


def test_sectors_due_within_the_loading_time_are_waiting_work(curio):  # noqa: F811
    pipeline(curio, due=0, soon=2, later=4)  # due in about 4 minutes
    curio.machine("vast-101", age_s=10)
    inst = instance("vast-101")
    Instance.objects.filter(pk=inst.pk).update(created_at=inst.created_at - timedelta(minutes=10))  # it loaded 10 min
    w = world()

    refusal = check("stop_instance", {"instance_id": "vast-101", "reason": "idle"}, "key-1", w)

    assert w.demand.loading_s == 11 * 60  # 10 min to running, + the 60-s startup grace
    assert (w.demand.backlog, w.demand.backlog_soon, w.demand.backlog_not_due) == (2, 2, 6)
    assert refusal is not None and refusal.code == "demand_guard"


def test_with_nothing_live_sectors_due_soon_launch_a_worker(curio):  # noqa: F811
    pipeline(curio, due=0, soon=1)

    launches = [p for p in RulesPlanner().first_turn(world()).calls if p.tool == "launch_instance"]

    assert len(launches) == 1 and "+1 in the backlog" in launches[0].args["reason"]


def test_the_loading_time_is_measured_from_launch_to_running(curio, settings):  # noqa: F811
    settings.WARDEN = {**settings.WARDEN, "STARTUP_GRACE_S": 60, "CURIO_LOADING_S": 600}
    assert measured_loading_s() == 600  # nothing measured yet: the setting
    now = timezone.now()
    for k, minutes in enumerate((20, 30, 40)):
        Instance.objects.create(provider="vastai", external_id=f"v-{k}", worker_name=f"v-{k}", status="running",
                                status_since=now - timedelta(hours=1) + timedelta(minutes=minutes),
                                created_at=now - timedelta(hours=1))
    assert measured_loading_s() == 30 * 60 + 60  # the median launch reached running after 30 min, + the grace

    # a sector due in about 25 minutes now falls within the loading time
    head = curio.head()
    curio.sdr_sector(1, seed_epoch=head + 47)
    curio.sdr_sector(2, seed_epoch=head + 200)
    r = read_demand(instances())
    assert (r.backlog, r.backlog_soon, r.backlog_not_due) == (1, 1, 2)
    assert r.loading_s == 30 * 60 + 60


def test_the_chain_head_is_the_databases_not_wardens(curio):  # noqa: F811
    pipeline(curio, due=1, later=1)
    for skew in (timedelta(hours=2), -timedelta(hours=2)):
        with use_clock(VirtualClock(timezone.now() + skew)):
            r = read_demand([])
        assert (r.backlog, r.backlog_not_due) == (1, 1), skew


@pytest.mark.parametrize("genesis", [1667326380])  # calibnet
def test_the_networks_genesis_is_a_setting(curio, settings, genesis):  # noqa: F811
    main_head = curio.head()
    calib_head = curio.head(genesis=genesis)
    curio.sdr_sector(1, seed_epoch=calib_head - 10)   # due on calibnet (and long due on mainnet)
    curio.sdr_sector(2, seed_epoch=main_head - 10)    # due on mainnet, far in calibnet's future

    assert read_demand([]).backlog == 2
    settings.WARDEN = {**settings.WARDEN, "CURIO_GENESIS_UNIX": genesis}
    r = read_demand([])
    assert (r.backlog, r.backlog_not_due, r.chain_epoch in (calib_head, calib_head + 1)) == (1, 1, True)
