"""The Memory page: everyone signed in lists and filters what the agent remembers;
operators edit and delete facts, each an audited action; viewers see the same page and cannot act."""

import pytest

from agent.memory import store as memory
from agent.models import MemoryFact
from fleet.models import AuditLog

pytestmark = pytest.mark.django_db

KEY = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" * 2


@pytest.fixture
def facts():
    a, _ = memory.remember("machine_perf", "v-1 proof time", "v-1 proves in 41 minutes", importance=0.7)
    b, _ = memory.remember("provider_note", "vast offers", "vast offers vanish within minutes", importance=0.4)
    c, _ = memory.remember("incident", "host fault v-3", "v-3 GPU fell off the bus", importance=0.9, kind="memory")
    return a, b, c


def test_the_top_bar_links_the_memory_page(client, bob):
    client.force_login(bob)
    assert 'href="/memory/"' in client.get("/").content.decode()


def test_anonymous_users_are_sent_to_sign_in(client, facts):
    resp = client.get("/memory/")
    assert resp.status_code == 302 and resp["Location"].startswith("/login/")


def test_viewers_see_the_facts_with_disabled_controls(client, bob, facts):
    client.force_login(bob)
    html = client.get("/memory/").content.decode()
    for f in facts:
        assert f.value in html
    assert html.count('disabled title="viewers cannot act"') >= 2 * len(facts)
    assert client.post(f"/memory/{facts[0].pk}/delete/").status_code == 403
    assert MemoryFact.objects.count() == 3


def test_filter_by_category_and_by_text(client, alice, facts):
    client.force_login(alice)
    html = client.get("/memory/?category=provider_note").content.decode()
    assert "vast offers vanish" in html and "41 minutes" not in html and "fell off the bus" not in html
    html = client.get("/memory/?q=fell+off").content.decode()
    assert "fell off the bus" in html and "vast offers vanish" not in html
    html = client.get("/memory/?q=nothing-like-this").content.decode()
    assert "No memories match this filter." in html


def test_an_htmx_get_returns_the_table_only(client, alice, facts):
    client.force_login(alice)
    html = client.get("/memory/?category=incident", headers={"HX-Request": "true"}).content.decode()
    assert "fell off the bus" in html and "<html" not in html


def test_an_operator_edits_a_fact_and_the_change_is_audited(client, alice, facts):
    client.force_login(alice)
    fact = facts[0]
    resp = client.post(f"/memory/{fact.pk}/edit/", {"value": f"v-1 proves in 38 minutes; key {KEY}", "importance": "0.9",
                                                    "kind": "memory", "reason": "new driver"},
                       headers={"HX-Request": "true"})
    assert resp.status_code == 200 and "38 minutes" in resp.content.decode()
    fact.refresh_from_db()
    assert fact.value.startswith("v-1 proves in 38 minutes") and KEY not in fact.value
    assert (fact.importance, fact.kind, fact.source) == (0.9, "memory", "operator")
    row = AuditLog.objects.get(verb="update_memory")
    assert row.actor == "user:alice" and row.reason == "new driver" and row.target == "memory machine_perf/v-1 proof time"
    assert row.before["value"] == "v-1 proves in 41 minutes" and row.after["importance"] == 0.9
    assert KEY not in str(row.after)


@pytest.mark.parametrize("data, error", [
    ({"value": "x", "importance": "1.5", "kind": "fact"}, "importance"),
    ({"value": "", "importance": "0.5", "kind": "fact"}, "value"),
    ({"value": "x", "importance": "0.5", "kind": "forever"}, "kind"),
])
def test_bad_input_is_refused_with_the_field_named_and_nothing_changes(client, alice, facts, data, error):
    client.force_login(alice)
    resp = client.post(f"/memory/{facts[1].pk}/edit/", data, headers={"HX-Request": "true"})
    assert resp.status_code == 400 and error in resp.content.decode()
    facts[1].refresh_from_db()
    assert facts[1].value == "vast offers vanish within minutes" and not AuditLog.objects.filter(verb="update_memory").exists()


def test_an_operator_deletes_a_fact_and_the_audit_keeps_what_it_said(client, alice, facts):
    client.force_login(alice)
    resp = client.post(f"/memory/{facts[2].pk}/delete/", {"reason": "fixed host"})
    assert resp.status_code == 302 and resp["Location"].startswith("/memory/")
    assert not MemoryFact.objects.filter(pk=facts[2].pk).exists() and MemoryFact.objects.count() == 2
    row = AuditLog.objects.get(verb="delete_memory")
    assert row.before["value"] == "v-3 GPU fell off the bus" and row.after is None and row.reason == "fixed host"
    assert client.post(f"/memory/{facts[2].pk}/delete/").status_code == 404
