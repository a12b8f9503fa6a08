"""A Celery worker SIGKILLed between the claim and the provider call (docs/faults.md).

A real worker (``celery -A console worker --pool solo``) on this session's databases and Redis
resumes an approved P1 launch on the ``local`` provider (a real worker process per launch). The
test holds the local provider's id counter lock (``flock`` on ``workers/counter``), so the worker
claims the side effect and then blocks inside the provider call before anything is created; it is
SIGKILLed there. The run lock TTL is 600 s, as in production.

Right: the dead run's lock is free at once (its holder is known dead), the claim is settled at the
next tick — not found, so ``stale_claim``, the alert names it, and the approval waits for the
operator again (never voided as ``duplicate``) — and approving it again launches exactly once.
"""

import fcntl
import signal
import time
from pathlib import Path

import pytest

from agent.models import Approval, Run, SessionState, SideEffect
from agent.runtime.approvals import do_decide
from agent.runtime.loop import acquire_lock, release_lock
from agent.runtime.monitor_runner import monitor_tick
from agent.tasks import start_resume
from fleet.models import Alert
from tests import fleet_support
from tests.console_support import broker_idle, tasks_done
from tests.fleet_support import FLEET_DB, wait_for
from tests.test_approval_restart import VISIBILITY_S, Worker, launched, park_a_launch, worker_env  # noqa: F401

pytestmark = [FLEET_DB, pytest.mark.slow]  # real processes: `make test-slow`
local_fleet = fleet_support.local_fleet


def waits_for_flock(pid: int) -> bool:
    """Whether process ``pid`` is blocked waiting for a ``flock`` (a ``->`` line of /proc/locks)."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "->" and fields[2] == "FLOCK" and fields[5] == str(pid):
            return True
    return False


@pytest.fixture
def workers(worker_env, tmp_path):  # noqa: F811 — the shared fixture, with the production lock TTL
    env = {**worker_env, "WARDEN_RUN_LOCK_TTL_S": "600"}
    started: list[Worker] = []

    def make(name: str) -> Worker:
        w = Worker(env, tmp_path / "celery.log", name)
        started.append(w)
        return w.start()

    yield make
    for w in started:
        w.kill()


def test_a_worker_killed_after_claiming_loses_nothing_and_blocks_nothing(workers, local_fleet, alice):
    approval = park_a_launch()
    run = approval.run
    victim = workers("victim")

    counter = open(local_fleet.root / "counter", "a+")  # noqa: SIM115 — held across the kill
    fcntl.flock(counter, fcntl.LOCK_EX)
    try:
        do_decide(approval, "approve", "user:alice", user=alice)
        start_resume(run.pk)
        claim = wait_for(lambda: SideEffect.objects.filter(key=approval.idempotency_key).first(), timeout=60,
                         what=f"the worker to claim the launch; log:\n{victim.text()}")
        wait_for(lambda: waits_for_flock(victim.proc.pid), timeout=30,
                 what="the worker to block inside the provider call, on the id counter's flock")
        victim.kill()
        killed_at = time.monotonic()
        assert victim.proc.returncode == -signal.SIGKILL
    finally:
        victim.kill()
        fcntl.flock(counter, fcntl.LOCK_UN)
        counter.close()

    claim.refresh_from_db()
    assert claim.status == "claimed" and f"|{victim.proc.pid}|" in claim.worker
    assert launched(local_fleet) == []
    state = SessionState.get()
    assert state.lock_token and f"|{victim.proc.pid}|" in state.lock_holder  # the dead run still "holds" it

    token = acquire_lock()  # freed because its holder is dead, not 600 s later
    assert token is not None
    release_lock(token)

    monitor_tick()  # what beat runs every minute

    claim.refresh_from_db()
    assert (claim.status, claim.code) == ("failed", "stale_claim")
    [alert] = Alert.objects.filter(kind="stale_claim")
    assert "launch_instance" in alert.message and claim.label in alert.message
    approval.refresh_from_db()
    assert approval.status == "waiting" and "never ran" in approval.outcome_detail  # not void, not duplicate
    assert Run.objects.get(pk=run.pk).status == "parked"

    # the operator approves again; a restarted worker runs it, exactly once
    # A solo-pool worker hands an unacknowledged message out again when it starts, once the message
    # is past the visibility timeout (kombu restores due messages at start-up): the survivor starts
    # after that, so the redelivery below is certain, not a race with the clock.
    time.sleep(max(0.0, VISIBILITY_S + 1 - (time.monotonic() - killed_at)))
    survivor = workers("restarted")
    do_decide(approval, "approve", "user:alice", user=alice)
    start_resume(run.pk)
    wait_for(lambda: Approval.objects.get(pk=approval.pk).status == "executed", timeout=90,
             what=f"the re-approved launch to run; log:\n{survivor.text()}")
    # the killed worker's unacked task comes back after the visibility timeout: the survivor has
    # finished it too (two resume tasks done) and nothing is left queued or unacknowledged
    wait_for(lambda: broker_idle() and len(tasks_done(survivor.text(), "agent.tasks.resume")) >= 2,
             timeout=VISIBILITY_S + 60, what=f"the redelivered resume task to finish; log:\n{survivor.text()}")
    assert len(launched(local_fleet)) == 1
    assert Approval.objects.get(pk=approval.pk).status == "executed"
    assert SideEffect.objects.filter(key=approval.idempotency_key, status="done").count() == 1
    assert not SideEffect.objects.filter(status="claimed").exists()
