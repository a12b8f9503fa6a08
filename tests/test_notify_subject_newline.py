"""An alert whose message spans lines (a command's output, a pasted log) still reaches the SMTP
server: an email subject is one header line (Django refuses one with a newline, and the delivery
raised instead of failing or sending), so the subject is the message on one line; the body keeps it whole."""

import pytest

from agent.actions.notifications import do_save_notification_settings
from agent.models import Notification
from agent.notify.notifications import deliver
from fleet.alerts import raise_alert
from tests.notify_support import smtp_server

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def test_a_multi_line_alert_is_emailed_with_a_one_line_subject(alice, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.NOTIFY = {**settings.NOTIFY, "RETRY_WAIT_S": 0.01, "ATTEMPTS": 2, "EMAIL_PASSWORD_REF": ""}
    with smtp_server() as (box, port):
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
        do_save_notification_settings(alice, email="alice@example.test", webhook_ref="", kinds=["alert"],
                                      actor="user:alice")
        raise_alert("worker_dead", "rig-1 stopped answering\r\nlast output: GPU is lost\nreboot needed", severity="P1")
        [n] = Notification.objects.all()
        n = deliver(n.pk)
    assert n.status == "sent", n.last_error
    [msg] = box.messages
    subject = msg["Subject"].replace("\r\n ", " ").replace("\n ", " ")  # undo the header's folding
    assert "\n" not in subject and subject.startswith("[P1] worker_dead: rig-1 stopped answering last output")
    assert "reboot needed" in msg.get_payload()
