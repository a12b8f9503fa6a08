""""Trigger observe cycle now": operators enqueue an ``operator`` cycle; viewers cannot."""

import json

from fleet.models import AuditLog
from tests.console_support import cycle_messages

HX = {"HX-Request": "true"}


def test_it_enqueues_an_operator_cycle(client, alice, broker_queue, django_capture_on_commit_callbacks):
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post("/actions/observe/", headers=HX)
    assert resp.status_code == 200
    assert "observe cycle queued" in resp.content.decode()
    assert "runs-changed" in json.loads(resp["HX-Trigger"])
    assert len(cycle_messages("operator")) == 1
    assert AuditLog.objects.filter(verb="observe_now", actor="user:alice").count() == 1


def test_it_forbids_viewers_and_get(client, bob, alice, broker_queue):
    client.force_login(bob)
    assert client.post("/actions/observe/", headers=HX).status_code == 403
    client.force_login(alice)
    assert client.get("/actions/observe/").status_code == 405
    assert cycle_messages("operator") == []
