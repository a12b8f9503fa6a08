"""One typed limits schema (``agent.policy.limits.Limits``): every limit's type, default and range in
one place, read by the settings page, replay files' objectives, the policy merge and the loop."""

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.actions.settings import OverrideError, validate_overrides
from agent.policy.limits import DEFAULT_LIMITS, LIMIT_RANGES, MAX_TARGET_PROOFS_HR, Limits, default
from agent.replay.file_format import check_objectives

ROOT = Path(__file__).resolve().parent.parent
#: how the code reads a limit: ``limits.x``, ``lim.x``, ``world.limits.x``, ``self.limits.x``
READ = re.compile(r"\b(?:limits|lim)\.([a-z_]+)\b")
NOT_LIMITS = {"values", "items", "get", "py", "model_dump"}  # dict methods on ``.values``, the file name


def test_every_limit_the_code_reads_is_a_field_of_the_schema():
    """A misspelt limit fails here, in CI, not in a run at 3 a.m. (Limits has no __getattr__)."""
    read = {}
    for path in sorted(ROOT.glob("*/**/*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in ("agent", "fleet", "console") or "migrations" in rel.parts:
            continue
        for name in READ.findall(path.read_text()):
            read.setdefault(name, str(rel))
    unknown = {n: where for n, where in read.items() if n not in Limits.model_fields and n not in NOT_LIMITS}
    assert unknown == {}
    assert "__getattr__" not in vars(Limits)
    with pytest.raises(AttributeError):
        Limits().dwell_mins  # noqa: B018


def test_an_unknown_or_mistyped_limit_is_refused_when_the_limits_are_built():
    with pytest.raises(ValidationError, match="dwell_mins"):
        Limits(dwell_mins=5)
    with pytest.raises(ValidationError, match="max_steps"):
        Limits(max_steps=2.5)
    with pytest.raises(ValidationError, match="launch_rate"):
        Limits(launch_rate=[0, 600])
    with pytest.raises(ValidationError, match="max_dph"):
        Limits(max_dph=float("inf"))
    assert Limits(dwell_min=0.5, max_steps=20).values["max_steps"] == 20


def test_the_settings_page_and_replay_files_take_the_schema_ranges():
    for name, (kind, low, high) in LIMIT_RANGES.items():
        if kind in ("int", "float"):
            with pytest.raises(OverrideError, match=name):
                validate_overrides({}, {name: high * 2 + 1})
            with pytest.raises(ValueError, match=name):
                check_objectives({name: high * 2 + 1})
            with pytest.raises(OverrideError, match=name):
                validate_overrides({}, {name: low - 1})
            assert validate_overrides({}, {name: high})[1][name] == high


def test_the_target_cap_is_one_number():
    """10^6 proofs/hr for the operator and for a replay file alike (the file's 10^9 is gone)."""
    assert check_objectives({"target_proofs_hr": MAX_TARGET_PROOFS_HR})
    with pytest.raises(ValueError, match="target_proofs_hr"):
        check_objectives({"target_proofs_hr": MAX_TARGET_PROOFS_HR + 1})


def test_defaults_have_one_home():
    from agent.policy import claims

    assert DEFAULT_LIMITS["claim_max_age_min"] == default("claim_max_age_min") == 30
    assert claims.settle_claims.__defaults__ == (30,)
    assert not hasattr(claims, "CLAIM_MAX_AGE_MIN")
    assert DEFAULT_LIMITS["network_recheck_min"] == 2
