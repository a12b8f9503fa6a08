"""Notifications reach a real SMTP server and a real webhook receiver, after commit, through the
Celery queue; transient failures are retried, permanent ones are not; secrets stay references.

The SMTP server is aiosmtpd, the webhook receiver an ``http.server`` answering like Slack's
incoming webhooks (``tests/notify_support.py``); both listen on loopback ports of this test.
"""

import json

import pytest

from agent.actions.notifications import do_save_notification_settings
from agent.models import Notification
from agent.notify.notifications import deliver
from fleet.models import AuditLog
from tests.console_support import IDLE, broker_messages, park_stops
from tests.notify_support import WebhookReceiver, smtp_server
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


@pytest.fixture
def mail(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.NOTIFY = {**settings.NOTIFY, "RETRY_WAIT_S": 0.01, "ATTEMPTS": 4, "EMAIL_PASSWORD_REF": ""}
    with smtp_server() as (box, port):
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
        yield box


def _queued_pks() -> list[int]:
    return [m["args"][0] for m in broker_messages() if m["task"] == "agent.tasks.deliver_notification"]


def test_a_parked_approval_reaches_the_smtp_server_and_the_webhook_after_commit(
        alice, mail, monkeypatch, broker_queue, django_capture_on_commit_callbacks):
    with WebhookReceiver() as hook:
        monkeypatch.setenv("WARDEN_TEST_SLACK_URL", hook.url)
        do_save_notification_settings(alice, email="alice@example.test", webhook_ref="env:WARDEN_TEST_SLACK_URL",
                                      kinds=["approval_new"], actor="user:alice")
        with scenario_world([entry("v-1")], IDLE):
            with django_capture_on_commit_callbacks(execute=True):
                run, _ = park_stops("v-1")
                # written in the cycle's transaction, not sent yet: nothing is enqueued before commit
                assert Notification.objects.filter(status="queued").count() == 2
                assert _queued_pks() == []
            rows = list(Notification.objects.order_by("channel"))
            assert sorted(_queued_pks()) == sorted(n.pk for n in rows)  # one Celery task per row, after commit
            for n in rows:
                assert deliver(n.pk).status == "sent"
        [msg] = mail.messages
        assert msg["X-Rcpt"] == "alice@example.test"
        assert msg["Subject"].startswith("Approval ") and "stop_instance" in msg["Subject"]
        assert f"Run {run.number} asks for stop_instance" in msg.get_payload()
        assert "/approvals/" in msg.get_payload()
        [req] = hook.requests
        assert req["type"] == "application/json" and req["path"].endswith("xoxb-secret-token-12345")
        assert "stop_instance" in req["json"]["text"] and req["json"]["blocks"][0]["type"] == "section"
        # the URL with its token is a reference: stored nowhere, audited nowhere
        stored = json.dumps(list(Notification.objects.values())
                            + list(AuditLog.objects.values("reason", "before", "after", "target")), default=str)
        assert "xoxb-secret-token" not in stored and "env:WARDEN_TEST_SLACK_URL" in stored
        assert AuditLog.objects.filter(verb="notify_sent").count() == 2


def test_a_failing_webhook_succeeds_on_retry(alice, mail, monkeypatch):
    with WebhookReceiver(statuses=(503, 502, 200)) as hook:
        monkeypatch.setenv("WARDEN_TEST_SLACK_URL", hook.url)
        do_save_notification_settings(alice, email="", webhook_ref="env:WARDEN_TEST_SLACK_URL", kinds=["alert"],
                                      actor="user:alice")
        from fleet.alerts import raise_alert

        raise_alert("workers_dead", "0 of 2 workers live, 7 tasks queued", severity="P0")
        [n] = Notification.objects.all()
        n = deliver(n.pk)
    assert n.status == "sent" and n.attempts == 3 and n.last_error == ""
    assert len(hook.requests) == 3 and all("workers_dead" in r["json"]["text"] for r in hook.requests)
    assert AuditLog.objects.get(verb="notify_sent").after["attempts"] == 3


def test_a_webhook_down_for_longer_is_left_for_celery_to_retry_and_fails_on_the_last_try(alice, mail, monkeypatch):
    with WebhookReceiver(statuses=(503,)) as hook:
        monkeypatch.setenv("WARDEN_TEST_SLACK_URL", hook.url)
        do_save_notification_settings(alice, email="", webhook_ref="env:WARDEN_TEST_SLACK_URL", kinds=["alert"],
                                      actor="user:alice")
        from fleet.alerts import raise_alert

        raise_alert("workers_dead", "dead", severity="P1")
        [n] = Notification.objects.all()
        assert deliver(n.pk, last_try=False).status == "retrying"
        n = deliver(n.pk, last_try=True)
    assert n.status == "failed" and n.attempts == 8 and n.last_error == "webhook answered HTTP 503"
    assert AuditLog.objects.filter(verb="notify_retrying").count() == 1
    assert AuditLog.objects.get(verb="notify_failed").reason == "webhook answered HTTP 503"


def test_a_permanent_failure_is_not_retried_and_names_no_secret(alice, mail, monkeypatch):
    with WebhookReceiver(statuses=(404, 200)) as hook:
        monkeypatch.setenv("WARDEN_TEST_SLACK_URL", hook.url)
        do_save_notification_settings(alice, email="", webhook_ref="env:WARDEN_TEST_SLACK_URL", kinds=["alert"],
                                      actor="user:alice")
        from fleet.alerts import raise_alert

        raise_alert("budget", "over the $/hr cap", severity="P1")
        [n] = Notification.objects.all()
        n = deliver(n.pk)
    assert n.status == "failed" and n.attempts == 1 and len(hook.requests) == 1
    assert "404" in n.last_error and "xoxb" not in n.last_error


def test_an_unset_reference_fails_with_its_name_and_a_dead_receiver_is_transient(alice, mail, monkeypatch):
    do_save_notification_settings(alice, email="", webhook_ref="env:WARDEN_TEST_UNSET_HOOK", kinds=["alert"],
                                  actor="user:alice")
    from fleet.alerts import raise_alert

    raise_alert("budget", "over the cap", severity="P0")
    [n] = Notification.objects.all()
    n = deliver(n.pk)
    assert n.status == "failed" and n.attempts == 1 and "WARDEN_TEST_UNSET_HOOK is not set" in n.last_error
    from tests.subprocs import free_port

    monkeypatch.setenv("WARDEN_TEST_UNSET_HOOK", f"http://127.0.0.1:{free_port()}/hook")  # nothing listens
    Notification.objects.filter(pk=n.pk).update(status="queued", attempts=0)
    n = deliver(n.pk)
    assert n.status == "failed" and n.attempts == 4 and n.last_error.startswith("webhook unreachable")


def test_the_smtp_password_is_a_reference_resolved_at_send(alice, settings, monkeypatch, tmp_path):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    secret = tmp_path / "smtp-login"
    secret.write_text("smtp-pass-7\n")
    settings.NOTIFY = {**settings.NOTIFY, "RETRY_WAIT_S": 0.01, "EMAIL_PASSWORD_REF": f"file:{secret}"}
    with smtp_server(auth=True) as (box, port):
        settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_HOST_USER = "127.0.0.1", port, "warden"
        do_save_notification_settings(alice, email="alice@example.test", webhook_ref="", kinds=["escalation"],
                                      actor="user:alice")
        from fleet.alerts import raise_alert

        raise_alert("escalation", "all workers dead and the queue grows", severity="P0")
        [n] = Notification.objects.all()
        assert deliver(n.pk).status == "sent"
        assert box.logins == [("warden", "smtp-pass-7")]
        [msg] = box.messages
        assert msg["Subject"].startswith("[P0] escalation")
        # the reference stops resolving: a permanent failure naming the reference, nothing sent
        secret.unlink()
        Notification.objects.filter(pk=n.pk).update(status="queued")
        n = deliver(n.pk)
    assert n.status == "failed" and n.attempts == 2 and len(box.messages) == 1
    assert n.last_error.startswith(f"SMTP login: secret reference 'file:{secret}': cannot read file")


def test_send_a_test_from_the_page(client, alice, mail, monkeypatch):
    with WebhookReceiver() as hook:
        monkeypatch.setenv("WARDEN_TEST_SLACK_URL", hook.url)
        client.force_login(alice)
        resp = client.post("/notifications/test/")
        assert resp.status_code == 302 and "set an email address or a webhook reference first" in (
            client.get("/notifications/").content.decode())
        do_save_notification_settings(alice, email="alice@example.test", webhook_ref="env:WARDEN_TEST_SLACK_URL",
                                      kinds=[], actor="user:alice")
        assert client.post("/notifications/test/").status_code == 302
        for n in Notification.objects.filter(kind="test"):
            assert deliver(n.pk).status == "sent"
    assert mail.messages[0]["Subject"] == "Warden test notification"
    assert "this channel works" in hook.requests[0]["json"]["text"]
    assert AuditLog.objects.get(verb="notify_test").after == {"channels": ["email", "webhook"]}


def test_a_broker_down_at_commit_never_breaks_the_alert_and_the_scan_sends_it_later(
        alice, mail, monkeypatch, django_capture_on_commit_callbacks):
    import kombu.exceptions

    from agent import tasks
    from agent.notify.notifications import scan
    from fleet.alerts import raise_alert
    from fleet.clock import clock

    do_save_notification_settings(alice, email="alice@example.test", webhook_ref="", kinds=["alert"], actor="user:alice")

    def broker_down(*args, **kwargs):
        raise kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(tasks.deliver_notification, "delay", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        alert = raise_alert("workers_dead", "0 live", severity="P0")
    assert alert.pk and Notification.objects.get().status == "queued"
    sent = []
    monkeypatch.setattr(tasks.deliver_notification, "delay", lambda pk: sent.append(pk))
    from datetime import timedelta

    scan(clock.now() + timedelta(minutes=1))
    assert sent == []  # too young: it may still be in the queue
    scan(clock.now() + timedelta(minutes=3))
    assert sent == [Notification.objects.get().pk]
