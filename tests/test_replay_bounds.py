"""Replay bounds the work a file may ask for before doing any of it, and always removes its
temporary folder (docs/replay.md "Bounds").

A file is refused with one line (exit 2) when it holds more than 1,000 steps or model responses,
more than 1,000 operator decisions, or more than 500,000 units of work (instances × cycles ×
planner turns); a file just inside runs. The temporary folder of a replay is gone after a run, a
refusal, a SIGTERM, a Ctrl-C, and (for a parent killed with SIGKILL) after the next replay.
"""

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.replay import ScenarioFileError, load_scenario
from agent.replay.file_format import MAX_WORK, work_units

ROOT = Path(__file__).resolve().parent.parent
BASE = json.loads((ROOT / "tests" / "scenarios" / "v2-fault-skip.json").read_text())
VERDICT = {"text": 'done <verdict>{"action": false, "state_changed": false}</verdict>'}


def scenario(fleet: int = 1, moments: int = 0, steps: int = 1, decisions: int = 0, **extra) -> dict:
    d = copy.deepcopy(BASE)
    for key in ("expect", "provider_faults"):
        d.pop(key, None)
    entry = d["fleet"][0]
    d["fleet"] = [{**copy.deepcopy(entry), "id": f"v-{i}"} for i in range(fleet)]
    d["objectives"] = {"target_proofs_hr": 40, "max_instances": 10_000, "max_dph": 100_000}
    d["demand"].update(workers_expected=fleet, workers_live=fleet)
    if steps is not None:
        d["steps"] = [{"tool": "list_instances", "args": {}}] * steps + [VERDICT]
    else:
        d.pop("steps", None)
    d["timeline"] = [{"at_min": i + 1, "run": "heartbeat"} for i in range(moments)]
    d["operator"] = {"default": "none", "decisions": [{"tool": "stop_instance", "decision": "approve"}] * decisions}
    d.update(extra)
    return d


def write(tmp_path, data: dict, name: str = "s.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def replay(path, tmpdir, timeout=300, **popen):
    env = {**{k: v for k, v in os.environ.items() if k != "WARDEN_REPLAY_DB_DIR"}, "TMPDIR": str(tmpdir)}
    return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "replay", str(path)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.parametrize(("data", "says"), [
    (scenario(fleet=1000, moments=600), "the file asks for too much work: 1,000 instances"),
    (scenario(fleet=50, moments=999, steps=12), "× 1,000 cycles × 13 planner turns = 650,000 units"),
    (scenario(steps=1000), "steps: 1,001 entries; a replay plays at most 1,000"),
    (scenario(decisions=1001), "operator decisions: 1,001 in all"),
    (scenario(fleet=1, offers=[{"id": f"o-{i}", "gpu_name": "RTX 4090", "dph": 0.4} for i in range(9_999)],
              moments=10, planner="rules", steps=None), "10,000 instances (fleet, offers and timeline fleet entries)"),
])
def test_a_file_that_asks_too_much_is_refused_before_it_is_validated(tmp_path, data, says):
    with pytest.raises(ScenarioFileError) as exc:
        load_scenario(write(tmp_path, data))
    assert says in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_the_bound_counts_what_the_contract_says():
    assert work_units(scenario(fleet=3, moments=4, steps=2)) == (3 * 5 * 4, 3, 5, 4)  # 2 calls and a verdict: 1 + 3 turns
    rules = scenario(fleet=2, planner="rules", steps=None)
    assert work_units({**rules, "objectives": {"max_steps": 20}}) == (2 * 1 * 20, 2, 1, 20)
    assert work_units({"fleet": "nonsense", "timeline": 7}) == (1 * 1 * 1, 1, 1, 1)  # checked later, never crashes


def test_every_scenario_of_the_suite_is_far_inside_the_bound():
    for path in (ROOT / "tests" / "scenarios").rglob("*.json"):
        assert work_units(json.loads(path.read_text()))[0] <= MAX_WORK // 100, path.name


def test_the_command_refuses_with_one_line_exit_2_and_leaves_no_folder(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = replay(write(tmp_path, scenario(fleet=1000, moments=600)), scratch)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and "too much work" in err, err
    assert list(scratch.iterdir()) == []


@pytest.mark.slow
def test_a_replay_inside_the_bound_runs_and_removes_its_folder(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    stale = scratch / "warden-replay-999999999-left"  # a parent killed with SIGKILL left it; that pid is not running
    stale.mkdir()
    (stale / "replay.sqlite3").write_bytes(b"x" * 1000)
    proc = replay(write(tmp_path, scenario(fleet=20, moments=3)), scratch)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert list(scratch.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_replay_removes_its_folder(tmp_path, sig):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = replay(write(tmp_path, scenario(fleet=2000, moments=5)), scratch)
    try:
        deadline = time.monotonic() + 120
        while not any(p.name.startswith("warden-replay-") and any(p.iterdir()) for p in scratch.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + sig), err
    assert "temporary folder removed" in err and "Traceback" not in err, err
    assert list(scratch.iterdir()) == []
