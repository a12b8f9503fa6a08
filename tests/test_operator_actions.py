"""Operators act on instances from the fleet page through the same guards as the agent."""

import pytest

from agent.actions.instances import ActionRefused, do_operator_instance_action
from fleet.clock import clock
from fleet.models import AuditLog, Diagnosis, Instance
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

BUSY = {"state": "ok", "active": True, "queued": 7, "running": 1, "workers_expected": 1, "workers_live": 1, "idle_min": None}


def _diagnose(iid):
    Diagnosis.objects.create(instance=Instance.objects.get(external_id=iid), taken_at=clock.now(), health="healthy")


def test_it_refuses_a_stop_while_tasks_are_queued():
    with scenario_world([entry("v-1")], BUSY) as provider:
        _diagnose("v-1")
        with pytest.raises(ActionRefused) as err:
            do_operator_instance_action(Instance.objects.get(external_id="v-1"), "stop", actor="user:alice", reason="cost")
    assert err.value.code == "demand_guard"
    assert "stop_instance" not in [c for c, _ in provider.calls]
    assert AuditLog.objects.filter(verb="stop_instance_refused").exists()


def test_a_typed_override_lets_the_stop_through_and_is_audited():
    with scenario_world([entry("v-1")], BUSY) as provider:
        _diagnose("v-1")
        do_operator_instance_action(Instance.objects.get(external_id="v-1"), "stop", actor="user:alice", reason="cost",
                                    override_reason="queue belongs to a cancelled deal")
    assert "stop_instance" in [c for c, _ in provider.calls]
    row = AuditLog.objects.get(verb="override_guard")
    assert row.reason == "queue belongs to a cancelled deal"
    assert row.after["overrides"] == ["demand_guard", "hold_off"]


def test_an_override_does_not_skip_the_diagnosis_precondition():
    with scenario_world([entry("v-1")], BUSY):
        with pytest.raises(ActionRefused) as err:
            do_operator_instance_action(Instance.objects.get(external_id="v-1"), "stop", actor="user:alice", reason="cost",
                                        override_reason="I know")
    assert (err.value.code, err.value.status) == ("diagnosis_required", 428)


def test_a_replayed_request_runs_once():
    idle = {**BUSY, "queued": 0, "running": 0, "active": False, "idle_min": 60}
    with scenario_world([entry("v-1")], idle) as provider:
        _diagnose("v-1")
        inst = Instance.objects.get(external_id="v-1")
        do_operator_instance_action(inst, "reboot", actor="user:alice", reason="wedged", request_key="form-123")
        with pytest.raises(ActionRefused) as err:
            do_operator_instance_action(inst, "reboot", actor="user:alice", reason="wedged", request_key="form-123")
    assert err.value.code == "duplicate"
    assert [c for c, _ in provider.calls].count("reboot_instance") == 1


def test_an_owned_host_is_never_destroyed():
    idle = {**BUSY, "queued": 0, "running": 0, "active": False, "idle_min": 60}
    with scenario_world([entry("h-1")], idle, provider_name="ssh"):
        _diagnose("h-1")
        with pytest.raises(ActionRefused) as err:
            do_operator_instance_action(Instance.objects.get(external_id="h-1"), "destroy", actor="user:alice", reason="x")
    assert err.value.code == "owned_host"
