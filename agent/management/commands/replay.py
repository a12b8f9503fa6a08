"""``python manage.py replay FILE.json [--json]``: run one scenario through the real observe cycle.

Contract: ``docs/replay.md``. The file is validated first (an invalid file: one line on
stderr naming the file and key path, exit 2). The command then re-executes itself in a child
process whose ``default`` and ``harmony`` databases are fresh SQLite files in a temporary
directory (migrated quietly, deleted afterwards), whose Redis URL points nowhere and whose Celery
broker is in memory — nothing outside the process is touched. The child runs
:func:`agent.replay.run_scenario` and prints the report.

Exit status: 0 every expectation holds (or the file has no ``expect``), 1 some do not (the
mismatches are listed), 2 the file is invalid, 3 the replay itself crashed (traceback on stderr).
"""

import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

CHILD_ENV = "WARDEN_REPLAY_DB_DIR"


class Command(BaseCommand):
    help = "Replay a scenario file (docs/replay.md) on a throwaway database and virtual clock."
    requires_system_checks = []
    requires_migrations_checks = False

    def add_arguments(self, parser):
        parser.add_argument("file", help="the scenario JSON file")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args, **opts):
        from agent.replay import ScenarioFileError, load_scenario

        path = opts["file"]
        try:
            sc, raw = load_scenario(path)
        except ScenarioFileError as exc:
            self.stderr.write(f"replay: {exc}")
            raise SystemExit(2) from None
        db_dir = settings.WARDEN.get("REPLAY_DB_DIR")
        if not db_dir:
            raise SystemExit(self._reexec(path, opts["json"]))
        raise SystemExit(self._replay(sc, raw, path, opts["json"], db_dir))

    def _reexec(self, path: str, as_json: bool) -> int:
        """Run this command again in a child whose databases are fresh files in a temp directory."""
        with tempfile.TemporaryDirectory(prefix="warden-replay-") as tmp:
            env = dict(os.environ)
            env.update(
                {
                    CHILD_ENV: tmp,
                    "DATABASE_URL": f"sqlite:///{tmp}/replay.sqlite3",
                    "HARMONY_DATABASE_URL": f"sqlite:///{tmp}/harmony.sqlite3",
                    "WARDEN_VAR_DIR": tmp,
                    "WARDEN_SECRET_KEY": "replay-throwaway",
                    # nothing listens on port 1: an accidental Redis use fails instead of touching a real one
                    "REDIS_URL": "redis://127.0.0.1:1/0",
                    "WARDEN_UNATTENDED": "0",
                }
            )
            cmd = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "replay", str(Path(path).resolve())]
            if as_json:
                cmd.append("--json")
            self.stdout.flush()
            return subprocess.run(cmd, env=env, cwd=settings.BASE_DIR, check=False).returncode

    def _replay(self, sc, raw, path: str, as_json: bool, db_dir: str) -> int:
        """In the child: refuse anything but the throwaway database, migrate it, replay, print."""
        from django.core.management import call_command

        from agent.replay import ScenarioFileError, format_report, public_report, run_scenario

        for alias in ("default", "harmony"):
            name = str(settings.DATABASES[alias]["NAME"])
            if not name.startswith(db_dir):
                self.stderr.write(f"replay: refusing to run: database {alias!r} is {name}, not a throwaway file")
                return 3
        # the project's Celery app (console/celery.py, loaded with the settings), without importing
        # the console layer from the agent's: nothing in the replay may reach a real broker
        from celery import current_app

        current_app.conf.broker_url = "memory://"
        call_command("migrate", verbosity=0, interactive=False)
        try:
            report = run_scenario(sc, raw, path=path)
        except ScenarioFileError as exc:
            self.stderr.write(f"replay: {exc}")
            return 2
        except Exception:  # noqa: BLE001 — print the traceback, distinct exit status
            self.stderr.write(f"replay: {path}: the replay crashed:\n{traceback.format_exc()}")
            return 3
        if as_json:
            self.stdout.write(json.dumps(public_report(report), indent=2, default=str))
        else:
            self.stdout.write(format_report(report))
        return 0 if report["ok"] else 1
