"""Setting the target proofs/hr from the dashboard: operators only, bad input kept and explained."""

import json

from agent.models import SessionState
from fleet.models import AuditLog
from tests.console_support import capture_topics

HX = {"HX-Request": "true"}


def test_it_sets_the_target_on_the_anchor(client, alice, django_capture_on_commit_callbacks):
    client.force_login(alice)
    with capture_topics() as topics, django_capture_on_commit_callbacks(execute=True):
        resp = client.post("/actions/target/", {"target": "150", "reason": "more proofs"}, headers=HX)
    assert resp.status_code == 200
    assert "target set to 150 proofs/hr" in resp.content.decode()
    assert "settings-changed" in json.loads(resp["HX-Trigger"])
    assert SessionState.get().target_proofs_hr == 150
    row = AuditLog.objects.get(verb="set_target")
    assert row.actor == "user:alice" and row.after == {"target_proofs_hr": 150.0}
    assert "settings-changed" in topics and "demand-changed" in topics


def test_it_explains_a_bad_target_and_keeps_the_input(client, alice):
    SessionState.objects.update_or_create(pk=1, defaults={"target_proofs_hr": 90})
    client.force_login(alice)
    resp = client.post("/actions/target/", {"target": "abc"}, headers=HX)
    html = resp.content.decode()
    assert resp.status_code == 200  # htmx swaps it in place
    assert "target proofs/hr must be a number, e.g. 120" in html
    assert 'value="abc"' in html
    assert SessionState.get().target_proofs_hr == 90
    resp = client.post("/actions/target/", {"target": "-5"}, headers=HX)
    assert "cannot be negative" in resp.content.decode()
    assert not AuditLog.objects.filter(verb="set_target").exists()


def test_it_shows_the_error_on_the_page_without_htmx(client, alice):
    client.force_login(alice)
    resp = client.post("/actions/target/", {"target": "abc"})
    assert resp.status_code == 400
    html = resp.content.decode()
    assert "<html" in html and "target proofs/hr must be a number" in html and 'value="abc"' in html


def test_it_redirects_after_a_plain_post(client, alice):
    client.force_login(alice)
    resp = client.post("/actions/target/", {"target": "200"}, follow=True)
    assert resp.redirect_chain == [("/", 302)]
    assert "target set to 200 proofs/hr" in resp.content.decode()


def test_it_forbids_viewers(client, bob):
    client.force_login(bob)
    resp = client.post("/actions/target/", {"target": "10"}, headers=HX)
    assert resp.status_code == 403
    assert SessionState.get().target_proofs_hr != 10


def test_it_requires_csrf(alice):
    from django.test import Client

    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(alice)
    assert csrf_client.post("/actions/target/", {"target": "10"}).status_code == 403
    page = csrf_client.get("/")
    token = page.cookies["csrftoken"].value
    assert '"x-csrftoken": "' in page.content.decode()
    resp = csrf_client.post("/actions/target/", {"target": "10"}, headers={**HX, "X-CSRFToken": token})
    assert resp.status_code == 200
    assert SessionState.get().target_proofs_hr == 10
