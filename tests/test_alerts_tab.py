"""The Alerts tab: firing / acknowledged / resolved, acknowledge with a comment (audited, once)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent.actions.alerts import do_ack_alert
from fleet.alerts import raise_alert, resolve
from fleet.clock import clock
from fleet.models import Alert, AuditLog, Instance
from tests.console_support import HX

pytestmark = pytest.mark.django_db


def _alerts():
    now = clock.now()
    inst = Instance.objects.create(provider="local", external_id="local-3", status="running", status_since=now, created_at=now)
    dead = raise_alert("workers_dead", "1 expected worker dead; 59 tasks queued", severity="P1", instance=inst)
    unknown = raise_alert("demand_unknown", "harmony unreadable")
    old = raise_alert("provider_error", "http_429 from vast", key="provider:vast")
    resolve("provider:vast")
    return dead, unknown, old


def test_it_shows_firing_alerts_by_default_with_counts(client, alice):
    dead, unknown, old = _alerts()
    client.force_login(alice)
    html = client.get("/alerts/").content.decode()
    assert f'id="alert-{dead.pk}"' in html and f'id="alert-{unknown.pk}"' in html
    assert f'id="alert-{old.pk}"' not in html
    assert "59 tasks queued" in html and 'href="/instances/local-3/"' in html
    assert 'id="chip-firing">firing <span class="n">2</span>' in html.replace("\n", "")
    resolved = client.get("/alerts/?state=resolved").content.decode()
    assert f'id="alert-{old.pk}"' in resolved and f'id="alert-{dead.pk}"' not in resolved
    assert f'id="alert-{old.pk}"' in client.get("/alerts/?state=all").content.decode()


def test_an_operator_acknowledges_with_a_comment(client, alice):
    dead, _, _ = _alerts()
    client.force_login(alice)
    resp = client.post(f"/alerts/{dead.pk}/ack/", {"comment": "on it: restarting the worker", "state": "firing"})
    assert resp.status_code == 302 and resp["Location"] == "/alerts/?state=firing"
    dead.refresh_from_db()
    assert (dead.state, dead.acknowledged_by, dead.ack_comment) == ("acknowledged", "user:alice", "on it: restarting the worker")
    row = AuditLog.objects.get(verb="ack_alert")
    assert (row.actor, row.reason, row.target) == ("user:alice", "on it: restarting the worker", f"alert {dead.pk}")
    html = client.get("/alerts/?state=acknowledged").content.decode()
    assert "by user:alice" in html and "restarting the worker" in html


def test_an_acknowledgement_needs_a_comment_and_happens_once(client, alice):
    dead, _, old = _alerts()
    client.force_login(alice)
    resp = client.post(f"/alerts/{dead.pk}/ack/", {"comment": " "})
    assert resp.status_code == 400 and "say what you are doing" in resp.content.decode()
    assert Alert.objects.get(pk=dead.pk).state == "firing"
    assert client.post(f"/alerts/{dead.pk}/ack/", {"comment": "mine"}).status_code == 302
    second = client.post(f"/alerts/{dead.pk}/ack/", {"comment": "mine too"})
    assert second.status_code == 409 and "already acknowledged" in second.content.decode()
    assert client.post(f"/alerts/{old.pk}/ack/", {"comment": "x"}).status_code == 409  # resolved
    assert AuditLog.objects.filter(verb="ack_alert").count() == 1


def test_htmx_gets_the_table_back(client, alice):
    dead, _, _ = _alerts()
    client.force_login(alice)
    resp = client.post(f"/alerts/{dead.pk}/ack/", {"comment": "looking", "state": "all"}, headers=HX)
    assert resp.status_code == 200 and "<html" not in resp.content.decode()
    assert "alerts-changed" in resp["HX-Trigger"]
    region = client.get("/alerts/?state=firing", headers=HX).content.decode()
    assert f'id="alert-{dead.pk}"' not in region and "<html" not in region


def test_do_ack_alert_refuses_empty_comments():
    dead, _, _ = _alerts()
    with pytest.raises(ValueError, match="say what you are doing"):
        do_ack_alert(dead, "user:alice", "")


def test_viewers_see_alerts_but_cannot_acknowledge(client, bob):
    dead, _, _ = _alerts()
    client.force_login(bob)
    html = client.get("/alerts/").content.decode()
    assert "Acknowledge" in html and 'disabled title="viewers cannot act"' in html
    assert client.post(f"/alerts/{dead.pk}/ack/", {"comment": "x"}).status_code == 403
    assert Alert.objects.get(pk=dead.pk).state == "firing"


def test_the_query_count_is_constant_in_the_number_of_alerts(client, alice):
    _alerts()
    client.force_login(alice)
    client.get("/alerts/?state=all")
    with CaptureQueriesContext(connection) as few:
        client.get("/alerts/?state=all")
    now = clock.now()
    for i in range(30):
        inst = Instance.objects.create(provider="local", external_id=f"x-{i}", status="running", status_since=now, created_at=now)
        Alert.objects.create(kind="stuck_provisioning", key=f"k{i}", message="m", raised_at=now - timedelta(minutes=i), instance=inst)
    with CaptureQueriesContext(connection) as many:
        html = client.get("/alerts/?state=all").content.decode()
    assert html.count('class="alert-row') == 33
    assert len(many) == len(few)
