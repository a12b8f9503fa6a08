"""The observe phase's lifecycle alerts cost the same queries whatever the fleet's size
(bench/README.md: the query count per cycle is constant in fleet size) — and still resolve an open episode."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import lifecycle_alerts, observe
from fleet.alerts import raise_alert
from fleet.models import Alert, Instance
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

BUSY = {"state": "ok", "active": True, "queued": 3, "running": 2, "workers_expected": 2, "workers_live": 2, "idle_min": None}


def _queries(n: int) -> int:
    with scenario_world([entry(f"v-{i}") for i in range(n)], BUSY):
        world = observe(effective_limits(), effective_policy())
        with CaptureQueriesContext(connection) as ctx:
            lifecycle_alerts(world)
    Instance.objects.all().delete()
    return len(ctx.captured_queries)


def test_the_queries_do_not_grow_with_the_fleet():
    assert _queries(2) == _queries(20)


def test_an_open_episode_is_still_resolved_when_the_worker_is_live_again():
    with scenario_world([entry("v-1")], BUSY):
        raise_alert("instance_exited", "v-1 died", key="instance_exited:v-1")
        lifecycle_alerts(observe(effective_limits(), effective_policy()))
    assert Alert.objects.get(key="instance_exited:v-1").state == "resolved"
