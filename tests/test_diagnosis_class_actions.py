"""The rules planner acts on the diagnosis' class: host → replace and remember the
machine as bad; container → reboot; app → reboot; network → diagnose again later, never destroy
(nor reboot) on one failure.

A real cycle (``agent.runtime.loop.run_cycle`` + ``RulesPlanner``) against the scenario provider, whose
``ssh`` block answers the diagnosis commands; one expected worker, dead, with work queued.
"""

import pytest

from agent.models import MemoryFact
from agent.planners.rules import RulesPlanner
from agent.runtime.loop import run_cycle
from fleet.models import Diagnosis
from tests.rails_support import calls, fleet_entry, rails_world

pytestmark = pytest.mark.django_db

DEAD = {"state": "ok", "active": False, "queued": 3, "running": 0, "idle_min": None}
AUTO = {"reboot_instance": "auto", "destroy_instance": "auto", "launch_instance": "auto"}


def ssh(rc: int, out: str) -> dict:
    return {"reachable": True, "commands": {"nvidia-smi": {"rc": rc, "out": out}, "uptime": {"rc": 0, "out": "up 3 days"}}}


def cycle(ssh_block):
    with rails_world([fleet_entry("v-1", live=False, ssh=ssh_block)], DEAD, policy=AUTO, limits={"max_instances": 2}) as w:
        run = run_cycle("heartbeat", planner=RulesPlanner())
        run.refresh_from_db()
        return w, run, [(s.tool, s.outcome) for s in calls(run)]


def test_a_host_fault_replaces_the_instance_and_remembers_the_machine_as_bad():
    w, run, steps = cycle(ssh(15, "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost."))

    assert ("diagnose_instance", "executed") in steps
    assert ("destroy_instance", "executed") in steps
    assert ("remember", "executed") in steps
    assert ("reboot_instance", "executed") not in steps
    fact = MemoryFact.objects.get(category="machine_perf")
    assert fact.key.startswith("bad host scenario v-1") and "GPU lost" in fact.value
    assert w.provider_calls("destroy_instance") == 1


@pytest.mark.parametrize(("ssh_block", "cls"), [
    (ssh(255, "Failed to initialize NVML: Unknown Error"), "container"),
    (ssh(0, "GPU 0: NVIDIA H200 (UUID: GPU-1)"), "app"),  # GPU fine, heartbeat stale
])
def test_container_and_app_faults_reboot(ssh_block, cls):
    w, run, steps = cycle(ssh_block)

    assert Diagnosis.objects.get().fault_class == cls
    assert ("reboot_instance", "executed") in steps
    assert not any(t in ("destroy_instance", "remember") for t, _ in steps)
    assert w.provider_calls("destroy_instance") == 0


def test_a_network_verdict_is_diagnosed_again_later_and_never_destroys_on_one_failure():
    unreachable = {"reachable": False, "commands": {}}
    with rails_world([fleet_entry("v-1", live=False, ssh=unreachable)], DEAD, policy=AUTO, limits={"max_instances": 2}) as w:
        first = run_cycle("heartbeat", planner=RulesPlanner())
        w.clock.advance(30)  # within network_recheck_min: the verdict stands, nothing is redone
        second = run_cycle("heartbeat", planner=RulesPlanner())
        w.clock.advance(180)  # past it: diagnosed again
        third = run_cycle("heartbeat", planner=RulesPlanner())
        tools = [[s.tool for s in calls(r)] for r in (first, second, third)]

    assert [d.fault_class for d in Diagnosis.objects.order_by("taken_at")] == ["network", "network"]
    assert "diagnose_instance" in tools[0] and "diagnose_instance" not in tools[1] and "diagnose_instance" in tools[2]
    for t in tools:
        assert "destroy_instance" not in t and "reboot_instance" not in t
    assert w.provider_calls("destroy_instance") == 0 and w.provider_calls("reboot_instance") == 0

