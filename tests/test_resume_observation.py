"""A parked run resumed after an approval observes again and records that observation: its answer
("Demand ok: queued N …") cites the numbers of the resumed turns' observation, so the run page
shows them and the entailment check does not flag them (found in the demo: a launch approved two
minutes later answered "queued 6" against the parked observation's 12, and was flagged)."""

import json

import pytest

from agent.models import Approval
from agent.planners.rules import RulesPlanner
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run, run_cycle
from agent.runtime.report import entailment_flags
from fleet import demand as demand_mod
from fleet.demand.scenario import ScenarioDemandSource
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

BUSY = {"state": "ok", "active": True, "queued": 12, "running": 1, "workers_expected": 1, "workers_live": 1,
        "idle_min": None}


def test_a_resumed_run_records_the_observation_its_answer_cites():
    fleet = [entry("v-1")]
    with scenario_world(fleet, BUSY, objectives={"target_proofs_hr": 360}) as provider:
        provider.offers = [{"id": "o-1", "gpu_name": "RTX 4090", "dph": 0.4}]
        run = run_cycle("heartbeat", planner=RulesPlanner())
        assert run.status == "parked"
        demand_mod.set_override(ScenarioDemandSource({**BUSY, "queued": 6}, fleet))  # the queue drains meanwhile
        do_decide(Approval.objects.get(run=run), "approve", "user:alice")
        resume_run(run, planner=RulesPlanner())
    run.refresh_from_db()
    observed = [json.loads(o)["demand"]["queued"]
                for o in run.steps.filter(kind="observe").order_by("seq").values_list("observation", flat=True)]
    assert observed == [12, 6]
    assert "queued 6" in run.final_answer
    assert entailment_flags(run) == [] and run.entailment_flags == []
