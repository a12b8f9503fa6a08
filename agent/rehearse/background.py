"""A stored rehearsal played in the background: the Celery task ``agent.tasks.rehearse`` (docs/rehearse.md).

:func:`play_stored` plays the day of one ``agent.models.Rehearsal`` row the way ``manage.py rehearse``
plays a file: in that command's child (its scratch mode, ``agent/management/commands/rehearse.py``),
whose ``default`` and ``harmony`` databases are fresh SQLite files in a temporary folder (migrated,
removed afterwards), whose Redis URL points nowhere and whose Celery broker is in memory, so the
rehearsal's runs, approvals and instances never touch this installation's records. The child writes
its progress (0..1 of the horizon) to a file; this process reads it every :data:`POLL_S`, stores it
on the row when it moved by :data:`PROGRESS_STEP` or more and announces ``rehearsals-changed``, so
the console's progress bar advances. The outcome is stored on the row: ``done`` with ``result``, or
``failed`` with one line saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent.models import Rehearsal
from fleet.clock import clock
from fleet.events import emit
from fleet.secrets import redact

#: the least change of progress stored on the row (a day writes it at most 50 times)
PROGRESS_STEP = 0.02
#: how often the child's progress file is read (seconds)
POLL_S = 0.5
#: the temporary folder's name: ``warden-rehearse-<pid>-<random>`` (``manage.py rehearse``'s own)
TMP_PREFIX = "warden-rehearse-"
#: the longest a rehearsal may take before it is stopped and failed (seconds)
TIME_LIMIT_S = 3 * 3600


def child_env(folder: str) -> dict:
    """The child's environment, as ``manage.py rehearse`` gives its own: scratch SQLite databases in
    ``folder`` (``WARDEN_REHEARSE_DB_DIR``), a Redis URL nothing listens on, a throwaway secret key."""
    env = dict(os.environ)
    env.update({"WARDEN_REHEARSE_DB_DIR": folder, "DATABASE_URL": f"sqlite:///{folder}/rehearse.sqlite3",
                "HARMONY_DATABASE_URL": f"sqlite:///{folder}/harmony.sqlite3", "WARDEN_VAR_DIR": folder,
                "WARDEN_SECRET_KEY": "rehearse-throwaway", "REDIS_URL": "redis://127.0.0.1:1/0",
                "WARDEN_UNATTENDED": "0", "DJANGO_SETTINGS_MODULE": "console.settings"})
    return env


def _store_progress(pks: list[int], fraction: float) -> None:
    Rehearsal.objects.filter(pk__in=pks, status="running").update(progress=max(0.0, min(1.0, fraction)))
    emit("rehearsals-changed")


def _store_end(pk: int, *, result: dict | None = None, error: str = "") -> None:
    fields = {"status": "done", "progress": 1.0, "result": result} if result is not None else {
        "status": "failed", "error": redact(error)[:2000]}
    Rehearsal.objects.filter(pk=pk).update(ended_at=clock.now(), **fields)
    emit("rehearsals-changed")


def _last_line(text: str, code: int) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"the simulation ended with status {code}"


def play_stored(pk: int) -> str:
    """Play rehearsal ``pk`` (a ``queued`` row) in a scratch child and store its outcome; returns the
    row's final status (``done`` / ``failed``), or ``""`` when the row is gone or not queued (it is
    played once). When its ``compare_to`` row is queued too (an A/B pair from
    ``agent.actions.runs.do_start_rehearsal``), that one — the current settings — is played first, then
    this one, each in its own child from the same day (same seed, arrivals and faults); the
    progress stored on the running rows covers both (0..0.5 the first, 0.5..1 the second), and if
    the first fails the second is failed with the same line. Never raises for the rehearsal's own
    failure: it is stored on the row."""
    if not Rehearsal.objects.filter(pk=pk, status="queued").update(status="running", progress=0.0):
        return ""
    other = Rehearsal.objects.filter(pk=pk).values_list("compare_to", flat=True).get()
    sides = [pk]
    if other is not None and Rehearsal.objects.filter(pk=other, status="queued").update(status="running", progress=0.0):
        sides = [other, pk]
    emit("rehearsals-changed")
    for n, side in enumerate(sides):
        rows = sides[n:]

        def progress(fraction: float, n=n, rows=rows) -> None:
            _store_progress(rows, (n + fraction) / len(sides))

        error = _play(side, progress)
        if error is not None:
            for rest in rows:
                _store_end(rest, error=error if rest == side else f"the current settings' side failed: {error}")
            return "failed"
    return "done"


def _play(pk: int, progress) -> str | None:
    """Play the day of row ``pk`` in a scratch child, calling ``progress(fraction)`` as it moves by
    :data:`PROGRESS_STEP` and storing ``done`` with the result; returns None, or the one line why it
    failed (nothing stored then)."""
    day = Rehearsal.objects.values_list("day", flat=True).get(pk=pk)
    folder = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")
    proc = errors = None
    try:
        day_file, out_file, prog_file = (Path(folder, n) for n in ("day.json", "result.json", "progress"))
        day_file.write_text(json.dumps(day), encoding="utf-8")
        errors = open(Path(folder, "stderr.txt"), "w+", encoding="utf-8")  # a file: a long traceback never blocks
        root = Path(__file__).resolve().parents[2]
        proc = subprocess.Popen([sys.executable, str(root / "manage.py"), "rehearse", str(day_file),
                                 "--child-out", str(out_file), "--child-progress", str(prog_file)],
                                cwd=root, env=child_env(folder), stdout=subprocess.DEVNULL, stderr=errors)
        stored, started = 0.0, time.monotonic()
        while proc.poll() is None:
            if time.monotonic() - started > TIME_LIMIT_S:
                raise TimeoutError(f"the rehearsal took longer than {TIME_LIMIT_S // 3600} h and was stopped")
            time.sleep(POLL_S)
            try:
                fraction = float(prog_file.read_text(encoding="utf-8") or 0)
            except (OSError, ValueError):
                continue
            if fraction - stored >= PROGRESS_STEP and fraction < 1:
                stored = fraction
                progress(fraction)
        if proc.returncode == 0 and out_file.exists():
            result = json.loads(out_file.read_text(encoding="utf-8"))
            progress(1.0)
            _store_end(pk, result=result)
            return None
        errors.seek(0)
        return _last_line(errors.read()[-20_000:], proc.returncode)
    except Exception as exc:  # noqa: BLE001 — an OS error, a bad result file, a time limit: stored, never lost
        return f"the rehearsal could not run: {type(exc).__name__}: {exc}"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if errors is not None:
            errors.close()
        shutil.rmtree(folder, ignore_errors=True)
