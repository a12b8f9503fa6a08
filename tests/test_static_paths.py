"""A static path that climbs out of the static folders answers 404 to anyone, never a 500 with a
traceback: through the ASGI application daphne serves (``make run``, and ``runserver``, which is
daphne's and wraps the same ``ASGIStaticFilesHandler``), through Django's static view, and from a
real daphne process as the Procfile starts it."""

import http.client
import subprocess
import sys
import time

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.contrib.staticfiles.views import serve
from django.http import Http404
from django.test import RequestFactory

from tests.subprocs import ROOT, free_port, test_db_env

CLIMBS = [
    "/static/%2e%2e/%2e%2e/console/settings.py",
    "/static/../../console/settings.py",
    "/static/..%2f..%2fconsole%2fsettings.py",
    "/static/%2e%2e%2f%2e%2e%2fmanage.py",
    "/static/admin/../../../../console/settings.py",
    "/static//etc/passwd",
]


def asgi_get(path: str) -> tuple[int, bytes]:
    """GET ``path`` (as sent on the wire: ``raw_path``; ``path`` decoded, as daphne does) through
    ``console.asgi.application``; the status and the whole body (streamed bodies read to the end)."""
    from urllib.parse import unquote

    from console.asgi import application

    async def go():
        comm = HttpCommunicator(application, "GET", unquote(path))
        comm.scope["raw_path"] = path.encode()
        await comm.send_input({"type": "http.request", "body": b""})
        start = await comm.receive_output(10)
        body = b""
        while True:
            msg = await comm.receive_output(10)
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        return start["status"], body

    return async_to_sync(go)()


@pytest.mark.django_db
@pytest.mark.parametrize("path", CLIMBS)
def test_a_climbing_static_path_is_404_through_the_asgi_application(path):
    status, body = asgi_get(path)
    assert status == 404, body[:500]
    assert b"Traceback" not in body and b"SECRET_KEY" not in body and b"import" not in body


@pytest.mark.django_db
def test_near_miss_a_real_static_file_is_served():
    status, body = asgi_get("/static/console.css")
    assert status == 200 and body


@pytest.mark.parametrize("path", ["../../console/settings.py", "admin/../../../manage.py", "/etc/passwd"])
def test_the_static_view_answers_404(path):
    with pytest.raises(Http404):
        serve(RequestFactory().get("/static/x"), path, insecure=True)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_daphne_answers_404_to_an_anonymous_climb(tmp_path):
    port = free_port()
    env = {**__import__("os").environ, **test_db_env(), "WARDEN_VAR_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "console.asgi:application"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/static/console.css")
                assert conn.getresponse().status == 200
                break
            except OSError:
                time.sleep(0.1)
        for path in CLIMBS:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", path)  # sent as written: http.client does not normalise the path
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 404, (path, body[:300])
            assert b"Traceback" not in body
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0]
    assert b"SuspiciousFileOperation" not in out and b"Traceback" not in out, out[-2000:]
