"""The instance page's "Diagnose now": an operator's POST diagnoses the instance at once (audited),
and the page shows each diagnosis with its verdict, the lines that support it and all that was
collected. Viewers cannot (tests/test_action_urls_by_role.py)."""

import re

import pytest

from fleet.models import AuditLog, Diagnosis, Instance
from tests.console_support import IDLE
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])

LOST = {"reachable": True, "commands": {"nvidia-smi": {"rc": 15, "out": "Unable to determine the device handle for GPU "
                                                       "0000:3B:00.0: GPU is lost. Reboot the system to recover this GPU"}}}


@pytest.fixture
def operator(client, alice):
    client.force_login(alice)
    return alice


def test_diagnose_now_stores_an_audited_diagnosis_and_the_page_shows_its_evidence(client, operator):
    with scenario_world([entry("v-1", ssh=LOST)], IDLE):
        page = client.get("/instances/v-1/")
        assert b"Diagnose now" in page.content

        resp = client.post("/instances/v-1/diagnose/")

        assert resp.status_code == 302 and resp["Location"] == "/instances/v-1/"
        d = Diagnosis.objects.get(instance__external_id="v-1")
        assert (d.health, d.fault_class, d.judge) == ("failed", "host", "rules")
        row = AuditLog.objects.get(verb="diagnose")
        assert row.actor == "user:alice" and row.target == "v-1" and row.after["class"] == "host"
        page = client.get("/instances/v-1/").content.decode()
        assert "GPU lost" in page and "GPU is lost" in page  # the cause and the line that supports it
        row = re.search(rf'<tr id="diagnosis-{d.pk}">(.*?)</tr>', page, re.S)
        assert row, page
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
        assert cells[4].startswith("rules") and "all collected" in row.group(1), cells  # the judge's own cell


def test_htmx_gets_the_instance_region_back_with_the_verdict(client, operator):
    with scenario_world([entry("v-1")], IDLE):
        resp = client.post("/instances/v-1/diagnose/", HTTP_HX_REQUEST="true")

        assert resp.status_code == 200
        body = resp.content.decode()
        assert "diagnosed v-1: healthy" in body and 'id="diagnosis-' in body


def test_a_killed_instance_is_not_diagnosed(client, operator):
    from django.utils import timezone

    with scenario_world([entry("v-1")], IDLE):
        Instance.objects.filter(external_id="v-1").update(killed_at=timezone.now(), kill_reason="destroyed")

        resp = client.post("/instances/v-1/diagnose/", HTTP_HX_REQUEST="true")

        assert resp.status_code == 409 and b"gone" in resp.content
        assert not Diagnosis.objects.exists()


NO_EVIDENCE = {"reachable": True, "commands": {}}  # every command answers rc 127 (the local demo's case)


@pytest.mark.parametrize("live, health, fault_class", [(True, "healthy", ""), (False, "degraded", "app")])
def test_diagnose_now_weighs_the_workers_heartbeat_as_the_agents_diagnosis_does(client, operator, live, health,
                                                                              fault_class):
    # found in the demo: a worker heartbeating on a local instance was "degraded: no evidence … and no
    # worker heartbeat is known" by Diagnose now, a minute after the agent had diagnosed it healthy
    with scenario_world([entry("v-1", live=live, ssh=NO_EVIDENCE)], IDLE):
        client.post("/instances/v-1/diagnose/")
    d = Diagnosis.objects.get(instance__external_id="v-1")
    assert (d.health, d.fault_class or "") == (health, fault_class), d.cause
