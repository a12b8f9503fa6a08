"""A need larger than one batch launches one batch's worth: the rules planner proposes at most
``MAX_BATCH_CALLS`` calls (launches cut first), because the pipeline refuses a larger batch whole
(``batch_too_large``) and a need of 400 workers proposed at once launched none."""

import pytest

from agent.planners.rules import RulesPlanner
from agent.policy.tool_specs import MAX_BATCH_CALLS
from agent.runtime.loop import run_cycle
from tests.scenario_world import scenario_world

pytestmark = pytest.mark.django_db

EMPTY = {"state": "ok", "active": True, "queued": 5000, "running": 0, "workers_expected": 0, "workers_live": 0,
         "idle_min": None, "proof_s": 20}


def _launches(run):
    return run.steps.filter(kind="call", tool="launch_instance")


def test_a_need_of_forty_launches_one_batch_and_none_is_refused_as_too_large():
    with scenario_world([], EMPTY, objectives={"target_proofs_hr": 7200, "max_instances": 100}):
        run = run_cycle("heartbeat", planner=RulesPlanner())
    calls = run.steps.filter(kind="call")
    assert calls.count() <= MAX_BATCH_CALLS
    assert _launches(run).count() == MAX_BATCH_CALLS
    assert not calls.filter(reason_code="batch_too_large").exists()
    assert run.halt_reason != "batch_too_large"


def test_near_miss_a_need_within_one_batch_is_proposed_whole():
    with scenario_world([], EMPTY, objectives={"target_proofs_hr": 1800, "max_instances": 100}):
        run = run_cycle("heartbeat", planner=RulesPlanner())
    assert _launches(run).count() == 10  # 1800/hr at 20 s a proof
