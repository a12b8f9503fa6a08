"""Start-up and shut-down as an operator sees them: beat writes its tick as it starts,
so ``/healthz`` does not answer 503 "beat has never ticked" for its first half-minute; the console's
last line on Ctrl-C says the demo's workers keep running and that ``make stop`` ends them."""

import os
import signal
import subprocess
import time
import urllib.request

import pytest
from django.conf import settings

from console.shutdown import shutdown_line
from console.tasks import BEAT_TICK_KEY, redis_client
from tests.subprocs import BIN, ROOT, free_port, test_db_env


@pytest.mark.slow
@pytest.mark.django_db
def test_beat_ticks_as_it_starts(tmp_path):
    client = redis_client()
    client.delete(BEAT_TICK_KEY)
    started = time.time()
    env = {**os.environ, **test_db_env(), "DJANGO_SETTINGS_MODULE": "console.settings", "WARDEN_VAR_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [str(BIN / "celery"), "-A", "console", "beat", "-S", "celery.beat:PersistentScheduler",
         "-s", str(tmp_path / "schedule"), "--pidfile=", "-l", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        raw = None
        while raw is None and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            raw = client.get(BEAT_TICK_KEY)
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    # no task went through a worker (none runs here): the beat process wrote it itself, at start
    assert raw is not None and float(raw) >= int(started)
    from console.health import check_beat

    assert check_beat(client, True)["up"] is True


def test_the_shutdown_line_names_the_workers_that_keep_running(tmp_path, settings):
    settings.VAR_DIR = tmp_path
    assert shutdown_line() == "Warden console stopped. No local demo worker is running."


@pytest.mark.slow
def test_ctrl_c_on_the_console_prints_the_line(tmp_path):
    port = free_port()
    env = {**os.environ, "WARDEN_VAR_DIR": str(tmp_path), "REDIS_URL": settings.REDIS_URL}
    env.pop("DATABASE_URL", None)
    env.pop("HARMONY_DATABASE_URL", None)
    proc = subprocess.Popen(
        [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "console.asgi:application"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=5)
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Warden console stopped. No local demo worker is running." in err.decode()
