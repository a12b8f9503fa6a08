"""Replay Version 2 (docs/replay.md): a timeline of cycles, records that disagree, faults after the
effect or after N requests, the observe-only session, backlog and proof_s, the new ``expect`` keys
and report fields.

The ``v2-*`` files in tests/scenarios/ run through :func:`agent.replay.run_scenario` (the real cycle
on the test database); their ``expect`` holds (tests/test_replay_cases.py replays them too) and the
tests here check what ``expect`` cannot say: which cycle wrote an entry, the database rows a sync
left, the rows a ``claimed`` history entry writes, and each piece alone.
"""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.replay import (
    ExpectSpec,
    ScenarioFileError,
    flat_calls,
    isolated,
    load_scenario,
    match_expect,
    public_report,
    run_scenario,
    setup_world,
)
from fleet.clock import VirtualClock, use_clock
from fleet.demand.scenario import ScenarioDemandSource
from fleet.providers import ProviderError
from fleet.providers.scenario import ScenarioProvider

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "tests" / "scenarios"
NOW = datetime(2026, 6, 9, 16, 50, tzinfo=UTC)


def _data(name: str) -> dict:
    return json.loads((SCENARIOS / f"{name}.json").read_text())


def _replay(tmp_path, data: dict) -> dict:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    sc, raw = load_scenario(path)
    return run_scenario(sc, raw, path=str(path))


def _fresh() -> None:
    """Empty the test database between two replays in one test (each replay starts from nothing)."""
    from django.core.management import call_command

    call_command("flush", interactive=False, verbosity=0)


def _ok(report: dict) -> dict:
    assert report["mismatches"] == [], json.dumps(public_report(report), indent=1, default=str)
    return report


# --- the timeline --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_later_heartbeat_acts_on_the_new_demand_and_its_entries_carry_the_cycle(tmp_path):
    report = _ok(_replay(tmp_path, _data("v2-timeline-demand-returns")))
    assert report["cycles"] == 2
    launches = [c for c in flat_calls(report) if c["tool"] == "launch_instance"]
    assert [(c["cycle"], c["outcome"]) for c in launches] == [(1, "executed")]
    assert report["provider_requests"]["launch"] == 1
    assert report["final_fleet"] == {"v-101": "running", "s-1": "loading"}
    from agent.models import Run

    runs = list(Run.objects.order_by("number"))
    assert len(runs) == 2 and runs[1].started_at == NOW + timedelta(minutes=10)  # the virtual clock moved
    assert "launch_instance" in report["final_report"]  # the last cycle's report


@pytest.mark.django_db(transaction=True)
def test_without_the_timeline_the_same_file_launches_nothing(tmp_path):
    data = _data("v2-timeline-demand-returns")
    del data["timeline"]
    data["expect"] = {"executed": [], "provider_requests": {"launch": 0}}
    report = _ok(_replay(tmp_path, data))
    assert report["cycles"] == 1


@pytest.mark.django_db(transaction=True)
def test_a_timeline_decision_dispatches_at_that_moment_without_a_cycle(tmp_path):
    report = _ok(_replay(tmp_path, _data("v2-timeline-approve-later")))
    assert report["cycles"] == 1  # run: none
    stop = next(c for c in flat_calls(report) if c["tool"] == "stop_instance")
    assert stop["outcome"] == "approved_executed" and stop["cycle"] == 0 and stop.get("_parked")
    from agent.models import Approval, SideEffect

    a = Approval.objects.get(tool="stop_instance")
    assert a.status == "executed" and a.decided_at == NOW + timedelta(minutes=5)
    assert SideEffect.objects.get(tool="stop_instance").claimed_at == NOW + timedelta(minutes=5)


@pytest.mark.django_db(transaction=True)
def test_an_approval_is_rechecked_by_the_guards_at_the_moment_it_is_given(tmp_path):
    report = _ok(_replay(tmp_path, _data("v2-timeline-approval-refused-at-dispatch")))
    stop = next(c for c in flat_calls(report) if c["tool"] == "stop_instance")
    assert (stop["outcome"], stop["reason"]) == ("refused", "demand_guard")
    from agent.models import Approval

    assert Approval.objects.get(tool="stop_instance").status == "void"


@pytest.mark.django_db(transaction=True)
def test_a_top_level_default_answers_calls_parked_in_later_cycles(tmp_path):
    data = _data("v2-timeline-demand-returns")
    data["policy"] = {"launch_instance": "approval"}
    data["operator"] = {"default": "approve"}
    data["expect"] = {"parked": [{"tool": "launch_instance"}],
                      "executed": [{"tool": "launch_instance", "outcome": "approved_executed"}]}
    report = _ok(_replay(tmp_path, data))
    assert [c["cycle"] for c in flat_calls(report) if c["tool"] == "launch_instance"] == [1]


@pytest.mark.django_db(transaction=True)
def test_naming_tool_in_policy_replaces_its_priority_defaults(tmp_path):
    # "launch_instance": "approval" also covers :P0, which the product's defaults make auto
    data = _data("v2-timeline-demand-returns")
    data["policy"] = {"launch_instance": "approval"}
    data["timeline"][0]["demand"]["workers_live"] = 0  # a P0 launch (no worker live)
    data["timeline"][0]["fleet"] = [{"id": "v-101", "worker": {"live": False, "unschedulable": False, "owned_tasks": 0}}]
    # the dead worker is not capacity: the sizing's two workers are two P0 launches, both parked
    data["expect"] = {"parked": [{"tool": "launch_instance", "args": {"launch_priority": "P0"}}] * 2,
                      "never_executed": ["launch_instance"]}
    _ok(_replay(tmp_path, data))


@pytest.mark.django_db(transaction=True)
def test_a_timeline_decision_naming_a_call_never_parked_is_a_file_error(tmp_path):
    data = _data("v2-timeline-approve-later")
    data["timeline"][0]["operator"]["decisions"][0]["tool"] = "reboot_instance"
    with pytest.raises(ScenarioFileError, match=r"timeline\[0\].operator.decisions\[0\]: names reboot_instance, which was never parked"):
        _replay(tmp_path, data)


@pytest.mark.django_db(transaction=True)
def test_a_timeline_decision_fitting_several_different_calls_must_say_which(tmp_path):
    data = _data("v2-timeline-approve-later")
    data["steps"] = [{"parallel": [{"tool": "stop_instance", "args": {"instance_id": "v-101", "reason": "idle"}},
                                   {"tool": "stop_instance", "args": {"instance_id": "v-102", "reason": "idle"}}]}]
    data["timeline"][0]["operator"]["decisions"][0].pop("args")
    data["objectives"]["retire_budget_pct"] = 100  # two stops of two workers wait: the budget's default allows one
    data.pop("expect")
    with pytest.raises(ScenarioFileError, match="2 stop_instance calls with different arguments wait; add args keys"):
        _replay(tmp_path, data)
    _fresh()
    data["timeline"][0]["operator"]["decisions"][0]["args"] = {"instance_id": "v-101"}
    data["expect"] = {"executed": [{"tool": "stop_instance", "args": {"instance_id": "v-101"}}],
                      "parked": [{"tool": "stop_instance"}, {"tool": "stop_instance"}],
                      "final_fleet": {"v-101": "stopped", "v-102": "running"}}
    _ok(_replay(tmp_path, data))


@pytest.mark.django_db(transaction=True)
def test_objectives_change_at_a_moment_as_an_operator_sets_them(tmp_path):
    data = _data("v2-timeline-demand-returns")
    data["timeline"][0]["objectives"] = {"max_instances": 1, "offline_grace_min": 45}
    data["expect"] = {"executed": [], "provider_requests": {"launch": 0}}
    _ok(_replay(tmp_path, data))
    from agent.models import SessionState

    objectives = SessionState.get().objectives
    assert objectives["max_instances"] == 1 and objectives["offline_grace_min"] == 45
    assert objectives["max_dph"] == 6.0  # the rest stays


# --- fleet records that disagree ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_gone_and_new_instances_reach_the_database_through_the_next_sync(tmp_path):
    report = _ok(_replay(tmp_path, _data("v2-fleet-gone-and-new")))
    from fleet.models import Instance

    gone = Instance.objects.get(external_id="v-102")
    assert gone.killed_at == NOW + timedelta(minutes=15) and gone.killed_by == "provider"
    new = Instance.objects.get(external_id="v-103")
    assert new.killed_at is None and new.status == "running"
    assert "v-102" not in report["final_fleet"]  # not listed: "absent" to expect


@pytest.mark.django_db(transaction=True)
def test_known_false_has_no_row_until_adopted_and_listed_false_has_a_row_the_provider_lacks(tmp_path):
    from fleet.models import Instance

    sc, _ = load_scenario(SCENARIOS / "v2-known-and-listed.json")
    with isolated(sc) as provider:
        setup_world(sc, provider)
        assert set(Instance.objects.values_list("external_id", flat=True)) == {"v-202"}
        assert set(provider.statuses()) == {"v-201"}
    _fresh()
    _ok(_replay(tmp_path, _data("v2-known-and-listed")))
    assert Instance.objects.get(external_id="v-201").killed_at is None  # adopted by the sync
    assert Instance.objects.get(external_id="v-202").kill_reason == "vanished"


def test_an_entry_neither_known_nor_listed_is_a_file_error(tmp_path):
    data = _data("v2-known-and-listed")
    data["fleet"][0]["listed"] = False
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ScenarioFileError, match=r"fleet\[0\]: an entry with known: false and listed: false exists nowhere"):
        load_scenario(path)


@pytest.mark.django_db
def test_history_claimed_leaves_an_open_claim_and_done_destroy_records_the_request(tmp_path):
    from agent.models import SideEffect
    from fleet.models import Instance

    data = _data("v2-known-and-listed")
    data["fleet"] = [data["fleet"][1] | {"listed": True, "id": "v-1"}, data["fleet"][1] | {"listed": True, "id": "v-2"}]
    data["history"] = [{"min_ago": 2880, "tool": "launch_instance", "state": "claimed"},
                       {"min_ago": 2880, "tool": "reboot_instance", "instance": "v-1", "state": "claimed"},
                       {"min_ago": 12, "tool": "destroy_instance", "instance": "v-2"}]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    sc, _ = load_scenario(path)
    with isolated(sc) as provider:
        setup_world(sc, provider)
    claims = {s.tool: s for s in SideEffect.objects.all()}
    for tool in ("launch_instance", "reboot_instance"):
        assert claims[tool].status == "claimed" and claims[tool].finished_at is None
        assert claims[tool].claimed_at == NOW - timedelta(minutes=2880)
    assert claims["reboot_instance"].instance_ref == "v-1"
    assert claims["destroy_instance"].status == "done"
    assert Instance.objects.get(external_id="v-2").destroy_requested_at == NOW - timedelta(minutes=12)
    assert Instance.objects.get(external_id="v-1").destroy_requested_at is None


# --- session, faults, demand ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_observe_only_session_refuses_side_effects(tmp_path):
    _ok(_replay(tmp_path, _data("v2-observe-only-session")))
    from agent.models import SessionState

    assert SessionState.get().observe_only is True
    data = _data("v2-observe-only-session")
    _fresh()
    data["session"] = {"observe_only": False}
    data["expect"] = {"executed": [{"tool": "list_instances"}, {"tool": "stop_instance"}], "provider_requests": {"stop": 1}}
    _ok(_replay(tmp_path, data))


@pytest.mark.django_db(transaction=True)
def test_a_fault_after_the_effect_reports_an_error_while_the_effect_stands(tmp_path):
    report = _ok(_replay(tmp_path, _data("v2-fault-after-effect")))
    stop = next(c for c in flat_calls(report) if c["tool"] == "stop_instance")
    assert stop["outcome"] == "error" and "after it took effect" in stop["detail"]


def test_after_effect_launch_rents_the_machine_then_times_out():
    p = ScenarioProvider([], [{"id": "o-1", "gpu_name": "RTX 4090", "dph": 0.42}],
                         [{"call": "launch", "times": 1, "error": "timeout", "after_effect": True}])
    clock = VirtualClock(NOW)
    with use_clock(clock), pytest.raises(ProviderError) as exc:
        p.launch(gpu_name="RTX 4090", label="warden-abc")
    assert exc.value.code == "timeout" and clock.now() == NOW + timedelta(seconds=p.timeout_s)
    listed = p.list_instances()
    assert [(i.external_id, i.status, i.label) for i in listed] == [("s-1", "loading", "warden-abc")]
    assert p.request_counts()["launch"] == 1 and p.request_counts()["list"] == 1


def test_skip_lets_the_first_requests_pass_then_the_fault_fires():
    p = ScenarioProvider([{"id": "v-1"}], [], [{"call": "list_instances", "times": 2, "skip": 2, "error": "http_500"}])
    seen = []
    for _ in range(5):
        try:
            p.list_instances()
            seen.append("ok")
        except ProviderError as exc:
            seen.append(exc.code)
    assert seen == ["ok", "ok", "http_500", "http_500", "ok"]
    assert p.request_counts()["list"] == 5  # faulted requests count too


@pytest.mark.parametrize("fault, problem", [
    ({"call": "list_instances", "error": "http_500", "after_effect": True}, "after_effect applies to launch"),
    ({"call": "stop", "error": "http_500", "skip": -1}, r"provider_faults\[0\]\.skip"),
    ({"call": "stop", "error": "http_500", "times": 0}, r"provider_faults\[0\]\.times"),
])
def test_bad_fault_options_are_file_errors(tmp_path, fault, problem):
    data = _data("v2-fault-skip")
    data["provider_faults"] = [fault]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ScenarioFileError, match=problem):
        load_scenario(path)


def test_backlog_and_proof_s_reach_the_demand_reading():
    src = ScenarioDemandSource({"state": "ok", "queued": 0, "running": 0, "backlog": 40, "proof_s": 95.5}, [])
    with use_clock(VirtualClock(NOW)):
        r = src.read([])
    assert (r.backlog, r.proof_s) == (40, 95.5)
    with use_clock(VirtualClock(NOW)):
        r = ScenarioDemandSource({"state": "ok", "queued": 3}, []).read([])
    assert (r.backlog, r.proof_s) == (None, None)  # not measured: None, never 0


# --- expect and the report ------------------------------------------------------------------------


def _report(**kw):
    base = {"name": "t", "ok": True, "steps": [], "alerts": ["workers_dead"], "halt": None, "verdict": None,
            "final_report": "Run 4 — done. Did: Launch_instance.", "mismatches": [],
            "final_fleet": {"v-1": "running", "s-1": "loading"},
            "provider_requests": {"list": 2, "search": 0, "launch": 1, "stop": 0, "resume": 0, "reboot": 0, "destroy": 0}}
    base.update(kw)
    return base


def _check(report, **exp):
    return match_expect(report, ExpectSpec.model_validate(exp))


def test_the_version_2_expect_keys():
    r = _report()
    assert _check(r, alerts_any=["demand_unknown", "workers_dead"], no_alerts=["demand_unknown"]) == []
    assert _check(r, alerts_any=["demand_unknown", "stale_claim"]) == [
        "alerts_any: none of demand_unknown, stale_claim was raised (raised: workers_dead)"]
    assert _check(r, no_alerts=["workers_dead"]) == ["no_alerts: 'workers_dead' was raised"]
    assert _check(r, report_contains=["did: launch"], report_lacks=["destroy"]) == []  # case-insensitive
    assert _check(r, report_contains=["resumed"], report_lacks=["LAUNCH"]) == [
        "report_contains: 'resumed' is not in the final report", "report_lacks: 'LAUNCH' is in the final report"]
    assert _check(r, final_fleet={"v-1": "running", "v-9": "absent", "s-1": "loading"}) == []
    assert _check(r, final_fleet={"v-1": "absent", "s-1": "running"}) == [
        "final_fleet: v-1 is running, expected absent", "final_fleet: s-1 is loading, expected running"]
    assert _check(r, provider_requests={"launch": 1, "destroy": 0}) == []
    assert _check(r, provider_requests={"launch": 0}) == ["provider_requests: 1 launch request(s), expected 0"]


def test_a_refused_reason_may_be_a_list_and_outcome_and_errored_match():
    calls = [{"i": 0, "cycle": 0, "actor": "agent", "tool": "launch_instance", "args": {}, "outcome": "refused",
              "reason": "no_longer_needed", "detail": ""},
             {"i": 1, "cycle": 1, "actor": "agent", "tool": "stop_instance", "args": {"instance_id": "v-1"},
              "outcome": "error", "reason": "outcome_unknown", "detail": ""}]
    r = _report(steps=calls)
    assert _check(r, refused=[{"tool": "launch_instance", "reason": ["instance_cap", "no_longer_needed"]}]) == []
    assert _check(r, refused=[{"tool": "launch_instance", "reason": ["instance_cap"]}])[0].startswith("refused: no call matches")
    assert _check(r, errored=[{"tool": "stop_instance", "reason": "outcome_unknown", "outcome": "error"}]) == []
    assert _check(r, errored=[]) != []


def test_unknown_expect_values_are_file_errors(tmp_path):
    for expect, problem in [({"final_fleet": {"v-1": "sleeping"}}, "expect.final_fleet.v-1"),
                            ({"provider_requests": {"teleport": 1}}, "expect.provider_requests"),
                            ({"no_alerts": ["bananas"]}, "unknown alert kind 'bananas'"),
                            ({"alerts_any": ["x"]}, "unknown alert kind 'x'")]:
        data = _data("v2-fault-skip")
        data["expect"] = expect
        path = tmp_path / "s.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ScenarioFileError, match=problem):
            load_scenario(path)


def test_the_json_report_carries_cycles_final_fleet_and_provider_requests():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "WARDEN_REPLAY_DB_DIR"}
    proc = subprocess.run([sys.executable, str(ROOT / "manage.py"), "replay", str(SCENARIOS / "v2-timeline-demand-returns.json"),
                           "--json"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["cycles"] == 2
    assert report["final_fleet"] == {"v-101": "running", "s-1": "loading"}
    assert report["provider_requests"] == {"list": 2, "search": 1, "launch": 1, "stop": 0, "resume": 0, "reboot": 0,
                                           "destroy": 0}
    assert all("cycle" in e for e in report["steps"])


def test_file_policy_expands_a_tool_over_its_priorities_but_not_the_monitor(monkeypatch):
    from agent.policy import table as policy
    from agent.replay import file_policy

    monkeypatch.setitem(policy.DEFAULT_POLICY, "destroy_instance:monitor", "auto")
    out = file_policy({"launch_instance": "approval", "destroy_instance": "approval", "launch_instance:P1": "auto"})
    assert out["launch_instance:P0"] == "approval" and out["launch_instance:P1"] == "auto"
    assert "destroy_instance:monitor" not in out  # the monitor keeps its own default
    assert file_policy({"destroy_instance:monitor": "approval"}) == {"destroy_instance:monitor": "approval"}


def test_policy_keys_for_the_monitor_are_accepted_and_others_are_not(tmp_path):
    data = _data("v2-fault-skip")
    data["policy"] = {"destroy_instance:monitor": "approval", "stop_instance:monitor": "forbidden"}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    assert load_scenario(path)[0].policy["destroy_instance:monitor"] == "approval"
    for key in ("stop_instance:P1", "destroy_instance:robot", "teleport:monitor"):
        data["policy"] = {key: "auto"}
        path.write_text(json.dumps(data))
        with pytest.raises(ScenarioFileError, match=f"unknown policy key '{key}'"):
            load_scenario(path)
