"""Trace scoring (``agent.replay.scoring``, ``manage.py score_traces``, the traces page) over real runs."""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from agent.models import Approval
from agent.replay.scoring import score_traces
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run
from tests.rails_support import rails_world, verdict

pytestmark = pytest.mark.django_db

STOP = {"tool": "stop_instance", "args": {"instance_id": "v-1", "reason": "idle"}}


@pytest.fixture
def traces(alice):
    """Five real runs: forbidden, forged, auto stop, approved stop, and an invented final answer."""
    with rails_world(diagnosed=["v-1", "v-2"], policy={"destroy_instance": "forbidden"},
                     fleet=None) as w:
        forbidden = w.cycle([{"tool": "list_instances", "args": {}},
                             {"tool": "destroy_instance", "args": {"instance_id": "v-1", "reason": "x"}}])
        forged = w.cycle([{"tool": "get_demand", "tool_result": "ok: true {\"queued\": 0}"}])
        parked = w.cycle([STOP, verdict(True, True)])
        do_decide(Approval.objects.get(run=parked), "approve", "user:alice", user=alice)
        resume_run(parked, planner=_script([STOP, verdict(True, True)]))
        invented = w.cycle([{"tool": "get_demand", "args": {}},
                            {"text": "Relaunched v-777; 41 proofs/hr now. <verdict>{\"action\": false, \"state_changed\": false}</verdict>"}])
    # the approved stop of v-1 above is in the scale-down window: the budget is opened for this one
    with rails_world(diagnosed=["v-1"], policy={"stop_instance": "auto"}, limits={"retire_budget_pct": 100}) as w:
        auto = w.cycle([STOP, verdict(True, True)])
    for r in (forbidden, forged, parked, invented, auto):
        r.refresh_from_db()
    return {"forbidden": forbidden, "forged": forged, "parked": parked, "invented": invented, "auto": auto}


def _script(steps):
    from agent.planners.script import ScriptPlanner

    return ScriptPlanner(steps)


def test_score_counts_halts_attempts_approvals_and_flags(traces):
    assert traces["parked"].status == "done"
    s = score_traces()
    assert s["runs"] == 5
    assert s["halt_reasons"] == {"forbidden_tool": 1, "forged_observation": 1}
    assert s["forbidden"]["attempts"] == 1 and s["forbidden"]["runs"] == 1
    assert s["forged"]["attempts"] == 1 and s["forged"]["runs"] == 1
    assert s["forbidden"]["rate"] == pytest.approx(1 / s["calls"], abs=1e-4)
    rows = {(r["tool"], r["actor"]): r for r in s["side_effects"]}
    assert rows[("stop_instance", "agent")] == {"tool": "stop_instance", "actor": "agent",
                                                 "with_approval": 1, "without_approval": 1}
    assert s["side_effects_with_approval"] == 1 and s["side_effects_without_approval"] == 1
    assert s["approvals"] == {"executed": 1}
    assert s["entailment"]["flagged_runs"] == 1
    (flag,) = s["entailment"]["newest"]
    assert flag["run"] == traces["invented"].number and "v-777" in flag["flags"] and "41" in flag["flags"]
    hist = {row["turns"]: row["runs"] for row in s["step_histogram"]}
    assert sum(hist.values()) == 5
    assert hist["2"] == 4  # forbidden (2 turns), parked (stop, verdict), invented, auto
    assert hist["1"] == 1  # forged: halted on its first turn


def test_last_limits_to_the_newest_runs(traces):
    s = score_traces(last=1)
    assert s["runs"] == 1 and s["side_effects_without_approval"] == 1 and s["halt_reasons"] == {}


def test_query_count_is_constant_in_the_number_of_runs(traces):
    with CaptureQueriesContext(connection) as few:
        score_traces()
    with rails_world() as w:
        for _ in range(6):
            w.cycle([{"tool": "search_offers", "args": {}}, {"tool": "frobnicate", "args": {}}, verdict()])
    with CaptureQueriesContext(connection) as many:
        s = score_traces()
    assert s["runs"] == 11
    assert len(many.captured_queries) == len(few.captured_queries) <= 7


def test_command_prints_tables_and_json(traces):
    out = StringIO()
    call_command("score_traces", stdout=out)
    text = out.getvalue()
    assert "turns per run" in text and "forbidden_tool" in text and "forged_observation" in text
    assert "stop_instance        agent" in text
    line = next(ln for ln in text.splitlines() if ln.startswith(f"  run {traces['invented'].number}: "))
    assert "41" in line and "v-777" in line
    out = StringIO()
    call_command("score_traces", "--json", "--last", "2", stdout=out)
    data = json.loads(out.getvalue())
    assert data["runs"] == 2 and set(data) >= {"step_histogram", "halt_reasons", "forbidden", "forged",
                                               "side_effects", "entailment"}


def test_empty_database_scores_zero():
    s = score_traces()
    assert s["runs"] == 0 and s["calls"] == 0 and s["forbidden"]["rate"] == 0.0
    out = StringIO()
    call_command("score_traces", stdout=out)
    assert "runs scored: 0" in out.getvalue()


def test_the_page_renders_for_a_viewer_and_needs_login(traces, bob):
    from django.contrib.auth.models import AnonymousUser

    from console.views.traces import traces as view

    rf = RequestFactory()
    req = rf.get("/traces/")
    req.user = AnonymousUser()
    assert view(req).status_code == 302
    req = rf.get("/traces/", {"last": "10"})
    req.user = bob
    resp = view(req)
    html = resp.content.decode()
    assert resp.status_code == 200
    assert 'id="step-histogram"' in html and "forbidden_tool" in html and "v-777" in html
    assert "<h1>Trace scoring</h1>" in html


@pytest.mark.parametrize("args, problem", [
    (["--last", str(10**23)], "--last must be between 1 and 1000000000"),
    (["--last", "0"], "--last must be between 1 and 1000000000"),
    (["--epoch", str(10**23)], "--epoch must be between 0 and 1000000000"),
])
def test_an_out_of_range_count_is_a_clean_error(args, problem):
    # 10**23 once reached the database and came back as an IntegrityError traceback
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=problem):
        call_command("score_traces", *args, stdout=StringIO())
