"""The target proofs/hr refuses what is not a plain number: ``-0``, ``1e-320``,
full-width digits, exponents, signs, infinities, NaN and too many decimals are refused with a
message naming the problem; the stored target and the audit log are untouched."""

import pytest

from agent.actions.session import do_set_target
from agent.models import SessionState
from fleet.models import AuditLog
from tests.console_support import HX


@pytest.mark.parametrize("text, says", [
    ("-0", "cannot be negative, not even -0"),
    ("-0.0", "cannot be negative, not even -0"),
    ("-5", "cannot be negative"),
    ("1e-320", "no sign or exponent"),
    ("1e3", "no sign or exponent"),
    ("+5", "no sign or exponent"),
    ("0.001", "at most 2 decimals"),
    ("１２０", "full-width and other digits are not accepted"),
    ("١٢٠", "full-width and other digits are not accepted"),  # Arabic-Indic digits
    ("inf", "must be a number"),
    ("NaN", "must be a number"),
    ("1_000", "must be a number"),
    ("2000000", "must be between 0 and 1,000,000"),
])
def test_the_dashboard_refuses_a_target_that_is_not_a_plain_number(client, alice, text, says):
    SessionState.objects.update_or_create(pk=1, defaults={"target_proofs_hr": 90})
    client.force_login(alice)
    resp = client.post("/actions/target/", {"target": text, "reason": "try"}, headers=HX)
    html = resp.content.decode()
    assert says in html, html
    assert "target set to" not in html
    state = SessionState.get()
    assert state.target_proofs_hr == 90 and str(state.target_proofs_hr) == "90.0"
    assert not AuditLog.objects.filter(verb="set_target").exists()


def test_a_plain_post_gets_a_400_page_with_the_reason(client, alice):
    client.force_login(alice)
    resp = client.post("/actions/target/", {"target": "1e-320"})
    assert resp.status_code == 400
    assert "no sign or exponent" in resp.content.decode()


@pytest.mark.parametrize("text, stored", [("0", 0.0), ("120", 120.0), ("7.5", 7.5), (" 42 ", 42.0), ("1000000", 1e6)])
def test_plain_numbers_are_accepted(client, alice, text, stored):
    client.force_login(alice)
    resp = client.post("/actions/target/", {"target": text}, headers=HX)
    assert "target set to" in resp.content.decode()
    assert SessionState.get().target_proofs_hr == stored


@pytest.mark.parametrize("value", [-0.0, 1e-320, float("inf"), float("nan"), -1.0, 1e7, "120", True])
def test_the_action_itself_refuses_what_the_form_would(db, value):
    SessionState.objects.update_or_create(pk=1, defaults={"target_proofs_hr": 90})
    with pytest.raises(ValueError, match="target proofs/hr must be"):
        do_set_target(value, "user:alice")
    assert SessionState.get().target_proofs_hr == 90
    assert not AuditLog.objects.filter(verb="set_target").exists()
