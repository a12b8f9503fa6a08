"""Operators stop, destroy, reboot and cordon from the fleet and instance pages, through the agent's
guards; an override of demand_guard / hold_off needs a typed reason and is audited; the JSON API
answers 428 for diagnosis_required; a replayed form (same request_key) runs once."""

import json
import re

import pytest
from django.test import Client
from django.utils import timezone

from fleet.clock import clock
from fleet.harmony import HarmonyMachine, HarmonyMachineDetails
from fleet.models import AuditLog, Diagnosis, Instance
from tests.console_support import BUSY, HX, IDLE
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def _diagnose(iid: str) -> None:
    Diagnosis.objects.create(instance=Instance.objects.get(external_id=iid), taken_at=clock.now(), health="healthy")


def _calls(provider, tool: str) -> int:
    return [c for c, _ in provider.calls].count(tool)


def test_the_fleet_page_offers_the_actions_with_a_form_token(client, alice):
    with scenario_world([entry("v-1"), entry("v-2")], IDLE):
        client.force_login(alice)
        html = client.get("/fleet/").content.decode()
    assert 'action="/instances/v-1/act/"' in html and 'action="/instances/v-2/act/"' in html
    for verb in ("stop", "destroy", "reboot", "cordon"):
        assert f'<option value="{verb}"' in html
    assert re.search(r'name="request_key" value="[0-9a-f]{32}"', html)
    assert 'href="/instances/v-1/"' in html


def test_a_stop_while_tasks_are_queued_is_refused_by_the_demand_guard(client, alice):
    with scenario_world([entry("v-1")], BUSY) as provider:
        _diagnose("v-1")
        client.force_login(alice)
        resp = client.post("/instances/v-1/act/", {"action": "stop", "reason": "cost"})
        assert resp.status_code == 409
        html = resp.content.decode()
        assert "demand_guard" in html and "7 tasks queued" in html and "override this with a typed reason" in html
        assert _calls(provider, "stop_instance") == 0
    assert AuditLog.objects.filter(verb="stop_instance_refused", actor="user:alice").exists()


def test_a_typed_override_passes_the_demand_guard_and_is_audited(client, alice):
    with scenario_world([entry("v-1")], BUSY) as provider:
        _diagnose("v-1")
        client.force_login(alice)
        resp = client.post("/instances/v-1/act/", {"action": "stop", "reason": "cost",
                                                   "override_reason": "queue belongs to a cancelled deal"})
        assert resp.status_code == 302 and resp["Location"] == "/instances/v-1/"
        assert _calls(provider, "stop_instance") == 1
    row = AuditLog.objects.get(verb="override_guard")
    assert (row.actor, row.reason, row.target) == ("user:alice", "queue belongs to a cancelled deal", "v-1")
    assert AuditLog.objects.filter(verb="stop_instance", actor="user:alice", reason="cost").exists()
    assert Instance.objects.get(external_id="v-1").intended_status == "stopped"


def test_a_destroy_without_a_fresh_diagnosis_is_428(client, alice):
    with scenario_world([entry("v-1")], IDLE) as provider:
        client.force_login(alice)
        resp = client.post("/instances/v-1/act/", {"action": "destroy", "reason": "old", "override_reason": "I know"})
        assert resp.status_code == 428
        assert "diagnosis_required" in resp.content.decode()
        assert _calls(provider, "destroy_instance") == 0


def test_a_reboot_runs_and_a_replayed_form_is_a_duplicate(client, alice):
    with scenario_world([entry("v-1")], IDLE) as provider:
        client.force_login(alice)
        form = {"action": "reboot", "reason": "wedged", "request_key": "0f" * 16}
        assert client.post("/instances/v-1/act/", form).status_code == 302
        replay = client.post("/instances/v-1/act/", form)
        assert replay.status_code == 409 and "duplicate" in replay.content.decode()
        assert _calls(provider, "reboot_instance") == 1
        # a fresh form (new token) is a new request
        assert client.post("/instances/v-1/act/", {**form, "request_key": "1e" * 16}).status_code == 302
        assert _calls(provider, "reboot_instance") == 2


def test_htmx_gets_the_form_back_with_the_outcome(client, alice):
    with scenario_world([entry("v-1")], BUSY):
        _diagnose("v-1")
        client.force_login(alice)
        resp = client.post("/instances/v-1/act/", {"action": "stop", "reason": "cost"}, headers=HX)
    assert resp.status_code == 200
    body = resp.content.decode()
    assert 'id="actions-v-1"' in body and "demand_guard" in body and "<html" not in body
    assert "actions-changed" in resp["HX-Trigger"]


def test_cordon_marks_the_worker_unschedulable(client, alice):
    machine = HarmonyMachine.objects.using("harmony").create(last_contact=timezone.now(), host_and_port="127.0.0.1:1")
    HarmonyMachineDetails.objects.using("harmony").create(machine=machine, machine_name="v-1")
    with scenario_world([entry("v-1"), entry("v-2")], BUSY):
        client.force_login(alice)
        assert client.post("/instances/v-1/act/", {"action": "cordon", "reason": "drain for maintenance"}).status_code == 302
        assert HarmonyMachine.objects.using("harmony").get(pk=machine.pk).unschedulable is True
        # a worker that has not registered yet: the cordon is Warden's record, applied when it registers
        resp = client.post("/instances/v-2/act/", {"action": "cordon", "reason": "drain"}, HTTP_HX_REQUEST="true")
        assert resp.status_code == 200 and "has not registered" in resp.content.decode()
    assert AuditLog.objects.get(verb="cordon", target="v-1").reason == "drain for maintenance"
    assert set(Instance.objects.filter(cordoned=True).values_list("external_id", flat=True)) == {"v-1", "v-2"}


def test_a_reason_is_required(client, alice):
    with scenario_world([entry("v-1")], IDLE) as provider:
        client.force_login(alice)
        resp = client.post("/instances/v-1/act/", {"action": "reboot", "reason": ""})
        assert resp.status_code == 400 and "say why" in resp.content.decode()
        assert _calls(provider, "reboot_instance") == 0


# --- the JSON API ------------------------------------------------------------------------------
def _api(client, path, body, **kw):
    return client.post(path, json.dumps(body), content_type="application/json", **kw)


def test_the_api_answers_428_for_diagnosis_required(client, alice):
    with scenario_world([entry("v-1")], IDLE) as provider:
        client.force_login(alice)
        resp = _api(client, "/api/instances/v-1/stop/", {"reason": "idle"})
        assert resp.status_code == 428
        data = resp.json()
        assert data["ok"] is False and data["code"] == "diagnosis_required" and "diagnose_instance" in data["detail"]
        assert _calls(provider, "stop_instance") == 0
        _diagnose("v-1")
        resp = _api(client, "/api/instances/v-1/stop/", {"reason": "idle"})
        assert (resp.status_code, resp.json()["ok"]) == (200, True)
        assert _calls(provider, "stop_instance") == 1


def test_the_api_answers_409_for_other_refusals_and_honours_overrides(client, alice):
    with scenario_world([entry("v-1")], BUSY) as provider:
        _diagnose("v-1")
        client.force_login(alice)
        resp = _api(client, "/api/instances/v-1/stop/", {"reason": "cost"})
        assert resp.status_code == 409 and resp.json()["code"] == "demand_guard"
        resp = _api(client, "/api/instances/v-1/stop/", {"reason": "cost", "override_reason": "deal cancelled"})
        assert resp.status_code == 200
        assert _calls(provider, "stop_instance") == 1
    assert AuditLog.objects.get(verb="override_guard").reason == "deal cancelled"


def test_the_api_needs_a_session_csrf_and_the_operator_role(alice, bob):
    with scenario_world([entry("v-1")], IDLE) as provider:
        anon = Client(enforce_csrf_checks=True)
        assert _api(anon, "/api/instances/v-1/reboot/", {"reason": "x"}).status_code == 403  # CSRF first
        csrf = Client(enforce_csrf_checks=True)
        csrf.force_login(alice)
        assert _api(csrf, "/api/instances/v-1/reboot/", {"reason": "x"}).status_code == 403  # no token
        csrf.get("/fleet/")
        token = csrf.cookies["csrftoken"].value
        assert _api(csrf, "/api/instances/v-1/reboot/", {"reason": "x"}, headers={"X-CSRFToken": token}).status_code == 200
        viewer = Client()
        viewer.force_login(bob)
        resp = _api(viewer, "/api/instances/v-1/reboot/", {"reason": "x"})
        assert (resp.status_code, resp.json()["code"]) == (403, "forbidden")
        assert _api(Client(), "/api/instances/v-1/reboot/", {"reason": "x"}).status_code == 401
        assert _calls(provider, "reboot_instance") == 1


def test_the_api_rejects_bad_input(client, alice):
    with scenario_world([entry("v-1")], IDLE):
        client.force_login(alice)
        assert client.post("/api/instances/v-1/reboot/", "not json", content_type="application/json").status_code == 400
        assert _api(client, "/api/instances/v-1/reboot/", {"reason": ""}).json()["code"] == "invalid"
        assert _api(client, "/api/instances/v-1/explode/", {"reason": "x"}).status_code == 404
        assert _api(client, "/api/instances/nope/reboot/", {"reason": "x"}).status_code == 404
        assert client.get("/api/instances/v-1/reboot/").status_code == 405


def test_the_api_replay_with_the_same_request_key_is_a_duplicate(client, alice):
    with scenario_world([entry("v-1")], IDLE) as provider:
        client.force_login(alice)
        body = {"reason": "wedged", "request_key": "abc123"}
        assert _api(client, "/api/instances/v-1/reboot/", body).status_code == 200
        resp = _api(client, "/api/instances/v-1/reboot/", body)
        assert (resp.status_code, resp.json()["code"]) == (409, "duplicate")
        assert _calls(provider, "reboot_instance") == 1
