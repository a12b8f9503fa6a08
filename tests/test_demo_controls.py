"""Demo controls: add tasks to the local queue; SIGKILL one worker so the agent has something to see."""

import pytest
from django.db import connections

from fleet.harmony import HarmonyTask
from fleet.models import Instance
from tests import fleet_support
from tests.fleet_support import FLEET_DB, wait_for

HX = {"HX-Request": "true"}
local_fleet = fleet_support.local_fleet


@pytest.mark.django_db(databases=["default", "harmony"])
def test_it_adds_tasks_to_the_queue(client, alice, settings):
    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "local"}
    before = HarmonyTask.objects.count()
    client.force_login(alice)
    resp = client.post("/actions/demo/enqueue/", {"n": "3"}, headers=HX)
    assert "added 3 tasks to the queue" in resp.content.decode()
    assert HarmonyTask.objects.count() == before + 3


@pytest.mark.django_db(databases=["default", "harmony"])
def test_it_explains_a_bad_count_and_keeps_it(client, alice):
    before = HarmonyTask.objects.count()
    client.force_login(alice)
    html = client.post("/actions/demo/enqueue/", {"n": "-3"}, headers=HX).content.decode()
    assert "the number of tasks must be a plain decimal with no sign" in html and 'value="-3"' in html
    html = client.post("/actions/demo/enqueue/", {"n": "lots"}, headers=HX).content.decode()
    assert "must be a whole number" in html
    assert HarmonyTask.objects.count() == before

@pytest.mark.django_db(transaction=True, databases=["default", "harmony"])
@pytest.mark.django_db(transaction=True, databases=["default", "harmony"])
def test_it_reports_an_unreadable_harmony_database(client, alice, settings):
    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "local"}
    harmony = connections["harmony"]
    real = harmony.settings_dict["NAME"]
    harmony.close()
    harmony.settings_dict["NAME"] = "warden_no_such_database"
    client.force_login(alice)
    try:
        resp = client.post("/actions/demo/enqueue/", {"n": "2"}, headers=HX)
        page = client.get("/")
    finally:
        harmony.close()
        harmony.settings_dict["NAME"] = real
    assert resp.status_code == 200
    assert "could not add tasks" in resp.content.decode()
    assert page.status_code == 200


def test_it_says_when_there_is_no_worker_to_kill(client, alice):
    client.force_login(alice)
    html = client.post("/actions/demo/kill/", headers=HX).content.decode()
    assert "no running local worker to kill" in html


def test_it_forbids_viewers(client, bob):
    client.force_login(bob)
    assert client.post("/actions/demo/kill/", headers=HX).status_code == 403
    assert client.post("/actions/demo/enqueue/", {"n": "1"}, headers=HX).status_code == 403


@FLEET_DB
def test_it_kills_a_real_worker_with_sigkill(client, alice, local_fleet):
    from fleet.sync import sync_instances

    launched = local_fleet.launch(label="victim")
    wait_for(lambda: any(i.external_id == launched.external_id and i.status == "running"
                         for i in sync_instances(local_fleet)), what="worker running")
    client.force_login(alice)
    html = client.post("/actions/demo/kill/", headers=HX).content.decode()
    assert f"sent SIGKILL to worker {launched.external_id}" in html
    inst = Instance.objects.get(external_id=launched.external_id)
    assert inst.status == "exited" and inst.exit_code == -9
