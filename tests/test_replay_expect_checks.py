"""Names in ``expect`` (and in operator decisions) are checked before anything runs: a typo in a
tool or a reason code exits 2 naming it, wherever it appears — never exit 1, a mismatch the
replay could not have avoided (docs/replay.md "Files replay refuses").

The reason codes are one list, :data:`agent.replay.file_format.REASON_CODES`; it must be docs/replay.md's
table (code and "halts" column), and every code an agent module emits must be in it.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.replay import HALT_CODES, REASON_CODES, ScenarioFileError, load_scenario

ROOT = Path(__file__).resolve().parent.parent
BASE = json.loads((ROOT / "tests" / "scenarios" / "v2-fault-skip.json").read_text())


def _file(tmp_path, **changes) -> Path:
    data = json.loads(json.dumps(BASE))
    data.update(changes)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    return path


def _refused(tmp_path, **changes) -> str:
    path = _file(tmp_path, **changes)
    with pytest.raises(ScenarioFileError) as exc:
        load_scenario(path)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    return msg.removeprefix(f"{path}: ")


def _command(path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "WARDEN_REPLAY_DB_DIR"}
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), "replay", str(path)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=60)


# --- reason codes ------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["demand_gaurd", ["owned_tasks", "demand_gaurd"]], ids=["alone", "in-a-list"])
@pytest.mark.parametrize("key", ["refused", "executed", "parked", "errored"])
def test_an_unknown_reason_code_is_a_file_error(tmp_path, key, reason):
    msg = _refused(tmp_path, expect={key: [{"tool": "stop_instance", "reason": reason}]})
    assert msg == (f"expect.{key}[0].reason: unknown reason code 'demand_gaurd' (did you mean 'demand_guard'?); "
                   'the codes are those of docs/replay.md "Reason codes"')


def test_an_empty_list_of_reasons_is_a_file_error(tmp_path):
    msg = _refused(tmp_path, expect={"refused": [{"tool": "stop_instance", "reason": []}]})
    assert msg == "expect.refused[0].reason: an empty list accepts no reason code; give one code or several"


def test_every_reason_code_is_accepted(tmp_path):
    items = [{"tool": "stop_instance", "reason": code} for code in REASON_CODES]
    sc, _ = load_scenario(_file(tmp_path, expect={"refused": [*items, {"reason": list(REASON_CODES)}]}))
    assert [e.reason for e in sc.expect.refused[:-1]] == list(REASON_CODES)


def _docs_reason_table() -> dict[str, bool]:
    doc = (ROOT / "docs" / "replay.md").read_text()
    table = doc.split("## Reason codes", 1)[1].split("\n\n", 2)[2].split("\n\n", 1)[0]
    codes = {}
    for row in table.splitlines()[2:]:  # after the header and the rule
        first, halts = row.split("|")[1:3]
        for code in re.findall(r"`([a-z_]+)`", first):
            codes[code] = halts.strip() == "yes"
    return codes


def test_the_code_list_is_the_table_of_docs_replay_md():
    table = _docs_reason_table()
    assert len(table) > 30  # the table was found and read
    assert table == REASON_CODES
    assert HALT_CODES == {code for code, halts in table.items() if halts}


def test_every_code_an_agent_module_emits_is_in_the_list():
    # the guards' Refusal("code"), the breakers' Halt("code"), the pipeline's _finish(step, outcome, "code")
    pattern = re.compile(r'(?:Refusal|Halt)\(\s*"([a-z_]+)"|_finish\([^()]*?"(?:refused|halted|error)",\s*"([a-z_]+)"')
    emitted = set()
    for path in (ROOT / "agent").rglob("*.py"):
        for m in pattern.finditer(path.read_text()):
            emitted.add(m.group(1) or m.group(2))
    assert {"demand_guard", "max_steps", "unknown_tool", "outcome_unknown"} <= emitted  # the scan finds them
    assert emitted - set(REASON_CODES) == set()


# --- tools -------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["executed", "parked", "errored"])
def test_an_unknown_tool_in_a_call_list_is_a_file_error(tmp_path, key):
    msg = _refused(tmp_path, expect={key: [{"tool": "stop_instanse"}]})
    assert msg == (f"expect.{key}[0].tool: unknown tool 'stop_instanse' (did you mean 'stop_instance'?); "
                   "Warden has no such tool, so this expectation could only fail")


def test_an_unknown_tool_in_never_executed_is_the_same_error(tmp_path):
    msg = _refused(tmp_path, expect={"never_executed": ["stop_instanse"]})
    assert msg.startswith("expect.never_executed: unknown tool 'stop_instanse' (did you mean 'stop_instance'?)")


@pytest.mark.parametrize("item", [
    {"tool": "stop_instanse"},
    {"tool": "stop_instanse", "reason": "demand_guard"},
    {"tool": "stop_instanse", "reason": ["demand_guard", "owned_tasks"]},
])
def test_an_unknown_tool_is_expected_refused_only_as_unknown_tool(tmp_path, item):
    msg = _refused(tmp_path, expect={"refused": [item]})
    assert msg == ("expect.refused[0].tool: unknown tool 'stop_instanse' (did you mean 'stop_instance'?); "
                   "a tool Warden lacks is expected refused only with reason 'unknown_tool'")


def test_a_made_up_tool_refused_as_unknown_tool_is_a_valid_expectation(tmp_path):
    path = _file(tmp_path, expect={"refused": [{"tool": "reboot_everything", "reason": "unknown_tool"},
                                               {"tool": "teleport", "reason": ["unknown_tool", "invalid_args"]}]})
    sc, _ = load_scenario(path)
    assert [e.tool for e in sc.expect.refused] == ["reboot_everything", "teleport"]


def test_a_decision_naming_an_unknown_tool_is_a_file_error(tmp_path):
    msg = _refused(tmp_path, operator={"default": "none", "decisions": [{"tool": "stop_instanse", "decision": "approve"}]})
    assert msg.startswith("operator.decisions[0].tool: unknown tool 'stop_instanse' (did you mean 'stop_instance'?)")
    msg = _refused(tmp_path, timeline=[{"at_min": 5, "operator": {"decisions": [{"tool": "stopinstance", "decision": "approve"}]}}])
    assert msg.startswith("timeline[0].operator.decisions[0].tool: unknown tool 'stopinstance' (did you mean 'stop_instance'?)")


# --- outcomes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key, outcome, allowed", [
    ("executed", "refused", "executed or approved_executed"),
    ("refused", "approved_executed", "refused or halted"),
    ("errored", "executed", "error"),
])
def test_an_outcome_its_list_never_holds_is_a_file_error(tmp_path, key, outcome, allowed):
    msg = _refused(tmp_path, expect={key: [{"tool": "stop_instance"}, {"tool": "stop_instance", "outcome": outcome}]})
    assert msg == f"expect.{key}[1].outcome: {key} holds calls whose outcome is {allowed}, never {outcome!r}"


def test_outcomes_a_list_holds_are_accepted(tmp_path):
    expect = {"executed": [{"tool": "stop_instance", "outcome": "approved_executed"}],
              "refused": [{"tool": "stop_instance", "outcome": "halted"}],
              "errored": [{"tool": "list_instances", "outcome": "error"}],
              "parked": [{"tool": "stop_instance", "outcome": "rejected"}, {"tool": "stop_instance", "outcome": "refused"}]}
    sc, _ = load_scenario(_file(tmp_path, expect=expect))
    assert [e.outcome for e in sc.expect.parked] == ["rejected", "refused"]


# --- the command: exit 2, one line, never 1 ------------------------------------------------------


@pytest.mark.parametrize("expect, problem", [
    ({"refused": [{"tool": "stop_instance", "reason": ["owned_tasks", "demand_gaurd"]}]},
     "expect.refused[0].reason: unknown reason code 'demand_gaurd'"),
    ({"executed": [{"tool": "list_instancez"}]}, "expect.executed[0].tool: unknown tool 'list_instancez'"),
])
def test_the_command_exits_2_not_1(tmp_path, expect, problem):
    path = _file(tmp_path, expect=expect)
    proc = _command(path)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"replay: {path}: {problem}"), proc.stderr
    assert proc.stdout == ""
