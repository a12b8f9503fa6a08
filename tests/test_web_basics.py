"""The web basics: a CSRF failure on /api/… answers JSON (HTML elsewhere); every page carries the
Content-Security-Policy and needs no inline script, inline handler or inline style; the Secure
cookie flag, HSTS behind a TLS proxy and the session lifetime come from the environment (a bad
value stops with one line).

Real parts: the console's views over Django's test client (CSRF checks on), ``console.settings``
imported in a fresh interpreter for the environment's settings.
"""

import re
import subprocess
import sys

import pytest
from django.test import Client

from tests.subprocs import ROOT

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])

PAGES = ["/", "/fleet/", "/runs/", "/approvals/", "/alerts/", "/actions/", "/performance/", "/traces/", "/memory/",
         "/settings/", "/notifications/", "/users/"]
#: a <script> that is neither loaded from a file nor JSON data (json_script) is inline code
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I)
INLINE_HANDLER = re.compile(r"<[a-z][^>]*\son[a-z]+\s*=", re.I)
INLINE_STYLE = re.compile(r"<[a-z][^>]*\sstyle\s*=", re.I)


def test_a_csrf_failure_on_the_api_answers_json(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    resp = client.post("/api/instances/local-1/stop/", data='{"reason": "wedged"}', content_type="application/json")
    assert resp.status_code == 403 and resp["Content-Type"] == "application/json"
    body = resp.json()
    assert body["ok"] is False and body["code"] == "csrf_failed" and "X-CSRFToken" in body["detail"]
    # near miss: the same failure on a page answers Django's HTML page
    resp = client.post("/actions/observe/")
    assert resp.status_code == 403 and resp["Content-Type"].startswith("text/html")
    # with the token the API is reached (and answers its own JSON: no such instance)
    client.get("/")
    resp = client.post("/api/instances/local-1/stop/", data='{"reason": "wedged"}', content_type="application/json",
                       headers={"X-CSRFToken": client.cookies["csrftoken"].value})
    assert resp.status_code == 404 and resp.json()["code"] == "not_found"


def test_every_page_has_the_csp_and_no_inline_script_or_style(django_user_model, alice):
    admin = django_user_model.objects.create_superuser("root", password="root-pass-1")
    client = Client()
    client.force_login(admin)
    for path in ["/login/", *PAGES]:
        resp = (Client() if path == "/login/" else client).get(path)
        assert resp.status_code == 200, path
        csp = resp["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe" not in csp, (path, csp)
        html = resp.content.decode()
        for name, pattern in (("inline script", INLINE_SCRIPT), ("inline handler", INLINE_HANDLER),
                              ("inline style", INLINE_STYLE)):
            found = pattern.findall(html)
            assert not found, f"{path}: {name}: {found[:3]}"


def test_the_inline_patterns_catch_what_they_name():
    """The page test's patterns are not blind (near misses stay allowed)."""
    assert INLINE_SCRIPT.search('<script>alert(1)</script>') and INLINE_HANDLER.search('<input onclick="x()">')
    assert INLINE_STYLE.search('<td style="width:60%">')
    assert not INLINE_SCRIPT.search('<script src="/static/a.js" defer></script>')
    assert not INLINE_SCRIPT.search('<script id="perf-series" type="application/json">{}</script>')
    assert not INLINE_HANDLER.search('<button type="button" class="one">')


def test_hsts_and_secure_cookies_behind_a_tls_proxy(settings, alice):
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    client = Client()
    resp = client.post("/login/", {"username": "alice", "password": "alice-pass-1"}, headers={"X-Forwarded-Proto": "https"},
                       secure=False)
    assert resp.status_code == 302
    assert resp.cookies["sessionid"]["secure"] and resp.cookies["sessionid"]["httponly"]
    assert resp["Strict-Transport-Security"] == "max-age=3600"
    # near miss: a plain-http request (no proxy header) gets no HSTS
    assert "Strict-Transport-Security" not in Client().get("/login/")


def _settings_in_fresh_process(env: dict, expr: str) -> subprocess.CompletedProcess:
    code = f"import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'console.settings'); django.setup(); " \
           f"from django.conf import settings as s; print({expr})"
    import os

    full = {**os.environ, **env}
    full.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True, timeout=60)


def test_the_environment_sets_cookies_hsts_and_the_session_lifetime():
    done = _settings_in_fresh_process(
        {"WARDEN_SECURE_COOKIES": "on", "WARDEN_HSTS_SECONDS": "31536000", "WARDEN_TLS_PROXY": "1",
         "WARDEN_SESSION_HOURS": "2.5"},
        "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, s.SECURE_PROXY_SSL_HEADER, s.SESSION_COOKIE_AGE")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True True 31536000 ('HTTP_X_FORWARDED_PROTO', 'https') 9000"
    done = _settings_in_fresh_process({}, "s.SESSION_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, s.SECURE_PROXY_SSL_HEADER, s.SESSION_COOKIE_AGE")
    assert done.stdout.strip() == "False 0 None 43200"


@pytest.mark.parametrize("name, value", [("WARDEN_SESSION_HOURS", "twelve"), ("WARDEN_SESSION_HOURS", "0"),
                                         ("WARDEN_HSTS_SECONDS", "-1"), ("WARDEN_SECURE_COOKIES", "maybe"),
                                         ("WARDEN_LOGIN_FAILURE_LIMIT", "0")])
def test_a_bad_security_setting_stops_with_one_line(name, value):
    done = _settings_in_fresh_process({name: value}, "1")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warden: bad {name}=") and "Traceback" not in done.stderr
