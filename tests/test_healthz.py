"""``/healthz``: JSON state of database, harmony, Redis, Celery worker and beat; 200 all up, 503 naming what is down.
Anonymous callers get the status and the names only; the details are for signed-in users."""

import json
import os
import subprocess
import time
from datetime import timedelta

import pytest
import redis
from django.db import connections
from django.utils import timezone

from agent.models import Run
from console.health import BEAT_KEY
from fleet.models import DemandSample
from tests.subprocs import BIN, ROOT, test_db_env

DB = pytest.mark.django_db(databases=["default", "harmony"])


def fresh_tick(settings, age_s: float = 0) -> None:
    redis.Redis.from_url(settings.REDIS_URL).set(BEAT_KEY, int(time.time() - age_s))


@pytest.fixture
def client(client, alice):
    """A signed-in operator: the details of every check are for signed-in users."""
    client.force_login(alice)
    return client


@DB
def test_anonymous_callers_get_the_status_and_names_only(settings):
    from django.test import Client

    fresh_tick(settings)
    Run.objects.create(number=4, trigger="beat", planner="rules", status="done", started_at=timezone.now())
    resp = Client().get("/healthz")
    body = resp.json()
    # no Celery worker listens on this test Redis db: 503 naming it, and nothing else
    assert resp.status_code == 503
    assert body == {"status": "down", "up": ["database", "harmony", "redis", "beat", "runs"], "down": ["celery"]}
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    body = Client().get("/healthz").json()
    assert set(body) == {"status", "up", "down"} and {"redis", "celery", "beat"} <= set(body["down"])
    assert "127.0.0.1:1" not in json.dumps(body)  # no error text, no address


@DB
def test_it_needs_no_login_and_names_what_is_down(client, settings):
    fresh_tick(settings)
    t = timezone.now() - timedelta(seconds=90)
    Run.objects.create(number=4, trigger="beat", planner="rules", status="done", started_at=t)
    DemandSample.objects.create(taken_at=t, state="unknown")
    resp = client.get("/healthz")
    body = resp.json()
    assert set(body["checks"]) == {"database", "harmony", "redis", "celery", "beat", "runs"}
    for name in ("database", "harmony", "redis", "beat"):
        assert body["checks"][name]["up"], (name, body["checks"][name])
    assert body["last_run"]["number"] == 4 and body["last_run"]["status"] == "done"
    assert body["demand"]["state"] == "unknown" and 85 <= body["demand"]["age_s"] <= 120
    # no Celery worker listens on this test Redis db
    assert resp.status_code == 503
    assert body["status"] == "down" and body["down"] == ["celery"]
    assert "no worker answered" in body["checks"]["celery"]["detail"]


@DB
def test_it_reports_a_silent_beat(client, settings):
    fresh_tick(settings, age_s=61)
    body = client.get("/healthz").json()
    assert not body["checks"]["beat"]["up"] and "beat" in body["down"]
    redis.Redis.from_url(settings.REDIS_URL).delete(BEAT_KEY)
    body = client.get("/healthz").json()
    assert body["checks"]["beat"]["detail"] == "beat has never ticked"


@DB
def test_it_answers_when_redis_is_unreachable(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    started = time.monotonic()
    resp = client.get("/healthz")
    assert time.monotonic() - started < 5
    body = resp.json()
    assert resp.status_code == 503
    assert {"redis", "celery", "beat"} <= set(body["down"])
    assert body["checks"]["database"]["up"] and body["checks"]["harmony"]["up"]

@pytest.mark.django_db(transaction=True, databases=["default", "harmony"])
@pytest.mark.django_db(transaction=True, databases=["default", "harmony"])
def test_it_answers_when_harmony_is_unreadable(client, settings):
    fresh_tick(settings)
    harmony = connections["harmony"]
    real = harmony.settings_dict["NAME"]
    harmony.close()
    harmony.settings_dict["NAME"] = "warden_no_such_database"
    try:
        resp = client.get("/healthz")
    finally:
        harmony.close()
        harmony.settings_dict["NAME"] = real
    body = resp.json()
    assert resp.status_code == 503 and "harmony" in body["down"]
    assert "warden_no_such_database" in body["checks"]["harmony"]["detail"]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True, databases=["default", "harmony"])
def test_it_is_200_when_a_real_worker_answers(client, settings):
    fresh_tick(settings)
    env = {**os.environ, **test_db_env()}
    worker = subprocess.Popen(
        [str(BIN / "celery"), "-A", "console", "worker", "-Q", "warden-healthz-test", "--pool", "solo",
         "--without-mingle", "--without-gossip", "-n", "healthz@%h", "--loglevel", "WARNING"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 40
        while True:
            fresh_tick(settings)
            resp = client.get("/healthz")
            if resp.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        body = resp.json()
        assert resp.status_code == 200, body
        assert body["status"] == "ok" and body["down"] == []
        assert "healthz@" in body["checks"]["celery"]["detail"]
    finally:
        worker.terminate()
        worker.wait(timeout=20)


def test_supervised_processes_are_named_down_unless_running(tmp_path):
    from console.health import check_processes, supervised_processes

    infos = [{"name": "web", "group": "warden", "statename": "RUNNING", "description": "pid 10, uptime 0:01:00"},
             {"name": "worker", "group": "warden", "statename": "STARTING", "description": ""},
             {"name": "beat", "group": "warden", "statename": "FATAL", "description": "Exited too quickly"}]
    checks = check_processes(infos)
    assert {n: c["up"] for n, c in checks.items()} == {"process:web": True, "process:worker": False, "process:beat": False}
    assert checks["process:worker"]["detail"].startswith("STARTING: restarting")
    assert "supervisorctl -c supervisord.conf start warden:beat" in checks["process:beat"]["detail"]
    # not under supervisor (no socket, another scheme): no process checks at all
    assert supervised_processes(f"unix://{tmp_path}/no.sock") is None and supervised_processes("") is None
    assert supervised_processes("http://127.0.0.1:9001") is None and check_processes(None) == {}
