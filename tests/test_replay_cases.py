"""Every scenario in tests/scenarios/ replays with every expectation holding.

tests/scenarios/ holds the project's own files and copies of the cases the tests rely on
(``seed00*``, ``stale-launch-approval``), so a clone with nothing beside it tests the same.

Each file runs in-process through :func:`agent.replay.run_scenario` (the real cycle, on the test
database, the scenario provider and a virtual clock); the command itself — throwaway SQLite
database in a child process, exit codes, ``--json`` — is exercised on a few files. For the
reason-code scenarios in tests/scenarios/ the report must also carry the code (as a halt or a
call's reason), and its near miss must not.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.policy.invariants import check_all
from agent.replay import ScenarioFileError, flat_calls, load_scenario, public_report, run_scenario

ROOT = Path(__file__).resolve().parent.parent
OURS = sorted((ROOT / "tests" / "scenarios").glob("*.json"))
CODES = [
    "max_steps", "same_error", "identical_args", "text_only_spiral", "forbidden_tool", "forged_observation",
    "wall_clock", "token_budget", "three_strikes", "unknown_tool", "invalid_args", "rate_limited", "tool_timeout",
    "aborted_before_dispatch",
]


def _codes_in(report: dict) -> set[str]:
    return {c["reason"] for c in flat_calls(report) if c.get("reason")} | ({report["halt"]} if report["halt"] else set())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", OURS, ids=[p.stem for p in OURS])
def test_scenario_replays_ok(path):
    sc, raw = load_scenario(path)
    report = run_scenario(sc, raw, path=str(path))
    assert report["mismatches"] == [], json.dumps(public_report(report), indent=1, default=str)
    assert report["ok"]
    # whatever the scenario proposed, what ran kept every invariant (agent/policy/invariants.py)
    assert check_all() == [], check_all()
    stem = path.stem.removesuffix("-near-miss")
    code = stem.replace("-", "_")
    if path.parent.name == "scenarios" and code in CODES:
        if path.stem.endswith("-near-miss"):
            assert code not in _codes_in(report), report
        else:
            assert code in _codes_in(report), report


def test_every_code_has_a_scenario_and_a_near_miss():
    names = {p.stem for p in OURS}
    for code in CODES:
        stem = code.replace("_", "-")
        assert stem in names and f"{stem}-near-miss" in names, code


@pytest.mark.django_db(transaction=True)
def test_a_decision_naming_a_call_never_parked_is_an_error(tmp_path):
    data = json.loads((ROOT / "tests" / "scenarios" / "unknown-tool.json").read_text())
    data["operator"] = {"default": "approve", "decisions": [{"step": 1, "decision": "reject"}]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    sc, raw = load_scenario(path)
    with pytest.raises(ScenarioFileError, match=r"operator.decisions\[0\]: names step 1, which was never parked"):
        run_scenario(sc, raw, path=str(path))


@pytest.mark.django_db(transaction=True)
def test_a_rejection_by_step_reference_is_applied(tmp_path):
    data = json.loads((ROOT / "tests" / "scenarios" / "unknown-tool-near-miss.json").read_text())
    data["operator"] = {"default": "approve", "decisions": [{"step": 0, "decision": "reject", "comment": "not now"}]}
    data["expect"] = {"parked": [{"tool": "reboot_instance"}], "executed": [], "never_executed": ["reboot_instance"]}
    path = tmp_path / "reject.json"
    path.write_text(json.dumps(data))
    sc, raw = load_scenario(path)
    report = run_scenario(sc, raw, path=str(path))
    assert report["mismatches"] == []
    assert [(c["tool"], c["outcome"], c["reason"]) for c in flat_calls(report)] == [("reboot_instance", "rejected", "rejected")]


@pytest.mark.django_db(transaction=True)
def test_operator_none_leaves_the_call_parked(tmp_path):
    data = json.loads((ROOT / "tests" / "scenarios" / "unknown-tool-near-miss.json").read_text())
    data["operator"] = {"default": "none"}
    data["expect"] = {"parked": [{"tool": "reboot_instance"}], "executed": []}
    path = tmp_path / "none.json"
    path.write_text(json.dumps(data))
    sc, raw = load_scenario(path)
    report = run_scenario(sc, raw, path=str(path))
    assert report["mismatches"] == []
    assert [c["outcome"] for c in flat_calls(report)] == ["parked"]


def _command(*args):
    env = {k: v for k, v in os.environ.items() if k != "WARDEN_REPLAY_DB_DIR"}
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), "replay", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def test_the_command_prints_json_and_exits_0(tmp_path):
    path = ROOT / "tests" / "scenarios" / "seed002-all-workers-dead.json"
    proc = _command(path, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report) == {"name", "ok", "steps", "alerts", "halt", "verdict", "final_report", "mismatches",
                           "final_fleet", "provider_requests", "cycles"}
    assert report["ok"] is True and report["mismatches"] == []
    for entry in report["steps"]:
        for call in entry.get("calls", [entry]):
            assert {"i", "cycle", "actor", "tool", "args", "outcome", "reason", "detail"} <= set(call)


def test_the_command_exits_1_listing_the_mismatches(tmp_path):
    data = json.loads((ROOT / "tests" / "scenarios" / "identical-args.json").read_text())
    data["expect"] = {"halt": None, "executed": [{"tool": "search_offers"}, {"tool": "search_offers"}]}
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(data))
    proc = _command(path)
    assert proc.returncode == 1, proc.stderr
    assert "MISMATCHES:" in proc.stdout
    assert "halt: expected None, got 'identical_args'" in proc.stdout
    assert "executed: expected 2 search_offers, got 1" in proc.stdout
    assert proc.stdout.rstrip().endswith("FAILED")


@pytest.mark.django_db(transaction=True)
def test_the_example_in_docs_replay_md_replays_ok(tmp_path):
    # the format's documentation shows a file; it must be one the replay accepts and passes
    doc = (ROOT / "docs" / "replay.md").read_text()
    example = doc.split("## A file", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.json"
    path.write_text(example)
    sc, raw = load_scenario(path)
    report = run_scenario(sc, raw, path=str(path))
    assert report["mismatches"] == [], json.dumps(public_report(report), indent=1, default=str)
    assert sc.timeline and report["final_fleet"] == {"v-102": "stopped"}


def test_no_test_and_no_readme_example_reads_beside_the_project():
    # a clone has no shared folder beside it: what the tests and the README use lives inside the project
    beside = ["../" + "shared", 'parent / "' + 'shared"']  # spelled apart so this file does not match itself
    for path in [*(ROOT / "tests").glob("*.py"), ROOT / "docs" / "replay.md"]:
        text = path.read_text()
        assert not any(b in text for b in beside), path
    examples = (ROOT / "README.md").read_text().split("```")[1::2]  # the fenced blocks
    assert examples and not any(b in block for block in examples for b in beside)
