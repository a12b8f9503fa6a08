""""Export as scenario": a real run's situation becomes a replay file (docs/contract.md
version 2) that ``manage.py replay`` loads and runs; a ``rules`` run replays the rules planner,
others their recorded calls; operator decisions are kept; secrets never leave."""

import json

import pytest

from agent.actions.settings import do_update_overrides
from agent.models import Approval, Run
from agent.planners.script import ScriptPlanner
from agent.replay.file_format import load_scenario
from agent.runtime.approvals import do_decide
from agent.runtime.loop import run_cycle
from fleet.models import Instance
from tests.console_support import IDLE, park_stops
from tests.scenario_world import entry, scenario_world
from tests.subprocs import manage

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def _download(client, run) -> dict:
    resp = client.get(f"/runs/{run.number}/scenario.json")
    assert resp.status_code == 200, resp.content[:300]
    assert resp["Content-Disposition"] == f'attachment; filename="run-{run.number}-scenario.json"'
    return json.loads(resp.content)


@pytest.mark.slow
def test_an_exported_run_loads_and_replays(client, alice, tmp_path):
    with scenario_world([entry("v-1"), entry("v-2")], IDLE):
        run, _ = park_stops("v-1")
        do_decide(Approval.objects.get(run=run), "approve", "user:alice", "idle past the dwell", user=alice)
        client.force_login(alice)
        assert 'id="export-scenario"' in client.get(f"/runs/{run.number}/").content.decode()
        data = _download(client, run)
    assert data["name"] == f"run-{run.number}" and data["planner"] == "script"
    assert {e["id"] for e in data["fleet"]} == {"v-1", "v-2"}
    assert data["demand"]["state"] == "ok" and data["demand"]["queued"] == 0
    assert data["steps"][0] == {"tool": "diagnose_instance", "args": {"instance_id": "v-1"}}
    assert data["steps"][1]["tool"] == "stop_instance" and data["steps"][1]["args"]["instance_id"] == "v-1"
    assert data["operator"]["decisions"] == [{"tool": "stop_instance", "args": {"instance_id": "v-1"},
                                              "decision": "approve", "comment": "idle past the dwell"}]
    assert data["policy"]["stop_instance"] == "approval"
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    load_scenario(path)  # the file format's own reader accepts it
    done = manage("replay", str(path), "--json", env={}, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    calls = [s for s in report["steps"] if s.get("tool")]
    assert [s["tool"] for s in calls[:2]] == ["diagnose_instance", "stop_instance"]
    assert calls[0]["outcome"] == "executed"
    assert calls[1]["parked"] is True and calls[1]["outcome"] in ("approved_executed", "refused")


def test_a_rules_run_exports_as_the_rules_planner_on_its_situation(client, alice, tmp_path):
    with scenario_world([entry("v-1", live=False)], {**IDLE, "workers_expected": 1, "workers_live": 0},
                        objectives={"target_proofs_hr": 40}):
        run = run_cycle("heartbeat")
        do_update_overrides({"stop_instance": "forbidden"}, {"max_dph": 3.0}, "user:alice", "after the incident")
        client.force_login(alice)
        data = _download(client, run)
    assert run.planner == "rules" and data["planner"] == "rules" and "steps" not in data
    # the policy and limits in force during the run, not the ones changed after it
    assert data["policy"]["stop_instance"] == "approval" and data["objectives"]["max_dph"] != 3.0
    assert data["objectives"]["target_proofs_hr"] == 40
    [v1] = data["fleet"]
    assert v1["worker"]["live"] is False and v1["actual_status"] == "running"
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(data))
    sc, _ = load_scenario(path)
    assert sc.planner == "rules"


def test_secrets_never_leave_in_the_file(client, alice):
    with scenario_world([entry("v-1"), entry("v-2")], IDLE):
        planner = ScriptPlanner([
            {"tool": "remember", "args": {"category": "note", "key": "k", "value": "api_key=sk-abcdefghijklmnop1234"}},
            {"text": 'done <verdict>{"action": false, "state_changed": false}</verdict>'}])
        run = run_cycle("operator", planner=planner)
        client.force_login(alice)
        text = client.get(f"/runs/{run.number}/scenario.json").content.decode()
    assert "sk-abcdefghijklmnop1234" not in text and "[REDACTED]" in text


def test_a_run_without_an_observation_cannot_be_exported(client, alice):
    from fleet.clock import clock

    run = Run.objects.create(number=77, trigger="chat", planner="", status="queued", started_at=clock.now())
    client.force_login(alice)
    resp = client.get(f"/runs/{run.number}/scenario.json")
    assert resp.status_code == 409 and "run 77 has no observation" in resp.content.decode()
    assert client.get("/runs/999/scenario.json").status_code == 404
    assert not Instance.objects.exists()
