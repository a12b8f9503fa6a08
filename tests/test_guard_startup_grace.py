"""A worker inside the startup grace is *starting* through the guard path, and its near miss.

The cycle runs for real (``rails_world``: the scenario provider and demand source, whose worker
counts come from ``fleet.demand.base.count_workers``, the rule every demand source uses). An
instance that started less than ``WARDEN_STARTUP_GRACE_S`` ago and whose worker has not
heartbeated yet is neither expected nor dead: the idle stop of another instance runs and no
``workers_dead`` alert is raised. The near miss is the same instance just past the grace: its
worker is expected and dead, so the stop is refused ``demand_guard`` and ``workers_dead`` fires.
"""

import pytest

from fleet.models import Alert, DemandSample
from tests.rails_support import CALM_DEMAND, calls, fleet_entry, rails_world, verdict

GRACE_S = 600


def _stop_beside(new_age_min: float):
    """One cycle stopping the idle v-2 while v-3 (no heartbeat yet) is ``new_age_min`` old."""
    fleet = [fleet_entry("v-1"), fleet_entry("v-2"), fleet_entry("v-3", live=False, age_min=new_age_min)]
    stop = {"tool": "stop_instance", "args": {"instance_id": "v-2", "reason": "idle past the dwell"}}
    with rails_world(fleet, CALM_DEMAND, policy={"stop_instance": "auto"},
                     limits={"hold_off_min": 0}, diagnosed=("v-1", "v-2")) as w:
        run = w.cycle([stop, verdict(action=True, changed=True)])
    return calls(run)[0], DemandSample.objects.latest("taken_at")


@pytest.fixture
def grace(settings):
    settings.WARDEN = {**settings.WARDEN, "STARTUP_GRACE_S": GRACE_S}


@pytest.mark.django_db
def test_a_worker_inside_the_startup_grace_is_starting_not_dead(grace):
    step, sample = _stop_beside(new_age_min=GRACE_S / 60 - 1)
    assert step.outcome == "executed", (step.outcome, step.reason_code, step.detail)
    assert (sample.workers_expected, sample.workers_live, sample.workers_dead) == (2, 2, 0)
    assert sample.detail["workers_starting"] == 1
    assert not Alert.objects.filter(kind="workers_dead").exists()


@pytest.mark.django_db
def test_near_miss_just_past_the_grace_the_silent_worker_is_dead(grace):
    step, sample = _stop_beside(new_age_min=GRACE_S / 60 + 1)
    assert step.outcome == "refused" and step.reason_code == "demand_guard", (step.outcome, step.reason_code)
    assert "1 expected worker(s) dead" in step.detail
    assert (sample.workers_expected, sample.workers_live, sample.workers_dead) == (3, 2, 1)
    assert sample.detail.get("workers_starting") == 0
    assert Alert.objects.filter(kind="workers_dead", state="firing").count() == 1
