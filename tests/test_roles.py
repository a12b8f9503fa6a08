"""Roles: operators act and approve; viewers see every page with the action buttons disabled and get
403 on every side-effect POST (nothing changes); anonymous users are sent to the login page."""

import pytest

from agent.models import Approval, SessionState
from fleet.alerts import raise_alert
from fleet.models import AuditLog
from tests.console_support import IDLE, park_stops
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

PAGES = ["/", "/fleet/", "/runs/", "/approvals/", "/alerts/", "/actions/", "/settings/", "/traces/", "/performance/", "/rehearsals/", "/instances/v-1/"]


@pytest.fixture
def world():
    with scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider:
        run, _ = park_stops("v-1")
        raise_alert("workers_dead", "1 dead")
        yield run, provider


def _posts(approval_pk: int, alert_pk: int) -> list[tuple[str, dict]]:
    return [
        (f"/approvals/{approval_pk}/decide/", {"decision": "approve"}),
        (f"/alerts/{alert_pk}/ack/", {"comment": "mine"}),
        ("/instances/v-2/act/", {"action": "reboot", "reason": "x"}),
        ("/actions/observe-only/", {"on": "1"}),
        ("/actions/reset/", {"confirm": "yes"}),
        ("/settings/", {"reason": "x", "limits__max_dph": "1"}),
        ("/actions/target/", {"target": "5"}),
        ("/actions/observe/", {}),
    ]


def test_viewers_see_every_page_with_actions_disabled(client, bob, world):
    run, _ = world
    client.force_login(bob)
    for url in [*PAGES, f"/runs/{run.number}/"]:
        resp = client.get(url)
        assert resp.status_code == 200, url
        assert 'id="who-user" title="signed in as bob; role viewer">bob<' in resp.content.decode(), url
        assert 'class="badge role-viewer">read-only<' in resp.content.decode(), url
    html = client.get("/approvals/").content.decode()
    assert "stop_instance" in html
    assert html.count('disabled title="viewers cannot act"') >= 3  # approve, comment, reject
    assert 'id="reset-session" disabled title="viewers cannot act"' in client.get("/").content.decode()
    fleet = client.get("/fleet/").content.decode()
    assert '<button type="submit" class="danger" disabled title="viewers cannot act">Run</button>' in fleet


def test_viewers_cannot_act(client, bob, world):
    run, provider = world
    approval = Approval.objects.get(run=run)
    alert = raise_alert("workers_dead", "1 dead")
    before = AuditLog.objects.count()
    client.force_login(bob)
    for url, data in _posts(approval.pk, alert.pk):
        assert client.post(url, data).status_code == 403, url
    assert Approval.objects.get(pk=approval.pk).status == "waiting"
    assert SessionState.get().observe_only is False and SessionState.get().epoch == 1
    assert AuditLog.objects.count() == before
    assert "reboot_instance" not in [c for c, _ in provider.calls]


def test_operators_see_enabled_actions(client, alice, world):
    client.force_login(alice)
    for url in PAGES:
        html = client.get(url).content.decode()
        assert "viewers cannot act" not in html, url
        assert 'title="signed in as alice; role operator">alice<' in html and ">can act<" in html, url


def test_anonymous_users_are_sent_to_login(client, world):
    run, _ = world
    approval = Approval.objects.get(run=run)
    for url in PAGES:
        resp = client.get(url)
        assert resp.status_code == 302 and resp["Location"].startswith("/login/"), url
    for url, data in _posts(approval.pk, 1):
        resp = client.post(url, data)
        assert resp.status_code == 302 and resp["Location"].startswith("/login/"), url
    assert Approval.objects.get(pk=approval.pk).status == "waiting"


def test_reset_session_needs_a_confirm_and_starts_a_new_epoch(client, alice):
    client.force_login(alice)
    asked = client.post("/actions/reset/", {}, headers={"HX-Request": "true"})
    assert asked.status_code == 200 and "Reset the session?" in asked.content.decode()
    assert SessionState.get().epoch == 1  # the first step only asks
    resp = client.post("/actions/reset/", {"confirm": "yes"}, headers={"HX-Request": "true"})
    assert resp.status_code == 200 and "session reset: new conversation (epoch 2)" in resp.content.decode()
    assert SessionState.get().epoch == 2
    assert AuditLog.objects.get(verb="reset_session").actor == "user:alice"
