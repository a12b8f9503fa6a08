"""Every POST route of ``console/urls.py``, for each role: anonymous → the login page (401 JSON on
the API), viewer → 403 with nothing done, operator → allowed (users routes: 403), superuser →
allowed everywhere. The table must name every route, so a new one cannot skip this test."""

import json

import pytest
from django.contrib.auth.models import User
from django.urls import URLPattern

from agent.models import Approval, MemoryFact, SessionState
from console import urls
from fleet.alerts import raise_alert
from fleet.clock import clock
from fleet.models import AuditLog
from tests.console_support import IDLE, park_stops
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])

#: not side-effect routes: pages that only read (tests/test_roles.py checks who sees them), the health
#: check, and Django's sign-in/sign-out views (the admin is an include, not a pattern here)
NOT_ACTIONS = {"dashboard", "fleet", "runs", "run", "export_scenario", "instance_timeline", "approvals", "alerts", "actions", "instance", "traces", "users",
            "memory", "performance", "rehearsals", "rehearsal", "healthz", "login", "logout"}


def routes(approval_pk: int, alert_pk: int, user_pk: int) -> dict[str, tuple[str, dict, str]]:
    """``name: (url, POST data, who may: "operator" or "superuser")``. The memory routes act on the
    world's one fact (edit before delete)."""
    fact_pk = MemoryFact.objects.values_list("pk", flat=True).first() or 0
    return {
        "decide_approval": (f"/approvals/{approval_pk}/decide/", {"decision": "approve"}, "operator"),
        "bulk_decide": ("/approvals/bulk/", {"decision": "approve", "ids": [str(approval_pk)]}, "operator"),
        "ack_alert": (f"/alerts/{alert_pk}/ack/", {"comment": "mine"}, "operator"),
        "ack_alerts": ("/alerts/ack/", {"alert": [alert_pk], "comment": "all mine"}, "operator"),
        "silence_alert": (f"/alerts/{alert_pk}/silence/", {"minutes": "60", "comment": "known"}, "operator"),
        "unsilence_alert": (f"/alerts/{alert_pk}/unsilence/", {}, "operator"),
        "notification_settings": ("/notifications/", {"email": "a@example.test", "kind": ["alert"]}, "operator"),
        "notification_test": ("/notifications/test/", {}, "operator"),
        "instance_action": ("/instances/v-2/act/", {"action": "reboot", "reason": "x"}, "operator"),
        "diagnose_now": ("/instances/v-2/diagnose/", {}, "operator"),
        "api_instance_action": ("/api/instances/v-2/reboot/", {"reason": "x"}, "operator"),
        "settings": ("/settings/", {"reason": "x", "limits__max_dph": "1"}, "operator"),
        "rehearse_change": ("/settings/rehearse/", {"limits__max_dph": "1"}, "operator"),
        "set_observe_only": ("/actions/observe-only/", {"on": "1"}, "operator"),
        "reset_session": ("/actions/reset/", {"confirm": "yes"}, "operator"),
        "set_target": ("/actions/target/", {"target": "5"}, "operator"),
        "post_message": ("/actions/message/", {"text": "hello"}, "operator"),
        "observe_now": ("/actions/observe/", {}, "operator"),
        "demo_enqueue": ("/actions/demo/enqueue/", {"n": "1"}, "operator"),
        "demo_kill": ("/actions/demo/kill/", {}, "operator"),
        "add_user": ("/users/add/", {"username": "dave", "role": "viewer", "password1": "Correct-Horse-57",
                                     "password2": "Correct-Horse-57"}, "superuser"),
        "set_user_role": (f"/users/{user_pk}/role/", {"role": "operator"}, "superuser"),
        "set_user_active": (f"/users/{user_pk}/active/", {}, "superuser"),
        "edit_fact": (f"/memory/{fact_pk}/edit/", {"value": "v-2 is slow", "importance": "0.5", "kind": "fact"}, "operator"),
        "delete_fact": (f"/memory/{fact_pk}/delete/", {}, "operator"),
    }


@pytest.fixture
def world(db):
    with scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider:
        run, _ = park_stops("v-1")
        carol = User.objects.create_user("carol", password="x")
        MemoryFact.objects.create(category="machine_perf", key="v-2", value="v-2 proves in 40 min", created_at=clock.now())
        yield Approval.objects.get(run=run), raise_alert("workers_dead", "1 dead"), carol, provider


@pytest.fixture
def root(db):
    return User.objects.create_superuser("root", password="x")


def _post(client, url: str, data: dict):
    if url.startswith("/api/"):
        return client.post(url, json.dumps(data), content_type="application/json")
    return client.post(url, data)


def _refused_to_login(resp, url: str) -> bool:
    if url.startswith("/api/"):
        return resp.status_code == 401 and resp.json()["code"] == "unauthenticated"
    return resp.status_code == 302 and resp["Location"].startswith("/login/")


def test_the_table_names_every_route(world):
    approval, alert, carol, _ = world
    names = {p.name for p in urls.urlpatterns if isinstance(p, URLPattern)}
    assert set(routes(approval.pk, alert.pk, carol.pk)) == names - NOT_ACTIONS


def test_anonymous_users_are_sent_to_sign_in(client, world):
    approval, alert, carol, _ = world
    before = AuditLog.objects.count()
    for name, (url, data, _) in routes(approval.pk, alert.pk, carol.pk).items():
        assert _refused_to_login(_post(client, url, data), url), name
    assert AuditLog.objects.count() == before
    assert not User.objects.filter(username="dave").exists()


def test_viewers_get_403_and_nothing_is_done(client, bob, world):
    approval, alert, carol, provider = world
    before = AuditLog.objects.count()
    client.force_login(bob)
    for name, (url, data, _) in routes(approval.pk, alert.pk, carol.pk).items():
        assert _post(client, url, data).status_code == 403, name
    assert AuditLog.objects.count() == before
    assert Approval.objects.get(pk=approval.pk).status == "waiting"
    assert SessionState.get().observe_only is False and SessionState.get().epoch == 1
    assert not User.objects.filter(username="dave").exists() and User.objects.get(pk=carol.pk).is_active
    assert "reboot_instance" not in [c for c, _ in provider.calls]
    assert MemoryFact.objects.get().value == "v-2 proves in 40 min"


def test_operators_may_act_but_not_manage_users(client, alice, world, broker_queue):
    approval, alert, carol, _ = world
    client.force_login(alice)
    for name, (url, data, who) in routes(approval.pk, alert.pk, carol.pk).items():
        resp = _post(client, url, data)
        if who == "superuser":
            assert resp.status_code == 403 and b"only superusers manage users" in resp.content, name
        else:
            assert resp.status_code not in (401, 403) and not _refused_to_login(resp, url), (name, resp.status_code)
    assert not User.objects.filter(username="dave").exists() and User.objects.get(pk=carol.pk).is_active
    done = set(AuditLog.objects.filter(actor="user:alice").values_list("verb", flat=True))
    assert {"ack_alert", "approve_call", "chat_message", "demo_enqueue", "diagnose", "observe_now", "reboot_instance",
            "reset_session", "set_observe_only", "set_target", "update_memory", "delete_memory", "silence_alert",
            "unsilence_alert", "notification_settings", "notify_test"} <= done


def test_superusers_may_manage_users(client, root, world):
    approval, alert, carol, _ = world
    client.force_login(root)
    for name, (url, data, who) in routes(approval.pk, alert.pk, carol.pk).items():
        if who == "superuser":
            resp = _post(client, url, data)
            assert resp.status_code == 302 and resp["Location"] == "/users/", (name, resp.status_code, resp.content[:300])
    assert User.objects.get(username="dave").groups.filter(name="viewers").exists()
    assert not User.objects.get(pk=carol.pk).is_active
    assert [r.verb for r in AuditLog.objects.filter(actor="user:root").order_by("id")] == [
        "add_user", "set_role", "deactivate_user"]
