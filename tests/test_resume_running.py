"""Resuming an instance the provider reports running is refused ``already_running`` and leaves its
"running since" alone (it was once accepted and reset the clock). The status is the
provider's at the click: the operator's action lists the fleet right before the guards."""

import pytest

from agent.actions.instances import ActionRefused, do_operator_instance_action
from fleet.models import Instance
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

IDLE = {"state": "ok", "active": False, "queued": 0, "running": 0, "workers_expected": 1, "workers_live": 1, "idle_min": 60}


def test_resuming_a_running_instance_is_refused_and_keeps_running_since():
    with scenario_world([entry("v-1")], IDLE) as provider:
        inst = Instance.objects.get(external_id="v-1")
        since = inst.status_since
        with pytest.raises(ActionRefused) as err:
            do_operator_instance_action(inst, "resume", actor="user:alice", reason="bring it back")
        inst.refresh_from_db()
    assert err.value.code == "already_running" and "already running" in err.value.detail
    assert "resume_instance" not in [c for c, _ in provider.calls]
    assert inst.status_since == since


def test_the_provider_status_at_the_click_decides_not_the_stored_one():
    # the row says stopped; the provider says running (it was resumed elsewhere): refused
    with scenario_world([entry("v-1")], IDLE) as provider:
        Instance.objects.filter(external_id="v-1").update(status="stopped")
        with pytest.raises(ActionRefused) as err:
            do_operator_instance_action(Instance.objects.get(external_id="v-1"), "resume", actor="user:alice", reason="x")
    assert err.value.code == "already_running"
    assert "resume_instance" not in [c for c, _ in provider.calls]


def test_a_stopped_instance_is_resumed():
    with scenario_world([entry("v-1", status="stopped")], IDLE) as provider:
        do_operator_instance_action(Instance.objects.get(external_id="v-1"), "resume", actor="user:alice", reason="work")
    assert "resume_instance" in [c for c, _ in provider.calls]
