"""Real receivers for the notification tests: an SMTP server (aiosmtpd) and a webhook receiver
(an HTTP server speaking what Slack's incoming webhooks speak: JSON in, ``ok`` out)."""

import contextlib
import json
import threading
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.subprocs import free_port


class Mailbox:
    """Collects the messages an aiosmtpd server accepted (``messages``: email.message.Message) and
    the logins it saw (``logins``: ``(user, password)``)."""

    def __init__(self):
        self.messages, self.logins = [], []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 — aiosmtpd's hook name
        msg = message_from_bytes(envelope.original_content)
        msg["X-Rcpt"] = ",".join(envelope.rcpt_tos)
        self.messages.append(msg)
        return "250 OK"

    def authenticate(self, server, session, envelope, mechanism, auth_data):
        if isinstance(auth_data, LoginPassword):
            self.logins.append((auth_data.login.decode(), auth_data.password.decode()))
            return AuthResult(success=auth_data.password == b"smtp-pass-7")
        return AuthResult(success=False)


@contextlib.contextmanager
def smtp_server(*, auth: bool = False):
    """A local SMTP server on a free port; yields ``(mailbox, port)``. With ``auth`` it requires
    LOGIN/PLAIN with password ``smtp-pass-7`` (over plain text: it is loopback)."""
    box = Mailbox()
    port = free_port()
    kwargs = {"authenticator": box.authenticate, "auth_required": True, "auth_require_tls": False} if auth else {}
    controller = Controller(box, hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()


class WebhookReceiver:
    """A real HTTP server: records each POST's JSON body in ``requests`` and answers ``statuses``
    in turn (the last one repeats). ``url`` is where to POST."""

    def __init__(self, statuses=(200,)):
        self.statuses, self.requests = list(statuses), []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 — http.server's hook name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append({"path": self.path, "type": self.headers.get("Content-Type"),
                                          "json": json.loads(body or b"null")})
                i = min(len(receiver.requests), len(receiver.statuses)) - 1
                status = receiver.statuses[i]
                out = b"ok" if status == 200 else b"service unavailable"
                self.send_response(status)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/xoxb-secret-token-12345"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
