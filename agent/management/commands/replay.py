"""``python manage.py replay FILE.json [--json]``: run one scenario through the real observe cycle.

Contract: ``docs/replay.md``. The file is validated first (an invalid file: one line on
stderr naming the file and key path, exit 2). The command then re-executes itself in a child
process whose ``default`` and ``harmony`` databases are fresh SQLite files in a temporary
directory (migrated quietly, deleted afterwards), whose Redis URL points nowhere and whose Celery
broker is in memory — nothing outside the process is touched. The child runs
:func:`agent.replay.run_scenario` and prints the report.

Exit status: 0 every expectation holds (or the file has no ``expect``), 1 some do not (the
mismatches are listed), 2 the file is invalid or asks for more work than a replay does
(``agent.replay.file_format.check_bounds``), 3 the replay itself crashed (traceback on stderr),
130/143 it was interrupted (Ctrl-C / SIGTERM).

The temporary folder is always removed: when the child ends however it ends, when this process is
interrupted (Ctrl-C, SIGTERM, SIGHUP: the child is killed first), and, for a parent that was
SIGKILLed, by the next replay (a folder named for a process that no longer runs is removed).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from celery import current_app
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from agent.management.stopping import Stopped, raise_stopped
from agent.replay import ScenarioFileError, format_report, load_scenario, public_report, run_scenario

CHILD_ENV = "WARDEN_REPLAY_DB_DIR"
#: the temporary folder's name: ``warden-replay-<parent pid>-<random>``
TMP_PREFIX = "warden-replay-"
_TMP_NAME = re.compile(r"warden-replay-(\d+)-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_folders(root: str | None = None) -> list[str]:
    """Remove the temporary folders of replays whose parent process no longer runs (one killed with
    SIGKILL could not clean up); returns the folders removed."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        m = _TMP_NAME.match(name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
    return removed


class Command(BaseCommand):
    help = "Replay a scenario file (docs/replay.md) on a throwaway database and virtual clock."
    requires_system_checks = []
    requires_migrations_checks = False

    def add_arguments(self, parser):
        parser.add_argument("file", help="the scenario JSON file")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args, **opts):
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
        """Run this command again in a child whose databases are fresh files in a temp directory;
        the directory is removed whatever happens (see the module docstring)."""
        remove_stale_folders()
        tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")
        previous = {sig: signal.signal(sig, raise_stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
        proc = None
        try:
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
            # the child ignores Ctrl-C (the terminal sends it to both): the parent stops it and cleans up
            proc = subprocess.Popen(cmd, env=env, cwd=settings.BASE_DIR,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
            return proc.wait()
        except KeyboardInterrupt:
            self.stderr.write("replay: interrupted; the replay was stopped and its temporary folder removed")
            return 130
        except Stopped as exc:
            self.stderr.write(f"replay: stopped by signal {exc.signum}; the replay was stopped and its temporary "
                              "folder removed")
            return 128 + exc.signum
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            shutil.rmtree(tmp, ignore_errors=True)

    def _replay(self, sc, raw, path: str, as_json: bool, db_dir: str) -> int:
        """In the child: refuse anything but the throwaway database, migrate it, replay, print."""
        for alias in ("default", "harmony"):
            name = str(settings.DATABASES[alias]["NAME"])
            if not name.startswith(db_dir):
                self.stderr.write(f"replay: refusing to run: database {alias!r} is {name}, not a throwaway file")
                return 3
        # the project's Celery app (console/celery.py, loaded with the settings), without importing
        # the console layer from the agent's: nothing in the replay may reach a real broker
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
