"""Blind mode (docs/contract.md): while demand is not ``ok`` nothing is destroyed
without an operator's approval.

The incident, with real parts: a real local worker proves from the harmony database; the
database breaks (its machines table disappears); demand turns ``unknown`` and the worker exits on
the same fault. The monitor must not destroy the only instance: worker liveness is unknown, so the
exited instance is terminal, but a terminal instance is destroyed while blind only with approval
(forced, whatever the policy). A non-terminal instance is never stopped or destroyed while blind
(``demand_guard``).
"""

import contextlib

import pytest
from django.db import connections

from agent.actions.instances import do_launch_instance
from agent.models import Approval
from agent.planners.rules import RulesPlanner
from agent.planners.script import ScriptPlanner
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run, run_cycle
from fleet.models import Alert, Instance
from tests import fleet_support
from tests.fleet_support import FLEET_DB, machine_of, wait_for
from tests.rails_support import calls, fleet_entry, rails_world, verdict

local_fleet = fleet_support.local_fleet

DONE = {"text": 'ok <verdict>{"action": false, "state_changed": false}</verdict>'}


@contextlib.contextmanager
def corrupt_harmony():
    """The harmony database breaks: its machines table is gone (restored afterwards)."""
    with connections["harmony"].cursor() as cur:
        cur.execute("ALTER TABLE harmony_machines RENAME TO harmony_machines_broken")
    try:
        yield
    finally:
        with connections["harmony"].cursor() as cur:
            cur.execute("ALTER TABLE harmony_machines_broken RENAME TO harmony_machines")


@FLEET_DB
def test_a_broken_demand_source_does_not_destroy_the_only_instance(local_fleet):
    inst = do_launch_instance(actor="user:alice", reason="test")
    wait_for(lambda: machine_of(inst.worker_name), what="the worker registers")
    with corrupt_harmony():
        wait_for(lambda: any(p.status == "exited" for p in local_fleet.list_instances()),
                 what="the worker exits on the broken database")
        run = run_cycle("test", planner=RulesPlanner())
        [monitor] = run.steps.filter(kind="call", actor="monitor")
        assert (monitor.tool, monitor.outcome, monitor.reason_code) == ("destroy_instance", "parked", "approval_required")
        assert "blind" in monitor.detail
        assert Alert.objects.filter(kind="demand_unknown", state="firing").exists()
        assert Alert.objects.filter(kind="instance_exited").exists()
        assert [p.external_id for p in local_fleet.list_instances()] == [inst.external_id]  # still there
        assert Instance.objects.get(pk=inst.pk).killed_at is None
        # the rules planner's own destroy of it is not a second way round
        assert not [s for s in calls(run) if s.tool == "destroy_instance" and s.outcome == "executed"]

        # an operator who looked approves: now it is destroyed
        approval = Approval.objects.get(step=monitor)
        do_decide(approval, "approve", "user:alice")
        resume_run(Approval.objects.get(pk=approval.pk).run)
    monitor.refresh_from_db()
    assert monitor.outcome == "approved_executed"
    assert local_fleet.list_instances() == []


@FLEET_DB
def test_near_miss_with_demand_readable_the_monitor_replaces_the_exited_instance(local_fleet):
    inst = do_launch_instance(actor="user:alice", reason="test")
    wait_for(lambda: machine_of(inst.worker_name), what="the worker registers")
    local_fleet.kill_worker(inst.external_id)
    wait_for(lambda: any(p.status == "exited" for p in local_fleet.list_instances()), what="exited")
    wait_for(lambda: run_cycle("test", planner=ScriptPlanner([DONE])).steps.filter(
        kind="call", actor="monitor", outcome="executed").exists(), timeout=20, what="the stale heartbeat")
    assert local_fleet.list_instances() == []


@pytest.mark.django_db
@pytest.mark.parametrize("tool", ["stop_instance", "destroy_instance"])
def test_a_non_terminal_instance_is_never_scaled_down_while_blind(tool):
    step = {"tool": tool, "args": {"instance_id": "v-1", "reason": "no demand"}}
    with rails_world([fleet_entry("v-1")], {"state": "unknown"}, policy={tool: "auto"}, diagnosed=["v-1"]) as w:
        run = w.cycle([step, verdict()])
    assert (calls(run)[0].outcome, calls(run)[0].reason_code) == ("refused", "demand_guard")
    assert w.provider_calls("stop_instance") == w.provider_calls("destroy_instance") == 0
