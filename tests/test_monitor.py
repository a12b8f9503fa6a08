"""The monitor's lifecycle rules (fleet.monitor), run by the beat tick (agent.runtime.monitor_runner.monitor_tick)
and by every observe cycle (agent.runtime.loop.run_cycle), on virtual time.

- terminal instances (exited, error, unknown, offline) are destroyed by actor ``monitor``;
- stuck created/loading/scheduling > 3 h are destroyed with a ``stuck_provisioning`` alert, not before;
- instances missing from the provider's list are marked killed, except those created < 10 min ago;
- a destroy counts once a re-list confirms it; unconfirmed after 15 min → ``destroy_unconfirmed``;
- an operator-owned SSH host is never destroyed.

The "rented" provider stands in for an external cloud (fleet.providers.base.Provider).
"""


import pytest

from agent.models import Approval, Run, SideEffect, Step
from agent.planners.script import ScriptPlanner
from agent.runtime.loop import run_cycle
from agent.runtime.monitor_runner import monitor_tick
from fleet.clock import clock
from fleet.models import Alert, AuditLog, Instance
from fleet.providers import set_override
from fleet.providers.base import ProviderError
from tests import rented_cloud
from tests.rented_cloud import RentedProvider

vclock, cloud = rented_cloud.vclock, rented_cloud.cloud

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])

DONE = 'nothing else <verdict>{"action": false, "state_changed": false}</verdict>'


def monitor_steps(run_number=None):
    qs = Step.objects.filter(kind="call", actor="monitor")
    if run_number is not None:
        qs = qs.filter(run__number=run_number)
    return list(qs.order_by("run__number", "seq"))


@pytest.mark.parametrize("status", ["exited", "error", "unknown", "offline"])
def test_the_tick_destroys_a_terminal_instance_as_the_monitor(cloud, status):
    inst = cloud.add("v-1", status, age_min=120)

    number = monitor_tick()

    assert number is not None
    assert cloud.destroyed == ["v-1"]
    inst.refresh_from_db()
    assert inst.killed_at == clock.now() and inst.killed_by == "monitor"
    [step] = monitor_steps(number)
    assert (step.tool, step.outcome, step.args["instance_id"]) == ("destroy_instance", "executed", "v-1")
    assert f"provider status {status}" in step.call_reason
    [audit] = AuditLog.objects.filter(verb="destroy_instance")
    assert (audit.actor, audit.target) == ("monitor", "v-1")
    assert audit.before["killed"] is False and audit.after["killed"] is True
    assert SideEffect.objects.get(key=step.idempotency_key).actor == "monitor"
    assert not Approval.objects.exists()  # its rules are its policy: no approval
    assert Run.objects.get(number=number).planner == "monitor"


def test_a_tick_with_nothing_to_do_records_no_run(cloud):
    cloud.add("v-1", "running", age_min=120)

    assert monitor_tick() is None
    assert not Run.objects.exists() and cloud.destroyed == []


def test_the_observe_cycle_runs_the_monitor_before_the_planner(cloud):
    cloud.add("v-1", "exited", age_min=120)
    cloud.add("v-2", "running", age_min=120)

    run = run_cycle("test", planner=ScriptPlanner([{"text": DONE}]))

    [step] = monitor_steps(run.number)
    assert (step.tool, step.outcome, step.args["instance_id"]) == ("destroy_instance", "executed", "v-1")
    kinds = list(run.steps.order_by("seq").values_list("kind", "actor"))
    assert kinds[:2] == [("observe", "system"), ("call", "monitor")]
    assert cloud.destroyed == ["v-1"]
    assert Instance.objects.get(external_id="v-2").killed_at is None
    assert AuditLog.objects.get(verb="destroy_instance").actor == "monitor"


@pytest.mark.parametrize("status", ["created", "loading", "scheduling"])
def test_stuck_provisioning_past_3_hours_is_destroyed_with_an_alert_and_not_before(cloud, vclock, status):
    inst = cloud.add("v-1", status, age_min=200, status_age_min=179)

    assert monitor_tick() is None
    assert cloud.destroyed == [] and not Alert.objects.exists()

    vclock.advance(2 * 60)  # 181 min in that status
    number = monitor_tick()

    assert cloud.destroyed == ["v-1"]
    [step] = monitor_steps(number)
    assert step.outcome == "executed" and f"stuck {status}" in step.call_reason
    [alert] = Alert.objects.all()
    assert (alert.kind, alert.state) == ("stuck_provisioning", "firing")
    assert "v-1" in alert.message
    inst.refresh_from_db()
    assert inst.killed_by == "monitor"


def test_a_running_instance_is_never_stuck_however_old(cloud):
    cloud.add("v-1", "running", age_min=10_000)

    assert monitor_tick() is None
    assert cloud.destroyed == []


def test_a_vanished_instance_is_marked_killed_but_a_young_one_is_still_pending(cloud, vclock):
    old = cloud.add("v-old", "running", age_min=11, listed=False)
    young = cloud.add("v-young", "running", age_min=9, listed=False)

    monitor_tick()

    old.refresh_from_db()
    young.refresh_from_db()
    assert (old.killed_at, old.killed_by, old.kill_reason) == (clock.now(), "provider", "vanished")
    assert young.killed_at is None
    vclock.advance(2 * 60)
    monitor_tick()
    young.refresh_from_db()
    assert young.killed_by == "provider" and young.kill_reason == "vanished"


def test_a_vanished_instance_is_marked_killed_through_the_cycle_too(cloud):
    gone = cloud.add("v-gone", "running", age_min=30, listed=False)

    run_cycle("test", planner=ScriptPlanner([{"text": DONE}]))

    gone.refresh_from_db()
    assert gone.killed_by == "provider"


def test_a_destroy_counts_only_once_a_relist_confirms_it(cloud, vclock):
    inst = cloud.add("v-1", "exited", age_min=60)
    cloud.sticky.add("v-1")  # the provider accepts the destroy but keeps listing it

    first = monitor_tick()

    inst.refresh_from_db()
    assert cloud.destroyed == ["v-1"]
    assert inst.killed_at is None and inst.destroy_requested_at == clock.now()
    assert inst.intended_status == "destroyed"

    vclock.advance(10 * 60)  # still within 15 min: wait, do not retry, no alert
    assert monitor_tick() is None
    assert cloud.destroyed == ["v-1"] and not Alert.objects.exclude(kind="instance_exited").exists()  # it exited unasked: instance_exited

    vclock.advance(6 * 60)  # 16 min: unconfirmed
    second = monitor_tick()

    assert second is not None and second != first
    [alert] = Alert.objects.filter(kind="destroy_unconfirmed")
    assert "v-1" in alert.message and "$0.50/hr" in alert.message
    assert cloud.destroyed == ["v-1", "v-1"]  # retried
    [retry] = monitor_steps(second)
    assert retry.outcome == "executed" and "unconfirmed" in retry.call_reason

    # the provider finally lets go: the next re-list confirms it, and the alert is not raised again
    cloud.sticky.clear()
    del cloud.listed["v-1"]
    vclock.advance(60)
    monitor_tick()
    inst.refresh_from_db()
    assert inst.killed_at is not None
    assert Alert.objects.filter(kind="destroy_unconfirmed").count() == 1


def test_destroy_unconfirmed_is_raised_once_per_episode(cloud, vclock):
    cloud.add("v-1", "exited", age_min=60)
    cloud.sticky.add("v-1")
    monitor_tick()
    for _ in range(3):
        vclock.advance(16 * 60)
        monitor_tick()

    assert len(cloud.destroyed) == 4  # the first destroy and one retry per unconfirmed period
    assert Alert.objects.filter(kind="destroy_unconfirmed").count() == 1


def test_an_owned_ssh_host_is_never_destroyed_by_the_monitor(settings, vclock):
    settings.WARDEN = {**settings.WARDEN, "PROVIDER": "ssh"}
    hosts = RentedProvider(name="ssh")  # stands in for the operator's own SSH hosts
    set_override(hosts)
    try:
        inst = hosts.add("rig-1", "offline", age_min=600)
        hosts.add("rig-2", "loading", age_min=600)

        assert monitor_tick() is None
        run = run_cycle("test", planner=ScriptPlanner([
            {"tool": "destroy_instance", "args": {"instance_id": "rig-1", "reason": "offline"}},
            {"text": DONE},
        ]))
    finally:
        set_override(None)

    assert hosts.destroyed == []
    assert monitor_steps() == []
    step = run.steps.get(kind="call", tool="destroy_instance")
    assert (step.outcome, step.reason_code) == ("refused", "owned_host")
    inst.refresh_from_db()
    assert inst.killed_at is None and not AuditLog.objects.filter(verb="destroy_instance").exists()


def test_the_monitor_passes_the_same_idempotency_a_repeated_action_runs_once(cloud):
    """Two ticks over the same terminal instance: the first destroys it; the second finds nothing."""
    cloud.add("v-1", "error", age_min=60)

    monitor_tick()
    assert monitor_tick() is None

    assert cloud.destroyed == ["v-1"]
    assert SideEffect.objects.filter(tool="destroy_instance").count() == 1


def test_a_failed_destroy_is_an_error_step_and_the_instance_stays(cloud):
    class Refusing(RentedProvider):
        def destroy(self, external_id):
            raise ProviderError("403 forbidden", kind="permanent", code="http_403")

    provider = Refusing()
    set_override(provider)
    inst = provider.add("v-1", "exited", age_min=60)

    number = monitor_tick()

    [step] = monitor_steps(number)
    assert (step.outcome, step.ok) == ("error", False) and "http_403" in step.detail
    inst.refresh_from_db()
    assert inst.killed_at is None and inst.destroy_requested_at is None
