"""One rule for every number an operator types (``fleet.numbers``): plain ASCII decimals only.

Each refused form (``1e-320``, full-width ``１０``, Arabic-Indic ``٤``, ``1_0``, ``-0``, a nested
list) is tried at each entry point — a limit on the settings page, the target, demo enqueue on the
dashboard and from the shell, and a replay file's objectives — and each is refused there with a
message naming the field; the near misses (``10``, ``7.5``) are accepted at each.
"""

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from agent.actions.settings import OverrideError, validate_overrides
from agent.models import SessionState
from agent.replay import ScenarioFileError, load_scenario
from fleet.harmony import HarmonyTask
from fleet.models import AuditLog
from fleet.numbers import NumberError, parse_number, parse_number_list
from tests.console_support import HX

ROOT = Path(__file__).resolve().parent.parent
BASE = json.loads((ROOT / "tests" / "scenarios" / "v2-fault-skip.json").read_text())

#: (typed text, a fragment of the reason); each is refused everywhere
REFUSED = [
    ("1e-320", "no sign or exponent"),
    ("１０", "digits 0-9"),
    ("٤", "digits 0-9"),
    ("1_0", "no _ or space separators"),
    ("-0", "not even -0"),
    ("[[6]]", "not a list"),
    ("inf", "number, e.g."),
    ("", "number, e.g."),
]
ACCEPTED = [("12", 12), ("7.5", 7.5)]  # 10 is max_dph's default: no override


@pytest.mark.parametrize(("text", "says"), REFUSED)
def test_the_rule_refuses_each_form_with_its_reason(text, says):
    with pytest.raises(NumberError) as exc:
        parse_number(text, "max_dph", low=0, high=100_000)
    assert str(exc.value).startswith("max_dph ") and says in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("value", [1e-320, -0.0, float("nan"), True, None, [6], {"a": 1}])
def test_a_number_is_judged_by_its_written_form(value):
    with pytest.raises(NumberError):
        parse_number(value, "max_dph", low=0, high=100_000)


def test_near_misses_are_read():
    assert parse_number("10", "n", low=0, high=100) == 10.0 and parse_number(" 7.5 ", "n", low=0, high=100) == 7.5
    assert parse_number("6.0", "n", low=0, high=100, whole=True) == 6
    assert parse_number(0.5, "n", low=0, high=1) == 0.5 and parse_number(12, "n", low=0, high=100, whole=True) == 12
    assert parse_number_list("6, 600", "l", low=1, high=1000) == [6, 600]
    assert parse_number_list("[3, 5, 8]", "l", low=1, high=100) == [3, 5, 8]
    for nested in ("[[6, 600]]", "[6, [600]]", [[6], 600]):
        with pytest.raises(NumberError, match="nested lists are not read"):
            parse_number_list(nested, "l", low=1, high=1000)


# --- the settings page ---------------------------------------------------------------------------

def _settings_post(client, **limits):
    from tests.test_settings_page import _form

    data = _form(client)
    data.update({**{f"limits__{k}": v for k, v in limits.items()}, "reason": "try"})
    return client.post("/settings/", data)


@pytest.mark.django_db
@pytest.mark.parametrize(("text", "says"), [r for r in REFUSED if r[0]])
def test_the_settings_page_refuses_each_form(client, alice, text, says):
    client.force_login(alice)
    resp = _settings_post(client, max_dph=text)
    assert resp.status_code == 400
    html = resp.content.decode()
    html = html.replace("&#x27;", "'")
    assert says in html, html[:3000]
    assert html.index(says, html.index("<code>max_dph</code>")) > 0  # shown at the field it names
    assert SessionState.get().overrides.get("limits", {}) == {}
    assert not AuditLog.objects.filter(verb="update_overrides").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("text", ["[[6, 600]]", "6, [600]", "６, 600", "6, 6e2", "6, -0"])
def test_the_settings_page_refuses_a_nested_or_odd_list(client, alice, text):
    client.force_login(alice)
    resp = _settings_post(client, launch_rate=text)
    assert resp.status_code == 400, text
    assert SessionState.get().overrides.get("limits", {}) == {}


@pytest.mark.django_db
@pytest.mark.parametrize(("text", "stored"), ACCEPTED)
def test_the_settings_page_accepts_plain_decimals(client, alice, text, stored):
    client.force_login(alice)
    assert _settings_post(client, max_dph=text, launch_rate="[4, 300]").status_code == 302
    assert SessionState.get().overrides["limits"] == {"max_dph": stored, "launch_rate": [4, 300]}


def test_validate_overrides_refuses_the_forms_from_any_caller():
    for text, says in REFUSED:
        with pytest.raises(OverrideError) as exc:
            validate_overrides({}, {"max_dph": text})
        assert str(exc.value).startswith("limits.max_dph: ") and says in str(exc.value)
    with pytest.raises(OverrideError, match="nested"):
        validate_overrides({}, {"repeat_reminders": [[3], 5]})


# --- the target ----------------------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize(("text", "says"), [r for r in REFUSED if r[0]])
def test_the_target_refuses_each_form(client, alice, text, says):
    SessionState.objects.update_or_create(pk=1, defaults={"target_proofs_hr": 90})
    client.force_login(alice)
    html = client.post("/actions/target/", {"target": text, "reason": "try"}, headers=HX).content.decode()
    assert says in html.replace("&#x27;", "'") and "target set to" not in html, html
    assert SessionState.get().target_proofs_hr == 90


@pytest.mark.django_db
@pytest.mark.parametrize(("text", "stored"), ACCEPTED)
def test_the_target_accepts_plain_decimals(client, alice, text, stored):
    client.force_login(alice)
    assert "target set to" in client.post("/actions/target/", {"target": text}, headers=HX).content.decode()
    assert SessionState.get().target_proofs_hr == stored


# --- demo enqueue --------------------------------------------------------------------------------

@pytest.mark.django_db(databases=["default", "harmony"])
@pytest.mark.parametrize(("text", "says"), [r for r in REFUSED if r[0]])
def test_demo_enqueue_refuses_each_form_on_the_dashboard_and_in_the_shell(client, alice, text, says):
    before = HarmonyTask.objects.count()
    client.force_login(alice)
    html = client.post("/actions/demo/enqueue/", {"n": text}, headers=HX).content.decode()
    assert "the number of tasks " in html and says in html.replace("&#x27;", "'"), html
    with pytest.raises(CommandError, match="demo enqueue: N "):
        call_command("demo", "enqueue", text, stdout=io.StringIO())
    assert HarmonyTask.objects.count() == before


@pytest.mark.django_db(databases=["default", "harmony"])
def test_demo_enqueue_accepts_a_plain_count(client, alice):
    from fleet.demo import prepare

    prepare()
    before = HarmonyTask.objects.count()
    client.force_login(alice)
    assert "added 10 tasks" in client.post("/actions/demo/enqueue/", {"n": "10"}, headers=HX).content.decode()
    assert HarmonyTask.objects.count() == before + 10


# --- a replay file's objectives ------------------------------------------------------------------

def _objectives_file(tmp_path, literal: str) -> Path:
    text = json.dumps({**BASE, "objectives": {"max_dph": "__X__"}}).replace('"__X__"', literal)
    path = tmp_path / "s.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("literal", "says"), [("1e-320", "no sign or exponent"), ("-0", "not even -0"),
                                               ("-0.0", "not even -0"), ("1E2", "no sign or exponent"),
                                               ("[[6]]", "not a list")])
def test_replay_objectives_refuse_each_form_as_written(tmp_path, literal, says):
    with pytest.raises(ScenarioFileError) as exc:
        load_scenario(_objectives_file(tmp_path, literal))
    assert says in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


@pytest.mark.parametrize(("literal", "value"), [("10", 10), ("7.5", 7.5)])
def test_replay_objectives_accept_plain_decimals(tmp_path, literal, value):
    scenario, _raw = load_scenario(_objectives_file(tmp_path, literal))
    assert scenario.objectives["max_dph"] == value
