"""The run lock is renewed while a run works, within the run's wall clock: a run blocked inside
one call (here a real provider call that never returns while the test holds the local provider's
id lock) keeps the agent single-flight past the lock's TTL; past its wall clock the lock is no
longer renewed, an alert says so, the lock lapses, the next cycle fails the stuck run, and the
blocked run stops at its next check instead of going on beside the new one."""

import fcntl
import threading
from pathlib import Path

import pytest
from django.db import connections

from agent.models import Run, SessionState, SideEffect
from agent.planners.script import ScriptPlanner
from agent.runtime.loop import run_cycle
from fleet import demo
from fleet.models import Alert
from tests import fleet_support
from tests.fleet_support import FLEET_DB, wait_for

pytestmark = FLEET_DB
local_fleet = fleet_support.local_fleet
TTL_S = 1.5
LAUNCH = [{"tool": "launch_instance", "args": {"gpu_name": "local-cpu", "launch_priority": "P0", "reason": "queue"}}]


class HungProvider:
    """Holds the local provider's id counter lock: a launch claims, then blocks inside the provider."""

    def __init__(self, provider):
        root = Path(provider.root)
        root.mkdir(parents=True, exist_ok=True)
        self.fh = open(root / "counter", "a+")  # noqa: SIM115 — held until release()
        fcntl.flock(self.fh, fcntl.LOCK_EX)

    def release(self):
        if not self.fh.closed:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()


def _cycle_in_thread(box: dict) -> threading.Thread:
    def body():
        try:
            box["run"] = run_cycle("test", planner=ScriptPlanner(LAUNCH))
        except BaseException as exc:  # noqa: BLE001 — the test reads it
            box["error"] = exc
        finally:
            connections.close_all()  # this thread's default and harmony connections

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


@pytest.fixture
def short_lock(settings, local_fleet):
    settings.WARDEN = {**settings.WARDEN, "RUN_LOCK_TTL_S": TTL_S, "EVENT_TRIGGERS": False}
    demo.enqueue(1)
    return local_fleet


def test_a_run_blocked_inside_a_call_keeps_its_lock_past_the_ttl_and_no_second_run_starts(short_lock):
    hang = HungProvider(short_lock)
    box: dict = {}
    try:
        t = _cycle_in_thread(box)
        wait_for(lambda: SideEffect.objects.filter(tool="launch_instance", status="claimed").exists(), timeout=60,
                 what="the launch to block inside the provider")
        first = SessionState.get().lock_expires_at
        # renewed: the expiry moves on while the call is blocked, well past the first TTL
        wait_for(lambda: (SessionState.get().lock_expires_at - first).total_seconds() >= 2 * TTL_S, timeout=30,
                 what="the run lock to be renewed")
        assert run_cycle("heartbeat", planner=ScriptPlanner([])) is None  # the agent is still busy
        assert Run.objects.filter(status="running").count() == 1 and Run.objects.count() == 1
    finally:
        hang.release()
    t.join(60)
    assert "error" not in box, box.get("error")
    run = box["run"]
    run.refresh_from_db()
    assert run.status == "done"
    assert SideEffect.objects.get(tool="launch_instance").status == "done"
    assert SessionState.get().lock_token == ""
    assert not Alert.objects.filter(kind="run_overdue").exists()


def test_past_its_wall_clock_a_blocked_run_lets_its_lock_lapse_and_the_next_cycle_fails_it(short_lock, settings):
    settings.MODEL = {**settings.MODEL, "TIMEOUT_S": 0.1}  # the renewal bound: wall clock + tool + model timeouts
    state = SessionState.get()
    state.overrides = {"limits": {"wall_clock_s": 1, "tool_timeout_s": 1}}
    state.save()
    hang = HungProvider(short_lock)
    box: dict = {}
    try:
        t = _cycle_in_thread(box)
        wait_for(lambda: SideEffect.objects.filter(tool="launch_instance", status="claimed").exists(), timeout=60,
                 what="the launch to block inside the provider")
        [stuck] = Run.objects.filter(status="running")
        wait_for(lambda: Alert.objects.filter(kind="run_overdue").exists(), timeout=60, what="the run_overdue alert")
        assert f"run {stuck.number} passed its wall clock" in Alert.objects.get(kind="run_overdue").message
        nxt = wait_for(lambda: run_cycle("heartbeat", planner=ScriptPlanner([])), timeout=30,
                       what="the next cycle to take the lapsed lock")
        stuck.refresh_from_db()
        assert stuck.status == "failed" and "let go of the run lock" in stuck.halt_detail and stuck.final_report
        assert Run.objects.get(pk=nxt.pk).status == "done"
    finally:
        hang.release()
    t.join(60)
    stuck.refresh_from_db()
    # the blocked call finished after all: its effect is recorded once, and the run went no further
    assert SideEffect.objects.get(tool="launch_instance").status == "done"
    assert stuck.status in ("failed", "halted") and stuck.status != "done"
    assert not stuck.steps.filter(kind="call").exclude(tool="launch_instance").exists()
    assert SessionState.get().lock_token == ""  # the blocked run's release did not free anyone's lock wrongly
