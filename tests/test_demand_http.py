"""The ``http`` demand source against a real local HTTP server: good answers, and every way an
answer can fail (timeout, refused, non-200, empty, HTML, wrong fields) read as ``unknown`` with
the reason, never zero."""

import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from agent.runtime.observe import read_and_record_demand
from fleet.demand import read_demand
from fleet.models import Instance
from tests.sshd import free_port

DB = pytest.mark.django_db(databases=["default", "harmony"])
TOKEN = "tok_" + "9f8e7d6c5b4a" * 3


class Endpoint:
    """A demand endpoint on 127.0.0.1: answers ``status`` with ``body`` after ``delay_s``; records
    each request's Authorization header in ``auth``."""

    def __init__(self):
        self.status, self.body, self.delay_s, self.ctype = 200, b"{}", 0.0, "application/json"
        self.auth: list[str | None] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 — http.server's name
                endpoint.auth.append(self.headers.get("Authorization"))
                time.sleep(endpoint.delay_s)
                try:
                    self.send_response(endpoint.status)
                    self.send_header("Content-Type", endpoint.ctype)
                    self.send_header("Content-Length", str(len(endpoint.body)))
                    self.end_headers()
                    self.wfile.write(endpoint.body)
                except OSError:
                    pass  # the client gave up (timeout test)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/demand"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, obj=None, *, raw: bytes | None = None, status: int = 200, ctype: str = "application/json"):
        self.body = raw if raw is not None else json.dumps(obj).encode()
        self.status, self.ctype = status, ctype

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint(settings):
    ep = Endpoint()
    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "http", "DEMAND_URL": ep.url, "DEMAND_TIMEOUT_S": 1.0,
                       "DEMAND_TOKEN_ENV": "", "DEMAND_TOKEN_FILE": "", "STARTUP_GRACE_S": 60, "OBSERVE_INTERVAL_S": 60}
    yield ep
    ep.close()


def running(name: str, started_min_ago: float = 10) -> Instance:
    now = timezone.now()
    return Instance.objects.create(provider="ssh", external_id=name, worker_name=name, status="running",
                                   status_since=now, created_at=now, started_at=now - timedelta(minutes=started_min_ago))


@DB
def test_a_good_answer_is_read_with_worker_counts_against_our_instances(endpoint):
    insts = [running("rig-1"), running("rig-2"), running("rig-3"), running("rig-new", started_min_ago=0.1)]
    endpoint.answer({
        "queued": 7, "running": 2, "backlog": 4, "proof_s": 240.5, "proofs_hr": 28.0, "rate_window_s": 900,
        "oldest_queued_s": 300, "extra_field": "ignored",
        "workers": [{"name": "rig-1", "live": True, "owned_tasks": 1},
                    {"name": "rig-2", "live": True, "unschedulable": True, "owned_tasks": 1},
                    {"name": "someone-else", "live": True}],
    })

    r = read_demand(insts)

    assert (r.state, r.source, r.error) == ("ok", "http", "")
    assert (r.queued, r.running, r.backlog, r.proof_s, r.proofs_hr, r.rate_window_s) == (7, 2, 4, 240.5, 28.0, 900)
    # rig-3 has no live worker: dead; rig-new is inside the startup grace: starting
    assert (r.workers_expected, r.workers_live, r.workers_cordoned, r.workers_dead, r.workers_starting) == (3, 1, 1, 1, 1)
    assert [u["name"] for u in r.unmatched] == ["someone-else"]
    assert r.workers["rig-1"].owned_tasks == 1 and r.workers["rig-3"].live is False


@DB
def test_without_workers_the_worker_counts_are_unknown_not_zero(endpoint):
    endpoint.answer({"queued": 0, "running": 0})

    r = read_demand([running("rig-1")])

    assert r.state == "ok" and (r.queued, r.running) == (0, 0)
    assert (r.workers_live, r.workers_dead, r.workers_cordoned) == (None, None, None)
    assert r.unreadable["workers_live"] == "the demand endpoint sent no workers"


@DB
@pytest.mark.parametrize("answer, reason", [
    (dict(raw=b""), "empty body"),
    (dict(raw=b"<html><body>502 Bad Gateway</body></html>", ctype="text/html"), "bad body: not JSON"),
    (dict(raw=b"[1, 2]"), "bad body: the body: Input should be an object"),
    (dict(obj={"running": 1}), "bad body: queued: Field required"),
    (dict(obj={"queued": -1, "running": 0}), "bad body: queued: Input should be greater than or equal to 0"),
    (dict(obj={"queued": "many", "running": 0}), "bad body: queued: Input should be a valid integer"),
    (dict(obj={"queued": 1, "running": 0, "workers": [{"live": True}]}), "bad body: workers.0.name: Field required"),
    (dict(obj={"error": "db down"}, status=503), "HTTP 503"),
    # values the sample's columns cannot hold, or that no sizing can use
    (dict(raw=b'{"queued": 1, "running": 0, "proof_s_by_gpu": {"RTX 4090": NaN}}'),
     "bad body: proof_s_by_gpu.RTX 4090: Input should be a finite number"),
    (dict(obj={"queued": 1, "running": 0, "proof_s_by_gpu": {"RTX 4090": -5}}),
     "bad body: proof_s_by_gpu.RTX 4090: Input should be greater than 0"),
    (dict(obj={"queued": 10**23, "running": 0}), "bad body: queued: Input should be less than or equal to 2147483647"),
])
def test_a_bad_answer_is_unknown_with_the_reason(endpoint, answer, reason):
    endpoint.answer(**answer)

    r = read_demand([])

    assert r.state == "unknown" and r.source == "http"
    assert reason in r.error and endpoint.url in r.error
    assert (r.queued, r.running, r.workers_live) == (None, None, None)


@DB
def test_a_timeout_is_unknown(endpoint):
    endpoint.answer({"queued": 1, "running": 0})
    endpoint.delay_s = 3

    r = read_demand([])

    assert r.state == "unknown" and "timed out after 1 s" in r.error


@DB
def test_a_body_dripped_a_byte_at_a_time_times_out_as_a_whole(endpoint, settings):
    """Each byte arrives within the read timeout, the whole answer would take 30 s: unknown after about 1 s."""
    import socket

    srv = socket.create_server(("127.0.0.1", 0))
    body = json.dumps({"queued": 1, "running": 0, "pad": " " * 300}).encode()

    def drip():
        conn, _ = srv.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        try:
            for i in range(len(body)):
                conn.sendall(body[i:i + 1])
                time.sleep(0.1)
        except OSError:
            pass  # the client gave up
        conn.close()

    threading.Thread(target=drip, daemon=True).start()
    settings.WARDEN = {**settings.WARDEN, "DEMAND_URL": f"http://127.0.0.1:{srv.getsockname()[1]}/demand"}
    started = time.monotonic()

    r = read_demand([])

    assert r.state == "unknown" and "timed out after 1 s" in r.error
    assert time.monotonic() - started < 5
    srv.close()


@DB
def test_a_refused_connection_is_unknown(endpoint, settings):
    settings.WARDEN = {**settings.WARDEN, "DEMAND_URL": f"http://127.0.0.1:{free_port()}/demand"}

    r = read_demand([])

    assert r.state == "unknown" and "ConnectError" in r.error


@DB
def test_an_old_reading_is_stale(endpoint):
    old = (timezone.now() - timedelta(minutes=5)).isoformat()
    endpoint.answer({"queued": 3, "running": 0, "taken_at": old})

    r = read_demand([])

    assert r.state == "stale" and r.queued == 3
    assert "reading is 300 s old (limit 120 s)" in r.error


@DB
def test_a_reading_dated_in_the_future_is_stale_not_fresh_for_ever(endpoint):
    ahead = (timezone.now() + timedelta(hours=6)).isoformat()
    endpoint.answer({"queued": 3, "running": 0, "taken_at": ahead})

    r = read_demand([])

    assert r.state == "stale" and "in the future" in r.error


@DB
def test_the_token_is_sent_by_reference_and_never_recorded(endpoint, settings, monkeypatch):
    monkeypatch.setenv("DEMAND_TOKEN_FOR_TEST", TOKEN)
    settings.WARDEN = {**settings.WARDEN, "DEMAND_TOKEN_ENV": "DEMAND_TOKEN_FOR_TEST"}
    endpoint.answer({"detail": f"token {TOKEN} refused"}, status=401)

    read_and_record_demand([])

    assert endpoint.auth == [f"Bearer {TOKEN}"]
    from fleet.models import Alert, DemandSample

    sample = DemandSample.objects.get()
    assert sample.state == "unknown" and "HTTP 401" in sample.error
    assert TOKEN not in sample.error and TOKEN not in json.dumps(sample.detail)
    assert all(TOKEN not in a.message for a in Alert.objects.all())


@DB
def test_a_token_variable_that_is_unset_is_named(endpoint, settings, monkeypatch):
    monkeypatch.delenv("DEMAND_TOKEN_FOR_TEST", raising=False)
    settings.WARDEN = {**settings.WARDEN, "DEMAND_TOKEN_ENV": "DEMAND_TOKEN_FOR_TEST"}

    r = read_demand([])

    assert r.state == "unknown" and "DEMAND_TOKEN_FOR_TEST is not set" in r.error
    assert endpoint.auth == []  # nothing was sent without it


@DB
def test_the_sample_records_the_source_and_the_rate_window(endpoint):
    endpoint.answer({"queued": 0, "running": 1, "proofs_hr": 90, "rate_window_s": 900})

    read_and_record_demand([])

    from fleet.models import DemandSample

    s = DemandSample.objects.get()
    assert (s.state, s.proofs_hr, s.detail["source"], s.detail["rate_window_s"]) == ("ok", 90, "http", 900)
