"""Alerts tab: silence for a time (not firing, no notification until it ends), end a silence,
acknowledge a selection with one comment (an audit row each, all or none); the Notifications
page shows the webhook reference and whether it resolves, never a URL."""

from datetime import timedelta

import pytest

from agent.actions.alerts import do_ack_alert
from agent.models import Notification
from fleet.alerts import raise_alert
from fleet.clock import clock
from fleet.models import Alert, AuditLog
from tests.console_support import HX

pytestmark = pytest.mark.django_db


def _three():
    return (raise_alert("workers_dead", "0 of 2 workers live", severity="P0"),
            raise_alert("demand_unknown", "harmony unreadable", severity="P1"),
            raise_alert("provider_error", "vast.ai 500", key="provider:vast"))


def test_a_silenced_alert_leaves_firing_until_its_silence_ends(client, alice):
    dead, unknown, _ = _three()
    client.force_login(alice)
    resp = client.post(f"/alerts/{dead.pk}/silence/", {"minutes": "60", "comment": "host rebooting", "state": "firing"})
    assert resp.status_code == 302 and resp["Location"] == "/alerts/?state=firing"
    dead.refresh_from_db()
    assert dead.state == "firing" and dead.silenced_by == "user:alice" and dead.silence_comment == "host rebooting"
    assert timedelta(minutes=59) < dead.silenced_until - clock.now() <= timedelta(minutes=60)
    row = AuditLog.objects.get(verb="silence_alert")
    assert row.target == f"alert {dead.pk}" and row.after["minutes"] == 60 and row.reason == "host rebooting"
    html = client.get("/alerts/").content.decode().replace("\n", "")
    assert f'id="alert-{dead.pk}"' not in html and f'id="alert-{unknown.pk}"' in html
    assert 'id="chip-firing">firing <span class="n">2</span>' in html
    assert 'id="chip-silenced">silenced <span class="n">1</span>' in html
    silenced = client.get("/alerts/?state=silenced").content.decode()
    assert f'id="alert-{dead.pk}"' in silenced and "by user:alice" in silenced and "End silence" in silenced
    # the silence ends: firing again
    Alert.objects.filter(pk=dead.pk).update(silenced_until=clock.now() - timedelta(seconds=1))
    assert f'id="alert-{dead.pk}"' in client.get("/alerts/").content.decode()


def test_ending_a_silence_and_bad_durations(client, alice):
    dead, _, _ = _three()
    client.force_login(alice)
    resp = client.post(f"/alerts/{dead.pk}/silence/", {"minutes": "7"}, headers=HX)
    assert resp.status_code == 200 and "choose one of the offered durations" in resp.content.decode()
    assert Alert.objects.get(pk=dead.pk).silenced_until is None
    client.post(f"/alerts/{dead.pk}/silence/", {"minutes": "15"})
    resp = client.post(f"/alerts/{dead.pk}/unsilence/", {"state": "firing"})
    assert resp.status_code == 302 and not Alert.objects.get(pk=dead.pk).is_silenced(clock.now())
    assert AuditLog.objects.filter(verb="unsilence_alert").count() == 1
    assert client.post(f"/alerts/{dead.pk}/unsilence/", {}).status_code == 409  # not silenced any more


def test_a_resolved_alert_cannot_be_silenced(client, alice):
    _, _, old = _three()
    Alert.objects.filter(pk=old.pk).update(state="resolved", resolved_at=clock.now())
    client.force_login(alice)
    resp = client.post(f"/alerts/{old.pk}/silence/", {"minutes": "60"})
    assert resp.status_code == 409 and "is resolved" in resp.content.decode()


def test_bulk_acknowledge_writes_one_audit_row_each(client, alice):
    dead, unknown, vast = _three()
    client.force_login(alice)
    html = client.get("/alerts/").content.decode()
    assert 'form="bulk-ack"' in html and 'id="alerts-select-all"' in html
    resp = client.post("/alerts/ack/", {"alert": [dead.pk, unknown.pk], "comment": "alice on both", "state": "firing"})
    assert resp.status_code == 302
    states = dict(Alert.objects.values_list("pk", "state"))
    assert states == {dead.pk: "acknowledged", unknown.pk: "acknowledged", vast.pk: "firing"}
    rows = AuditLog.objects.filter(verb="ack_alert").order_by("target")
    assert sorted(r.target for r in rows) == sorted([f"alert {dead.pk}", f"alert {unknown.pk}"])
    assert {r.reason for r in rows} == {"alice on both"}


def test_bulk_acknowledge_is_all_or_nothing_and_needs_a_selection_and_a_comment(client, alice):
    dead, unknown, vast = _three()
    do_ack_alert(unknown, "user:carol", "carol has it")
    client.force_login(alice)
    resp = client.post("/alerts/ack/", {"alert": [dead.pk, unknown.pk, vast.pk], "comment": "mine"})
    assert resp.status_code == 409 and f"nothing acknowledged: alert {unknown.pk} is already acknowledged" in resp.content.decode()
    assert Alert.objects.get(pk=dead.pk).state == "firing" and Alert.objects.get(pk=vast.pk).state == "firing"
    assert client.post("/alerts/ack/", {"comment": "mine"}).status_code == 400
    resp = client.post("/alerts/ack/", {"alert": [dead.pk], "comment": ""}, headers=HX)
    assert resp.status_code == 200 and "say what you are doing about it" in resp.content.decode()
    assert client.post("/alerts/ack/", {"alert": ["x"], "comment": "mine"}).status_code == 400
    assert AuditLog.objects.filter(verb="ack_alert", actor="user:alice").count() == 0


def test_the_notifications_page_names_the_reference_and_refuses_a_url(client, alice, bob, monkeypatch):
    client.force_login(alice)
    resp = client.post("/notifications/", {"email": "alice@example.test", "webhook_ref": "https://hooks.slack.com/x/y/z",
                                           "kind": ["alert"]})
    assert resp.status_code == 400 and "do not paste the webhook URL" in resp.content.decode()
    assert "hooks.slack.com" not in resp.content.decode()  # a pasted URL is a secret: not echoed back
    resp = client.post("/notifications/", {"email": "alice@example.test", "webhook_ref": "env:WARDEN_TEST_PAGE_HOOK",
                                           "kind": ["alert", "approval_new"]})
    assert resp.status_code == 302
    html = client.get("/notifications/").content.decode()
    assert "env:WARDEN_TEST_PAGE_HOOK" in html and "environment variable WARDEN_TEST_PAGE_HOOK is not set" in html
    monkeypatch.setenv("WARDEN_TEST_PAGE_HOOK", "https://hooks.example.test/services/T/B/tok-123456")
    html = client.get("/notifications/").content.decode()
    assert "resolves now" in html and "tok-123456" not in html
    raise_alert("budget", "over the cap", severity="P0")
    assert Notification.objects.filter(user=alice).count() == 2
    assert "[P0] budget" in client.get("/notifications/").content.decode()
    client.force_login(bob)  # a viewer sees the page, with the form disabled, and cannot save
    assert 'id="notify-email" name="email" value="" maxlength="254" placeholder="you@example.com" disabled' in (
        client.get("/notifications/").content.decode())
    assert client.post("/notifications/", {"email": "bob@example.test"}).status_code == 403
    assert AuditLog.objects.filter(verb="notification_settings").count() == 1
