"""The Users page (superusers): lists every user with role and state; adds a user with a role,
changes a role, deactivates and reactivates, each audited; bad input is a 400 naming the field;
operators and viewers get 403 and no Users link."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console.users import role_of
from fleet.models import AuditLog

pytestmark = pytest.mark.django_db

PASSWORD = "Gentle-Otter-57-Lamp"


@pytest.fixture
def root(db):
    return User.objects.create_superuser("root", password="x")


def test_it_lists_users_with_their_role_and_links_from_the_nav(client, root, alice, bob):
    client.force_login(root)
    html = client.get("/users/").content.decode()
    for name, role in [("alice", "operator"), ("bob", "viewer"), ("root", "superuser")]:
        row = html.split(f'data-user="{name}"')[1].split("</tr>")[0]
        assert f"<td>{role}</td>" in row, name
    assert '<a href="/users/">Users</a>' in client.get("/").content.decode()
    assert 'title="signed in as root; role superuser">root<' in html and ">superuser</span>" in html
    assert 'hx-trigger="users-changed from:body' in html
    region = client.get("/users/", headers={"HX-Request": "true"}).content.decode()
    assert region.lstrip().startswith('<div class="table-wrap"><table class="grid users" id="users">') and 'data-user="bob"' in region


def test_a_superuser_adds_a_viewer_who_can_sign_in(client, root):
    client.force_login(root)
    resp = client.post("/users/add/", {"username": "carol", "role": "viewer", "password1": PASSWORD,
                                       "password2": PASSWORD, "reason": "auditor"})
    assert resp.status_code == 302 and resp["Location"] == "/users/"
    carol = User.objects.get(username="carol")
    assert role_of(carol) == "viewer"
    row = AuditLog.objects.get(verb="add_user")
    assert (row.actor, row.target, row.reason, row.after) == ("user:root", "user:carol", "auditor",
                                                             {"role": "viewer", "active": True})
    assert PASSWORD not in str(list(AuditLog.objects.values()))
    assert Client().login(username="carol", password=PASSWORD)


@pytest.mark.parametrize(("data", "error"), [
    ({"username": "alice", "role": "viewer"}, "username &#x27;alice&#x27; is taken"),
    ({"username": "carol", "role": "admin"}, "role must be operator or viewer"),
    ({"username": "carol", "role": "viewer", "password2": "Other-Otter-57-Lamp"}, "the two passwords differ"),
    ({"username": "carol", "role": "viewer", "password1": "short", "password2": "short"}, "password: This password is too short"),
    ({"username": "carol", "role": "viewer", "reason": "r" * 501}, "reason is too long: at most 500 characters"),
])
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_added(client, root, alice, data, error):
    client.force_login(root)
    resp = client.post("/users/add/", {"password1": PASSWORD, "password2": PASSWORD, **data})
    assert resp.status_code == 400
    assert error in resp.content.decode()
    assert not User.objects.filter(username="carol").exists()
    assert not AuditLog.objects.filter(verb="add_user").exists()


def test_a_superuser_changes_a_role_and_deactivates_and_reactivates(client, root, bob):
    client.force_login(root)
    assert client.post(f"/users/{bob.pk}/role/", {"role": "operator", "reason": "on call"}).status_code == 302
    assert role_of(User.objects.get(pk=bob.pk)) == "operator"
    bob_client = Client()
    bob_client.force_login(bob)
    assert bob_client.get("/").status_code == 200
    assert client.post(f"/users/{bob.pk}/active/", {"reason": "left"}).status_code == 302
    assert not User.objects.get(pk=bob.pk).is_active
    resp = bob_client.get("/")  # the session stops working at the next request
    assert resp.status_code == 302 and resp["Location"].startswith("/login/")
    assert client.post(f"/users/{bob.pk}/active/", {"active": "on"}).status_code == 302
    assert User.objects.get(pk=bob.pk).is_active
    assert [(r.verb, r.before, r.after) for r in AuditLog.objects.order_by("id")] == [
        ("set_role", {"role": "viewer"}, {"role": "operator"}),
        ("deactivate_user", {"active": True}, {"active": False}),
        ("activate_user", {"active": False}, {"active": True}),
    ]


def test_a_superuser_cannot_deactivate_themselves_or_demote_a_superuser(client, root):
    client.force_login(root)
    resp = client.post(f"/users/{root.pk}/active/", {})
    assert resp.status_code == 400 and "you cannot deactivate yourself" in resp.content.decode()
    resp = client.post(f"/users/{root.pk}/role/", {"role": "viewer"})
    assert resp.status_code == 400 and "root is a superuser" in resp.content.decode()
    assert User.objects.get(pk=root.pk).is_active and not AuditLog.objects.exists()


def test_operators_and_viewers_cannot_see_or_use_the_users_page(client, alice, bob):
    for user in (alice, bob):
        client.force_login(user)
        assert client.get("/users/").status_code == 403
        assert '<a href="/users/">Users</a>' not in client.get("/").content.decode()
    client.logout()
    resp = client.get("/users/")
    assert resp.status_code == 302 and resp["Location"].startswith("/login/")


@pytest.mark.parametrize("name", ["ｏｐｅｒａｔｏｒ", "OPERATOR", "Operator", "\u043eperator", "0perator", "оpеrаtоr"])
def test_a_name_that_looks_like_an_existing_one_is_a_400_not_a_500(client, root, name):
    # full width (NFKC folds it to "operator"), upper case, a Cyrillic о, a zero for an O, all Cyrillic vowels
    User.objects.create_user("operator", password="x")
    client.force_login(root)
    resp = client.post("/users/add/", {"username": name, "role": "viewer", "password1": PASSWORD, "password2": PASSWORD})
    assert resp.status_code == 400
    body = resp.content.decode()
    assert "is taken" in body or "looks like the existing user &#x27;operator&#x27;" in body, body[:2000]
    assert User.objects.count() == 2
    assert not AuditLog.objects.filter(verb="add_user").exists()


@pytest.mark.parametrize("name", ["operator2", "opera", "ｃａｒｏｌ"])
def test_near_miss_names_that_differ_in_their_letters_are_added(client, root, name):
    User.objects.create_user("operator", password="x")
    client.force_login(root)
    resp = client.post("/users/add/", {"username": name, "role": "viewer", "password1": PASSWORD, "password2": PASSWORD})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    # stored in its NFKC form: a full-width name is the plain one
    assert User.objects.filter(username=name if name.isascii() else "carol").exists()
