"""When an instance may be stopped, destroyed or rebooted: ``fleet.lifecycle.eligibility``, the one
rule the guards, the forced approvals, the monitor, the ``rules`` planner and the ssh provider read.

First the function itself on real observed worlds (the scenario provider and demand source), then
near-miss twins through each caller: the same instance one fact apart, eligible and not.
"""

from datetime import timedelta

import pytest

from agent.planners.rules import RulesPlanner, sizing
from agent.policy.guards import check
from agent.policy.lifecycle import forced_approval
from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import observe
from fleet import monitor
from fleet.clock import clock
from fleet.lifecycle import eligibility
from fleet.models import Instance
from tests.rails_support import fleet_entry, rails_world

pytestmark = pytest.mark.django_db

#: nothing queued, idle long past the dwell, the one expected worker live
IDLE = {"state": "ok", "queued": 0, "running": 0, "workers_expected": 1, "workers_live": 1, "idle_min": 120}
#: work queued, the one expected worker dead
DEAD = {"state": "ok", "queued": 8, "running": 0, "workers_expected": 1, "workers_live": 0, "idle_min": None}
RETIRE = ("stop_instance", "destroy_instance", "reboot_instance")


def world_now():
    return observe(effective_limits(), effective_policy())


def the(world, ident="v-1"):
    inst = world.instance(ident)
    assert inst is not None
    return inst


def test_a_killed_instance_is_gone_for_every_tool():
    with rails_world([fleet_entry("v-1", live=False), fleet_entry("v-2", live=False)], DEAD):
        Instance.objects.filter(external_id="v-1").update(killed_at=clock.now(), kill_reason="vanished")
        w = world_now()
        for tool in (*RETIRE, "resume_instance"):
            e = eligibility(the(w, "v-1"), w, tool)
            assert (e.code, e.ok) == ("target_gone", False) and "vanished" in e.detail
            assert eligibility(the(w, "v-2"), w, tool).code == ""  # its twin, not killed


def test_an_owned_host_is_never_destroyed_but_may_be_stopped():
    with rails_world([fleet_entry("v-1", live=False)], DEAD):
        w = world_now()
        inst = the(w)
        assert eligibility(inst, w, "destroy_instance").code == ""
        inst.provider = "ssh"  # an operator-owned SSH host (Instance.is_owned_host)
        e = eligibility(inst, w, "destroy_instance", actor="monitor")
        assert e.code == "owned_host" and "never destroyed by monitor" in e.detail
        assert eligibility(inst, w, "stop_instance").ok and eligibility(inst, w, "reboot_instance").ok


def test_a_live_worker_that_owns_tasks_is_never_stopped_destroyed_or_rebooted():
    with rails_world([fleet_entry("v-1", live=True, owned_tasks=2), fleet_entry("v-2", live=True, owned_tasks=0)], IDLE):
        w = world_now()
        for tool in RETIRE:
            e = eligibility(the(w, "v-1"), w, tool)
            assert e.code == "owned_tasks" and "owns 2 task(s)" in e.detail
            assert eligibility(the(w, "v-2"), w, tool).ok  # the twin owns none
        assert eligibility(the(w, "v-1"), w, "resume_instance").ok  # not a retirement


def test_a_dead_worker_that_owns_tasks_parks_a_stop_or_destroy_but_not_a_reboot():
    with rails_world([fleet_entry("v-1", live=False, owned_tasks=1), fleet_entry("v-2", live=False)], DEAD):
        w = world_now()
        for tool in ("stop_instance", "destroy_instance"):
            e = eligibility(the(w, "v-1"), w, tool)
            assert e.ok and "dead worker still owns 1 task(s)" in e.park
            assert eligibility(the(w, "v-2"), w, tool).park == ""
        assert eligibility(the(w, "v-1"), w, "reboot_instance").park == ""  # rebooting it is the repair


def test_terminal_is_a_replacement_and_a_destroy_already_requested_is_one_too():
    with rails_world([fleet_entry("v-1", status="error", live=False), fleet_entry("v-2", status="error", live=True),
                      fleet_entry("v-3", live=False)], DEAD):
        Instance.objects.filter(external_id="v-3").update(destroy_requested_at=clock.now() - timedelta(minutes=1))
        w = world_now()
        e = eligibility(the(w, "v-1"), w, "destroy_instance")
        assert e.ok and e.terminal and e.why == "provider status error"
        assert not eligibility(the(w, "v-2"), w, "destroy_instance").terminal  # a live worker is never terminal
        assert eligibility(the(w, "v-3"), w, "destroy_instance").terminal
        assert not eligibility(the(w, "v-3"), w, "stop_instance").terminal  # only a destroy is re-sent


def test_without_a_world_only_the_record_is_judged():
    inst = Instance(provider="ssh", external_id="h-1")
    assert eligibility(inst, None, "destroy_instance").code == "owned_host"
    assert eligibility(inst, None, "stop_instance").ok
    assert eligibility(Instance(provider="vastai", external_id="1"), None, "destroy_instance").ok


# -- near misses through the callers ----------------------------------------------------------------

def test_the_guards_refuse_what_it_refuses_and_pass_its_twin():
    with rails_world([fleet_entry("v-1", live=True, owned_tasks=2), fleet_entry("v-2", live=True)], IDLE,
                     diagnosed=("v-1", "v-2")):
        w = world_now()
        refused = check("reboot_instance", {"instance_id": "v-1", "reason": "t"}, "k-1", w, actor="monitor")
        assert refused is not None and refused.code == "owned_tasks"
        assert check("reboot_instance", {"instance_id": "v-2", "reason": "t"}, "k-2", w, actor="monitor") is None


def test_forced_approval_is_its_park():
    with rails_world([fleet_entry("v-1", live=False, owned_tasks=1), fleet_entry("v-2", live=False)], DEAD):
        w = world_now()
        assert "dead worker still owns" in forced_approval("stop_instance", {"instance_id": "v-1"}, w)
        assert forced_approval("stop_instance", {"instance_id": "v-2"}, w) == ""
        assert forced_approval("reboot_instance", {"instance_id": "v-1"}, w) == ""


def test_the_monitor_destroys_a_terminal_rented_instance_never_an_owned_host():
    with rails_world([fleet_entry("v-1", status="error", live=False), fleet_entry("v-2", status="error", live=False)], DEAD):
        w = world_now()
        the(w, "v-2").provider = "ssh"
        acts = monitor.decide(w)
    assert [(a.tool, a.args["instance_id"]) for a in acts] == [("destroy_instance", "v-1")]
    assert acts[0].args["reason"] == "terminal: provider status error"


def test_the_planner_replaces_terminal_instances_but_not_one_being_destroyed():
    with rails_world([fleet_entry("v-1", status="error", live=False), fleet_entry("v-2", status="error", live=False)], DEAD):
        Instance.objects.filter(external_id="v-2").update(destroy_requested_at=clock.now())
        w = world_now()
        assert [i.external_id for i in sizing(w).terminal] == ["v-1"]


def test_the_planner_does_not_retire_what_would_park():
    """Idle, both diagnosed healthy: the one whose worker is in doubt about its identity would park
    for an operator (forced approval), so the planner does not propose it; its twin it does."""
    with rails_world([fleet_entry("v-1"), fleet_entry("v-2")], {**IDLE, "workers_expected": 2, "workers_live": 2},
                     diagnosed=("v-1", "v-2")):
        w = world_now()
        w.worker_for(the(w, "v-1")).identity = "two nodes share this name"
        assert eligibility(the(w, "v-1"), w, "stop_instance").park
        candidates = RulesPlanner()._retire_candidates(w)
    assert [i.external_id for i in candidates] == ["v-2"]
