"""One claim -> act -> settle path (``agent.policy.claims.run_claimed``) behind both entries of a side
effect: the pipeline (``agent.runtime.pipeline.execute``: the agent's and the monitor's calls) and an
operator's instance action (``agent.actions.instances.do_operator_instance_action``).

The same provider answer through each entry leaves the same claim, the same audit rows and the
same count of requests sent. The "rented" cloud stands in for the external provider; the guards,
claims, pipeline and database are the real ones.
"""

import pytest

from agent.actions.instances import do_operator_instance_action
from agent.models import SessionState, SideEffect, Step
from agent.planners.script import ScriptPlanner
from agent.runtime.loop import run_cycle
from fleet.models import AuditLog
from fleet.providers.base import ProviderError
from tests import rented_cloud

vclock, cloud = rented_cloud.vclock, rented_cloud.cloud

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def through_the_pipeline(cloud) -> SideEffect:
    state = SessionState.get()
    state.overrides = {"policy": {"reboot_instance": "auto"}}
    state.save()
    run = run_cycle("test", planner=ScriptPlanner([
        {"tool": "reboot_instance", "args": {"instance_id": "v-1", "reason": "wedged"}}]))
    [step] = Step.objects.filter(run=run, kind="call", tool="reboot_instance")
    assert step.outcome == "error"
    return SideEffect.objects.get(key=step.idempotency_key)


def through_an_operator(cloud) -> SideEffect:
    with pytest.raises(ProviderError) as exc:
        do_operator_instance_action(cloud_instance(), "reboot", actor="user:alice", reason="wedged")
    assert "reboot" in str(exc.value) or exc.value.code
    return SideEffect.objects.get(tool="reboot_instance")


def cloud_instance():
    from fleet.models import Instance

    return Instance.objects.get(external_id="v-1")


ENTRIES = {"pipeline": through_the_pipeline, "operator": through_an_operator}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_an_answer_lost_is_looked_up_never_resent_through_either_entry(cloud, entry):
    cloud.add("v-1", "running", age_min=120)
    cloud.fault("reboot", "timeout", after_effect=True)

    claim = ENTRIES[entry](cloud)

    assert cloud.sent("reboot") == 1
    assert (claim.status, claim.code) == ("done", "outcome_unknown")  # the look-up found it restarted
    assert not SideEffect.objects.filter(status="claimed").exists()
    assert AuditLog.objects.filter(verb="reboot_instance_claimed", target="v-1").count() == 1


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_refused_request_closes_its_claim_failed_through_either_entry(cloud, entry):
    """Near miss of the above: the provider refuses before acting (a known outcome), so the claim
    closes ``failed`` with no look-up, and nothing is left in flight."""
    cloud.add("v-1", "running", age_min=120)
    cloud.fault("reboot", "http_410")

    claim = ENTRIES[entry](cloud)

    assert claim.status == "failed" and claim.code != "outcome_unknown"
    assert not SideEffect.objects.filter(status="claimed").exists()
    assert AuditLog.objects.filter(verb="reboot_instance_claimed", target="v-1").count() == 1
