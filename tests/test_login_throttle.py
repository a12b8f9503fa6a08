"""Login throttling (django-axes, console.auth): a few failed sign-ins lock out that username, or
that address, even for the right password; the login page says so; a ``login_lockout`` alert is
raised once, naming an existing user but never repeating a typed username that is no user.

Real parts: the login page over Django's test client, the test database (axes' attempt rows).
"""

import pytest
from django.conf import settings
from django.test import Client

from fleet.models import Alert

pytestmark = pytest.mark.django_db

RIGHT = "alice-pass-1"


def sign_in(username: str, password: str, address: str = "10.0.0.1"):
    client = Client(REMOTE_ADDR=address)
    resp = client.post("/login/", {"username": username, "password": password})
    return resp, client


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_thirty_wrong_passwords_then_the_right_one_is_refused(alice):
    statuses = [sign_in("alice", f"wrong-{i}")[0].status_code for i in range(30)]
    limit = settings.AXES_FAILURE_LIMIT
    assert statuses[: limit - 1] == [200] * (limit - 1)  # the form again: "didn't match"
    assert set(statuses[limit - 1:]) == {429}  # locked from the limit-th failure on
    resp, client = sign_in("alice", RIGHT)
    assert resp.status_code == 429 and not signed_in(client)
    html = resp.content.decode()
    assert 'id="login-locked"' in html and "Too many failed sign-ins" in html and "even with the right password" in html
    assert f"{settings.AXES_COOLOFF_TIME.total_seconds() / 60:g} minutes" in html
    alerts = list(Alert.objects.filter(kind="login_lockout"))
    assert len(alerts) == 1  # one per episode, not one per refused attempt
    assert "user 'alice'" in alerts[0].message and "10.0.0.1" in alerts[0].message


def test_per_user_the_lock_follows_the_username_to_another_address(alice, bob):
    for i in range(settings.AXES_FAILURE_LIMIT):
        sign_in("alice", f"wrong-{i}", address=f"10.0.1.{i}")  # each from its own address
    resp, client = sign_in("alice", RIGHT, address="10.0.9.9")
    assert resp.status_code == 429 and not signed_in(client)
    assert Alert.objects.filter(kind="login_lockout").count() == 1  # alice's lock: one alert, whatever the address
    # near miss: another user from a fresh address is not touched by alice's lock
    resp, client = sign_in("bob", "bob-pass-1", address="10.0.9.8")
    assert resp.status_code == 302 and signed_in(client)


def test_per_address_the_lock_covers_every_username_from_it(alice, bob):
    for i in range(settings.AXES_FAILURE_LIMIT):
        sign_in(f"guess-{i}", "wrong", address="10.0.2.1")  # one address, many usernames
    resp, client = sign_in("bob", "bob-pass-1", address="10.0.2.1")
    assert resp.status_code == 429 and not signed_in(client)
    # near miss: the same user from another address signs in
    resp, client = sign_in("bob", "bob-pass-1", address="10.0.2.2")
    assert resp.status_code == 302 and signed_in(client)
    alert = Alert.objects.get(kind="login_lockout")
    # the typed usernames were no users: none is repeated in the alert (an outsider's text)
    assert "guess-" not in alert.message and "not a Warden user" in alert.message


def test_fewer_failures_than_the_limit_then_success_resets_the_count(alice):
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        sign_in("alice", f"wrong-{i}")
    resp, client = sign_in("alice", RIGHT)
    assert resp.status_code == 302 and signed_in(client)
    for i in range(settings.AXES_FAILURE_LIMIT - 1):  # counted from zero again
        assert sign_in("alice", f"wrong-again-{i}")[0].status_code == 200
    assert sign_in("alice", RIGHT)[0].status_code == 302
    assert not Alert.objects.filter(kind="login_lockout").exists()
