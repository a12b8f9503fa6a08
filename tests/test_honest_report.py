"""The honest final report, written by the runtime from the trace, and the entailment check."""

import pytest

from agent.runtime.report import entailment_flags
from tests.rails_support import BUSY_DEMAND, rails_world, verdict

pytestmark = pytest.mark.django_db

FINAL = "<verdict>{\"action\": false, \"state_changed\": false}</verdict>"


def test_report_lists_done_refused_failed_and_the_fleet():
    faults = [{"call": "search_offers", "times": 1, "error": "http_410"}]
    with rails_world(demand=BUSY_DEMAND, diagnosed=["v-1"], policy={"stop_instance": "auto"}, faults=faults) as w:
        run = w.cycle([
            {"tool": "list_instances", "args": {}},
            {"tool": "stop_instance", "args": {"instance_id": "v-1", "reason": "no demand"}},
            {"tool": "search_offers", "args": {"gpu_name": "RTX 4090"}},
            verdict(False, False),
        ])
    report = run.final_report
    assert report.startswith(f"Run {run.number} (test) — done")
    assert "Done: list_instances" in report
    assert "Refused: stop_instance(v-1) — demand_guard: 5 tasks queued" in report
    assert "Failed: search_offers — permanent error (http_410)" in report
    assert "Fleet now: v-1 running" in report
    assert "Remains" not in report  # near miss: the planner finished with a verdict


def test_a_halted_run_says_why_and_what_remains():
    with rails_world(policy={"destroy_instance": "forbidden"}) as w:
        run = w.cycle([{"tool": "destroy_instance", "args": {"instance_id": "v-1", "reason": "cleanup"}}, verdict()])
    report = run.final_report
    assert "halted by forbidden_tool" in report
    assert "Why it stopped: destroy_instance is forbidden by policy" in report
    assert "Done: nothing" in report
    assert "Remains: the planner did not finish" in report


def test_a_parked_call_is_reported_as_waiting():
    with rails_world(diagnosed=["v-1"]) as w:
        run = w.cycle([{"tool": "stop_instance", "args": {"instance_id": "v-1", "reason": "idle"}}])
    assert run.status == "parked"
    assert "Waiting for an operator: stop_instance(v-1)" in run.final_report


def test_a_run_whose_script_runs_out_still_gets_a_report():
    with rails_world() as w:
        run = w.cycle([{"tool": "get_demand", "args": {}}])
    assert run.status == "done" and run.verdict_action is None
    assert "Done: get_demand" in run.final_report and "Remains" in run.final_report


def test_invented_instance_id_and_number_are_flagged():
    with rails_world() as w:
        run = w.cycle([{"tool": "list_instances", "args": {}},
                       {"text": f"Destroyed v-404 and saved 37 dollars; v-1 keeps running. {FINAL}"}])
    assert "v-404" in run.entailment_flags and "37" in run.entailment_flags
    assert "v-1" not in run.entailment_flags  # near miss: v-1 is in the observation


def test_near_miss_an_answer_entailed_by_observations_is_not_flagged():
    with rails_world(demand=BUSY_DEMAND) as w:
        run = w.cycle([{"tool": "get_demand", "args": {}},
                       {"text": f"v-1 is running; 5 tasks queued, 1 running. {FINAL}"}])
    assert run.entailment_flags == []
    assert entailment_flags(run) == []


def test_numbers_from_the_operator_message_are_entailed():
    with rails_world() as w:
        run = w.cycle([{"text": f"Target noted: 120 proofs/hr. {FINAL}"}], trigger="chat",
                      message="please aim for 120 proofs/hr")
    assert run.entailment_flags == []


def test_the_report_is_shown_in_the_run_view(client, alice):
    with rails_world() as w:
        run = w.cycle([{"tool": "list_instances", "args": {}}, {"text": f"Relaunched v-909. {FINAL}"}])
    client.force_login(alice)
    html = client.get(f"/runs/{run.number}/").content.decode()
    assert "Done: list_instances" in html


def test_entailment_flags_are_shown_in_the_run_view(client, alice):
    with rails_world() as w:
        run = w.cycle([{"tool": "list_instances", "args": {}}, {"text": f"Relaunched v-909. {FINAL}"}])
    assert run.entailment_flags == ["909", "v-909"] or "v-909" in run.entailment_flags
    client.force_login(alice)
    html = client.get(f"/runs/{run.number}/").content.decode()
    assert 'id="entailment-flags"' in html and "<code>v-909</code>" in html
