"""A side-effect request whose answer is lost is never re-sent blind (docs/safety.md invariant 10;
docs/contract.md ``outcome_unknown``).

The "rented" cloud stands in for an external provider (a test double is allowed for an external
service); it counts every request that reaches it. A fault ``after_effect`` takes effect and then
loses the answer (a timeout or reset after sending). The pipeline, guards, claims and database are
the real ones.
"""

import pytest

from agent.models import SessionState, SideEffect, Step
from agent.planners.script import ScriptPlanner
from agent.policy.claims import launch_label
from agent.runtime.loop import run_cycle
from fleet.models import Instance
from fleet.providers.base import ProviderError
from tests import rented_cloud

vclock, cloud = rented_cloud.vclock, rented_cloud.cloud

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])

LAUNCH = {"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "launch_priority": "P0", "reason": "tasks queued"}}


def _auto(**policy):
    """P0 launches auto, and three tasks waiting in the demo queue with no worker live: the launch is
    a P0 within the need (money moves only on facts), so it runs by itself."""
    from fleet import demo

    demo.enqueue(3)
    state = SessionState.get()
    state.overrides = {"policy": {"launch_instance:P0": "auto", **policy}}
    state.save()


def _calls(number=None):
    qs = Step.objects.filter(kind="call", actor="agent")
    if number is not None:
        qs = qs.filter(run__number=number)
    return list(qs.order_by("run__number", "seq"))


@pytest.mark.parametrize("code", ["timeout", "connection_reset", "http_500", "html_body"])
def test_a_create_whose_answer_is_lost_is_sent_once_and_what_it_made_is_adopted(cloud, code):
    _auto()
    cloud.fault("launch", code, after_effect=True)

    run = run_cycle("test", planner=ScriptPlanner([LAUNCH]))

    assert cloud.sent("launch") == 1  # never re-sent: one create, one machine
    [step] = _calls(run.number)
    assert (step.outcome, step.reason_code) == ("error", "outcome_unknown")
    assert "not re-sent" in step.detail and "found r-1" in step.detail
    inst = Instance.objects.get(external_id="r-1")  # adopted: nothing runs untracked
    assert inst.label == launch_label(step.idempotency_key) and inst.killed_at is None
    claim = SideEffect.objects.get(key=step.idempotency_key)
    assert (claim.status, claim.code) == ("done", "outcome_unknown")
    assert claim.worker  # the process that made the call is on the claim


def test_a_create_lost_before_it_took_effect_is_closed_not_resent_and_blocks_nothing(cloud):
    _auto()
    cloud.fault("launch", "timeout")

    first = run_cycle("test", planner=ScriptPlanner([LAUNCH]))

    assert cloud.sent("launch") == 1 and not cloud.listed
    [step] = _calls(first.number)
    assert (step.outcome, step.reason_code) == ("error", "outcome_unknown")
    claim = SideEffect.objects.get(key=step.idempotency_key)
    assert (claim.status, claim.code) == ("failed", "outcome_unknown")
    # decided: nothing exists, so a later launch is not held as pending
    second = run_cycle("test", planner=ScriptPlanner([LAUNCH]))
    [again] = _calls(second.number)
    assert again.outcome == "executed" and cloud.sent("launch") == 2 and list(cloud.listed) == ["r-1"]


def test_with_the_provider_unreadable_the_claim_stays_open_then_the_next_cycle_adopts(cloud):
    _auto()
    cloud.fault("launch", "timeout", after_effect=True)
    real_find = cloud.find_by_label

    def unreadable(label):
        raise ProviderError("rented: list: timed out", kind="transient", code="timeout")

    cloud.find_by_label = unreadable
    run = run_cycle("test", planner=ScriptPlanner([LAUNCH]))
    [step] = _calls(run.number)
    assert (step.outcome, step.reason_code) == ("error", "outcome_unknown") and "settled next cycle" in step.detail
    claim = SideEffect.objects.get(key=step.idempotency_key)
    assert (claim.status, claim.code) == ("claimed", "outcome_unknown")
    # undecided: no second launch while it may exist
    blocked = run_cycle("test", planner=ScriptPlanner([LAUNCH]))
    [refused] = _calls(blocked.number)
    assert (refused.outcome, refused.reason_code) == ("refused", "launch_pending")
    assert cloud.sent("launch") == 1

    cloud.find_by_label = real_find
    run_cycle("test", planner=ScriptPlanner([]))  # the next cycle settles it against the provider
    claim.refresh_from_db()
    assert claim.status == "done"
    assert Instance.objects.filter(external_id="r-1", label=launch_label(claim.key)).exists()
    assert cloud.sent("launch") == 1


@pytest.mark.parametrize("code", ["http_429", "connection_refused"])
def test_a_request_known_not_to_have_taken_effect_is_retried(cloud, code):
    _auto()
    cloud.fault("launch", code)

    run = run_cycle("test", planner=ScriptPlanner([LAUNCH]))

    [step] = _calls(run.number)
    assert step.outcome == "executed"
    assert cloud.sent("launch") == 2 and list(cloud.listed) == ["r-1"]
    assert SideEffect.objects.get(key=step.idempotency_key).status == "done"


def test_a_reboot_whose_answer_is_lost_is_looked_up_not_resent(cloud):
    _auto(reboot_instance="auto")
    cloud.add("v-1", "running", age_min=120)
    cloud.fault("reboot", "timeout", after_effect=True)

    run = run_cycle("test", planner=ScriptPlanner([
        {"tool": "reboot_instance", "args": {"instance_id": "v-1", "reason": "wedged"}},
    ]))

    assert cloud.sent("reboot") == 1
    [step] = _calls(run.number)
    assert (step.outcome, step.reason_code) == ("error", "outcome_unknown")
    claim = SideEffect.objects.get(key=step.idempotency_key)
    assert claim.status == "done"  # the instance restarted after the claim: the reboot happened
    assert not SideEffect.objects.filter(status="claimed").exists()  # nothing left in flight on v-1


def test_reads_are_still_retried(cloud):
    flaky = {"n": 0}
    real_list = cloud.list_instances

    def list_once_timing_out():
        flaky["n"] += 1
        if flaky["n"] == 1:
            raise ProviderError("rented: list: timed out", kind="transient", code="timeout")
        return real_list()

    cloud.list_instances = list_once_timing_out
    cloud.add("v-1", "running", age_min=120)
    run = run_cycle("test", planner=ScriptPlanner([{"tool": "list_instances", "args": {}}]))
    [step] = _calls(run.number)
    assert step.outcome == "executed" and flaky["n"] >= 2
