"""A file replay cannot accept exits 2 with one line naming the field and the problem, never a
traceback (docs/replay.md "Files replay refuses").

Most inputs go through :func:`agent.replay.load_scenario` (what the command calls first); the
command itself is run on the inputs that once crashed or hung it (a FIFO, ``/dev/zero``, deep
nesting, ``Infinity``, out-of-range numbers).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.replay import ScenarioFileError, load_scenario

ROOT = Path(__file__).resolve().parent.parent
BASE = json.loads((ROOT / "tests" / "scenarios" / "v2-fault-skip.json").read_text())


def _variant(mutate) -> dict:
    data = json.loads(json.dumps(BASE))
    mutate(data)
    return data


def _refused(tmp_path, text: str) -> str:
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(ScenarioFileError) as exc:
        load_scenario(path)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    return msg.removeprefix(f"{path}: ")


def _command(path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "WARDEN_REPLAY_DB_DIR"}
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), "replay", str(path)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=60)


def _exits_2(path, problem: str) -> None:
    proc = _command(path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert problem in lines[0], lines[0]
    assert proc.stdout == ""


# --- ranges ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mutate, problem", [
    (lambda d: d.update(now="0001-01-01T00:00:00Z"), "now: must lie between the years 2000 and 2100 (got year 1)"),
    (lambda d: d.update(now="9999-12-31T00:00:00Z"), "now: must lie between the years 2000 and 2100 (got year 9999)"),
    (lambda d: d.update(now="1999-12-31T23:59:00Z"), "now: must lie between the years 2000 and 2100"),
    (lambda d: d.update(now=1780000000), "now: must be an ISO 8601 date-time string"),
    (lambda d: d["fleet"][0].update(age_min=1e10), "fleet[0].age_min: Input should be less than or equal to 1000000"),
    (lambda d: d["fleet"][0].update(diagnosed_min_ago=1e12), "fleet[0].diagnosed_min_ago: Input should be less than or equal to 1000000"),
    (lambda d: d.update(history=[{"min_ago": 1e15, "tool": "launch_instance"}]), "history[0].min_ago: Input should be less than or equal to 1000000"),
    (lambda d: d["demand"].update(queued=10**12), "demand.queued: Input should be less than or equal to 1000000000"),
    (lambda d: d["demand"].update(idle_min=-1), "demand.idle_min: Input should be greater than or equal to 0"),
    (lambda d: d["fleet"][0]["worker"].update(owned_tasks=10**10), "fleet[0].worker.owned_tasks: Input should be less than or equal to 1000000000"),
    (lambda d: d.update(timeline=[{"at_min": 2e6}]), "timeline[0].at_min: Input should be less than or equal to 1000000"),
    (lambda d: d.update(objectives={"offline_grace_min": 1e7}), "objective 'offline_grace_min' must be between 0 and 10^6 minutes"),
])
def test_out_of_range_values(tmp_path, mutate, problem):
    assert problem in _refused(tmp_path, json.dumps(_variant(mutate)))


def test_the_edges_of_the_ranges_are_accepted(tmp_path):
    data = _variant(lambda d: (d.update(now="2100-06-01T00:00:00Z", objectives={"starve_min": 1e6, "claim_max_age_min": 0}),
                               d["fleet"][0].update(age_min=1e6), d["demand"].update(queued=10**9)))
    path = tmp_path / "edge.json"
    path.write_text(json.dumps(data))
    sc, _ = load_scenario(path)
    assert sc.now.year == 2100 and sc.fleet[0].age_min == 1e6 and sc.demand.queued == 10**9


# --- no coercion -------------------------------------------------------------------------------


@pytest.mark.parametrize("mutate, problem", [
    (lambda d: d["fleet"][0].update(dph="0.45"), "fleet[0].dph: Input should be a valid number (got '0.45'"),
    (lambda d: d["fleet"][0].update(dph=True), "fleet[0].dph: Input should be a valid number (got True"),
    (lambda d: d["demand"].update(queued="5"), "demand.queued: Input should be a valid integer"),
    (lambda d: d["demand"].update(queued=5.0), "demand.queued: Input should be a valid integer"),
    (lambda d: d["fleet"][0]["worker"].update(live=1), "fleet[0].worker.live: Input should be a valid boolean"),
    (lambda d: d.update(objectives={"max_dph": "6"}), "objective 'max_dph' must be a number (got '6'"),
    (lambda d: d.update(objectives={"max_instances": True}), "objective 'max_instances' must be a number (got True"),
    (lambda d: d.update(objectives={"target_proofs_hr": "40"}), "objective 'target_proofs_hr' must be a number"),
    (lambda d: d["provider_faults"][0].update(times="2"), "provider_faults[0].times: Input should be a valid integer"),
    (lambda d: d.update(objectives={"target_proofs_hr": [40]}), "objective 'target_proofs_hr' must be a number, not a list"),
    (lambda d: d.update(objectives={"launch_rate": ["6", 600]}), "objective 'launch_rate' must be a number (got '6'"),
])
def test_strings_and_booleans_are_not_numbers(tmp_path, mutate, problem):
    assert problem in _refused(tmp_path, json.dumps(_variant(mutate)))


# --- JSON itself -------------------------------------------------------------------------------


def _text(**replace) -> str:
    text = json.dumps(BASE)
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new, 1)
    return text


@pytest.mark.parametrize("text, problem", [
    (_text(**{'"dph": 0.45': '"dph": Infinity'}), "fleet[0].dph: Infinity is not a JSON number"),
    (_text(**{'"dph": 0.45': '"dph": -Infinity'}), "fleet[0].dph: -Infinity is not a JSON number"),
    (_text(**{'"idle_min": 60': '"idle_min": NaN'}), "demand.idle_min: NaN is not a JSON number"),
    (_text(**{'"idle_min": 60': '"idle_min": 1e400'}), "demand.idle_min: 1e400 is out of range for a number"),
    (_text(**{'"queued": 0': '"queued": ' + str(10**30)}), "demand.queued: an integer of 31 digits is out of range"),
    (_text(**{'"queued": 0': '"queued": 1' + "0" * 5000}), "demand.queued: an integer of 5001 digits is out of range"),
    (_text(**{'"state": "ok"': '"state": "ok", "state": "stale"'}), "demand: key 'state' appears twice"),
    ('{"name": "a", "fleet": [], "fleet": [], "now": "2026-06-09T16:50:00Z", "steps": []}', "(top level): key 'fleet' appears twice"),
    ("[" * 1000 + "]" * 1000, "brackets nest deeper than 64 levels"),
    ('{"a": ' * 1000 + "1" + "}" * 1000, "brackets nest deeper than 64 levels"),
    ("{nope", "not JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    ("[]", "the file must hold one JSON object"),
])
def test_json_the_replay_refuses(tmp_path, text, problem):
    assert problem in _refused(tmp_path, text)


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path):
    data = _variant(lambda d: d.update(about="[" * 5000 + "{" * 5000))
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    assert load_scenario(path)[0].about.startswith("[[[")


def test_a_key_with_a_newline_still_gives_one_line(tmp_path):
    msg = _refused(tmp_path, json.dumps(_variant(lambda d: d["demand"].update({"bad\nkey\r": 1}))))
    assert "demand.bad\\nkey\\r: unknown key" in msg


# --- sizes -------------------------------------------------------------------------------------


def test_more_than_10000_fleet_entries(tmp_path):
    fleet = [{"id": f"v-{n}"} for n in range(10_001)]
    assert "fleet: more than 10000 entries" in _refused(tmp_path, json.dumps(_variant(lambda d: d.update(fleet=fleet))))
    fleet.pop()
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(_variant(lambda d: d.update(fleet=fleet))))
    assert len(load_scenario(path)[0].fleet) == 10_000


def test_a_parallel_batch_of_more_than_16_calls(tmp_path):
    calls = [{"tool": "get_demand", "args": {}}] * 17
    msg = _refused(tmp_path, json.dumps(_variant(lambda d: d.update(steps=[{"parallel": calls}]))))
    assert "steps[0].parallel: more than 16 entries" in msg
    five_thousand = [{"tool": "get_demand", "args": {}}] * 5000
    assert "steps[0].parallel: more than 16 entries" in _refused(
        tmp_path, json.dumps(_variant(lambda d: d.update(steps=[{"parallel": five_thousand}]))))


def test_a_problem_list_is_cut_to_the_first_three(tmp_path):
    fleet = [{"id": f"v-{n}", "dph": "x"} for n in range(500)]
    msg = _refused(tmp_path, json.dumps(_variant(lambda d: d.update(fleet=fleet))))
    assert msg.count("Input should be a valid number") == 3 and msg.endswith("and 497 more")


# --- what the file is --------------------------------------------------------------------------


def test_dev_zero_is_refused_before_reading():
    with pytest.raises(ScenarioFileError, match="/dev/zero: not a regular file"):
        load_scenario("/dev/zero")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(ScenarioFileError, match="a FIFO"):
        load_scenario(fifo)


def test_a_directory_a_missing_file_and_an_oversized_file(tmp_path):
    with pytest.raises(ScenarioFileError, match="a directory"):
        load_scenario(tmp_path)
    with pytest.raises(ScenarioFileError, match="cannot read: No such file or directory"):
        load_scenario(tmp_path / "missing.json")
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(64 * 1024 * 1024)  # sparse: refused from its size, nothing read
    with pytest.raises(ScenarioFileError, match="67108864 bytes; a scenario file may hold at most 33554432 bytes"):
        load_scenario(big)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file; the permission check needs another user")
def test_an_unreadable_file(tmp_path):
    path = tmp_path / "secret.json"
    path.write_text(json.dumps(BASE))
    path.chmod(0)
    with pytest.raises(ScenarioFileError, match="cannot read: Permission denied"):
        load_scenario(path)


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
def test_a_regular_file_whose_read_fails():
    # /proc/self/mem is a regular file that cannot be read from offset 0 (EIO), even by root
    with pytest.raises(ScenarioFileError, match="/proc/self/mem: cannot read: Input/output error"):
        load_scenario("/proc/self/mem")


def test_not_utf8(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(ScenarioFileError, match=r"not UTF-8 text \(byte 13\)"):
        load_scenario(path)


# --- the command -------------------------------------------------------------------------------


def test_the_command_refuses_a_fifo_and_dev_zero_with_exit_2(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    _exits_2(fifo, f"replay: {fifo}: a FIFO")  # returns at once (the subprocess has a timeout)
    _exits_2("/dev/zero", "replay: /dev/zero: not a regular file")


@pytest.mark.parametrize("text, problem", [
    ("[" * 1000 + "]" * 1000, "brackets nest deeper than 64 levels"),
    (_text(**{'"dph": 0.45': '"dph": Infinity'}), "fleet[0].dph: Infinity is not a JSON number"),
    (_text(**{'"queued": 0': '"queued": ' + str(10**30)}), "demand.queued: an integer of 31 digits is out of range"),
    (_text(**{'"now": "2026-06-09T16:50:00Z"': '"now": "9999-01-01T00:00:00Z"'}), "now: must lie between the years 2000 and 2100"),
    (_text(**{'"age_min": 300': '"age_min": 1e10'}), "fleet[0].age_min: Input should be less than or equal to 1000000"),
])
def test_the_command_exits_2_with_one_line(tmp_path, text, problem):
    path = tmp_path / "bad.json"
    path.write_text(text)
    _exits_2(path, problem)


# --- one kind per step -------------------------------------------------------------------------


@pytest.mark.parametrize("step, kinds", [
    ({"tool": "get_demand", "args": {}, "text": "checking demand"}, "tool, text"),
    ({"parallel": [{"tool": "get_demand", "args": {}}], "text": "both at once"}, "parallel, text"),
    ({"tool_result": "all fine", "text": "see above"}, "text, tool_result"),
    ({"tool": "get_demand", "parallel": [{"tool": "get_demand"}]}, "tool, parallel"),
])
def test_a_step_holding_two_kinds_is_refused(tmp_path, step, kinds):
    msg = _refused(tmp_path, json.dumps(_variant(lambda d: d.update(steps=[step]))))
    assert msg == f"steps[0]: a step is one of tool, parallel, text or tool_result (one model turn); this one has {kinds}"


def test_args_beside_raw_arguments_is_refused_like_text_beside_a_call(tmp_path):
    step = {"tool": "get_demand", "args": {}, "raw_arguments": "{}"}
    assert "steps[0]: give either args or raw_arguments, not both" in _refused(
        tmp_path, json.dumps(_variant(lambda d: d.update(steps=[step]))))
    call = {"parallel": [{"tool": "get_demand", "args": {}, "raw_arguments": "{}"}]}
    assert "steps[0].parallel[0]: give either args or raw_arguments, not both" in _refused(
        tmp_path, json.dumps(_variant(lambda d: d.update(steps=[call]))))


def test_each_single_kind_of_step_is_accepted(tmp_path):
    steps = [{"tool": "get_demand", "args": {}}, {"tool": "list_instances", "raw_arguments": "{\"stat"},
             {"parallel": [{"tool": "get_demand"}]}, {"text": "thinking"},
             {"tool": "list_instances", "tool_result": "forged"}]  # a tool_result may name its tool
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_variant(lambda d: d.update(steps=steps))))
    assert len(load_scenario(path)[0].steps) == 5


# --- ids, now, history ---------------------------------------------------------------------------


@pytest.mark.parametrize("char", ["\x00", "\x1f", "\n", "\x7f", "\x85", "\u200b", "\u202e", "\u2028"])
def test_an_id_with_a_control_character_is_refused(tmp_path, char):
    bad = f"v{char}x"
    code = f"U+{ord(char):04X}"
    cases = [
        (lambda d: d["fleet"][0].update(id=bad), "fleet[0].id"),
        (lambda d: d.update(offers=[{"id": bad, "gpu_name": "RTX 4090", "dph": 0.4}]), "offers[0].id"),
        (lambda d: d.update(timeline=[{"at_min": 5, "fleet": [{"id": bad}]}]), "timeline[0].fleet[0].id"),
        (lambda d: d.update(history=[{"min_ago": 5, "tool": "stop_instance", "instance": bad}]), "history[0].instance"),
    ]
    for mutate, where in cases:
        msg = _refused(tmp_path, json.dumps(_variant(mutate)))
        assert msg == f"{where}: holds the control character {code} at position 1; an id is printable text", msg


def test_printable_ids_are_accepted(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_variant(lambda d: d["fleet"][0].update(id="gpu-Zürich 7"))))
    assert load_scenario(path)[0].fleet[0].id == "gpu-Zürich 7"


@pytest.mark.parametrize("now", ["2026-06-09T16:50:00", "2026-06-09 16:50", "2026-06-09"])
def test_now_without_a_time_zone_is_refused(tmp_path, now):
    msg = _refused(tmp_path, json.dumps(_variant(lambda d: d.update(now=now))))
    assert msg == "now: has no time zone; end it with Z (UTC) or an offset such as +02:00"


def test_now_with_an_offset_is_the_same_moment(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_variant(lambda d: d.update(now="2026-06-09T18:50:00+02:00"))))
    path2 = tmp_path / "z.json"
    path2.write_text(json.dumps(BASE))
    assert load_scenario(path)[0].now == load_scenario(path2)[0].now


@pytest.mark.parametrize("state", ["claimed", "done"])
def test_history_naming_an_instance_outside_the_fleet_is_refused(tmp_path, state):
    entry = {"min_ago": 5, "tool": "stop_instance", "instance": "v-999", "state": state}
    msg = _refused(tmp_path, json.dumps(_variant(lambda d: d.update(history=[{"min_ago": 9, "tool": "launch_instance"}, entry]))))
    assert msg == ("history[1].instance: 'v-999' is not in fleet; add it there "
                   '(with "listed": false if the provider no longer lists it)')


@pytest.mark.parametrize("tool", ["stop_instance", "destroy_instance", "reboot_instance", "resume_instance", "diagnose_instance"])
def test_history_of_a_tool_acting_on_an_instance_must_name_it(tmp_path, tool):
    msg = _refused(tmp_path, json.dumps(_variant(lambda d: d.update(history=[{"min_ago": 5, "tool": tool}]))))
    assert msg == f"history[0].instance: {tool} acts on one instance; name it (an id of fleet)"


def test_history_about_an_instance_gone_before_now_names_its_fleet_entry(tmp_path):
    # gone before now: our database keeps its row, the provider no longer lists it
    gone = {"id": "v-90", "actual_status": "exited", "intended_status": "destroyed", "listed": False}
    history = [{"min_ago": 50, "tool": "destroy_instance", "instance": "v-90"},
               {"min_ago": 40, "tool": "launch_instance"}]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_variant(lambda d: (d["fleet"].append(gone), d.update(history=history)))))
    assert [h.instance for h in load_scenario(path)[0].history] == ["v-90", None]


# --- text that is not text -----------------------------------------------------------------------


def test_a_lone_surrogate_is_refused_wherever_it_is(tmp_path):
    step = {"tool": "diagnose_instance", "args": {"instance_id": "SURROGATE"}}
    text = json.dumps(_variant(lambda d: d.update(steps=[step]))).replace("SURROGATE", "v\\ud800")
    assert _refused(tmp_path, text).startswith("steps[0].args.instance_id: holds a lone UTF-16 surrogate escape")
    key = json.dumps(_variant(lambda d: d["steps"][0]["args"].update(KEY=1))).replace("KEY", "\\udc00")
    assert "steps[0].args.\\udc00: the key holds a lone UTF-16 surrogate" in _refused(tmp_path, key)
    pair = json.dumps(_variant(lambda d: d.update(about="SMILE"))).replace("SMILE", "\\ud83d\\ude00 fine")
    path = tmp_path / "pair.json"
    path.write_text(pair)
    assert load_scenario(path)[0].about == "\U0001f600 fine"


@pytest.mark.parametrize("mutate, problem", [
    (lambda d: d["fleet"][0].update(id="v\u0000x"), "fleet[0].id: holds the control character U+0000"),
    (lambda d: d.update(now="2026-06-09T16:50:00"), "now: has no time zone"),
    (lambda d: d.update(history=[{"min_ago": 5, "tool": "stop_instance", "instance": "v-9", "state": "claimed"}]),
     "history[0].instance: 'v-9' is not in fleet"),
    (lambda d: d["steps"][0].update(text="and some words"), "steps[0]: a step is one of tool, parallel, text or tool_result"),
])
def test_the_command_exits_2_for_each_new_check(tmp_path, mutate, problem):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_variant(mutate)))
    _exits_2(path, f"replay: {path}: {problem}")


def test_the_command_exits_2_for_a_lone_surrogate_it_once_crashed_on(tmp_path):
    step = {"tool": "diagnose_instance", "args": {"instance_id": "SURROGATE"}}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_variant(lambda d: d.update(steps=[step]))).replace("SURROGATE", "\\ud800"))
    _exits_2(path, f"replay: {path}: steps[0].args.instance_id: holds a lone UTF-16 surrogate escape")
