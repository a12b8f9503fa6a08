"""The run page: halt reason, the honest report, entailment flags, each step's reason code."""

import pytest

from agent.planners.script import ScriptPlanner
from agent.runtime.loop import run_cycle
from tests.console_support import BUSY, IDLE
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db


def test_it_shows_the_halt_reason_and_the_honest_report(client, alice):
    script = ScriptPlanner([{"text": "thinking"}] * 6)
    with scenario_world([entry("v-1")], IDLE):
        run = run_cycle("operator", planner=script)
    run.refresh_from_db()
    assert run.halt_reason == "text_only_spiral"
    client.force_login(alice)
    html = client.get(f"/runs/{run.number}/").content.decode()
    assert 'id="halt"' in html and "Halted: <code class=\"reason\">text_only_spiral</code>" in html
    assert run.halt_detail in html
    assert 'id="final-report"' in html and run.final_report.splitlines()[0][:40] in html


def test_it_shows_each_steps_reason_code(client, alice):
    script = ScriptPlanner([
        {"tool": "stop_instance", "args": {"instance_id": "v-1", "reason": "no demand"}},
        {"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "reason": "more"}},
        {"text": 'done <verdict>{"action": false, "state_changed": false}</verdict>'},
    ])
    with scenario_world([entry("v-1")], BUSY):
        run = run_cycle("operator", planner=script)
    client.force_login(alice)
    html = client.get(f"/runs/{run.number}/").content.decode()
    assert '<code class="reason">demand_guard</code>' in html
    assert '<code class="reason">priority_required</code>' in html
    assert "7 tasks queued" in html


def test_it_flags_names_not_found_in_any_observation(client, alice):
    script = ScriptPlanner([
        {"tool": "list_instances", "args": {}},
        {"text": 'Stopped v-999 and saved $42.17/hr. <verdict>{"action": true, "state_changed": true}</verdict>'},
    ])
    with scenario_world([entry("v-1")], IDLE):
        run = run_cycle("operator", planner=script)
    run.refresh_from_db()
    assert "v-999" in run.entailment_flags
    client.force_login(alice)
    html = client.get(f"/runs/{run.number}/").content.decode()
    assert 'id="entailment-flags"' in html and "Claims not found in any observation" in html
    assert '<code>v-999</code> in “Stopped v-999 and saved $42.17/hr”' in html  # each flag with its claim
    assert 'id="final-answer"' in html


def test_a_clean_run_has_no_flags_or_halt(client, alice):
    with scenario_world([entry("v-1")], IDLE):
        run = run_cycle("operator", planner=ScriptPlanner([{"text": 'ok <verdict>{"action": false, "state_changed": false}</verdict>'}]))
    client.force_login(alice)
    html = client.get(f"/runs/{run.number}/").content.decode()
    assert 'id="entailment-flags"' not in html and 'id="halt"' not in html
