"""With a real Celery worker: an alert raised in a transaction is sent after commit, by the worker
(off the request path), to a real SMTP server and a webhook receiver that fails twice first."""

import pytest
from django.db import transaction

from agent.actions.notifications import do_save_notification_settings
from agent.models import Notification
from fleet.alerts import raise_alert
from fleet.models import AuditLog
from tests import fleet_support
from tests.fleet_support import FLEET_DB, wait_for
from tests.notify_support import WebhookReceiver, smtp_server
from tests.test_approval_restart import Worker, worker_env  # noqa: F401

pytestmark = [FLEET_DB, pytest.mark.slow, pytest.mark.integration]
local_fleet = fleet_support.local_fleet


def test_a_worker_sends_after_commit_and_retries_a_failing_webhook(worker_env, tmp_path, alice):  # noqa: F811
    with smtp_server() as (box, port), WebhookReceiver(statuses=(503, 500, 200)) as hook:
        env = {**worker_env, "WARDEN_EMAIL_HOST": "127.0.0.1", "WARDEN_EMAIL_PORT": str(port),
               "WARDEN_NOTIFY_RETRY_WAIT_S": "0.05", "WARDEN_TEST_WORKER_HOOK": hook.url}
        do_save_notification_settings(alice, email="alice@example.test", webhook_ref="env:WARDEN_TEST_WORKER_HOOK",
                                      kinds=["alert"], actor="user:alice")
        worker = Worker(env, tmp_path / "celery.log", "notify").start()
        try:
            with transaction.atomic():
                raise_alert("workers_dead", "0 of 4 workers live; 12 tasks queued", severity="P0")
                assert Notification.objects.count() == 2
            wait_for(lambda: Notification.objects.filter(status="sent").count() == 2, timeout=60,
                     what=f"both notifications sent; worker log:\n{worker.text()}")
        finally:
            worker.kill()
    [msg] = box.messages
    assert msg["Subject"].startswith("[P0] workers_dead") and "12 tasks queued" in msg.get_payload()
    assert len(hook.requests) == 3 and "workers_dead" in hook.requests[-1]["json"]["text"]
    assert Notification.objects.get(channel="webhook").attempts == 3
    assert AuditLog.objects.filter(verb="notify_sent", actor="system").count() == 2
