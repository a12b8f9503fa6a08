"""A cordon is Warden's state: re-applied after a reboot, a resume and a
re-registration of the worker, so a cordoned worker never comes back schedulable and claims work.

Real demo worker processes on the ``local`` provider, the real harmony tables on PostgreSQL.
"""

import signal

import pytest

from agent.actions.instances import do_cordon, do_instance_action, do_launch_instance
from agent.models import SessionState
from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import observe
from fleet import demo
from fleet.harmony import HarmonyMachine, HarmonyTask, HarmonyTaskHistory
from fleet.models import AuditLog
from tests import fleet_support
from tests.fleet_support import FLEET_DB, machine_of, wait_for, witness_proves

pytestmark = [FLEET_DB, pytest.mark.slow]  # real processes: `make test-slow`
local_fleet = fleet_support.local_fleet


def _registered_after(name: str, since_pid_host: str | None):
    """The worker's machine row once it registered again (a new ``host_and_port``: a new process)."""
    m = machine_of(name)
    return m if m is not None and m.host_and_port != since_pid_host else None


def _cordoned_launch(local_fleet):
    inst = do_launch_instance(actor="user:alice", reason="test")
    first = wait_for(lambda: machine_of(inst.worker_name), what="registration")
    do_cordon(inst, True, actor="user:alice", reason="drain for maintenance")
    assert HarmonyMachine.objects.get(pk=first.pk).unschedulable is True
    inst.refresh_from_db()
    assert inst.cordoned is True
    return inst, first


def _claims_nothing(local_fleet, machine) -> None:
    ids = demo.enqueue(2)
    witness = witness_proves(local_fleet, ids)  # positive: claimable for the witness's start-up, then drained
    assert HarmonyMachine.objects.get(pk=machine.pk).unschedulable is True
    done_by = set(HarmonyTaskHistory.objects.filter(task_id__in=ids).values_list("completed_by_host_and_port", flat=True))
    assert done_by == {witness}, f"the cordoned worker ({machine.host_and_port}) proved some of them"


def test_a_cordoned_worker_stays_cordoned_after_a_reboot(local_fleet):
    inst, first = _cordoned_launch(local_fleet)

    do_instance_action(inst, "reboot", actor="user:alice", reason="wedged")

    again = wait_for(lambda: _registered_after(inst.worker_name, first.host_and_port), what="re-registration")
    _claims_nothing(local_fleet, again)


def test_a_cordoned_worker_stays_cordoned_after_a_crash_and_a_resume(local_fleet):
    inst, first = _cordoned_launch(local_fleet)
    local_fleet.kill_worker(inst.external_id, signal.SIGKILL)

    do_instance_action(inst, "resume", actor="user:alice", reason="bring it back")

    again = wait_for(lambda: _registered_after(inst.worker_name, first.host_and_port), what="re-registration")
    _claims_nothing(local_fleet, again)


def test_a_worker_that_re_registered_schedulable_is_cordoned_again_at_the_next_observe(local_fleet):
    """A Curio node restarted outside Warden registers schedulable; the next observe re-applies the cordon."""
    inst, first = _cordoned_launch(local_fleet)
    HarmonyMachine.objects.filter(pk=first.pk).update(unschedulable=False)  # what a re-registration does

    state = SessionState.get()
    observe(effective_limits(state), effective_policy(state))

    assert HarmonyMachine.objects.get(pk=first.pk).unschedulable is True
    assert AuditLog.objects.filter(verb="cordon_reapplied", target=inst.external_id).count() == 1


def test_uncordon_is_warden_state_too(local_fleet):
    inst, first = _cordoned_launch(local_fleet)
    do_cordon(inst, False, actor="user:alice", reason="maintenance done")

    do_instance_action(inst, "reboot", actor="user:alice", reason="fresh start")

    again = wait_for(lambda: _registered_after(inst.worker_name, first.host_and_port), what="re-registration")
    assert HarmonyMachine.objects.get(pk=again.pk).unschedulable is False
    [task] = demo.enqueue(1)
    wait_for(lambda: HarmonyTask.objects.filter(id=task, owner__isnull=False).exists()
             or not HarmonyTask.objects.filter(id=task).exists(), timeout=20, what="the uncordoned worker to take work")
