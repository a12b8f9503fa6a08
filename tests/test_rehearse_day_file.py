"""``manage.py rehearse`` refuses a bad day file or option with one line naming what is wrong (exit 2)."""

import io
import json

import pytest
from django.core.management import call_command

from agent.rehearse.day import DayFileError, parse_day

GOOD = {
    "name": "small day",
    "market": {"offers": [{"gpu_name": "RTX 4090", "dph": 0.45}]},
    "work": {"proof_s": {"RTX 4090": {"median_s": 20}}, "arrivals": {"hourly": [10]}},
}


def _rehearse(tmp_path, day, *options):
    path = tmp_path / "day.json"
    path.write_text(day if isinstance(day, str) else json.dumps(day))
    err = io.StringIO()
    with pytest.raises(SystemExit) as exc:
        call_command("rehearse", str(path), *options, stderr=err, stdout=io.StringIO())
    return exc.value.code, err.getvalue().strip()


def _with(**changes):
    day = json.loads(json.dumps(GOOD))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = day
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return day


def test_a_good_day_takes_the_documented_defaults():
    d = parse_day(GOOD)
    assert d.horizon_h == 24 and d.heartbeat_s == 300 and d.planner == "rules"
    assert d.market.offers[0].count == 10 and d.market.loading.median_s == 300
    assert d.operator.approval_delay_min == [2.0] * 24 and d.work.looks_dead_s == 600


@pytest.mark.parametrize(("day", "names"), [
    (_with(market__offers=[{"gpu_name": "RTX 4090", "dph": 0.45, "colour": "red"}]), ["market.offers[0].colour", "unknown key"]),
    (_with(market__offers=[{"gpu_name": "RTX 4090", "dph": "0.45"}]), ["market.offers[0].dph", "strings and booleans"]),
    (_with(operator__reject_fraction=2), ["operator.reject_fraction", "less than or equal to 1"]),
    (_with(operator__approval_delay_min=[2] * 23), ["operator.approval_delay_min", "24"]),
    (_with(market__loading={"median_s": 600, "p95_s": 60}), ["market.loading", "p95_s"]),
    (_with(market__offers=[{"gpu_name": "A100", "dph": 1.0}]), ["work.proof_s", "'A100'"]),
    (_with(work__arrivals={"bursts": [{"at_h": 1, "count": 5, "type": "Snap"}]}), ["'Snap'", "work.task_types"]),
    (_with(horizon_h=0), ["horizon_h", "greater than 0"]),
    (_with(start="2026-06-09T00:00:00"), ["start", "time zone"]),
    (_with(planner="llm"), ["planner 'llm' needs model"]),
    (_with(policy={"launch_instance": "sometimes"}), ["policy.launch_instance"]),
    (_with(objectives={"target_proofs_hr": True}), ["objectives", "target_proofs_hr"]),
])
def test_a_bad_day_file_exits_2_with_one_line_naming_the_field(tmp_path, day, names):
    code, err = _rehearse(tmp_path, day)
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("rehearse: ") and "Traceback" not in err
    for name in names:
        assert name in err


@pytest.mark.parametrize(("text", "names"), [
    ("{not json", ["not JSON", "line 1"]),
    ('{"name": "x", "name": "y"}', ["appears twice"]),
    ("[1, 2]", ["one JSON object"]),
    ('{"name": "x", "seed": NaN}', ["seed", "finite"]),
])
def test_a_file_that_is_not_a_day_exits_2_with_one_line(tmp_path, text, names):
    code, err = _rehearse(tmp_path, text)
    assert code == 2 and len(err.splitlines()) == 1
    for name in names:
        assert name in err


@pytest.mark.parametrize(("options", "names"), [
    (["--hours", "0"], ["--hours", "out of range"]),
    (["--hours", "many"], ["--hours", "not a number"]),
    (["--hours", "200"], ["--hours", "at most 168"]),
    (["--planner", "llm"], ["planner 'llm' needs model"]),
])
def test_a_bad_option_exits_2_with_one_line(tmp_path, options, names):
    code, err = _rehearse(tmp_path, GOOD, *options)
    assert code == 2 and len(err.splitlines()) == 1
    for name in names:
        assert name in err


def test_a_missing_file_and_a_bad_compare_file_exit_2(tmp_path):
    err = io.StringIO()
    with pytest.raises(SystemExit) as exc:
        call_command("rehearse", str(tmp_path / "nope.json"), stderr=err)
    assert exc.value.code == 2 and "cannot read" in err.getvalue()
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**GOOD, "extra": 1}))
    code, text = _rehearse(tmp_path, GOOD, "--compare", str(other))
    assert code == 2 and str(other) in text and "extra: unknown key" in text


def test_parse_day_raises_one_line_for_a_value_that_is_not_an_object():
    with pytest.raises(DayFileError, match="one JSON object"):
        parse_day([GOOD])
