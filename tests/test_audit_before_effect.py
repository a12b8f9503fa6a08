"""Nothing is acted on without its audit row, and no error page hides an effect.

- Input is validated before any effect: a lone surrogate or a NUL byte in a reason is refused (400,
  JSON from the API) and nothing happens — on PostgreSQL, where both are unstorable.
- The intent audit row is written in the same transaction as the claim, before the effect. With
  the audit table write-locked (another PostgreSQL session holds it; this one gives up after
  300 ms, as SQLite does after its busy timeout), cordon, enqueue and observe-now answer 503
  "nothing was done" — and nothing was.
- When the effect happened and recording its outcome failed, the answer says the effect happened.
- The JSON API answers JSON, never an HTML 500.
"""

import json
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection, connections

from agent.models import Run, SideEffect
from fleet.harmony import HarmonyMachine, HarmonyMachineDetails, HarmonyTask
from fleet.models import AuditLog, Instance
from tests.console_support import BUSY, HX, broker_messages
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "harmony"])


def _api(client, action: str, body: dict, iid: str = "v-1"):
    return client.post(f"/api/instances/{iid}/{action}/", json.dumps(body), content_type="application/json")


def _register(name: str) -> HarmonyMachine:
    from django.utils import timezone

    machine = HarmonyMachine.objects.using("harmony").create(last_contact=timezone.now(), host_and_port="127.0.0.1:1")
    HarmonyMachineDetails.objects.using("harmony").create(machine=machine, machine_name=name)
    return machine


@contextmanager
def write_locked(table: str):
    """Another session holds a write lock on ``table``; ours waits at most 300 ms for it."""
    cfg = connections["default"].settings_dict
    other = psycopg.connect(host=cfg["HOST"] or "127.0.0.1", port=cfg["PORT"] or 5432, user=cfg["USER"],
                            password=cfg["PASSWORD"] or None, dbname=cfg["NAME"])
    with connection.cursor() as cur:
        cur.execute("SET lock_timeout = '300ms'")
    other.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")  # reads pass, writes wait
    try:
        yield other
    finally:
        other.rollback()
        other.close()
        with connection.cursor() as cur:
            cur.execute("SET lock_timeout = 0")


@pytest.mark.parametrize("bad", ["drain \ud800 now", "drain \x00 now"])
def test_a_cordon_with_unstorable_text_is_refused_before_anything_happens(client, alice, bad):
    assert connection.vendor == "postgresql"
    machine = _register("v-1")
    with scenario_world([entry("v-1")], BUSY):
        client.force_login(alice)
        resp = _api(client, "cordon", {"reason": bad})
    assert resp.status_code == 400 and resp["Content-Type"] == "application/json"
    assert resp.json()["code"] == "invalid" and "reason" in resp.json()["detail"]
    assert HarmonyMachine.objects.using("harmony").get(pk=machine.pk).unschedulable is False
    assert Instance.objects.get(external_id="v-1").cordoned is False
    assert not AuditLog.objects.filter(verb__in=["cordon", "uncordon"]).exists()


@pytest.mark.parametrize("field", ["reason", "override_reason", "request_key"])
def test_a_reboot_with_a_lone_surrogate_anywhere_runs_nothing(client, alice, field):
    with scenario_world([entry("v-1")], BUSY) as provider:
        client.force_login(alice)
        body = {"reason": "wedged", field: "x\ud800"}
        resp = _api(client, "reboot", body)
        assert resp.status_code == 400 and resp.json()["code"] == "invalid"
        assert [c for c, _ in provider.calls].count("reboot_instance") == 0
    assert not SideEffect.objects.exists()


def test_with_the_audit_table_locked_cordon_enqueue_and_observe_do_nothing_and_say_so(client, alice, broker_queue,
                                                                                       settings):
    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "local"}
    machine = _register("v-1")
    with scenario_world([entry("v-1")], BUSY):
        client.force_login(alice)
        runs_before = Run.objects.count()
        with write_locked("agent_auditlog"):
            cordon = _api(client, "cordon", {"reason": "drain"})
            enqueue = client.post("/actions/demo/enqueue/", {"n": "5"})
            observe = client.post("/actions/observe/")
            observe_htmx = client.post("/actions/observe/", headers=HX)
    assert cordon.status_code == 503 and cordon.json()["code"] == "database_unavailable"
    assert "nothing was done" in cordon.json()["detail"]
    assert HarmonyMachine.objects.using("harmony").get(pk=machine.pk).unschedulable is False
    assert Instance.objects.get(external_id="v-1").cordoned is False
    assert enqueue.status_code == 503 and "no task was added" in enqueue.content.decode()
    assert not HarmonyTask.objects.using("harmony").exists()
    assert observe.status_code == 503 and "nothing was queued" in observe.content.decode()
    assert "nothing was queued" in observe_htmx.content.decode()  # htmx swaps the controls with the same words
    assert Run.objects.count() == runs_before and broker_messages() == []
    assert not AuditLog.objects.exists()


def test_an_effect_whose_recording_failed_is_reported_as_done(client, alice):
    """The provider rebooted; then the instance table was locked, so the outcome could not be saved.
    The answer says the reboot was sent (not an error that invites a retry); the intent row and the
    claim are there."""
    with scenario_world([entry("v-1")], BUSY) as provider:
        real_reboot = provider.reboot
        held = {}

        def reboot_then_lock(external_id):
            real_reboot(external_id)
            held["cm"] = write_locked("fleet_instance")
            held["cm"].__enter__()

        provider.reboot = reboot_then_lock
        client.force_login(alice)
        try:
            resp = _api(client, "reboot", {"reason": "wedged", "request_key": "k1"})
        finally:
            if "cm" in held:
                held["cm"].__exit__(None, None, None)
        assert [c for c, _ in provider.calls].count("reboot_instance") == 1
    assert resp.status_code == 200 and resp.json()["ok"] is True
    assert "was sent to the provider" in resp.json()["detail"] and "recording its outcome failed" in resp.json()["detail"]
    assert AuditLog.objects.filter(verb="reboot_instance_claimed", target="v-1").count() == 1
    assert SideEffect.objects.get(tool="reboot_instance").status == "done"


def test_the_json_api_answers_json_when_something_unexpected_breaks(client, alice):
    with scenario_world([entry("v-1")], BUSY) as provider:
        def broken(external_id):
            raise RuntimeError("provider client bug")

        provider.reboot = broken
        client.force_login(alice)
        resp = _api(client, "reboot", {"reason": "wedged"})
    assert resp.status_code == 500 and resp["Content-Type"] == "application/json"
    assert resp.json()["code"] == "internal_error" and "RuntimeError" in resp.json()["detail"]
    claim = SideEffect.objects.get(tool="reboot_instance")
    assert claim.status == "failed"  # recorded, and it blocks nothing


def test_an_agent_call_whose_recording_failed_is_executed_not_an_error():
    from agent.models import Step
    from agent.planners.script import ScriptPlanner
    from agent.runtime.loop import run_cycle

    with scenario_world([entry("v-1")], BUSY, policy={"reboot_instance": "auto"}) as provider:
        real_reboot = provider.reboot
        held = {}

        def reboot_then_lock(external_id):
            real_reboot(external_id)
            held["cm"] = write_locked("fleet_instance")
            held["cm"].__enter__()

        provider.reboot = reboot_then_lock
        try:
            run = run_cycle("test", planner=ScriptPlanner([
                {"tool": "reboot_instance", "args": {"instance_id": "v-1", "reason": "wedged"}}]))
        finally:
            if "cm" in held:
                held["cm"].__exit__(None, None, None)
        assert [c for c, _ in provider.calls].count("reboot_instance") == 1
    step = Step.objects.get(run=run, tool="reboot_instance")
    assert step.outcome == "executed" and "recording its outcome failed" in step.detail
    assert SideEffect.objects.get(key=step.idempotency_key).status == "done"


def test_a_deeply_nested_body_gets_a_json_400(client, alice):
    with scenario_world([entry("v-1")], BUSY) as provider:
        client.force_login(alice)
        resp = client.post("/api/instances/v-1/reboot/", "[" * 5_000 + "]" * 5_000, content_type="application/json")
        assert [c for c, _ in provider.calls].count("reboot_instance") == 0
    assert resp.status_code == 400 and resp.json()["code"] == "invalid"
