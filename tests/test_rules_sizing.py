"""The rules planner's sizing: a cordoned worker is not capacity, an exited instance is not capacity
while its last heartbeat is still in the window, and a measured proof time a few milliseconds over
the configured one does not ask for one more worker."""

import pytest

from agent.planners.rules import RulesPlanner, sizing
from agent.policy.table import effective_limits, effective_policy
from agent.runtime.loop import run_cycle
from agent.runtime.observe import observe
from fleet.models import Instance
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

QUEUED = {"state": "ok", "active": True, "queued": 9, "running": 1, "workers_expected": 1, "workers_live": 1,
          "idle_min": None, "proof_s": 20}


def world():
    return observe(effective_limits(), effective_policy())


def launches(run):
    return [s for s in run.steps.filter(kind="call", tool="launch_instance")]


def test_a_cordoned_worker_is_not_capacity():
    with scenario_world([entry("v-1"), entry("v-2")], QUEUED, objectives={"target_proofs_hr": 360, "max_instances": 6}):
        Instance.objects.filter(external_id="v-2").update(cordoned=True)
        size = sizing(world())
        run = run_cycle("heartbeat", planner=RulesPlanner())
    assert size.desired == 2
    assert [i.external_id for i in size.active] == ["v-1"]
    assert size.launches == 1
    assert len(launches(run)) == 1


def test_near_miss_an_uncordoned_pair_is_enough():
    with scenario_world([entry("v-1"), entry("v-2")], QUEUED, objectives={"target_proofs_hr": 360, "max_instances": 6}):
        size = sizing(world())
        run = run_cycle("heartbeat", planner=RulesPlanner())
    assert size.desired == 2 and size.launches == 0
    assert launches(run) == []


def test_a_curio_unschedulable_worker_is_draining_too():
    fleet = [entry("v-1"), entry("v-2")]
    fleet[1]["worker"]["unschedulable"] = True
    with scenario_world(fleet, QUEUED, objectives={"target_proofs_hr": 360, "max_instances": 6}):
        size = sizing(world())
    assert [i.external_id for i in size.active] == ["v-1"] and size.launches == 1


@pytest.mark.parametrize("proof_s, want", [(20.0058, 2), (20.0, 2), (21.0, 3), (10.0, 1)])
def test_a_measured_proof_time_is_rounded_with_a_little_slack(proof_s, want):
    """360 proofs/hr at 20 s a proof is exactly 2 workers; 20.0058 s must not make it 3."""
    with scenario_world([], {**QUEUED, "workers_expected": 0, "workers_live": 0, "proof_s": proof_s},
                        objectives={"target_proofs_hr": 360, "max_instances": 6}):
        assert sizing(world()).desired == want


def test_an_exited_worker_is_not_capacity_while_its_last_heartbeat_is_still_fresh():
    """A killed demo worker (exit -9): the run its death triggers launches the replacement at once,
    not a heartbeat later when the worker's last heartbeat has gone stale."""
    fleet = [entry("v-1"), entry("v-2", status="exited")]  # v-2's worker still reads live (heartbeat in window)
    with scenario_world(fleet, {**QUEUED, "workers_expected": 2, "workers_live": 2},
                        objectives={"target_proofs_hr": 360, "max_instances": 6}):
        size = sizing(world())
    assert [i.external_id for i in size.active] == ["v-1"] and size.launches == 1


def test_a_live_worker_whose_provider_reads_offline_is_still_capacity():
    """The other side (docs/contract.md): an offline or unknown provider status with a live worker is capacity."""
    fleet = [entry("v-1"), entry("v-2", status="offline")]
    with scenario_world(fleet, {**QUEUED, "workers_expected": 2, "workers_live": 2},
                        objectives={"target_proofs_hr": 360, "max_instances": 6}):
        size = sizing(world())
    assert sorted(i.external_id for i in size.active) == ["v-1", "v-2"] and size.launches == 0
