"""Helpers for tests that start Warden's real processes (manage.py, daphne, celery) as subprocesses."""

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_db_env() -> dict:
    """Environment that points a subprocess at this test session's databases and Redis.

    The database URLs are the ones the local provider gives its workers (``child_env``), so every
    process started by a test writes to the test databases.
    """
    from django.conf import settings

    from fleet.providers.local import child_env

    env = child_env()
    urls = {k: env[k] for k in ("DATABASE_URL", "HARMONY_DATABASE_URL") if k in env}
    return {**urls, "REDIS_URL": settings.REDIS_URL}


test_db_env.__test__ = False  # a helper, not a test


def manage(*args, env: dict, timeout: float = 120, drop: tuple = ()) -> subprocess.CompletedProcess:
    """Run ``manage.py *args`` with ``env`` layered over ours (names in ``drop`` removed)."""
    full = {**os.environ, **env}
    for name in drop:
        full.pop(name, None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
