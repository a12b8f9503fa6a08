"""Idle enough to retire: one rule (``agent.policy.guards.idle_refusal``) for the guards and the ``rules``
planner. Its two copies disagreed on running tasks under an idle queue; settled as "running work is
never idle" (docs/contract.md "Reason codes", ``hold_off``). Played with the replay's real cycle."""

import json

import pytest

from agent.replay import load_scenario, run_scenario
from tests.test_guard_scenarios import SCENARIOS

STOP = {"tool": "stop_instance", "args": {"instance_id": "v-102", "reason": "idle past the dwell"}}


def _play(tmp_path, **changes) -> dict:
    data = json.loads((SCENARIOS / "guard-owned-tasks-near-miss.json").read_text())
    data["demand"].update(changes.pop("demand", {}))
    data.update(changes)
    data.pop("expect", None)
    if data.get("planner") == "rules":
        data.pop("steps")
    path = tmp_path / "idle.json"
    path.write_text(json.dumps(data))
    sc, raw = load_scenario(path)
    return run_scenario(sc, raw, path=str(path))


def _calls(report) -> list[dict]:
    from agent.replay import flat_calls

    return [c for c in flat_calls(report) if c["actor"] == "agent"]


@pytest.mark.django_db(transaction=True)
def test_an_idle_queue_lets_the_stop_run(tmp_path):
    idle = _calls(_play(tmp_path))
    assert [(c["tool"], c["outcome"]) for c in idle] == [("stop_instance", "executed")]  # the near miss runs


@pytest.mark.django_db(transaction=True)
def test_running_tasks_under_an_idle_queue_hold_a_stop_off(tmp_path):
    busy = _calls(_play(tmp_path, demand={"running": 1}))  # idle for 60 min by its idle_min, yet 1 task runs
    assert [(c["tool"], c["outcome"], c["reason"]) for c in busy] == [("stop_instance", "refused", "hold_off")]
    assert "1 running" in busy[0]["detail"]


@pytest.mark.django_db(transaction=True)
def test_the_rules_planner_retires_an_idle_fleet(tmp_path):
    idle = _calls(_play(tmp_path, planner="rules"))
    assert any(c["tool"] == "stop_instance" for c in idle)  # healthy, diagnosed, idle past the dwell: retired


@pytest.mark.django_db(transaction=True)
def test_the_rules_planner_proposes_no_retirement_the_guards_would_hold_off(tmp_path):
    busy = _calls(_play(tmp_path, planner="rules", demand={"running": 1}))
    assert not any(c["tool"] in ("stop_instance", "diagnose_instance") for c in busy)
