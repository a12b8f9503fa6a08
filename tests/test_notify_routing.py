"""What notifies and whom: ``escalate_human`` P0/P1 go to the notifications and the Alerts page,
P2/P3 to the Alerts page only; P0/P1 alerts notify unless silenced; approvals
notify when parked, when about to expire and when expired; each operator gets only the kinds
they ticked, once per event and channel."""

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User

from agent.actions.alerts import do_silence_alert
from agent.actions.notifications import do_save_notification_settings
from agent.models import Approval, Notification
from agent.notify.notifications import scan
from agent.planners.script import ScriptPlanner
from agent.runtime.loop import expire_approvals, run_cycle
from fleet.alerts import raise_alert, resolve
from fleet.clock import clock
from fleet.models import Alert, AuditLog
from tests.console_support import IDLE, park_stops
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])

DONE = {"text": 'done <verdict>{"action": true, "state_changed": false}</verdict>'}


@pytest.fixture
def subscribed(alice):
    do_save_notification_settings(alice, email="alice@example.test", webhook_ref="env:WARDEN_TEST_HOOK",
                                  kinds=["approval_new", "approval_expiring", "approval_expired", "alert", "escalation"],
                                  actor="user:alice")
    carol = User.objects.create_user("carol", password="x")
    do_save_notification_settings(carol, email="carol@example.test", webhook_ref="", kinds=["escalation"], actor="user:carol")
    return alice, carol


def _escalate(severity: str, message: str):
    run = run_cycle("operator", planner=ScriptPlanner([
        {"tool": "escalate_human", "args": {"severity": severity, "message": message}}, DONE]))
    step = run.steps.get(tool="escalate_human")
    assert step.outcome == "executed", (step.outcome, step.reason_code, step.detail)
    return json.loads(step.observation.removeprefix("ok: true\n"))


def test_escalations_p0_and_p1_notify_and_lower_ones_only_reach_the_alerts_page(subscribed):
    with scenario_world([entry("v-1")], IDLE):
        low = _escalate("P2", "v-1 proves slowly; look when you can")
        assert Alert.objects.get(kind="escalation", severity="P2").state == "firing"  # on the Alerts page
        assert Notification.objects.count() == 0
        high = _escalate("P0", "every worker is dead and 40 tasks wait")
    assert low["routed_to"] == ["alerts"] and "notifications_queued" not in low
    assert high["routed_to"] == ["alerts", "notifications"] and high["notifications_queued"] == 3
    rows = Notification.objects.all()
    # alice: email + webhook; carol: email only
    assert sorted((n.user.username, n.channel, n.kind) for n in rows) == [
        ("alice", "email", "escalation"), ("alice", "webhook", "escalation"), ("carol", "email", "escalation")]
    assert all(n.subject.startswith("[P0] escalation") for n in rows)


def test_p1_alerts_notify_once_per_episode_and_p2_alerts_do_not(subscribed):
    alice, _ = subscribed
    raise_alert("provider_error", "vast.ai answered 500", severity="P2")
    assert Notification.objects.count() == 0
    raise_alert("workers_dead", "0 of 3 workers live", severity="P1")
    raise_alert("workers_dead", "0 of 3 workers live", severity="P1")  # same episode: the open alert
    assert Notification.objects.filter(user=alice, kind="alert").count() == 2  # email + webhook, once


def test_a_silenced_key_does_not_notify_until_its_silence_ends(subscribed):
    alert = raise_alert("workers_dead", "0 of 3 workers live", severity="P0")
    Notification.objects.all().delete()
    do_silence_alert(alert, "user:alice", 60, "known: rebooting the host")
    resolve("workers_dead")
    again = raise_alert("workers_dead", "0 of 3 workers live", severity="P0")  # a new episode inside the silence
    assert again.pk != alert.pk and again.is_silenced(clock.now())
    assert Notification.objects.count() == 0
    assert scan() == 0
    later = clock.now() + timedelta(minutes=61)
    assert scan(later) == 2  # still firing when the silence ended: alice is told (email + webhook)
    assert scan(later) == 0


def test_approvals_notify_when_parked_about_to_expire_and_expired(subscribed):
    alice, carol = subscribed
    with scenario_world([entry("v-1")], IDLE):
        park_stops("v-1")
    approval = Approval.objects.get()
    assert set(Notification.objects.values_list("kind", flat=True)) == {"approval_new"}
    assert not Notification.objects.filter(user=carol).exists()  # carol did not ask for approvals
    assert scan() == 0  # 30 minutes left: not yet about to expire
    soon = approval.expires_at - timedelta(minutes=5)
    assert scan(soon) == 2 and scan(soon) == 0
    expiring = Notification.objects.get(kind="approval_expiring", channel="email")
    assert expiring.subject.startswith(f"Approval {approval.pk} expires in 5 min")
    Approval.objects.filter(pk=approval.pk).update(expires_at=clock.now() - timedelta(seconds=1))
    expire_approvals()
    assert scan() == 2
    assert Notification.objects.get(kind="approval_expired", channel="webhook").body.startswith("Nobody answered run")


def test_the_settings_refuse_a_pasted_url_and_unknown_kinds_and_audit_the_reference(alice):
    with pytest.raises(ValueError, match="do not paste the webhook URL"):
        do_save_notification_settings(alice, email="", webhook_ref="https://hooks.slack.com/services/T/B/xyz",
                                      kinds=[], actor="user:alice")
    with pytest.raises(ValueError, match="kinds: unknown kind 'everything'"):
        do_save_notification_settings(alice, email="", webhook_ref="", kinds=["everything"], actor="user:alice")
    with pytest.raises(ValueError, match="not an email address"):
        do_save_notification_settings(alice, email="alice@", webhook_ref="", kinds=[], actor="user:alice")
    assert not AuditLog.objects.filter(verb="notification_settings").exists()
    do_save_notification_settings(alice, email="a@example.test", webhook_ref="file:/etc/warden/slack-url",
                                  kinds=["alert"], actor="user:alice")
    assert AuditLog.objects.get(verb="notification_settings").after == {
        "email": "a@example.test", "webhook_ref": "file:/etc/warden/slack-url", "kinds": ["alert"]}
