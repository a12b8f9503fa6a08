"""The published secret key (once committed as ``var2/secret_key``) is refused wherever it is found:
a key file holding it gets a new key and every session ends; ``WARDEN_SECRET_KEY`` set to it stops
the process with one line. The key itself is read from the git history, never stored in the tests."""

import stat
import subprocess

import pytest
from django.contrib.sessions.models import Session

from console.secret_key import PublishedKeyError, is_published, load_secret_key
from tests.subprocs import ROOT, manage, test_db_env


def published_key() -> str:
    """The key as it was committed (from git history); skips when the checkout has no history."""
    try:
        commits = subprocess.run(["git", "rev-list", "--all", "--", "var2/secret_key"], cwd=ROOT, capture_output=True,
                                 text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        pytest.skip("no git history in this checkout")
    for commit in commits:
        shown = subprocess.run(["git", "show", f"{commit}:var2/secret_key"], cwd=ROOT, capture_output=True, text=True,
                               timeout=30)
        if shown.returncode == 0 and shown.stdout.strip():
            return shown.stdout.strip()
    pytest.skip("the published key is not in this checkout's history")


def test_the_committed_key_is_gone_and_var_directories_are_ignored():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert not [p for p in tracked if p.startswith("var") and "/" in p]
    for name in ("var", "var2", "var-demo"):
        ignored = subprocess.run(["git", "check-ignore", "-q", f"{name}/secret_key"], cwd=ROOT)
        assert ignored.returncode == 0, name


def test_a_key_file_holding_the_published_key_gets_a_new_one(tmp_path):
    key = published_key()
    assert is_published(key) and is_published(f"  {key}\n")
    (tmp_path / "secret_key").write_text(key + "\n")
    new, replaced = load_secret_key(tmp_path, environ={})
    assert replaced and new != key and not is_published(new) and len(new) >= 50
    assert (tmp_path / "secret_key").read_text() == new
    assert stat.S_IMODE((tmp_path / "secret_key").stat().st_mode) == 0o600
    # the next start keeps the new key (nothing to replace)
    assert load_secret_key(tmp_path, environ={}) == (new, False)


def test_an_ordinary_key_file_is_kept(tmp_path):
    # near miss: a key that differs from the published one by its last character
    key = published_key()
    twin = key[:-1] + ("A" if key[-1] != "A" else "B")
    (tmp_path / "secret_key").write_text(twin)
    assert load_secret_key(tmp_path, environ={}) == (twin, False)


def test_the_published_key_in_the_environment_is_refused(tmp_path):
    with pytest.raises(PublishedKeyError) as exc:
        load_secret_key(tmp_path, environ={"WARDEN_SECRET_KEY": published_key()})
    assert published_key() not in str(exc.value)
    assert not (tmp_path / "secret_key").exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_bootstrap_replaces_the_published_key_and_ends_sessions(tmp_path, client, alice):
    key = published_key()
    client.force_login(alice)
    assert Session.objects.count() == 1
    (tmp_path / "secret_key").write_text(key)
    result = manage("bootstrap", env={**test_db_env(), "WARDEN_VAR_DIR": str(tmp_path), "WARDEN_ADMIN_PASSWORD": "night-7x"},
                    drop=("WARDEN_SECRET_KEY",))
    assert result.returncode == 0, result.stderr
    assert "a new key was written and 1 session(s) ended" in result.stdout
    assert key not in result.stdout + result.stderr
    assert not is_published((tmp_path / "secret_key").read_text())
    assert Session.objects.count() == 0

    refused = manage("bootstrap", env={**test_db_env(), "WARDEN_VAR_DIR": str(tmp_path), "WARDEN_SECRET_KEY": key})
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warden: bad WARDEN_SECRET_KEY: this key is public"), refused.stderr
    assert key not in refused.stderr
