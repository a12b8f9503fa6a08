"""One observe phase costs the same queries whatever the fleet's size (no query per instance:
bench/README.md, fleet_day.py and observe_cycle.py), and the rows the sync returns without reading
them again are the rows a re-read gives."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import observe
from fleet.clock import VirtualClock, use_clock
from fleet.models import Instance
from fleet.sync import sync_instances
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

BUSY = {"state": "ok", "queued": 3, "running": 2, "workers_expected": 2, "workers_live": 2}


def _observe_queries(n: int) -> int:
    """Queries of one observe over ``n`` running instances, one of which changes status and one of
    which the provider lists for the first time (adopted), after a first observe settled the rest."""
    fleet = [entry(f"v-{i}") for i in range(n)]
    with scenario_world(fleet, BUSY) as provider:
        observe(effective_limits(), effective_policy())
        provider.put({"id": "v-0", "actual_status": "exited"})
        provider.put(entry("v-new"))
        with CaptureQueriesContext(connection) as ctx:
            world = observe(effective_limits(), effective_policy())
    assert len(world.instances) == n + 1
    Instance.objects.all().delete()
    return len(ctx.captured_queries)


def test_one_observe_costs_the_same_queries_at_5_and_at_50_instances():
    assert _observe_queries(5) == _observe_queries(50)


def test_the_rows_a_sync_returns_equal_a_re_read_of_them():
    # a clock off UTC and a whole-number price: a row kept in memory must still read as the database's
    start = datetime(2026, 3, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    fleet = [entry("v-1", dph=1), entry("v-2"), entry("v-3", status="exited")]
    with use_clock(VirtualClock(start)), scenario_world(fleet, BUSY) as provider:
        Instance.objects.filter(external_id="v-3").delete()  # listed with no row: adopted
        provider.put({"id": "v-2", "actual_status": "loading"})  # a status change
        rows = sync_instances(provider)
    assert [r.external_id for r in rows] == [r.external_id for r in Instance.objects.filter(
        killed_at__isnull=True).order_by("-created_at")]
    fresh = {r.pk: model_to_dict(r) for r in Instance.objects.all()}
    for row in rows:
        assert model_to_dict(row) == fresh[row.pk], row.external_id
        assert row.status_since.tzinfo == UTC and type(row.dph) is float
    assert {r.external_id: r.status for r in rows} == {"v-1": "running", "v-2": "loading", "v-3": "exited"}
