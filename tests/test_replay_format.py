"""Scenario replay's file format, report shape and ``expect`` matching (docs/replay.md).

The scenario provider, demand source and SSH runner are exercised directly; the report builder
and matcher read hand-made Run/Step/Approval/Alert rows, exactly as a cycle would write them.
"""

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.replay import (
    ExpectSpec,
    ScenarioFileError,
    build_report,
    load_scenario,
    match_expect,
    public_report,
)
from fleet.clock import VirtualClock, use_clock
from fleet.demand.scenario import ScenarioDemandSource
from fleet.providers import ProviderError
from fleet.providers.scenario import FaultBook, ScenarioProvider

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 6, 9, 16, 50, tzinfo=UTC)

BASE = {
    "name": "format-check",
    "now": "2026-06-09T16:50:00Z",
    "fleet": [
        {
            "id": "v-101",
            "actual_status": "running",
            "age_min": 300,
            "gpu_name": "RTX 4090",
            "dph": 0.45,
            "worker": {"live": True, "unschedulable": False, "owned_tasks": 0},
            "ssh": {"reachable": True, "commands": {"nvidia-smi": {"rc": 0, "out": "short"},
                                                    "nvidia-smi -L": {"rc": 0, "out": "GPU 0: RTX 4090"}}},
        }
    ],
    "demand": {"state": "ok", "queued": 0, "running": 0, "workers_expected": 1, "workers_live": 1, "idle_min": 60},
    "planner": "script",
    "steps": [
        {"tool": "list_instances", "args": {}},
        {"parallel": [{"tool": "get_demand", "args": {}}, {"tool": "stop_instance", "args": {"instance_id": "v-101", "reason": "x"}}]},
    ],
}


def write(tmp_path, data, name="s.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def variant(**changes) -> dict:
    data = json.loads(json.dumps(BASE))
    data.update(changes)
    return data


# --- validation ------------------------------------------------------------------------------


def test_every_scenario_file_validates():
    for path in sorted((ROOT / "tests" / "scenarios").glob("*.json")):
        sc, raw = load_scenario(path)
        assert sc.name == raw["name"]


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d.update(colour="red"), "colour: unknown key"),
        (lambda d: d["fleet"][0]["worker"].update(alive=True), "fleet[0].worker.alive: unknown key"),
        (lambda d: d["steps"][1]["parallel"][0].update(raw="{}"), "steps[1].parallel[0].raw: unknown key"),
        (lambda d: d["demand"].update(idle_minutes=3), "demand.idle_minutes: unknown key"),
        (lambda d: d.update(expect={"executed": [], "halted": None}), "expect.halted: unknown key"),
        (lambda d: d.update(objectives={"target": 3}), "objectives: unknown objective 'target'"),
        (lambda d: d.update(policy={"stop_instance": "sometimes"}), "policy.stop_instance"),
        (lambda d: d.update(policy={"launch_instance:P9": "auto"}), "unknown policy key 'launch_instance:P9'"),
        (lambda d: d.update(provider_faults=[{"call": "list_instances", "times": 1, "error": "http_418"}]), "provider_faults[0].error"),
        (lambda d: d.update(provider_faults=[{"call": "teleport", "times": 1, "error": "http_500"}]), "unknown provider call 'teleport'"),
    ],
)
def test_a_bad_key_is_one_line_naming_the_file_and_the_path(tmp_path, mutate, where):
    data = variant()
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(ScenarioFileError) as exc:
        load_scenario(path)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(str(path))
    assert where in msg


@pytest.mark.parametrize(
    "decision, problem",
    [
        ({"step": 7, "decision": "approve"}, "operator.decisions[0]: step 7 does not exist"),
        ({"step": 1, "decision": "approve"}, "step 1 is a parallel batch; say which call"),
        ({"step": 1, "call": 2, "decision": "approve"}, "step 1 has 2 calls; call 2 does not exist"),
        ({"step": 0, "call": 1, "decision": "approve"}, "step 0 is a single call; call 1 does not exist"),
        ({"decision": "approve"}, "name the call by step"),
        ({"step": 0, "tool": "list_instances", "decision": "approve"}, "not both"),
        ({"step": 0, "decision": "maybe"}, "operator.decisions[0].decision"),
    ],
)
def test_a_bad_decision_reference_is_an_error(tmp_path, decision, problem):
    path = write(tmp_path, variant(operator={"default": "approve", "decisions": [decision]}))
    with pytest.raises(ScenarioFileError) as exc:
        load_scenario(path)
    assert problem in str(exc.value)


def test_structural_errors(tmp_path):
    cases = [
        (variant(steps=[{"tool": "get_demand", "text": "x", "parallel": [{"tool": "get_demand"}]}]), "a step is one of"),
        (variant(steps=[{"tool": "get_demand", "args": {}, "raw_arguments": "{}"}]), "either args or raw_arguments"),
        (variant(steps=[{}]), "a step needs tool, parallel, text or tool_result"),
        (variant(planner="rules"), "planner 'rules' takes no steps"),
        (variant(fleet=[BASE["fleet"][0], BASE["fleet"][0]]), "fleet ids repeat: v-101"),
    ]
    for data, problem in cases:
        with pytest.raises(ScenarioFileError) as exc:
            load_scenario(write(tmp_path, data))
        assert problem in str(exc.value), str(exc.value)
    bad = tmp_path / "x.json"
    bad.write_text("{nope")
    with pytest.raises(ScenarioFileError, match="not JSON"):
        load_scenario(bad)


def test_the_command_exits_2_with_one_line_on_stderr(tmp_path):
    path = write(tmp_path, variant(fleet=[{**BASE["fleet"][0], "colour": "red"}]))
    env = {k: v for k, v in os.environ.items() if k != "WARDEN_REPLAY_DB_DIR"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "replay", str(path)], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"replay: {path}: fleet[0].colour: unknown key"]
    assert proc.stdout == ""


# --- the scenario provider, demand source and SSH runner -------------------------------------


def test_faults_fail_the_next_requests_with_the_right_kind():
    fleet = [{"id": "v-1", "actual_status": "running", "gpu_name": "RTX 4090", "dph": 0.4}]
    faults = [
        {"call": "list_instances", "times": 2, "error": "http_429"},
        {"call": "list_instances", "times": 1, "error": "http_410"},
        {"call": "search_offers", "times": 1, "error": "empty_body"},
        {"call": "launch", "times": 1, "error": "http_500"},
        {"call": "stop_instance", "times": 1, "error": "html_body"},
        {"call": "destroy_instance", "times": 1, "error": "timeout"},
    ]
    p = ScenarioProvider(fleet, [{"id": "o-1", "gpu_name": "RTX 4090", "dph": 0.42}], faults)
    seen = []
    for _ in range(4):
        try:
            p.list_instances()
            seen.append("ok")
        except ProviderError as exc:
            seen.append((exc.kind, exc.code))
    assert seen == [("transient", "http_429"), ("transient", "http_429"), ("permanent", "http_410"), "ok"]
    with pytest.raises(ProviderError) as exc:
        p.search_offers(gpu_name="RTX 4090")
    assert (exc.value.kind, exc.value.code) == ("semantic", "empty_body")
    assert [o["id"] for o in p.search_offers(gpu_name="rtx 4090")] == ["o-1"]
    with pytest.raises(ProviderError) as exc:
        p.launch(gpu_name="RTX 4090")
    assert exc.value.kind == "transient"
    new = p.launch(gpu_name="RTX 4090")
    assert (new.external_id, new.status, new.dph) == ("s-1", "loading", 0.42)
    assert p.search_offers() == []  # the offer is rented
    with pytest.raises(ProviderError) as exc:
        p.stop("v-1")
    assert exc.value.kind == "semantic"
    p.stop("v-1")
    assert {i.external_id: i.status for i in p.list_instances()} == {"v-1": "stopped", "s-1": "loading"}
    clock = VirtualClock(NOW)
    with use_clock(clock), pytest.raises(ProviderError) as exc:
        p.destroy("v-1")
    assert (exc.value.kind, exc.value.code) == ("transient", "timeout")
    assert clock.now() == NOW + timedelta(seconds=p.timeout_s)  # the timeout took virtual time
    p.destroy("v-1")
    assert [i.external_id for i in p.list_instances()] == ["s-1"]
    with pytest.raises(ProviderError) as exc:
        p.stop("v-404")
    assert exc.value.code == "not_found"


def test_ssh_runner_answers_from_the_file():
    from fleet.diagnostics import collect
    from fleet.ssh import Unreachable

    fleet = [
        {"id": "v-1", "ssh": {"reachable": True, "commands": {"nvidia-smi": {"rc": 9, "out": "short"},
                                                              "nvidia-smi -L": {"rc": 0, "out": "GPU 0: RTX 4090"}}}},
        {"id": "v-2", "ssh": {"reachable": False, "commands": {}}},
        {"id": "v-3"},
    ]
    p = ScenarioProvider(fleet, [], [{"call": "ssh", "times": 1, "error": "ssh_timeout"}])
    clock = VirtualClock(NOW)
    with use_clock(clock), pytest.raises(Unreachable, match="timed out"):
        collect(p.command_runner(type("I", (), {"external_id": "v-1"})()))
    assert clock.now() > NOW
    evidence = collect(p.command_runner(type("I", (), {"external_id": "v-1"})()))
    assert evidence["nvidia-smi -L"] == {"rc": 0, "out": "GPU 0: RTX 4090"}  # longest key wins
    assert evidence["uptime"]["rc"] == 127 and "command not found" in evidence["uptime"]["out"]
    with pytest.raises(Unreachable, match="refused"):
        collect(p.command_runner(type("I", (), {"external_id": "v-2"})()))
    assert p.command_runner(type("I", (), {"external_id": "v-3"})()) is None
    with pytest.raises(ValueError, match="name the call 'ssh'"):
        FaultBook([{"call": "list_instances", "times": 1, "error": "ssh_refused"}])


def test_demand_source_reports_idle_since_and_workers():
    fleet = [
        {"id": "v-1", "worker": {"live": True, "unschedulable": False, "owned_tasks": 2}},
        {"id": "v-2", "worker": {"live": False, "unschedulable": True, "owned_tasks": 0}},
    ]
    src = ScenarioDemandSource(
        {"state": "ok", "queued": 0, "running": 2, "workers_expected": 2, "workers_live": 1, "idle_min": 45, "active": False},
        fleet,
    )
    with use_clock(VirtualClock(NOW)):
        r = src.read([])
    assert r.state == "ok" and r.queued == 0 and r.running == 2
    assert r.idle_since == NOW - timedelta(minutes=45)
    assert r.workers_cordoned == 1 and r.workers_dead == 0
    assert r.workers["v-1"].owned_tasks == 2 and r.workers["v-2"].unschedulable
    with use_clock(VirtualClock(NOW)):
        r = ScenarioDemandSource({"state": "ok", "queued": 3, "idle_min": None}, fleet).read([])
    assert r.idle_since is None

    from fleet.demand import read_demand, set_override

    set_override(ScenarioDemandSource({"state": "unknown"}, fleet))
    try:
        r = read_demand([])
    finally:
        set_override(None)
    assert r.state == "unknown" and r.queued is None  # unknown, never zero


# --- the report, from rows -------------------------------------------------------------------


def _run(number=1, **kw):
    from agent.models import Run

    return Run.objects.create(number=number, trigger="replay", planner="script", started_at=NOW, **kw)


def _step(run, seq, **kw):
    from agent.models import Step

    kw.setdefault("kind", "call")
    return Step.objects.create(run=run, seq=seq, created_at=NOW, **kw)


@pytest.mark.django_db
def test_report_is_built_from_the_rows():
    from agent.models import Approval
    from fleet.models import Alert

    run = _run(status="done", verdict_action=True, verdict_state_changed=False, final_report="did things")
    _step(run, 0, kind="observe", text="fleet 1")
    _step(run, 1, turn=0, tool="stop_instance", args={"instance_id": "v-101"}, outcome="refused",
          reason_code="demand_guard", detail="59 tasks queued")
    _step(run, 2, turn=1, batch=True, position=0, tool="diagnose_instance", args={"instance_id": "v-101"}, outcome="executed")
    parked = _step(run, 3, turn=1, batch=True, position=1, tool="launch_instance",
                   args={"gpu_name": "RTX 4090", "launch_priority": "P1"}, outcome="parked",
                   reason_code="approval_required", idempotency_key="k1")
    Approval.objects.create(run=run, step=parked, tool="launch_instance", args=parked.args, idempotency_key="k1",
                            status="rejected", created_at=NOW, expires_at=NOW)
    _step(run, 4, turn=2, tool="launch_instance", args=None, raw_arguments='{"gpu', outcome="refused", reason_code="invalid_args")
    _step(run, 5, turn=None, actor="monitor", tool="destroy_instance", args={"instance_id": "v-9"}, outcome="executed")
    _step(run, 6, turn=3, kind="text", text='ok <verdict>{"action": true, "state_changed": false}</verdict>')
    Alert.objects.create(kind="workers_dead", key="workers_dead", message="x", raised_at=NOW)

    report = public_report(build_report([run], name="r"))
    assert set(report) == {"name", "ok", "steps", "alerts", "halt", "verdict", "final_report", "mismatches"}
    steps = report["steps"]
    assert [e["i"] for e in steps] == [0, 1, 2, 3, 4]
    assert steps[0] == {"i": 0, "cycle": 0, "actor": "agent", "tool": "stop_instance", "args": {"instance_id": "v-101"},
                        "outcome": "refused", "reason": "demand_guard", "detail": "59 tasks queued"}
    assert [c["outcome"] for c in steps[1]["calls"]] == ["executed", "rejected"]
    assert steps[1]["calls"][1]["reason"] == "rejected"
    assert set(steps[1]["calls"][0]) == {"i", "cycle", "actor", "tool", "args", "outcome", "reason", "detail"}
    assert steps[1]["calls"][1]["parked"] is True  # ever parked for an operator
    assert steps[2]["args"] is None and steps[2]["reason"] == "invalid_args"
    assert steps[3]["actor"] == "monitor"
    assert steps[4]["outcome"] == "text"
    assert report["alerts"] == ["workers_dead"]
    assert report["verdict"] == {"action": True, "state_changed": False}
    assert report["halt"] is None and report["final_report"] == "did things"


@pytest.mark.django_db
def test_a_parked_call_dispatched_later_is_one_entry_with_its_final_outcome():
    from agent.models import Approval

    run = _run(status="halted", halt_reason="max_steps")
    parked = _step(run, 1, turn=0, tool="stop_instance", args={"instance_id": "v-1"}, outcome="parked",
                   reason_code="approval_required", idempotency_key="k9")
    Approval.objects.create(run=run, step=parked, tool="stop_instance", args=parked.args, idempotency_key="k9",
                            status="executed", created_at=NOW, expires_at=NOW)
    _step(run, 2, turn=0, tool="stop_instance", args={"instance_id": "v-1"}, outcome="approved_executed", idempotency_key="k9")
    voided = _step(run, 3, turn=1, tool="stop_instance", args={"instance_id": "v-2"}, outcome="parked",
                   reason_code="approval_required", idempotency_key="k10")
    Approval.objects.create(run=run, step=voided, tool="stop_instance", args=voided.args, idempotency_key="k10",
                            status="void", created_at=NOW, expires_at=NOW)
    waiting = _step(run, 4, turn=2, tool="destroy_instance", args={"instance_id": "v-3"}, outcome="parked",
                    reason_code="approval_required", idempotency_key="k11")
    Approval.objects.create(run=run, step=waiting, tool="destroy_instance", args=waiting.args, idempotency_key="k11",
                            status="waiting", created_at=NOW, expires_at=NOW)
    report = build_report([run])
    assert [(e["tool"], e["outcome"]) for e in report["steps"]] == [
        ("stop_instance", "approved_executed"), ("stop_instance", "refused"), ("destroy_instance", "parked")]
    assert report["halt"] == "max_steps"
    exp = ExpectSpec.model_validate({"parked": [{"tool": "stop_instance"}, {"tool": "stop_instance"}, {"tool": "destroy_instance"}],
                                     "executed": [{"tool": "stop_instance", "args": {"instance_id": "v-1"}}],
                                     "refused": [{"tool": "stop_instance"}], "halt": "max_steps"})
    assert match_expect(report, exp) == []


# --- matching expect -------------------------------------------------------------------------


def _report(*calls, halt=None, alerts=()):
    steps = []
    for n, (tool, outcome, reason, args) in enumerate(calls):
        steps.append({"i": n, "actor": "agent", "tool": tool, "args": args, "outcome": outcome, "reason": reason, "detail": ""})
    return {"name": "t", "ok": True, "steps": steps, "alerts": list(alerts), "halt": halt, "verdict": None,
            "final_report": "", "mismatches": []}


def test_matching_is_a_multiset_with_exact_counts_per_tool():
    report = _report(
        ("stop_instance", "refused", "demand_guard", {"instance_id": "v-1"}),
        ("stop_instance", "refused", "demand_guard", {"instance_id": "v-2"}),
        ("diagnose_instance", "executed", None, {"instance_id": "v-1"}),
        ("launch_instance", "approved_executed", None, {"gpu_name": "RTX 4090", "launch_priority": "P1"}),
        ("destroy_instance", "halted", "forbidden_tool", {"instance_id": "v-1"}),
        halt="forbidden_tool",
        alerts=["workers_dead", "provider_error"],
    )

    def check(**exp):
        return match_expect(report, ExpectSpec.model_validate(exp))

    assert check(refused=[{"tool": "stop_instance", "reason": "demand_guard"}] * 2 + [{"tool": "destroy_instance"}]) == []
    # one stop named, two happened: the count per named tool is exact
    assert check(refused=[{"tool": "stop_instance"}, {"tool": "destroy_instance"}]) == [
        "refused: expected 1 stop_instance, got 2: stop_instance {\"instance_id\": \"v-1\"} refused (demand_guard); "
        "stop_instance {\"instance_id\": \"v-2\"} refused (demand_guard)"]
    # a tool the list does not name is not counted
    assert check(executed=[{"tool": "launch_instance", "args": {"launch_priority": "P1"}}]) == []
    assert check(executed=[{"tool": "launch_instance", "args": {"launch_priority": "P0"}}]) == [
        'executed: no call matches {"args": {"launch_priority": "P0"}, "tool": "launch_instance"}']
    # args match on the keys given
    assert check(refused=[{"tool": "stop_instance", "args": {"instance_id": "v-2"}},
                          {"tool": "stop_instance", "args": {"instance_id": "v-1"}}]) == []
    assert check(refused=[{"tool": "stop_instance", "args": {"instance_id": "v-2"}},
                          {"tool": "stop_instance", "args": {"instance_id": "v-2"}}]) == [
        'refused: no call matches {"args": {"instance_id": "v-2"}, "tool": "stop_instance"}']
    # an empty list means none at all
    assert check(parked=[]) == []
    assert check(executed=[])[0].startswith("executed: expected none, got 2")
    assert check(never_executed=["stop_instance", "destroy_instance"]) == []
    assert check(never_executed=["diagnose_instance"]) == [
        'never_executed: diagnose_instance was dispatched: diagnose_instance {"instance_id": "v-1"} executed']
    assert check(halt="forbidden_tool") == []
    assert check(halt=None) == ["halt: expected None, got 'forbidden_tool'"]
    assert check() == []  # halt not given: not checked
    assert check(alerts=["workers_dead"]) == []
    assert check(alerts=["demand_unknown"]) == ["alerts: 'demand_unknown' was not raised (raised: workers_dead, provider_error)"]


def test_an_error_outcome_counts_as_dispatched_but_not_executed():
    report = _report(("search_offers", "error", "tool_timeout", {}))
    assert match_expect(report, ExpectSpec.model_validate({"executed": [], "refused": []})) == []
    assert match_expect(report, ExpectSpec.model_validate({"never_executed": ["search_offers"]}))


def test_values_that_would_make_an_expectation_meaningless_or_crash_are_file_errors(tmp_path):
    cases = [
        (variant(expect={"never_executed": ["stop_instanse"]}), "unknown tool 'stop_instanse'"),
        (variant(expect={"halt": "banana"}), "unknown halt code 'banana'"),
        (variant(expect={"alerts": ["bananas"]}), "unknown alert kind 'bananas'"),
        (variant(objectives={"max_steps": "abc"}), "objective 'max_steps'"),
        (variant(objectives={"max_instances": -5}), "objective 'max_instances'"),
        (variant(objectives={"launch_rate": 3}), "objective 'launch_rate'"),
        (variant(objectives={"target_proofs_hr": "fast"}), "objective 'target_proofs_hr'"),
        (variant(fleet=[{**BASE["fleet"][0], "provider": "SSH"}]), "fleet[0].provider"),
        (variant(fleet=[{**BASE["fleet"][0], "actual_status": "banana"}]), "fleet[0].actual_status"),
    ]
    for data, problem in cases:
        with pytest.raises(ScenarioFileError) as exc:
            load_scenario(write(tmp_path, data))
        assert problem in str(exc.value), str(exc.value)
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(ScenarioFileError, match="not UTF-8"):
        load_scenario(latin1)
