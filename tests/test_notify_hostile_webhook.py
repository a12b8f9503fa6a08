"""A webhook reference an operator got wrong, or a receiver that misbehaves: the notification fails
with a reason that names no secret, and nothing is sent elsewhere.

Real parts: ``http.server`` receivers on loopback, files on disk, the real delivery path (``deliver``).
"""

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.actions.notifications import do_save_notification_settings
from agent.models import Notification
from agent.notify.notifications import deliver, reference_status

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


class Server:
    """A loopback HTTP server that records ``(method, path)`` and answers ``status`` with ``headers``."""

    def __init__(self, status=200, headers=()):
        self.seen = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append((self.command, self.path))
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST = _answer  # noqa: N815 — http.server's hook names

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fast(settings):
    settings.NOTIFY = {**settings.NOTIFY, "RETRY_WAIT_S": 0.01, "ATTEMPTS": 2, "WEBHOOK_TIMEOUT_S": 2}


def _one_alert_for(alice, ref: str) -> Notification:
    do_save_notification_settings(alice, email="", webhook_ref=ref, kinds=["alert"], actor="user:alice")
    from fleet.alerts import raise_alert

    raise_alert("budget", "over the $/hr cap", severity="P1")
    [n] = Notification.objects.all()
    return n


def test_a_redirect_to_another_host_is_not_followed_and_is_not_sent(alice, fast, monkeypatch):
    """urllib would follow a 302 with a GET to the other host and call it delivered."""
    other, hook = Server(200), None
    try:
        hook = Server(302, headers=[("Location", f"{other.url}/elsewhere")])
        monkeypatch.setenv("WARDEN_TEST_HOOK", f"{hook.url}/services/T0/B0/xoxb-secret-token-12345")
        n = deliver(_one_alert_for(alice, "env:WARDEN_TEST_HOOK").pk)
    finally:
        other.close()
        hook and hook.close()
    assert n.status == "failed" and "HTTP 302" in n.last_error and "redirect" in n.last_error
    assert other.seen == [] and len(hook.seen) == 1
    assert "xoxb" not in n.last_error


def test_a_reference_to_a_file_that_is_not_a_url_fails_without_showing_the_file(alice, fast, tmp_path):
    wrong = tmp_path / "creds"
    wrong.write_text("root:hunter2-secret-value:0:0\n")
    n = deliver(_one_alert_for(alice, f"file:{wrong}").pk)
    assert n.status == "failed" and n.attempts == 1
    assert "does not hold an http(s) URL" in n.last_error and "hunter2" not in n.last_error


def test_a_reference_to_a_huge_file_a_device_or_a_pipe_is_refused_quickly(alice, fast, tmp_path):
    big = tmp_path / "app.log"
    big.write_bytes(b"x" * 5_000_000)
    started = time.monotonic()
    assert "larger than" in reference_status(f"file:{big}")
    assert "not a regular file" in reference_status("file:/dev/zero")  # never ends: read whole, it fills memory
    fifo = tmp_path / "hook.fifo"
    os.mkfifo(fifo)  # nobody writes: a blocking open waits for ever
    assert "not a regular file" in reference_status(f"file:{fifo}")
    assert "not a regular file" in reference_status(f"file:{tmp_path}")
    assert time.monotonic() - started < 2
    n = deliver(_one_alert_for(alice, f"file:{fifo}").pk)
    assert n.status == "failed" and "not a regular file" in n.last_error


@pytest.mark.parametrize("pasted", [
    "env:https://hooks.slack.com/services/T0/B0/xoxbsecrettoken12345",
    "file:https://hooks.slack.com/services/T0/B0/xoxbsecrettoken12345",
    "env:hooks.slack.com/services/T0/B0/xoxbsecrettoken12345",
    "hooks.slack.com/services/T0/B0/xoxbsecrettoken12345",
])
def test_a_url_dressed_as_a_reference_is_refused_not_stored_and_not_echoed(client, alice, pasted):
    client.force_login(alice)
    resp = client.post("/notifications/", {"email": "", "webhook_ref": pasted, "kind": ["alert"]})
    html = resp.content.decode()
    assert resp.status_code == 400 and "xoxbsecrettoken12345" not in html and "hooks.slack.com" not in html
    from agent.models import NotificationSettings
    from fleet.models import AuditLog

    assert not NotificationSettings.objects.filter(webhook_ref__contains="xoxb").exists()
    assert not AuditLog.objects.filter(verb="notification_settings").exists()


def test_a_receiver_that_drips_its_body_does_not_hold_the_worker(alice, fast, monkeypatch):
    """200 and its headers at once, then the body a byte a second: the status is the answer."""
    import socket

    srv = socket.create_server(("127.0.0.1", 0))

    def drip():
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 600\r\n\r\n")
        try:
            for _ in range(600):
                conn.sendall(b"o")
                time.sleep(1)
        except OSError:
            pass  # the client hung up
        conn.close()

    threading.Thread(target=drip, daemon=True).start()
    monkeypatch.setenv("WARDEN_TEST_HOOK", f"http://127.0.0.1:{srv.getsockname()[1]}/hook")
    started = time.monotonic()
    n = deliver(_one_alert_for(alice, "env:WARDEN_TEST_HOOK").pk)
    assert n.status == "sent" and time.monotonic() - started < 5
    srv.close()
