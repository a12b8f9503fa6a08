"""The demo worker speaks HarmonyDB's queue protocol: register, heartbeat, claim, prove, record."""

import time

import pytest
from django.utils import timezone

from fleet import demo
from fleet.harmony import HarmonyTask, HarmonyTaskHistory
from tests import fleet_support
from tests.fleet_support import FLEET_DB, machine_of, wait_for, witness_proves

pytestmark = [FLEET_DB, pytest.mark.slow]  # real processes: `make test-slow`
local_fleet = fleet_support.local_fleet


def test_it_proves_queued_tasks_deletes_them_and_writes_history(local_fleet):
    ids = demo.enqueue(3)
    inst = local_fleet.launch()

    wait_for(lambda: not HarmonyTask.objects.exists(), timeout=30, what="the queue to drain")

    machine = machine_of(inst.worker_name)
    history = list(HarmonyTaskHistory.objects.order_by("task_id"))
    assert [h.task_id for h in history] == ids
    assert all(h.result and h.name == "PoRep" for h in history)
    assert all(h.completed_by_host_and_port == machine.host_and_port for h in history)
    assert all((h.work_end - h.work_start).total_seconds() >= 0.9 for h in history)


def test_two_workers_never_claim_the_same_task(local_fleet):
    ids = demo.enqueue(6)
    local_fleet.launch()
    local_fleet.launch()

    wait_for(lambda: not HarmonyTask.objects.exists(), timeout=40, what="the queue to drain")

    done = list(HarmonyTaskHistory.objects.values_list("task_id", flat=True))
    assert sorted(done) == ids
    assert len({h.completed_by_host_and_port for h in HarmonyTaskHistory.objects.all()}) == 2


def test_its_heartbeat_stays_fresh_while_two_workers_prove_on_all_cores(local_fleet, settings):
    settings.WARDEN = {**settings.WARDEN, "PROOF_SECONDS": 8.0}
    a = local_fleet.launch()
    b = local_fleet.launch()
    wait_for(lambda: machine_of(a.worker_name) and machine_of(b.worker_name), what="registration")
    demo.enqueue(2)
    wait_for(lambda: HarmonyTask.objects.filter(owner__isnull=False).count() == 2, what="both tasks claimed")

    worst = 0.0
    for _ in range(12):
        time.sleep(0.5)
        now = timezone.now()
        for inst in (a, b):
            worst = max(worst, (now - machine_of(inst.worker_name).last_contact).total_seconds())
    assert worst < 3 * settings.WARDEN["HEARTBEAT_S"], worst
    assert HarmonyTask.objects.filter(owner__isnull=False).count() == 2  # still proving


def test_it_puts_its_task_back_when_stopped_mid_proof(local_fleet, settings):
    settings.WARDEN = {**settings.WARDEN, "PROOF_SECONDS": 120.0}
    [task_id] = demo.enqueue(1)
    inst = local_fleet.launch()
    wait_for(lambda: HarmonyTask.objects.filter(id=task_id, owner__isnull=False).exists(), what="the claim")

    local_fleet.stop(inst.external_id)

    task = HarmonyTask.objects.get(id=task_id)
    assert task.owner_id is None
    assert not HarmonyTaskHistory.objects.exists()
    assert {p.external_id: p for p in local_fleet.list_instances()}[inst.external_id].exit_code == 0


def test_a_cordoned_worker_claims_nothing(local_fleet):
    inst = local_fleet.launch()
    machine = wait_for(lambda: machine_of(inst.worker_name), what="registration")
    type(machine).objects.filter(id=machine.id).update(unschedulable=True)

    ids = demo.enqueue(2)
    witness = witness_proves(local_fleet, ids)  # positive: the queue was claimable for seconds, then drained

    done_by = set(HarmonyTaskHistory.objects.filter(task_id__in=ids).values_list("completed_by_host_and_port", flat=True))
    assert done_by == {witness}, f"the cordoned worker ({machine.host_and_port}) proved some of them"


def test_it_ignores_tasks_that_are_not_its_own(local_fleet):
    sdr = demo.enqueue(2, name="SDR")
    inst = local_fleet.launch()
    wait_for(lambda: machine_of(inst.worker_name), what="registration")
    [porep] = demo.enqueue(1)  # posted after the SDR tasks: a worker taking any name would claim those first

    wait_for(lambda: HarmonyTaskHistory.objects.filter(task_id=porep, result=True).exists(), timeout=30,
             what="its own PoRep task to be proved (it has polled the queue since the SDR tasks were posted)")

    assert HarmonyTask.objects.filter(id__in=sdr, name="SDR", owner__isnull=True).count() == 2
    assert not HarmonyTaskHistory.objects.filter(task_id__in=sdr).exists()


def test_an_idle_worker_requeues_the_task_of_a_machine_that_died(local_fleet):
    from datetime import timedelta

    from fleet.harmony import HarmonyMachine
    from fleet.providers.local import set_child_env

    set_child_env({"WARDEN_LOOKS_DEAD_S": "2"})
    try:
        inst = local_fleet.launch()
        wait_for(lambda: machine_of(inst.worker_name), what="the worker to register")
        # a machine that died holding a task, after our worker registered (Curio only cleans up on register)
        old = timezone.now() - timedelta(minutes=30)
        dead = HarmonyMachine.objects.create(last_contact=old, host_and_port="gone:1", gpu=1.0)
        (task_id,) = demo.enqueue(1)
        HarmonyTask.objects.filter(id=task_id).update(owner=dead)

        wait_for(lambda: HarmonyTaskHistory.objects.filter(task_id=task_id, result=True).exists(), timeout=30,
                 what="the orphaned task to be requeued and proved")
        assert not HarmonyMachine.objects.filter(id=dead.id).exists()
    finally:
        set_child_env(None)
