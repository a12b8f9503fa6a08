"""Users are managed from a shell without the admin: ``adduser``, ``setrole``, ``deactivateuser``,
``activateuser``, ``listusers``. Each change is audited as ``cli:<login>``; a password is read
from a file or a prompt and never printed or stored in the audit log."""

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from console.users import role_of
from fleet.models import AuditLog

pytestmark = pytest.mark.django_db

PASSWORD = "Gentle-Otter-57-Lamp"


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def pwfile(tmp_path):
    path = tmp_path / "pw"
    path.write_text(PASSWORD + "\n")
    return str(path)


@pytest.mark.parametrize("role", ["operator", "viewer"])
def test_adduser_creates_a_user_who_can_sign_in_with_the_role(role, pwfile):
    out = run("adduser", "carol", "--role", role, "--password-file", pwfile, "--reason", "new on-call")
    assert out.strip() == f"added carol as {role}"
    user = User.objects.get(username="carol")
    assert role_of(user) == role and user.groups.filter(name=f"{role}s").exists()
    assert Client().login(username="carol", password=PASSWORD)
    row = AuditLog.objects.get(verb="add_user")
    assert row.actor.startswith("cli") and row.target == "user:carol" and row.after == {"role": role, "active": True}
    assert row.reason == "new on-call"
    assert PASSWORD not in str(list(AuditLog.objects.values())) and PASSWORD not in out


def test_a_viewer_added_from_the_shell_sees_pages_and_cannot_act(client, pwfile):
    run("adduser", "carol", "--role", "viewer", "--password-file", pwfile)
    assert client.login(username="carol", password=PASSWORD)
    assert 'title="signed in as carol; role viewer">carol<' in client.get("/").content.decode()
    assert client.post("/actions/observe/", {}).status_code == 403


@pytest.mark.parametrize(("args", "error"), [
    (["--role", "operator", "--password-file", "/nonexistent/pw"], "--password-file /nonexistent/pw: cannot read it"),
    (["--role", "operator"], "no terminal to prompt for the password: use --password-file FILE"),
])
def test_adduser_explains_a_missing_password(args, error):
    with pytest.raises(CommandError, match=error):
        call_command("adduser", "carol", *args, stdout=io.StringIO())
    assert not User.objects.filter(username="carol").exists()


def test_adduser_refuses_a_taken_name_a_weak_password_and_a_bad_name(tmp_path, alice, pwfile):
    with pytest.raises(CommandError, match="username 'alice' is taken"):
        call_command("adduser", "alice", "--role", "viewer", "--password-file", pwfile)
    weak = tmp_path / "weak"
    weak.write_text("123\n")
    with pytest.raises(CommandError, match="password: .*too short"):
        call_command("adduser", "carol", "--role", "viewer", "--password-file", str(weak))
    with pytest.raises(CommandError, match="use letters, digits"):
        call_command("adduser", "carol smith", "--role", "viewer", "--password-file", pwfile)
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("adduser", "carol", "--role", "admin", "--password-file", pwfile)
    assert not User.objects.filter(username__startswith="carol").exists()
    assert not AuditLog.objects.filter(verb="add_user").exists()


def test_setrole_deactivate_activate_and_listusers(alice, bob):
    assert run("setrole", "bob", "operator", "--reason", "promoted").strip() == "bob: viewer → operator"
    assert role_of(User.objects.get(username="bob")) == "operator"
    row = AuditLog.objects.get(verb="set_role")
    assert (row.before, row.after, row.reason) == ({"role": "viewer"}, {"role": "operator"}, "promoted")

    bob_user = User.objects.get(username="bob")
    bob_user.set_password(PASSWORD)
    bob_user.save()
    assert run("deactivateuser", "bob").strip() == "bob deactivated"
    assert not Client().login(username="bob", password=PASSWORD)
    listing = run("listusers").splitlines()
    assert listing[0].split() == ["user", "role", "active", "last", "login"]
    assert [line.split()[:3] for line in listing[1:]] == [["alice", "operator", "yes"], ["bob", "operator", "no"]]
    assert run("activateuser", "bob").strip() == "bob reactivated"
    assert Client().login(username="bob", password=PASSWORD)
    assert [r.verb for r in AuditLog.objects.order_by("id")] == ["set_role", "deactivate_user", "activate_user"]
    with pytest.raises(CommandError, match="no user 'nobody'; see manage.py listusers"):
        call_command("setrole", "nobody", "viewer")


def test_a_superusers_role_is_not_changed_from_setrole():
    User.objects.create_superuser("root", password="x")
    with pytest.raises(CommandError, match="root is a superuser"):
        call_command("setrole", "root", "viewer")
    with pytest.raises(CommandError, match="root is the last active superuser"):
        call_command("deactivateuser", "root")


@pytest.mark.parametrize("name", ["ｏｐｅｒａｔｏｒ", "OPERATOR", "\u043eperator"])
def test_adduser_refuses_a_look_alike_name_with_one_line(name, pwfile):
    User.objects.create_user("operator", password="x")
    with pytest.raises(CommandError) as exc:
        call_command("adduser", name, "--role", "viewer", "--password-file", pwfile, stdout=io.StringIO())
    message = str(exc.value)
    assert "\n" not in message and ("is taken" in message or "looks like the existing user 'operator'" in message)
    assert User.objects.count() == 1


def test_adduser_stores_a_full_width_name_in_its_plain_form(pwfile):
    assert run("adduser", "ｃａｒｏｌ", "--role", "viewer", "--password-file", pwfile).strip() == "added carol as viewer"
    assert Client().login(username="carol", password=PASSWORD)


@pytest.mark.timeout(30)  # a regression blocks on the FIFO: fail, do not hang
def test_adduser_refuses_a_fifo_as_the_password_file_at_once(tmp_path):
    import os

    fifo = tmp_path / "pw.fifo"
    os.mkfifo(fifo)  # no writer: opening it for reading would block for ever
    with pytest.raises(CommandError, match=r"--password-file .*pw.fifo: a FIFO; put the password alone in a regular file"):
        call_command("adduser", "carol", "--role", "viewer", "--password-file", str(fifo), stdout=io.StringIO())
    with pytest.raises(CommandError, match="a directory"):
        call_command("adduser", "carol", "--role", "viewer", "--password-file", str(tmp_path), stdout=io.StringIO())
    with pytest.raises(CommandError, match="not a regular file"):
        call_command("adduser", "carol", "--role", "viewer", "--password-file", "/dev/zero", stdout=io.StringIO())
    assert not User.objects.filter(username="carol").exists()
