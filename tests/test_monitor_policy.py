"""The monitor obeys the policy table and observe-only like every actor (docs/contract.md, The cycle, step 2):
``forbidden`` on the tool binds it (skipped as ``forbidden_tool``, halting nothing),
observe-only refuses its side effects, ``TOOL:monitor`` sets its own policy (default ``auto``), and
an action that needs approval parks as an Approval row (step actor ``monitor``) dispatched like any
approved call."""

import pytest

from agent.models import Approval
from agent.policy.table import effective_policy, policy_for
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run
from fleet.models import Instance
from tests.rails_support import calls, fleet_entry, rails_world, verdict

pytestmark = pytest.mark.django_db

DEAD = {"state": "ok", "active": True, "queued": 8, "running": 0, "idle_min": None}
DIAG = {"tool": "diagnose_instance", "args": {"instance_id": "v-1"}}


def exited():
    return [fleet_entry("v-1", status="exited", live=False)]


def monitor_steps(run):
    return list(run.steps.filter(kind="call", actor="monitor").order_by("seq"))


def test_its_own_default_is_auto_even_where_the_agent_needs_approval():
    table = effective_policy()
    assert policy_for("destroy_instance", {}, table) == "approval"
    assert policy_for("destroy_instance", {}, table, "monitor") == "auto"


def test_forbidden_binds_the_monitor_and_halts_nothing():
    with rails_world(exited(), DEAD, policy={"destroy_instance": "forbidden"}) as w:
        run = w.cycle([DIAG, verdict()])
    [step] = monitor_steps(run)
    assert (step.outcome, step.reason_code) == ("refused", "forbidden_tool")
    assert w.provider_calls("destroy_instance") == 0
    assert run.status == "done" and run.halt_reason == ""
    assert calls(run)[0].outcome == "executed"  # the planner still ran


def test_observe_only_binds_the_monitor():
    with rails_world(exited(), DEAD, observe_only=True) as w:
        run = w.cycle([verdict()])
    [step] = monitor_steps(run)
    assert (step.outcome, step.reason_code) == ("refused", "observe_only")
    assert w.provider_calls("destroy_instance") == 0
    assert Instance.objects.get(external_id="v-1").killed_at is None


def test_an_approval_policy_parks_the_monitor_and_the_decision_dispatches_it():
    with rails_world(exited(), DEAD, policy={"destroy_instance:monitor": "approval"}) as w:
        run = w.cycle([verdict()])
        [step] = monitor_steps(run)
        assert (step.outcome, step.reason_code) == ("parked", "approval_required")
        approval = Approval.objects.get(step=step)
        assert approval.step.actor == "monitor" and approval.status == "waiting"
        assert run.status == "parked"  # the planner finished; the monitor's call waits
        assert w.provider_calls("destroy_instance") == 0
        # the next cycle does not propose it again while it waits
        again = w.cycle([verdict()])
        assert monitor_steps(again) == []

        do_decide(approval, "approve", "user:alice")
        resume_run(run)
    step.refresh_from_db()
    run.refresh_from_db()
    assert step.outcome == "approved_executed"
    assert w.provider_calls("destroy_instance") == 1
    assert Instance.objects.get(external_id="v-1").killed_by == "monitor"
    assert run.status == "done"
    assert Approval.objects.get(pk=approval.pk).status == "executed"


def test_the_beat_tick_parks_too():
    from agent.runtime.monitor_runner import monitor_tick

    with rails_world(exited(), DEAD, policy={"destroy_instance:monitor": "approval"}) as w:
        number = monitor_tick()
        assert monitor_tick() is None  # waiting: nothing new to do
    approval = Approval.objects.get()
    assert approval.run.number == number and approval.run.status == "parked"
    assert w.provider_calls("destroy_instance") == 0


def test_its_alert_says_what_became_of_the_action_never_that_it_happened():
    from fleet.models import Alert

    stuck = [fleet_entry("v-0"), fleet_entry("v-1", status="loading", live=False, age_min=200)]
    one_live = {**DEAD, "running": 1, "workers_live": 1}  # a live worker: not starving, just stuck
    with rails_world(stuck, one_live, observe_only=True) as w:
        w.cycle([verdict()])
    [alert] = Alert.objects.filter(kind="stuck_provisioning")
    assert "destroy_instance: refused (observe_only)" in alert.message
    assert "destroying" not in alert.message
