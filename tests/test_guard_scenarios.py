# Over 500 lines on purpose: one scenario and near miss per guard code, so coverage is checked in one place.
"""The structural guards and approvals, replayed: one scenario per reason code and a near miss for each.

Every ``guard-*``, ``order-*``, ``terminal-*`` and ``rules-*`` file in tests/scenarios/ runs through
:func:`agent.replay.run_scenario` (the real cycle on the test database, the scenario provider and a
virtual clock) and must meet its ``expect``. On top of that:

- ``guard-<code>.json`` must carry ``<code>`` in its report and ``guard-<code>-near-miss.json`` must not
  (codes of docs/replay.md "Reason codes": the guards and the approval outcomes);
- ``order-<a>-beats-<b>.json``: the first call reports ``a``, ``a`` comes before ``b`` in the order
  docs/replay.md lists, and the same file with ``a``'s condition removed reports ``b`` (both applied);
- what the file format cannot express is driven here with the replay's own pieces
  (:func:`agent.replay.isolated`, :func:`agent.replay.setup_world`, ``run_cycle``): ``in_flight`` (a
  side effect claimed and never finished, seeded as a row), ``expired`` (the virtual clock moved past
  the approval's expiry, then the next cycle), and ``duplicate`` across two cycles.
"""

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from agent.replay import (
    ExpectSpec,
    build_report,
    flat_calls,
    isolated,
    load_scenario,
    make_planner,
    match_expect,
    public_report,
    run_scenario,
    setup_world,
)
from tests.test_replay_cases import ROOT, _codes_in

SCENARIOS = ROOT / "tests" / "scenarios"
#: the project's own statement of the refusal order (docs/replay.md, between the refusal-order marks)
CONTRACT = ROOT / "docs" / "replay.md"
MINE = sorted(p for p in SCENARIOS.glob("*.json") if p.stem.split("-")[0] in {"guard", "order", "terminal", "rules"})

#: section 3 of the issue: the guards' codes and the approval outcomes
GUARD_CODES = [
    "owned_host",
    "demand_guard",
    "owned_tasks",
    "hold_off",
    "launch_pending",
    "instance_cap",
    "budget_cap",
    "priority_required",
    "diagnosis_required",
    "in_flight",
    "duplicate",
    "target_gone",
    "rejected_recently",
    "no_longer_needed",
    "approval_required",
    "rejected",
    "expired",
    # Version 3: the scale-down budget
    "disruption_budget",
]
#: codes whose refused (or both) scenario the file format cannot express; driven by tests below
NO_REFUSED_FILE = {"in_flight", "expired"}
NO_NEAR_MISS_FILE = {"expired"}

VERDICT = {"text": 'Done. <verdict>{"action": false, "state_changed": false}</verdict>'}


def _stem(code: str) -> str:
    return "guard-" + code.replace("_", "-")


def _code_of(path: Path) -> str | None:
    """The reason code a ``guard-<code>[-near-miss]`` file is about, else None."""
    stem = path.stem.removesuffix("-near-miss")
    if not stem.startswith("guard-"):
        return None
    return stem.removeprefix("guard-").replace("-", "_")


def _contract_order() -> list[str]:
    """The refusal order docs/replay.md states ("the first one of this order is the one reported")."""
    text = CONTRACT.read_text()
    para = text.split("<!-- refusal-order -->", 1)[1].split("<!-- /refusal-order -->", 1)[0]
    return re.findall(r"`([a-z_]+)`", para)


def _write(tmp_path: Path, data: dict, name: str = "variant.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _load(name: str) -> dict:
    return json.loads((SCENARIOS / f"{name}.json").read_text())


def _replay(tmp_path: Path, data: dict) -> dict:
    path = _write(tmp_path, data)
    sc, raw = load_scenario(path)
    return run_scenario(sc, raw, path=str(path))


def _dump(report: dict) -> str:
    return json.dumps(public_report(report), indent=1, default=str)


def _agent_calls(report: dict) -> list[dict]:
    return [c for c in flat_calls(report) if c["actor"] == "agent"]


# ------------------------------------------------------------------------------------------------
# the files


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", MINE, ids=lambda p: p.stem)
def test_guard_scenario_replays_ok(path):
    sc, raw = load_scenario(path)
    report = run_scenario(sc, raw, path=str(path))
    assert report["mismatches"] == [], _dump(report)
    code = _code_of(path)
    if code is not None:
        assert code in GUARD_CODES, path
        if path.stem.endswith("-near-miss"):
            assert code not in _codes_in(report), _dump(report)
        else:
            assert code in _codes_in(report), _dump(report)


def test_every_guard_code_has_a_scenario_and_a_near_miss():
    names = {p.stem for p in MINE}
    for code in GUARD_CODES:
        if code not in NO_REFUSED_FILE:
            assert _stem(code) in names, code
        if code not in NO_NEAR_MISS_FILE:
            assert f"{_stem(code)}-near-miss" in names, code
    order = _contract_order()
    for code in GUARD_CODES[:11]:
        assert code in order, f"{code} is not in the refusal order of docs/replay.md"


# ------------------------------------------------------------------------------------------------
# the order of refusals

#: file -> (the code reported, the code that also applies), and how to take the first one away
ORDER = {
    "order-priority-beats-instance-cap": (
        "priority_required",
        "instance_cap",
        lambda d: d["steps"][0]["args"].update(launch_priority="P0"),
    ),
    "order-demand-guard-beats-diagnosis": (
        "demand_guard",
        "diagnosis_required",
        lambda d: d["demand"].update(queued=0, running=0, idle_min=60),
    ),
    "order-owned-host-beats-demand-guard": (
        "owned_host",
        "demand_guard",
        lambda d: [f.update(provider="vastai") for f in d["fleet"]],
    ),
    "order-forbidden-beats-priority": ("forbidden_tool", "priority_required", lambda d: d.pop("policy")),
    "order-invalid-args-beats-owned-host": (
        "invalid_args",
        "owned_host",
        lambda d: d["steps"][0]["args"].update(reason="idle"),
    ),
    "order-demand-guard-beats-owned-tasks": (
        "demand_guard",
        "owned_tasks",
        lambda d: d["demand"].update(queued=0, idle_min=60),
    ),
    "order-owned-tasks-beats-hold-off": (
        "owned_tasks",
        "hold_off",
        lambda d: d["fleet"][1]["worker"].update(owned_tasks=0),
    ),
    "order-hold-off-beats-diagnosis": ("hold_off", "diagnosis_required", lambda d: d["demand"].update(idle_min=60)),
    "order-launch-pending-beats-instance-cap": (
        "launch_pending",
        "instance_cap",
        lambda d: d["fleet"][1].update(actual_status="running"),
    ),
    "order-instance-cap-beats-budget-cap": (
        "instance_cap",
        "budget_cap",
        lambda d: d["objectives"].update(max_instances=12),
    ),
    "order-budget-cap-beats-rate-limited": (
        "budget_cap",
        "rate_limited",
        lambda d: d["objectives"].update(max_dph=6.0),
    ),
    "order-guard-beats-approval": (
        "demand_guard",
        "approval_required",
        lambda d: (d["demand"].update(queued=0, running=0, idle_min=60), d.update(operator={"default": "none"})),
    ),
}


def test_every_order_file_is_named_here():
    assert {p.stem for p in MINE if p.stem.startswith("order-")} == set(ORDER)


def test_each_pair_is_in_contract_order():
    order = _contract_order() + ["approval_required"]  # then policy
    for name, (first, second, _) in ORDER.items():
        assert order.index(first) < order.index(second), (name, first, second, order)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", sorted(ORDER))
def test_the_first_refusal_in_contract_order_is_reported(name, tmp_path):
    first, _, _ = ORDER[name]
    report = _replay(tmp_path, _load(name))
    assert report["mismatches"] == [], _dump(report)
    assert _agent_calls(report)[0]["reason"] == first, _dump(report)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", sorted(ORDER))
def test_the_second_refusal_applied_too(name, tmp_path):
    """The same file with the first code's condition taken away reports the second code."""
    _, second, remove_first = ORDER[name]
    data = _load(name)
    remove_first(data)
    data["expect"] = None
    report = _replay(tmp_path, data)
    assert _agent_calls(report)[0]["reason"] == second, _dump(report)


# ------------------------------------------------------------------------------------------------
# variants of the guard files (conditions the one-world files do not cover)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("launch_min_ago", "refused"), [(5, True), (11, False)])
def test_hold_off_after_a_launch(launch_min_ago, refused, tmp_path):
    """Past the dwell, but a launch 5 minutes ago (hold-off 10): refused; 11 minutes ago: runs."""
    data = _load("guard-hold-off-near-miss")
    data["history"] = [{"min_ago": launch_min_ago, "tool": "launch_instance", "instance": "v-101"}]
    if refused:
        data["expect"] = {
            "refused": [{"tool": "stop_instance", "reason": "hold_off"}],
            "never_executed": ["stop_instance"],
        }
    else:
        data["expect"] = {"executed": [{"tool": "stop_instance"}], "refused": []}
    report = _replay(tmp_path, data)
    assert report["mismatches"] == [], _dump(report)
    if refused:
        assert "last launch" in _agent_calls(report)[0]["detail"]


@pytest.mark.django_db(transaction=True)
def test_diagnosis_freshness_is_configurable(tmp_path):
    """The 20-minute-old diagnosis that is stale at 15 minutes is fresh at 30."""
    data = _load("guard-diagnosis-required")
    data["objectives"]["diagnosis_fresh_min"] = 30
    data["expect"] = {"executed": [{"tool": "stop_instance"}, {"tool": "destroy_instance"}], "refused": []}
    report = _replay(tmp_path, data)
    assert report["mismatches"] == [], _dump(report)


@pytest.mark.django_db(transaction=True)
def test_demand_is_read_again_before_each_stop_or_destroy(tmp_path):
    """Each stop/destroy the guards check reads demand again (one DemandSample per read)."""
    from fleet.models import DemandSample

    data = _load("guard-demand-guard-near-miss")
    data["steps"] = [
        {
            "parallel": [
                {"tool": "stop_instance", "args": {"instance_id": "v-101", "reason": "idle"}},
                {"tool": "destroy_instance", "args": {"instance_id": "v-102", "reason": "idle"}},
            ]
        },
        VERDICT,
    ]
    data["policy"] = {"stop_instance": "auto", "destroy_instance": "auto"}
    data["objectives"]["retire_budget_pct"] = 100  # both of two workers: outside the scale-down budget's default
    data["expect"] = {"executed": [{"tool": "stop_instance"}, {"tool": "destroy_instance"}]}
    report = _replay(tmp_path, data)
    assert report["mismatches"] == [], _dump(report)
    assert DemandSample.objects.count() == 1 + 2  # the observe phase, then one per scale-down call


@pytest.mark.django_db(transaction=True)
def test_a_launch_does_not_read_demand_again(tmp_path):
    from fleet.models import DemandSample

    report = _replay(tmp_path, _load("guard-priority-required-near-miss"))
    assert report["mismatches"] == [], _dump(report)
    assert DemandSample.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_approved_launches_of_one_batch_do_not_block_each_other(tmp_path):
    """docs/contract.md: launch_pending — "calls of the same batch do not count". Two P1 launches in one
    batch, both parked and approved: both run (the second is re-checked at dispatch, when the first
    one is already loading)."""
    data = _load("guard-launch-pending-near-miss")
    for c in data["steps"][0]["parallel"]:
        c["args"]["launch_priority"] = "P1"
    data["operator"] = {"default": "approve"}
    # both launches are still needed at dispatch (no_longer_needed): 720 proofs/hr at 180 per
    # worker wants 4 workers, 2 run
    data["objectives"]["target_proofs_hr"] = 720
    data["expect"] = {
        "parked": [{"tool": "launch_instance"}, {"tool": "launch_instance"}],
        "executed": [{"tool": "launch_instance"}, {"tool": "launch_instance"}],
        "refused": [],
    }
    report = _replay(tmp_path, data)
    assert report["mismatches"] == [], _dump(report)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", ["error", "unknown", "offline"])
def test_every_terminal_status_is_replaced_while_tasks_are_queued(status, tmp_path):
    """terminal-exited-queued with v-103's provider status error / unknown / offline: the monitor destroys it."""
    data = _load("terminal-exited-queued")
    data["fleet"][2]["actual_status"] = status
    if status != "error":  # instance_exited is raised for exited and error, not for a lost contact
        data["expect"].pop("alerts")
    report = _replay(tmp_path, data)
    assert report["mismatches"] == [], _dump(report)


@pytest.mark.django_db(transaction=True)
def test_a_container_fault_is_not_terminal(tmp_path):
    """Near miss of terminal-diagnosed-failed-host: v-102 diagnosed failed with class ``container`` (not
    ``host``) is not terminal, so with tasks queued its stop is a scale-down: demand_guard."""
    data = _load("terminal-diagnosed-failed-host")
    data["fleet"][1]["ssh"]["commands"]["nvidia-smi -L"]["out"] = "Failed to initialize NVML: Unknown Error"
    data["steps"] = data["steps"][:2] + [VERDICT]
    data["expect"] = {
        "executed": [{"tool": "diagnose_instance"}],
        "refused": [{"tool": "stop_instance", "args": {"instance_id": "v-102"}, "reason": "demand_guard"}],
        "never_executed": ["stop_instance", "destroy_instance"],
    }
    report = _replay(tmp_path, data)
    assert report["mismatches"] == [], _dump(report)


# ------------------------------------------------------------------------------------------------
# what the file format cannot express


def _claim_in_flight(at) -> None:
    """A side effect on v-102 claimed and never finished (its worker died mid-call)."""
    from agent.models import SideEffect

    SideEffect.objects.create(
        key="crashed-mid-call",
        tool="reboot_instance",
        args={"instance_id": "v-102"},
        instance_ref="v-102",
        status="claimed",
        actor="agent",
        claimed_at=at - timedelta(minutes=2),
    )


@pytest.mark.django_db(transaction=True)
def test_in_flight(tmp_path):
    """With that claim on record, a stop of v-102 (fresh diagnosis, idle past the dwell) is refused ``in_flight``."""
    data = _load("guard-in-flight-near-miss")
    data["expect"] = {
        "refused": [{"tool": "stop_instance", "reason": "in_flight"}],
        "never_executed": ["stop_instance"],
    }
    path = _write(tmp_path, data)
    sc, raw = load_scenario(path)
    _claim_in_flight(sc.now)
    report = run_scenario(sc, raw, path=str(path))
    assert report["mismatches"] == [], _dump(report)
    assert "in_flight" in _codes_in(report)


@pytest.mark.django_db(transaction=True)
def test_diagnosis_required_beats_in_flight(tmp_path):
    data = _load("guard-in-flight-near-miss")
    data["fleet"][1]["diagnosed_min_ago"] = None
    data["expect"] = {"refused": [{"tool": "stop_instance", "reason": "diagnosis_required"}]}
    path = _write(tmp_path, data)
    sc, raw = load_scenario(path)
    _claim_in_flight(sc.now)
    report = run_scenario(sc, raw, path=str(path))
    assert report["mismatches"] == [], _dump(report)
    assert "in_flight" not in _codes_in(report)


def _cycle_world(tmp_path, data):
    """Load ``data`` as a scenario file; returns (scenario, raw) for :func:`isolated`."""
    return load_scenario(_write(tmp_path, data))


@pytest.mark.django_db(transaction=True)
def test_expired(tmp_path):
    """Parked, nobody answers, 31 minutes pass (expiry 30): the next cycle expires the approval; the
    call's outcome is ``expired``, nothing ran, and a late approval is refused."""
    from agent.models import Approval, Run
    from agent.planners.script import ScriptPlanner
    from agent.runtime.approvals import DecisionError, do_decide
    from agent.runtime.loop import run_cycle
    from fleet.clock import clock

    data = _load("guard-approval-required")
    data["objectives"]["retire_budget_pct"] = 100  # two of two workers parked: the budget's default allows one
    sc, raw = _cycle_world(tmp_path, data)
    with isolated(sc) as provider:
        setup_world(sc, provider)
        run_cycle("replay", planner=make_planner(sc, raw))
        approval = Approval.objects.get()
        assert approval.status == "waiting"
        clock.active.advance(31 * 60)
        run_cycle("heartbeat", planner=ScriptPlanner([VERDICT]))
        approval.refresh_from_db()
        assert approval.status == "expired"
        with pytest.raises(DecisionError, match="expired|already"):
            do_decide(approval, "approve", "user:replay-operator", "too late")
        report = build_report(Run.objects.order_by("number"), name="guard-expired")
        assert not [c for c in provider.calls if c[0] == "stop_instance"]
    assert "expired" in _codes_in(report), _dump(report)
    stops = [c for c in flat_calls(report) if c["tool"] == "stop_instance"]
    assert [(c["outcome"], c["reason"]) for c in stops] == [("expired", "expired")], _dump(report)
    expect = ExpectSpec.model_validate(
        {"parked": [{"tool": "stop_instance"}], "executed": [], "never_executed": ["stop_instance"]}
    )
    assert match_expect(report, expect) == []


@pytest.mark.django_db(transaction=True)
def test_an_expired_call_is_recorded_expired(tmp_path):
    """Beyond the report: once the approval expired, the call's own step says ``expired`` and its run
    is no longer waiting for an operator (the console and the final report read these rows)."""
    from agent.models import Approval, Run, Step
    from agent.planners.script import ScriptPlanner
    from agent.runtime.loop import run_cycle
    from fleet.clock import clock

    data = _load("guard-approval-required")
    data["objectives"]["retire_budget_pct"] = 100  # two of two workers parked: the budget's default allows one
    sc, raw = _cycle_world(tmp_path, data)
    with isolated(sc) as provider:
        setup_world(sc, provider)
        run1 = run_cycle("replay", planner=make_planner(sc, raw))
        clock.active.advance(31 * 60)
        run_cycle("heartbeat", planner=ScriptPlanner([VERDICT]))
        assert Approval.objects.get().status == "expired"
        step = Step.objects.get(run=run1, tool="stop_instance")
        run1 = Run.objects.get(pk=run1.pk)
    assert (step.outcome, step.reason_code) == ("expired", "expired")
    assert run1.status != "parked"
    assert "Waiting for an operator" not in run1.final_report


@pytest.mark.django_db(transaction=True)
def test_expired_near_miss(tmp_path):
    """29 minutes pass (expiry 30): the approval still waits; approved then, the stop runs once."""
    from agent.models import Approval, Run
    from agent.planners.script import ScriptPlanner
    from agent.runtime.approvals import do_decide
    from agent.runtime.loop import resume_run, run_cycle
    from fleet.clock import clock

    data = _load("guard-approval-required")
    data["objectives"]["diagnosis_fresh_min"] = 60  # keep the diagnosis fresh at dispatch; expiry is the point
    sc, raw = _cycle_world(tmp_path, data)
    with isolated(sc) as provider:
        setup_world(sc, provider)
        run1 = run_cycle("replay", planner=make_planner(sc, raw))
        clock.active.advance(29 * 60)
        run_cycle("heartbeat", planner=ScriptPlanner([VERDICT]))
        approval = Approval.objects.get()
        assert approval.status == "waiting"
        do_decide(approval, "approve", "user:replay-operator", "go")
        resume_run(run1, planner=make_planner(sc, raw))
        report = build_report(Run.objects.order_by("number"), name="guard-expired-near-miss")
        assert len([c for c in provider.calls if c[0] == "stop_instance"]) == 1
    assert "expired" not in _codes_in(report), _dump(report)
    stops = [c for c in flat_calls(report) if c["tool"] == "stop_instance"]
    assert [c["outcome"] for c in stops] == ["approved_executed"], _dump(report)


@pytest.mark.django_db(transaction=True)
def test_duplicate_while_an_approval_waits(tmp_path):
    """Run 1 parks a stop of v-102 (nobody answers). Five minutes later run 2 proposes the same stop:
    refused ``duplicate`` (the same action already waits). A stop of v-101 in run 2 is not a duplicate."""
    from agent.models import Approval, Run
    from agent.planners.script import ScriptPlanner
    from agent.runtime.loop import run_cycle
    from fleet.clock import clock

    data = _load("guard-approval-required")
    data["objectives"]["retire_budget_pct"] = 100  # two of two workers parked: the budget's default allows one
    sc, raw = _cycle_world(tmp_path, data)
    with isolated(sc) as provider:
        setup_world(sc, provider)
        run_cycle("replay", planner=make_planner(sc, raw))
        clock.active.advance(5 * 60)
        run_cycle(
            "heartbeat",
            planner=ScriptPlanner(
                [
                    {"tool": "stop_instance", "args": {"instance_id": "v-102", "reason": "still idle"}},
                    {"tool": "stop_instance", "args": {"instance_id": "v-101", "reason": "idle too"}},
                ]
            ),
        )
        report = build_report(Run.objects.order_by("number"), name="guard-duplicate-across-runs")
        assert Approval.objects.filter(status="waiting").count() == 2
        assert not [c for c in provider.calls if c[0] == "stop_instance"]
    calls = [(c["args"]["instance_id"], c["outcome"], c["reason"]) for c in flat_calls(report)]
    assert calls == [
        ("v-102", "parked", "approval_required"),
        ("v-102", "refused", "duplicate"),
        ("v-101", "parked", "approval_required"),
    ], _dump(report)
