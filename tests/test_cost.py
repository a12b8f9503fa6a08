"""Spend to date from $/hr × time in each billed state (fleet.cost), through the real sync path.

vast.ai bills storage from creation and the GPU only while running; a stopped instance still pays
for its disk; destroy stops all billing (vast.ai's billing; docs/operations.md). The rented provider stands in for the
cloud; time is virtual.
"""

from datetime import timedelta

import pytest

from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import observe
from fleet.clock import clock
from fleet.cost import fleet_dph, fleet_spend, spend_by_instance
from fleet.models import FleetSample, Instance, StatusChange
from fleet.providers.base import ProviderInstance
from fleet.sync import sync_instances
from tests import rented_cloud

vclock, cloud = rented_cloud.vclock, rented_cloud.cloud

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def hours(vclock, h: float) -> None:
    vclock.advance(h * 3600)


def provider_says(cloud, ext: str, status: str) -> None:
    cloud.listed[ext].status = status
    sync_instances(cloud)


def test_each_billed_state_is_paid_at_its_rate_and_nothing_after_destroy(cloud, vclock):
    inst = cloud.add("v-1", "loading", age_min=0, dph=1.0)
    cloud.listed["v-1"].storage_dph = 0.1
    sync_instances(cloud)  # the provider's storage price reaches the row
    hours(vclock, 0.5)
    provider_says(cloud, "v-1", "running")
    hours(vclock, 2)
    provider_says(cloud, "v-1", "stopped")
    hours(vclock, 10)

    inst.refresh_from_db()
    s = spend_by_instance([inst])[inst.pk]
    assert s.usd == pytest.approx(0.5 * 0.1 + 2 * 1.0 + 10 * 0.1)
    assert s.seconds == {"loading": 1800, "running": 7200, "stopped": 36000}
    assert (s.gpu_hours, s.storage_hours) == (2, 10.5)
    assert fleet_dph([inst]) == 0.1  # stopped: storage only

    del cloud.listed["v-1"]  # destroyed at the provider: the next sync marks it killed
    sync_instances(cloud)
    hours(vclock, 5)
    inst.refresh_from_db()
    assert inst.killed_at is not None and fleet_dph([inst]) == 0
    assert fleet_spend([inst]).usd == pytest.approx(3.05)  # no storage after destroy


def test_a_price_change_starts_a_new_period(cloud, vclock):
    inst = cloud.add("v-2", "running", age_min=0, dph=0.4)
    hours(vclock, 1)
    cloud.listed["v-2"].dph = 0.8  # a bid changed
    sync_instances(cloud)
    hours(vclock, 1)

    inst.refresh_from_db()
    assert fleet_spend([inst]).usd == pytest.approx(0.4 + 0.8)
    assert list(StatusChange.objects.filter(instance=inst).values_list("status", "dph")) == [("running", 0.4), ("running", 0.8)]


def test_an_adopted_instance_pays_storage_before_we_saw_it_run(cloud, vclock):
    # listed by the provider with no row of ours: sync adopts it, its status billed from adoption on
    cloud.listed["v-3"] = ProviderInstance("v-3", "running", dph=1.0, storage_dph=0.05,
                                           started_at=clock.now() - timedelta(hours=4))
    sync_instances(cloud)
    inst = Instance.objects.get(external_id="v-3")
    assert list(StatusChange.objects.filter(instance=inst).values_list("status", "at")) == [("running", clock.now())]
    hours(vclock, 1)

    s = spend_by_instance([inst])[inst.pk]
    assert s.seconds == {"created": 4 * 3600, "running": 3600}
    assert s.usd == pytest.approx(4 * 0.05 + 1.0)


def test_spend_since_counts_only_the_window(cloud, vclock):
    inst = cloud.add("v-4", "running", age_min=0, dph=2.0)
    hours(vclock, 30)
    since = clock.now() - timedelta(hours=24)

    assert fleet_spend([inst], since=since).usd == pytest.approx(48.0)
    assert fleet_spend([inst]).usd == pytest.approx(60.0)


def test_every_observe_cycle_records_a_fleet_sample(cloud, vclock):
    cloud.add("v-5", "running", age_min=10, dph=1.5)
    stopped = cloud.add("v-6", "stopped", age_min=10, dph=1.5)
    stopped.storage_dph = 0.2
    stopped.save()
    cloud.listed["v-6"].storage_dph = 0.2

    observe(effective_limits(), effective_policy())

    [sample] = FleetSample.objects.all()
    assert (sample.instances, sample.running, sample.dph) == (2, 1, pytest.approx(1.7))
    assert sample.taken_at == clock.now()
    assert sample.target_proofs_hr == effective_limits().target_proofs_hr


def test_an_adopted_instance_keeps_its_gpu_hours_when_its_status_later_changes(cloud, vclock):
    # adoption writes no change row (bulk_create); the first change after it must not turn the hours it
    # ran since adoption into storage hours
    cloud.listed["v-7"] = ProviderInstance("v-7", "running", dph=1.0, storage_dph=0.05,
                                           started_at=clock.now() - timedelta(hours=4))
    sync_instances(cloud)
    hours(vclock, 3)
    provider_says(cloud, "v-7", "stopped")
    hours(vclock, 1)

    inst = Instance.objects.get(external_id="v-7")
    s = spend_by_instance([inst])[inst.pk]
    assert s.seconds == {"created": 4 * 3600, "running": 3 * 3600, "stopped": 3600}
    assert s.usd == pytest.approx(4 * 0.05 + 3 * 1.0 + 1 * 0.05)
