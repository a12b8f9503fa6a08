"""The settings page: policies per tool and launch priority, caps, dwell, hold-off, diagnosis
freshness, approval expiry and breaker limits. Defaults live in agent.policy.table; every change is an
audited override (who, why); bad input names the field and saves nothing."""

import pytest

from agent.actions.settings import OverrideError, do_update_overrides
from agent.models import SessionState
from agent.policy.limits import DEFAULT_LIMITS
from agent.policy.table import effective_limits, effective_policy
from fleet.models import AuditLog
from tests.console_support import HX

pytestmark = pytest.mark.django_db


def _form(client) -> dict:
    """The settings form as the browser would submit it (every field with its current value)."""
    import re

    html = client.get("/settings/").content.decode()
    data = {}
    for name, body in re.findall(r'<select name="([^"]+)"[^>]*>(.*?)</select>', html, re.S):
        m = re.search(r'<option value="([^"]*)" selected>', body)
        data[name] = m.group(1) if m else ""
    for name, value in re.findall(r'<input type="text" name="(limits__[^"]+)" value="([^"]*)"', html):
        data[name] = value
    return data


def test_it_shows_the_defaults(client, alice):
    client.force_login(alice)
    html = client.get("/settings/").content.decode()
    for key in ("stop_instance", "destroy_instance", "reboot_instance", "launch_instance", "launch_instance:P0",
                "launch_instance:P1", "max_dph", "max_instances", "dwell_min", "hold_off_min", "diagnosis_fresh_min",
                "approval_expiry_min", "max_steps", "same_error", "token_budget", "launch_rate"):
        assert f"<code>{key}</code>" in html, key
    data = _form(client)
    assert data["policy__stop_instance"] == "approval" and data["policy__launch_instance__P0"] == "auto"
    assert data["policy__launch_instance__P1"] == ""  # follows launch_instance
    assert data["limits__max_steps"] == str(DEFAULT_LIMITS["max_steps"])
    assert data["limits__launch_rate"] == "6, 600"


def test_an_operator_changes_a_policy_and_caps_and_it_is_audited(client, alice):
    client.force_login(alice)
    data = _form(client)
    data.update({"policy__reboot_instance": "auto", "policy__launch_instance__P1": "auto",
                 "limits__max_dph": "3.5", "limits__dwell_min": "30", "limits__approval_expiry_min": "45",
                 "reason": "night shift: nobody to approve reboots"})
    resp = client.post("/settings/", data)
    assert resp.status_code == 302
    state = SessionState.get()
    assert state.overrides["policy"] == {"reboot_instance": "auto", "launch_instance:P1": "auto"}
    assert state.overrides["limits"] == {"max_dph": 3.5, "dwell_min": 30.0, "approval_expiry_min": 45.0}
    assert effective_policy(state)["reboot_instance"] == "auto"
    assert effective_limits(state).max_dph == 3.5
    row = AuditLog.objects.get(verb="update_overrides")
    assert (row.actor, row.reason) == ("user:alice", "night shift: nobody to approve reboots")
    assert row.after["changed"]["limits.max_dph"] == {"from": None, "to": 3.5}
    html = client.get("/settings/").content.decode()
    assert html.count("overridden</span>") == 5


def test_bad_input_names_the_field_and_saves_nothing(client, alice):
    client.force_login(alice)
    data = _form(client)
    data.update({"policy__reboot_instance": "auto", "limits__max_steps": "0", "reason": "try"})
    resp = client.post("/settings/", data)
    assert resp.status_code == 400
    html = resp.content.decode()
    assert "must be between 1 and 100 (got 0)" in html
    assert html.index("must be between 1 and 100") > html.index("<code>max_steps</code>")
    assert SessionState.get().overrides.get("policy", {}) == {}
    assert not AuditLog.objects.filter(verb="update_overrides").exists()
    data.update({"limits__max_steps": "12", "limits__launch_rate": "6"})
    assert "must be [launches, seconds]" in client.post("/settings/", data).content.decode()
    data.update({"limits__launch_rate": "6, 600", "policy__stop_instance": "sometimes"})
    assert client.post("/settings/", data).status_code == 400
    data.update({"policy__stop_instance": "approval", "reason": ""})
    assert "say why" in client.post("/settings/", data).content.decode()
    assert SessionState.get().overrides.get("policy", {}) == {}


def test_setting_a_value_back_to_its_default_removes_the_override(client, alice):
    do_update_overrides({"stop_instance": "forbidden"}, {"max_instances": 9}, "user:alice", "test")
    client.force_login(alice)
    data = _form(client)
    assert data["policy__stop_instance"] == "forbidden" and data["limits__max_instances"] == "9"
    data.update({"policy__stop_instance": "approval", "limits__max_instances": str(effective_limits(
        SessionState(overrides={})).max_instances), "reason": "back to normal"})
    resp = client.post("/settings/", data, headers=HX)
    assert resp.status_code == 200 and "settings saved" in resp.content.decode()
    assert "settings-changed" in resp["HX-Trigger"]
    assert SessionState.get().overrides == {"policy": {}, "limits": {}}


def test_do_update_overrides_validates_everything_first():
    with pytest.raises(OverrideError) as err:
        do_update_overrides({"reboot_instance": "auto", "teleport": "auto"}, {}, "user:alice", "x")
    assert err.value.field == "policy.teleport"
    with pytest.raises(OverrideError) as err:
        do_update_overrides({"reboot_instance": "auto"}, {"max_dph": -1}, "user:alice", "x")
    assert err.value.field == "limits.max_dph"
    with pytest.raises(OverrideError, match="whole number"):
        do_update_overrides({}, {"max_steps": 2.5}, "user:alice", "x")
    with pytest.raises(OverrideError, match="ascending"):
        do_update_overrides({}, {"repeat_reminders": [5, 3]}, "user:alice", "x")
    with pytest.raises(OverrideError):
        do_update_overrides({}, {"max_steps": True}, "user:alice", "x")
    assert SessionState.get().overrides == {}
    assert not AuditLog.objects.exists()


def test_viewers_see_the_settings_but_cannot_save(client, bob):
    client.force_login(bob)
    html = client.get("/settings/").content.decode()
    assert 'disabled title="viewers cannot act"' in html
    assert client.post("/settings/", {"reason": "x", "limits__max_dph": "1"}).status_code == 403
    assert SessionState.get().overrides == {}
