"""A stored rehearsal played in the background: the Celery task ``agent.tasks.rehearse`` (docs/rehearse.md).

:func:`play_stored` plays the day of one ``agent.models.Rehearsal`` row the way ``manage.py replay``
plays a scenario: in a child process whose ``default`` and ``harmony`` databases are fresh SQLite
files in a temporary folder (migrated, removed afterwards), whose Redis URL points nowhere and whose
Celery broker is in memory, so the rehearsal's runs, approvals and instances never touch this
installation's records. The child (``python -m agent.rehearse.background FOLDER``) calls
:func:`agent.rehearse.run_day` and reports its progress on stdout, one ``progress F`` line (F in
0..1 of the horizon) at a time; this process stores each on the row (at most one write per
:data:`PROGRESS_STEP` of the day) and announces ``rehearsals-changed``, so the console's progress bar
advances. The outcome is stored on the row: ``done`` with ``result``, or ``failed`` with one line
saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: the least change of progress stored on the row (a 1,000-heartbeat day writes at most 50 times)
PROGRESS_STEP = 0.02
#: the temporary folder's name: ``warden-rehearse-<pid>-<random>``
TMP_PREFIX = "warden-rehearse-"
#: the longest a rehearsal may take before it is stopped and failed (seconds)
TIME_LIMIT_S = 3 * 3600


def child_env(folder: str) -> dict:
    """The child's environment: throwaway SQLite databases in ``folder``, no Redis, no secrets of ours."""
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": f"sqlite:///{folder}/rehearsal.sqlite3",
        "HARMONY_DATABASE_URL": f"sqlite:///{folder}/harmony.sqlite3",
        "WARDEN_VAR_DIR": folder,
        "WARDEN_SECRET_KEY": "rehearsal-throwaway",
        # nothing listens on port 1: an accidental Redis use fails instead of touching a real one
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "WARDEN_UNATTENDED": "0",
        "DJANGO_SETTINGS_MODULE": "console.settings",
    })
    return env


def _store_progress(pk: int, fraction: float) -> None:
    from agent.models import Rehearsal
    from fleet.events import emit

    Rehearsal.objects.filter(pk=pk, status="running").update(progress=max(0.0, min(1.0, fraction)))
    emit("rehearsals-changed")


def _store_end(pk: int, *, result: dict | None = None, error: str = "") -> None:
    from agent.models import Rehearsal
    from fleet.clock import clock
    from fleet.events import emit
    from fleet.secrets import redact

    fields = {"status": "done", "progress": 1.0, "result": result} if result is not None else {
        "status": "failed", "error": redact(error)[:2000]}
    Rehearsal.objects.filter(pk=pk).update(ended_at=clock.now(), **fields)
    emit("rehearsals-changed")


def play_stored(pk: int) -> str:
    """Play rehearsal ``pk`` (a ``queued`` row) in a throwaway child and store its outcome; returns
    the row's final status (``done`` / ``failed``), or ``""`` when the row is gone or not queued (it
    is played once). Never raises for the rehearsal's own failure: it is stored on the row."""
    from agent.models import Rehearsal
    from fleet.events import emit

    if not Rehearsal.objects.filter(pk=pk, status="queued").update(status="running", progress=0.0):
        return ""
    emit("rehearsals-changed")
    day = Rehearsal.objects.values_list("day", flat=True).get(pk=pk)
    folder = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")
    proc = None
    try:
        Path(folder, "day.json").write_text(json.dumps(day), encoding="utf-8")
        root = Path(__file__).resolve().parents[2]
        errors = open(Path(folder, "stderr.txt"), "w+", encoding="utf-8")  # a file: a long traceback never blocks the pipe
        proc = subprocess.Popen([sys.executable, "-m", "agent.rehearse.background", folder], cwd=root,
                                env=child_env(folder), stdout=subprocess.PIPE, stderr=errors, text=True)
        stored = 0.0
        for line in proc.stdout:
            word, _, value = line.strip().partition(" ")
            if word == "progress":
                try:
                    fraction = float(value)
                except ValueError:
                    continue
                if fraction - stored >= PROGRESS_STEP and fraction < 1:
                    stored = fraction
                    _store_progress(pk, fraction)
        code = proc.wait(timeout=TIME_LIMIT_S)
        errors.seek(0)
        err = errors.read()[-20_000:]
        errors.close()
        out = Path(folder, "result.json")
        if code == 0 and out.exists():
            _store_end(pk, result=json.loads(out.read_text(encoding="utf-8")))
            return "done"
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        _store_end(pk, error=(lines[-1] if lines else f"the rehearsal's process ended with status {code}"))
        return "failed"
    except Exception as exc:  # noqa: BLE001 — an OS error, a bad result file, Celery's time limit: stored, never lost
        _store_end(pk, error=f"the rehearsal could not run: {type(exc).__name__}: {exc}")
        return "failed"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _child(folder: str) -> int:
    """In the child: refuse anything but the throwaway databases, migrate them, play the day, write
    ``result.json``. A day the reader refuses: its one line on stderr, status 2; a crash: status 3."""
    import django

    django.setup()
    from celery import current_app
    from django.conf import settings
    from django.core.management import call_command

    from agent.rehearse import run_day
    from agent.rehearse.day import DayFileError

    for alias in ("default", "harmony"):
        if not str(settings.DATABASES[alias]["NAME"]).startswith(folder):
            print(f"refusing to run: database {alias!r} is not a throwaway file", file=sys.stderr)
            return 3
    current_app.conf.broker_url = "memory://"
    call_command("migrate", verbosity=0, interactive=False)
    day = json.loads(Path(folder, "day.json").read_text(encoding="utf-8"))

    def progress(fraction: float) -> None:
        print(f"progress {fraction:.4f}", flush=True)

    try:
        result = run_day(day, progress=progress)
    except DayFileError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 — the last line is what the console shows
        import traceback

        traceback.print_exc()
        print(f"the rehearsal crashed: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        return 3
    Path(folder, "result.json").write_text(json.dumps(result, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1]))
