"""An instance page: its facts, diagnoses, events (audit rows targeting it), alerts and actions."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.alerts import raise_alert
from fleet.audit import do_audit
from fleet.clock import clock
from fleet.models import Diagnosis, Instance
from tests.console_support import HX

pytestmark = pytest.mark.django_db


def _inst(iid="v-7", **kw):
    now = clock.now()
    return Instance.objects.create(provider="vastai", external_id=iid, label="big-box", gpu_name="RTX 4090", status="running",
                                   status_since=now, created_at=now - timedelta(hours=2), dph=0.45, **kw)


def test_it_shows_diagnoses_and_events(client, alice):
    inst = _inst()
    Diagnosis.objects.create(instance=inst, taken_at=clock.now(), health="failed", fault_class="host",
                             cause="Xid 79: GPU fell off the bus", evidence={"nvidia-smi -L": {"rc": 9, "out": "No devices"}})
    do_audit("agent", "reboot_instance", "v-7", "wedged", {"status": "running"}, {"status": "rebooting"})
    do_audit("agent", "reboot_instance", "v-8", "another machine")
    raise_alert("stuck_provisioning", "v-7 stuck", key="stuck:v-7", instance=inst)
    client.force_login(alice)
    html = client.get("/instances/v-7/").content.decode()
    assert "big-box" in html and "RTX 4090" in html and "vastai" in html
    assert "Xid 79: GPU fell off the bus" in html and "status-failed" in html and "No devices" in html
    assert "reboot_instance" in html and "wedged" in html and "another machine" not in html
    assert "v-7 stuck" in html
    assert 'action="/instances/v-7/act/"' in html
    assert 'hx-trigger="fleet-changed from:body, actions-changed from:body' in html


def test_it_says_when_never_diagnosed_and_404s_unknown_ids(client, alice):
    _inst()
    client.force_login(alice)
    assert "Never diagnosed" in client.get("/instances/v-7/").content.decode()
    assert client.get("/instances/nope/").status_code == 404


def test_a_killed_instance_offers_no_actions(client, alice):
    _inst(killed_at=clock.now(), killed_by="agent", kill_reason="idle")
    client.force_login(alice)
    html = client.get("/instances/v-7/").content.decode()
    assert "gone: no actions" in html and "by agent: idle" in html
    assert client.post("/instances/v-7/act/", {"action": "reboot", "reason": "x"}).status_code == 409


def test_the_region_is_a_partial(client, alice):
    _inst()
    client.force_login(alice)
    body = client.get("/instances/v-7/", headers=HX).content.decode()
    assert "big-box" in body and "<html" not in body


def test_the_query_count_is_constant_in_diagnoses_and_events(client, alice):
    inst = _inst()
    client.force_login(alice)
    client.get("/instances/v-7/")
    with CaptureQueriesContext(connection) as few:
        client.get("/instances/v-7/")
    for i in range(15):
        Diagnosis.objects.create(instance=inst, taken_at=clock.now() - timedelta(minutes=i), health="healthy")
        do_audit("agent", "diagnose_instance", "v-7", f"check {i}")
    with CaptureQueriesContext(connection) as many:
        html = client.get("/instances/v-7/").content.decode()
    assert html.count('id="diagnosis-') == 15 and html.count('class="audit-row"') == 15
    assert len(many) == len(few)
