"""``manage.py bootstrap`` (what ``make run`` runs before supervisor): operator login, beat schedule,
the bundled redis-server, and the bad-input paths — each run as a real subprocess."""

import json
import re

import pytest
import redis
from django.contrib.auth.models import User
from django_celery_beat.models import PeriodicTask

from console.management.commands.bootstrap import stop_embedded_redis
from tests.subprocs import free_port, manage, test_db_env

pytestmark = [pytest.mark.django_db(transaction=True, databases="__all__"), pytest.mark.slow]  # real processes: `make test-slow`


def bootstrap(tmp_path, *args, drop=(), **env):
    return manage("bootstrap", *args, env={**test_db_env(), "WARDEN_VAR_DIR": str(tmp_path), **env}, drop=drop)


def warden_tasks() -> dict:
    return {t.name: t for t in PeriodicTask.objects.filter(name__startswith="warden: ").select_related("interval")}


def test_operator_login_from_env_and_beat_schedule(tmp_path):
    result = bootstrap(tmp_path, WARDEN_ADMIN_PASSWORD="night-shift-7", WARDEN_OBSERVE_INTERVAL_S="120")
    assert result.returncode == 0, result.stderr
    assert "night-shift-7" not in result.stdout + result.stderr

    user = User.objects.get(username="operator")
    assert user.check_password("night-shift-7")
    assert user.groups.filter(name="operators").exists()

    tasks = warden_tasks()
    observe = tasks["warden: observe heartbeat"]
    assert observe.task == "agent.tasks.observe_cycle"
    assert json.loads(observe.args) == ["heartbeat"]
    assert (observe.interval.every, observe.interval.period) == (120, "seconds")
    monitor = tasks["warden: monitor"]
    assert monitor.task == "agent.tasks.monitor_tick"
    assert monitor.interval.every == 60
    tick = tasks["warden: beat tick"]
    assert tick.task == "console.tasks.beat_tick"
    assert (tick.interval.every, tick.interval.period) == (30, "seconds")

    # Run again with another interval: refreshed in place, nothing duplicated, password kept.
    again = bootstrap(tmp_path, WARDEN_OBSERVE_INTERVAL_S="60", drop=("WARDEN_ADMIN_PASSWORD",))
    assert again.returncode == 0, again.stderr
    tasks = warden_tasks()
    assert len(tasks) == 3
    assert tasks["warden: observe heartbeat"].interval.every == 60
    assert User.objects.get(username="operator").check_password("night-shift-7")


def test_generated_password_is_printed_once(tmp_path):
    first = bootstrap(tmp_path, WARDEN_ADMIN_USER="night-op", drop=("WARDEN_ADMIN_PASSWORD",))
    assert first.returncode == 0, first.stderr
    match = re.search(r"operator login: night-op / (\S+)", first.stdout)
    assert match, first.stdout
    password = match.group(1)
    user = User.objects.get(username="night-op")
    assert user.check_password(password)
    assert user.groups.filter(name="operators").exists()
    assert not any(password in p.read_text(errors="ignore") for p in tmp_path.rglob("*") if p.is_file())

    second = bootstrap(tmp_path, WARDEN_ADMIN_USER="night-op", drop=("WARDEN_ADMIN_PASSWORD",))
    assert second.returncode == 0, second.stderr
    assert password not in second.stdout
    assert User.objects.get(username="night-op").check_password(password)


def test_bundled_redis_started_under_var_and_stopped(tmp_path):
    port = free_port()
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
    try:
        result = bootstrap(tmp_path, WARDEN_EMBEDDED_REDIS_PORT=str(port), drop=("REDIS_URL",))
        assert result.returncode == 0, result.stderr
        assert f"started on 127.0.0.1:{port}" in result.stdout
        assert client.ping()
        assert (tmp_path / "redis" / "redis.pid").exists()

        again = bootstrap(tmp_path, WARDEN_EMBEDDED_REDIS_PORT=str(port), drop=("REDIS_URL",))
        assert again.returncode == 0, again.stderr
        assert "already answering" in again.stdout

        stop = manage("bootstrap", "--stop-redis", env={"WARDEN_VAR_DIR": str(tmp_path)})
        assert stop.returncode == 0, stop.stderr
        assert "stopped" in stop.stdout
        with pytest.raises(redis.ConnectionError):
            client.ping()
        assert not (tmp_path / "redis" / "redis.pid").exists()
    finally:
        stop_embedded_redis(tmp_path)


def test_unreadable_harmony_database_is_one_line_and_not_fatal(tmp_path):
    dead = f"postgres://postgres@127.0.0.1:{free_port()}/harmony"
    result = bootstrap(tmp_path, HARMONY_DATABASE_URL=dead, WARDEN_ADMIN_PASSWORD="pw-1")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "HARMONY_DATABASE_URL" in lines[0]
    # Everything else still happened.
    assert User.objects.filter(username="operator").exists()
    assert len(warden_tasks()) == 3


def test_unreachable_redis_url_is_reported_not_fatal(tmp_path):
    result = bootstrap(tmp_path, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", WARDEN_ADMIN_PASSWORD="pw-1")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "REDIS_URL" in lines[0] and "unreachable" in lines[0]
