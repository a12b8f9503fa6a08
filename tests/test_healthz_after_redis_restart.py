"""After a Redis restart that lost its data, /healthz does not call beat down while beat's next
tick is still due (found by bench/faults.py: 503 "beat has never ticked" for up to 30 s after
every Redis restart). A real redis-server, started fresh for the test, stands for the restarted
one; the shared test Redis (up for long) still reports a beat that never ticked."""

import subprocess
import time

import pytest
import redis

from console.health import BEAT_KEY, check_beat
from tests.subprocs import free_port


@pytest.fixture
def fresh_redis():
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_connect_timeout=1)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)


def test_a_just_restarted_redis_without_a_tick_does_not_call_beat_down(fresh_redis):
    check = check_beat(fresh_redis, True)
    assert check["up"] is True
    assert "no tick since Redis started" in check["detail"] and "next is due within 30 s" in check["detail"]


def test_a_tick_written_after_the_restart_is_judged_as_always(fresh_redis):
    fresh_redis.set(BEAT_KEY, int(time.time() - 61))
    check = check_beat(fresh_redis, True)
    assert check["up"] is False and check["detail"].endswith("s ago (limit 60 s)")


def test_a_redis_up_for_long_with_no_tick_still_says_beat_never_ticked(settings):
    client = redis.Redis.from_url(settings.REDIS_URL)
    if float(client.info("server")["uptime_in_seconds"]) <= 60:
        pytest.skip("the test Redis itself started less than a minute ago")
    client.delete(BEAT_KEY)
    assert check_beat(client, True) == {"up": False, "detail": "beat has never ticked"}
