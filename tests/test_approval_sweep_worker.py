"""A Celery worker SIGKILLed right after an approval does not delay the approved launch until the
broker's visibility timeout (900 s): the monitor's next tick (the sweep, ``agent.runtime.sweep``) runs it,
and its alert says what waited and why.

A real worker (``celery -A console worker --pool solo``) on this session's databases and Redis db,
with the production visibility timeout. The test stands in for beat: it sends the monitor's task
through the broker every two seconds, as beat does every minute.
"""

import signal
import time

import pytest

from agent.models import Approval, SideEffect
from agent.runtime.approvals import do_decide
from agent.runtime.sweep import GRACE_S
from agent.tasks import monitor_tick, start_resume
from fleet.models import Alert
from tests.fleet_support import FLEET_DB, wait_for
from tests.test_approval_restart import (  # noqa: F401 — fixtures
    anchor_lock,
    blocked_on_anchor,
    launched,
    local_fleet,
    park_a_launch,
    worker_env,
    workers,
)

pytestmark = [FLEET_DB, pytest.mark.slow]  # real processes: `make test-slow`


@pytest.fixture
def long_visibility(worker_env):  # noqa: F811
    worker_env["WARDEN_CELERY_VISIBILITY_TIMEOUT_S"] = "900"  # the default: redelivery would take 15 minutes
    return worker_env


def _beat_until(predicate, timeout: float, what: str):
    """Send ``monitor_tick`` through the broker every 2 s (beat's job) until ``predicate()``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        monitor_tick.delay()
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_worker_killed_right_after_an_approval_is_caught_by_the_sweep_not_the_visibility_timeout(
        long_visibility, workers, local_fleet, alice):  # noqa: F811
    approval = park_a_launch()
    victim = workers("victim")
    lock = anchor_lock()  # the worker takes the resume task and waits for the run lock: nothing ran yet
    try:
        do_decide(approval, "approve", "user:alice", user=alice)
        start_resume(approval.run_id)
        wait_for(blocked_on_anchor, timeout=30, what="the worker to pick up the resume task")
        time.sleep(0.25)
        victim.kill(signal.SIGKILL)
    finally:
        victim.kill()
        lock.rollback()
        lock.close()
    assert Approval.objects.get(pk=approval.pk).status == "approved" and not SideEffect.objects.exists()

    survivor = workers("survivor")
    time.sleep(GRACE_S)  # the sweep leaves a decision this young to its own resume task
    _beat_until(lambda: Approval.objects.get(pk=approval.pk).status == "executed", 90,
                f"the sweep to dispatch the approved launch; worker log:\n{survivor.text()}")
    assert len(launched(local_fleet)) == 1
    assert SideEffect.objects.filter(tool="launch_instance").count() == 1
    # the alert follows the dispatch, in the same task
    wait_for(lambda: Alert.objects.filter(kind="approval_stalled").exists(), timeout=30, what="the approval_stalled alert")
    alert = Alert.objects.get(kind="approval_stalled")
    assert f"approval {approval.pk} (launch_instance" in alert.message and "approved by alice" in alert.message
    assert "its resume task was queued but no worker finished it" in alert.message
    assert "visibility timeout (900 s)" in alert.message and "dispatched it: executed" in alert.message
