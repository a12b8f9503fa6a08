"""Observe-only: one switch on the dashboard; the agent still observes and proposes, nothing
executes, and the run page shows the refused side effects as "would have done"."""

import pytest

from agent.models import SessionState
from agent.planners.script import ScriptPlanner
from agent.runtime.loop import run_cycle
from fleet.models import AuditLog
from tests.console_support import HX, IDLE, stop_script
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db


def test_the_dashboard_has_the_switch(client, alice):
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert 'id="observe-only-toggle"' in html and "Switch to observe-only" in html
    assert 'hx-confirm="Switch to observe-only?' in html


def test_an_operator_switches_it_on_and_off(client, alice):
    client.force_login(alice)
    resp = client.post("/actions/observe-only/", {"on": "1", "reason": "provider incident"}, headers=HX)
    assert resp.status_code == 200
    assert "nothing executes" in resp.content.decode() and "Let the agent act" in resp.content.decode()
    assert "settings-changed" in resp["HX-Trigger"]
    assert SessionState.get().observe_only is True
    row = AuditLog.objects.get(verb="set_observe_only")
    assert (row.actor, row.reason, row.after) == ("user:alice", "provider incident", {"observe_only": True})
    assert "badge warn\">observe-only" in client.get("/?partial=cards", headers=HX).content.decode()
    assert client.post("/actions/observe-only/", {}).status_code == 302
    assert SessionState.get().observe_only is False


def test_in_observe_only_the_agent_proposes_and_nothing_executes(client, alice):
    client.force_login(alice)
    client.post("/actions/observe-only/", {"on": "1"})
    script = ScriptPlanner(stop_script("v-1") + [{"tool": "reboot_instance", "args": {"instance_id": "v-2", "reason": "wedged"}}])
    with scenario_world([entry("v-1"), entry("v-2")], IDLE, policy={"stop_instance": "auto", "reboot_instance": "auto"}) as provider:
        SessionState.objects.filter(pk=1).update(observe_only=True)  # scenario_world saved the anchor
        run = run_cycle("operator", planner=script)
    calls = [c for c, _ in provider.calls]
    assert "stop_instance" not in calls and "reboot_instance" not in calls
    steps = {s.tool: s for s in run.steps.filter(kind="call")}
    assert steps["diagnose_instance"].outcome == "executed"  # observing still happens
    assert (steps["stop_instance"].outcome, steps["stop_instance"].reason_code) == ("refused", "observe_only")
    html = client.get(f"/runs/{run.number}/").content.decode()
    assert html.count("would have done") == 2
    assert "observe-only: 2 calls below would have run; nothing executed" in html


def test_viewers_cannot_flip_it(client, bob):
    client.force_login(bob)
    assert 'id="observe-only-toggle" disabled' in client.get("/").content.decode()
    assert client.post("/actions/observe-only/", {"on": "1"}).status_code == 403
    assert SessionState.get().observe_only is False
