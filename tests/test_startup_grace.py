"""Working workers are never counted as starting or dead.

During the startup grace (``WARDEN_STARTUP_GRACE_S``), workers that already heartbeat are live:
the grace only excuses instances whose worker is not heartbeating yet. The dashboard reads the same
count from the demand read, so "4 running" never sits next to "0 / 0 live, 4 starting".
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.runtime.observe import read_and_record_demand
from fleet.demand import set_override
from fleet.demand.curio import HarmonyDemandSource
from fleet.harmony import HarmonyMachine, HarmonyMachineDetails
from fleet.models import DemandSample, Instance
from tests.fleet_support import FLEET_DB, clear_harmony

pytestmark = FLEET_DB


@pytest.fixture
def knobs(settings):
    settings.WARDEN = {**settings.WARDEN, "HEARTBEAT_S": 5, "STARTUP_GRACE_S": 60, "DEMAND_SOURCE": "local",
                       "TASK_NAMES": ["PoRep"]}
    set_override(None)
    clear_harmony()
    yield
    clear_harmony()


def heartbeat(name):
    m = HarmonyMachine.objects.create(last_contact=timezone.now(), host_and_port=f"{name}:12300", unschedulable=False)
    HarmonyMachineDetails.objects.create(machine=m, tasks="PoRep", machine_name=name)


def fresh_instance(name, started_s_ago=10):
    t = timezone.now() - timedelta(seconds=started_s_ago)
    return Instance.objects.create(provider="local", external_id=name, worker_name=name, status="running",
                                   status_since=t, started_at=t, created_at=t)


def test_workers_heartbeating_inside_the_grace_are_live(knobs):
    for i in range(4):
        fresh_instance(f"local-{i}")
        heartbeat(f"local-{i}")

    r = HarmonyDemandSource().read(list(Instance.objects.all()))

    assert (r.workers_expected, r.workers_live, r.workers_dead, r.workers_starting) == (4, 4, 0, 0)


def test_the_grace_only_excuses_a_worker_not_heartbeating_yet(knobs):
    fresh_instance("local-1")
    heartbeat("local-1")
    fresh_instance("local-2")  # starting: no heartbeat yet, inside the grace
    fresh_instance("local-3", started_s_ago=120)  # past the grace without a heartbeat: dead

    r = HarmonyDemandSource().read(list(Instance.objects.all()))

    assert (r.workers_expected, r.workers_live, r.workers_dead, r.workers_starting) == (2, 1, 1, 1)


def test_the_dashboard_shows_the_demand_reads_count(knobs, client, alice):
    for i in range(4):
        fresh_instance(f"local-{i}")
        heartbeat(f"local-{i}")
    read_and_record_demand(list(Instance.objects.all()))
    assert DemandSample.objects.get().detail["workers_starting"] == 0
    client.force_login(alice)
    page = client.get("/").content.decode()
    assert "4 / 4" in page
    assert "starting (not yet expected)" not in page
