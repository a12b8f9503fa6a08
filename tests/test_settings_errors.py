"""Bad input: a malformed setting stops every entry point with ONE line naming the setting;
Redis down does not stop page serving (daphne answers, /healthz says 503 and names redis)."""

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.subprocs import BIN, ROOT, free_port, manage


def test_every_warden_variable_is_read_in_console_settings_only():
    """One place reads the environment's WARDEN_* settings (console/settings.py, where a bad value
    is one line); code elsewhere reads ``settings.WARDEN``. Names passed on to a child process
    (``env[...] = ``) or held as a reference are not reads."""
    import re

    read = re.compile(r"""(os\.environ\.get|os\.getenv|os\.environ\[)\(?\s*["']WARDEN_""")
    offenders = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in ("agent", "fleet", "console") or rel == Path("console/settings.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if read.search(line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize(
    "setting,value",
    [
        ("DATABASE_URL", "mysql//nope"),
        ("DATABASE_URL", "postgres://postgres@127.0.0.1:5432"),  # names no database
        ("HARMONY_DATABASE_URL", "not a url"),
        ("REDIS_URL", "http://127.0.0.1:6379/0"),
        ("REDIS_URL", "redis://"),
        ("WARDEN_DWELL_MIN", "fifteen"),
        ("WARDEN_OBSERVE_INTERVAL_S", "5m"),
        ("WARDEN_EMBEDDED_REDIS_PORT", "six"),
        # values that parse but would switch a guard off
        ("WARDEN_MAX_DPH", "nan"),
        ("WARDEN_MAX_DPH", "inf"),
        ("WARDEN_DWELL_MIN", "-5"),
        ("WARDEN_HOLD_OFF_MIN", "-100"),
        ("WARDEN_HEARTBEAT_S", "0"),
        ("WARDEN_CURIO_HEARTBEAT_S", "0"),
        ("HARMONY_DATABASE_URL", "postgres://ro@127.0.0.1:5433/yugabyte?search_path=curio;drop"),
        ("WARDEN_PROVIDER", "banana"),
        ("WARDEN_DEMAND_SOURCE", "somewhere"),
        ("WARDEN_ORPHANS", "ignore"),
        ("WARDEN_VANISH_GRACE_MIN", "-1"),
        ("WARDEN_VAST_OFFER_TYPE", "spot"),
        ("WARDEN_VAST_MIN_INTERVAL_S", "nan"),
        # read by the demo worker and the diagnosis fan-out, once outside settings (a traceback then)
        ("WARDEN_LOOKS_DEAD_S", "abc"),
        ("WARDEN_LOOKS_DEAD_S", "0"),
        ("WARDEN_DIAGNOSE_FANOUT", "maybe"),
        # beyond the limits schema's range (agent/policy/limits.py), which the settings page also keeps
        ("WARDEN_MAX_INSTANCES", "20000"),
        ("WARDEN_DWELL_MIN", "5000"),
    ],
)
def test_malformed_setting_is_one_line_naming_it(setting, value, tmp_path):
    result = manage("check", env={setting: value, "WARDEN_VAR_DIR": str(tmp_path)})
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert setting in lines[0]
    assert "Traceback" not in result.stderr


def test_a_vast_key_pasted_where_its_variable_name_belongs_is_refused_and_not_printed(tmp_path):
    key = "3f9c2b7a1d4e8f60a5b3c7d9e1f2a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8"
    result = manage("check", env={"WARDEN_VAST_API_KEY_ENV": key, "WARDEN_VAR_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert "WARDEN_VAST_API_KEY_ENV" in result.stderr and "NAME of the environment variable" in result.stderr
    assert key not in result.stderr + result.stdout


def test_database_password_is_not_printed(tmp_path):
    result = manage(
        "check", env={"DATABASE_URL": "postgres://warden:s3cr3t-pw@127.0.0.1:5432", "WARDEN_VAR_DIR": str(tmp_path)}
    )
    assert result.returncode != 0
    assert "DATABASE_URL" in result.stderr
    assert "s3cr3t-pw" not in result.stderr


def test_bootstrap_with_unreachable_database_is_one_line(tmp_path):
    url = f"postgres://postgres@127.0.0.1:{free_port()}/warden"
    result = manage(
        "bootstrap",
        env={
            "DATABASE_URL": url,
            "WARDEN_VAR_DIR": str(tmp_path),
            "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        },
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "DATABASE_URL" in lines[0] and "unset DATABASE_URL" in lines[0]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_redis_down_pages_still_served_healthz_names_redis(tmp_path):
    """Daphne starts with REDIS_URL pointing at nothing: the login page is served, /healthz is 503 naming redis."""
    port = free_port()
    env = {
        **os.environ,
        "WARDEN_VAR_DIR": str(tmp_path),
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    # The SQLite default, migrated, so the page needs nothing but the database.
    env.pop("DATABASE_URL", None)
    env.pop("HARMONY_DATABASE_URL", None)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=120)
    proc = subprocess.Popen(
        [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "console.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/healthz")
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.2)
        assert status == 503, body
        assert "redis" in body.lower()
        login_status, _ = _get(f"http://127.0.0.1:{port}/admin/login/")
        assert login_status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_unattended_is_refused_with_a_provider_that_costs_money(tmp_path):
    """WARDEN_UNATTENDED (every tool auto) is the demo's switch: with ssh or vastai it stops the
    start with one line, and the policy never applies it there (agent.policy.table.unattended)."""
    result = manage("check", env={"WARDEN_UNATTENDED": "true", "WARDEN_PROVIDER": "vastai",
                                  "WARDEN_VAR_DIR": str(tmp_path)})
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "WARDEN_UNATTENDED" in lines[0] and "WARDEN_PROVIDER=local" in lines[0], result.stderr
    assert manage("check", env={"WARDEN_UNATTENDED": "true", "WARDEN_VAR_DIR": str(tmp_path)}).returncode == 0


@pytest.mark.django_db
def test_unattended_turns_the_table_auto_only_with_the_local_provider(settings):
    from agent.policy.table import effective_policy

    settings.WARDEN = {**settings.WARDEN, "UNATTENDED": True, "PROVIDER": "local"}
    assert effective_policy()["destroy_instance"] == "auto"
    settings.WARDEN = {**settings.WARDEN, "PROVIDER": "ssh"}
    assert effective_policy()["destroy_instance"] == "approval"
