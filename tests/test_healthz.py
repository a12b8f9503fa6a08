"""``/healthz``: JSON state of database, harmony, Redis, Celery worker and beat; 200 all up, 503 naming what is down."""

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
