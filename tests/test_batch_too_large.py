"""A parallel batch of more than 16 calls is refused whole before any call runs (``batch_too_large``,
docs/contract.md; a 5,000-call batch once ran with no cap).

A replay file cannot hold such a batch (it is refused at load), so the real cycle is driven here
with the replay's own pieces and a script planner given the batch directly.
"""

import json
from pathlib import Path

import pytest

from agent.models import SideEffect, Step
from agent.planners.script import ScriptPlanner
from agent.policy.tool_specs import MAX_BATCH_CALLS
from agent.replay import isolated, load_scenario, setup_world
from agent.runtime.loop import run_cycle

ROOT = Path(__file__).resolve().parent.parent
STOP = {"tool": "stop_instance", "args": {"instance_id": "v-102", "reason": "idle"}}
READ = {"tool": "get_demand", "args": {}}


def _cycle(tmp_path, batch: list[dict]):
    data = json.loads((ROOT / "tests" / "scenarios" / "v2-observe-only-session.json").read_text())
    data["session"] = {"observe_only": False}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    sc, _ = load_scenario(path)
    with isolated(sc) as provider:
        setup_world(sc, provider)
        run = run_cycle("replay", planner=ScriptPlanner([{"parallel": batch}]))
    return run, provider


@pytest.mark.django_db(transaction=True)
def test_a_batch_of_17_is_refused_whole_and_nothing_runs(tmp_path):
    batch = [STOP] + [READ] * (MAX_BATCH_CALLS - 1) + [{"tool": "no_such_tool", "args": {}}]
    run, provider = _cycle(tmp_path, batch)
    calls = list(Step.objects.filter(run=run, kind="call", actor="agent").order_by("seq"))
    assert len(calls) == 17
    assert [(s.outcome, s.reason_code) for s in calls[:16]] == [("refused", "batch_too_large")] * 16
    assert (calls[16].outcome, calls[16].reason_code) == ("refused", "unknown_tool")  # earlier in the order
    assert "17 calls; at most 16" in calls[0].detail
    assert provider.request_counts()["stop"] == 0 and not SideEffect.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_duplicate_comes_before_batch_too_large(tmp_path):
    run, _ = _cycle(tmp_path, [STOP, STOP] + [READ] * MAX_BATCH_CALLS)
    codes = list(Step.objects.filter(run=run, kind="call", actor="agent").order_by("seq").values_list("reason_code", flat=True))
    assert codes[:3] == ["batch_too_large", "duplicate", "batch_too_large"]


@pytest.mark.django_db(transaction=True)
def test_a_batch_of_16_runs(tmp_path):
    run, provider = _cycle(tmp_path, [STOP] + [READ] * (MAX_BATCH_CALLS - 1))
    outcomes = set(Step.objects.filter(run=run, kind="call", actor="agent").values_list("outcome", flat=True))
    assert outcomes == {"executed"}
    assert provider.request_counts()["stop"] == 1
