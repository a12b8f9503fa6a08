"""A crash is never silent (docs/contract.md alert ``instance_exited``).

Real local workers on the test databases: ``demo kill-worker`` SIGKILLs one; the next observe
cycle raises ``instance_exited`` with the evidence the local provider recorded (exit code -9),
once per episode however many cycles see it. An instance we stopped ourselves raises nothing.
"""

import pytest
from django.core.management import call_command

from agent.actions.instances import do_instance_action, do_launch_instance
from agent.planners.script import ScriptPlanner
from agent.runtime.loop import run_cycle
from fleet.models import Alert, Instance
from tests import fleet_support, rented_cloud
from tests.fleet_support import FLEET_DB, machine_of, wait_for

pytestmark = FLEET_DB
local_fleet = fleet_support.local_fleet
vclock, cloud = rented_cloud.vclock, rented_cloud.cloud

DONE = {"text": 'ok <verdict>{"action": false, "state_changed": false}</verdict>'}


def cycle():
    run = run_cycle("test", planner=ScriptPlanner([DONE]))
    assert run is not None
    return run


def started(provider):
    inst = do_launch_instance(actor="user:alice", reason="test")
    wait_for(lambda: machine_of(inst.worker_name), what="the worker registers")
    return inst


def test_a_sigkilled_worker_raises_instance_exited_once_with_its_exit_code(local_fleet):
    inst = started(local_fleet)
    cycle()
    assert not Alert.objects.filter(kind="instance_exited").exists()

    call_command("demo", "kill-worker")
    wait_for(lambda: any(p.status == "exited" for p in local_fleet.list_instances()), what="status exited")
    cycle()
    cycle()

    [alert] = Alert.objects.filter(kind="instance_exited")
    assert inst.external_id in alert.message
    assert "exit code -9" in alert.message and "SIGKILL" in alert.message
    assert alert.state == "firing" and alert.instance_id == inst.pk


def test_near_miss_an_instance_we_stopped_raises_nothing(local_fleet):
    inst = started(local_fleet)
    do_instance_action(Instance.objects.get(pk=inst.pk), "stop", actor="user:alice", reason="test")
    cycle()
    assert not Alert.objects.filter(kind="instance_exited").exists()
    assert Instance.objects.get(pk=inst.pk).killed_at is None  # stopped, to resume: not destroyed


def _stale_worker(name: str, seconds: float):
    from datetime import timedelta

    from fleet.clock import clock
    from fleet.harmony import HarmonyMachine, HarmonyMachineDetails

    m = HarmonyMachine.objects.create(last_contact=clock.now() - timedelta(seconds=seconds),
                                      host_and_port=f"{name}:12300", unschedulable=False)
    HarmonyMachineDetails.objects.create(machine=m, tasks="PoRep", machine_name=name)


@pytest.mark.parametrize("running_min, alerted", [(120, True), (0.5, False)])
def test_a_worker_that_stops_heartbeating_while_its_instance_runs(cloud, running_min, alerted):
    """The instance still runs but its worker went silent: instance_exited, with the last contact.
    Near miss: an instance that came back from a reboot seconds ago is still inside its grace."""
    from tests.fleet_support import clear_harmony

    clear_harmony()
    try:
        cloud.add("v-1", "running", age_min=300, status_age_min=running_min)
        _stale_worker("v-1", 120)
        cycle()
    finally:
        clear_harmony()
    alerts = list(Alert.objects.filter(kind="instance_exited"))
    assert bool(alerts) == alerted
    if alerted:
        assert "stopped heartbeating" in alerts[0].message and "last contact" in alerts[0].message
