"""``python manage.py rehearse DAY.json [--json] [--compare OTHER.json] [--planner rules|llm] [--hours H]``.

Contract: ``docs/rehearse.md``. The day file is validated first (an invalid file, or an invalid
``--hours``: one line on stderr naming the file and field, exit 2). The day is then played by a
child process (this command again) whose ``default`` and ``harmony`` databases are fresh SQLite
files in a temporary folder (migrated quietly, removed afterwards), whose Redis URL points nowhere
and whose Celery broker is in memory: the operator's own records are never read or written by
the simulation. This process stores the rehearsal as an ``agent.models.Rehearsal`` row in the
configured database (its progress as the child reports it, then its result) and prints the table.

``--compare OTHER.json`` plays the same day under the other file's objectives, policy, planner,
model and heartbeat (the day itself — start, horizon, seed, market, work, operator — is the first
file's, so both see the same arrivals and faults) and prints both columns and their difference;
the two rows are linked by ``compare_to``.

Exit status: 0 played with no unsafe decision, 1 some decision was unsafe (listed), 2 invalid
input, 3 the simulation crashed (its traceback on stderr), 130/143 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from celery import current_app
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from agent.management.stopping import Stopped, raise_stopped
from agent.models import Rehearsal
from agent.rehearse.day import POLICY_KEYS, DayFileError, load_day, parse_day
from agent.rehearse.history import write_from_history
from agent.rehearse.metrics import SUMMARY_KEYS
from agent.rehearse.sim import run_day
from fleet.clock import clock

CHILD_ENV = "WARDEN_REHEARSE_DB_DIR"
TMP_PREFIX = "warden-rehearse-"


def compared_day(day: dict, other: dict) -> dict:
    """``day`` under ``other``'s objectives, policy, planner, model and heartbeat (see the module docstring)."""
    out = {k: v for k, v in day.items() if k not in POLICY_KEYS}
    out.update({k: other[k] for k in POLICY_KEYS if k in other})
    out["name"] = f"{day.get('name', 'day')} under {other.get('name', 'the other file')}"
    return out


def format_table(names: list[str], summaries: list[dict], unsafe: list[list[dict]]) -> str:
    """The summary as a table: one column per rehearsal and, for two, their difference (B − A)."""
    def cell(v) -> str:
        if v is None:
            return "—"
        if isinstance(v, dict):
            return ", ".join(f"{k} {n}" for k, n in sorted(v.items())) or "0"
        if isinstance(v, float):
            return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    head = ["metric", *names] + (["difference"] if len(names) == 2 else [])
    rows = []
    for key in SUMMARY_KEYS:
        vals = [s.get(key) for s in summaries]
        row = [key, *(cell(v) for v in vals)]
        if len(vals) == 2:
            a, b = vals
            if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
                row.append(cell(round(b - a, 4) if isinstance(b - a, float) else b - a))
            else:
                row.append("")
        rows.append(row)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for name, found in zip(names, unsafe, strict=True):
        for v in found:
            lines.append(f"UNSAFE [{name}] {v['invariant']}: cycle {v['cycle']}, run {v['run']}, {v['call']}: {v['detail']}")
    return "\n".join(lines)


class Command(BaseCommand):
    help = "Rehearse a day file (docs/rehearse.md): the real policy over a simulated day, on a throwaway database."
    requires_system_checks = []
    requires_migrations_checks = False

    def add_arguments(self, parser):
        parser.add_argument("file", nargs="?", help="the day JSON file")
        parser.add_argument("--json", action="store_true", help="print the result(s) as JSON")
        parser.add_argument("--compare", metavar="OTHER.json", help="also play the day under this file's objectives and policy")
        parser.add_argument("--planner", choices=["rules", "llm"], help="override the file's planner")
        parser.add_argument("--hours", help="override the horizon (hours, more than 0 and at most 168)")
        parser.add_argument("--from-history", metavar="SPAN", help="write a day file from this installation's records of the last SPAN (24h, 90m, 2d) instead")
        parser.add_argument("--out", metavar="FILE", help="with --from-history: the file to write (default: stdout)")
        parser.add_argument("--child-out", help=self._hidden())
        parser.add_argument("--child-progress", help=self._hidden())

    @staticmethod
    def _hidden():
        return argparse.SUPPRESS

    def _fail(self, text: str, code: int = 2):
        self.stderr.write(f"rehearse: {text}")
        raise SystemExit(code)

    def handle(self, *args, **opts):
        if settings.WARDEN.get("REHEARSE_DB_DIR"):
            raise SystemExit(self._child(opts))
        if opts["from_history"] is not None:
            raise SystemExit(write_from_history(opts["from_history"], opts["out"], self.stdout, self.stderr))
        if not opts["file"]:
            self._fail("give a day file (DAY.json), or --from-history SPAN to write one")
        path = opts["file"]
        try:
            _, raw = load_day(path)
            other = load_day(opts["compare"])[1] if opts["compare"] else None
        except DayFileError as exc:
            self._fail(str(exc))
        overrides = {}
        if opts["planner"]:
            overrides["planner"] = opts["planner"]
        if opts["hours"] is not None:
            try:
                hours = float(opts["hours"])
            except ValueError:
                self._fail(f"--hours: {opts['hours']!r} is not a number; give hours such as 6 or 0.5")
            if not 0 < hours <= 168:
                self._fail(f"--hours: {hours:g} is out of range; give more than 0 and at most 168 hours")
            overrides["horizon_h"] = hours
        days = [{**raw, **overrides}]
        if other is not None:
            days.append({**compared_day(raw, other), **overrides})
        for n, d in enumerate(days):
            try:
                parse_day(d, opts["compare"] if n else path)
            except DayFileError as exc:
                self._fail(str(exc))
        results, rows = [], []
        for d in days:
            row, result, code = self._run(d, path)
            if code:
                return self._exit(code)
            rows.append(row)
            results.append(result)
        if len(rows) == 2:
            rows[1].compare_to = rows[0]
            rows[1].save(update_fields=["compare_to"])
            rows[0].compare_to = rows[1]
            rows[0].save(update_fields=["compare_to"])
        if opts["json"]:
            out = [{"rehearsal": r.pk, "name": r.name, **res} for r, res in zip(rows, results, strict=True)]
            self.stdout.write(json.dumps(out[0] if len(out) == 1 else out, indent=2, default=str))
        else:
            names = ["A", "B"] if len(rows) == 2 else [Path(path).name]
            if len(rows) == 2:
                self.stdout.write(f"A: {rows[0].name}\nB: {rows[1].name}")
            self.stdout.write(format_table(names, [r["summary"] for r in results], [r["unsafe"] for r in results]))
            self.stdout.write(f"stored as rehearsal {', '.join(str(r.pk) for r in rows)}")
        raise SystemExit(1 if any(r["unsafe"] for r in results) else 0)

    def _exit(self, code: int):
        raise SystemExit(code)

    def _run(self, day: dict, path: str):
        """Play ``day`` in a child on scratch SQLite; store its ``Rehearsal`` row. Returns (row, result, 0) or
        (row, None, exit status)."""
        row = Rehearsal.objects.create(name=str(day.get("name", Path(path).name))[:200], day=day, status="running",
                                       started_by="manage.py rehearse")
        tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")
        previous = {sig: signal.signal(sig, raise_stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
        proc = None
        try:
            day_file, out_file, prog_file = (Path(tmp) / n for n in ("day.json", "result.json", "progress"))
            day_file.write_text(json.dumps(day))
            env = dict(os.environ)
            env.update({CHILD_ENV: tmp, "DATABASE_URL": f"sqlite:///{tmp}/rehearse.sqlite3",
                        "HARMONY_DATABASE_URL": f"sqlite:///{tmp}/harmony.sqlite3", "WARDEN_VAR_DIR": tmp,
                        "WARDEN_SECRET_KEY": "rehearse-throwaway", "REDIS_URL": "redis://127.0.0.1:1/0",
                        "WARDEN_UNATTENDED": "0"})
            cmd = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "rehearse", str(day_file),
                   "--child-out", str(out_file), "--child-progress", str(prog_file)]
            self.stdout.flush()
            proc = subprocess.Popen(cmd, env=env, cwd=settings.BASE_DIR,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
            last = -1.0
            while proc.poll() is None:
                time.sleep(0.5)
                try:
                    p = float(prog_file.read_text() or 0)
                except (OSError, ValueError):
                    continue
                if p != last:
                    last = p
                    Rehearsal.objects.filter(pk=row.pk).update(progress=p)
            if proc.returncode != 0 or not out_file.exists():
                row.status, row.error, row.ended_at = "failed", f"the simulation ended with status {proc.returncode}", clock.now()
                row.save()
                return row, None, 3 if proc.returncode in (0, 3) else proc.returncode
            result = json.loads(out_file.read_text())
            row.status, row.result, row.progress, row.ended_at = "done", result, 1.0, clock.now()
            row.save()
            return row, result, 0
        except KeyboardInterrupt:
            self._ended(row, "interrupted")
            self.stderr.write("rehearse: interrupted; the simulation was stopped and its temporary folder removed")
            return row, None, 130
        except Stopped as exc:
            self._ended(row, f"stopped by signal {exc.signum}")
            return row, None, 128 + exc.signum
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _ended(row, why: str) -> None:
        row.status, row.error, row.ended_at = "failed", why, clock.now()
        row.save()

    def _child(self, opts) -> int:
        """In the child: refuse anything but the scratch databases, migrate them, play, write the result."""
        db_dir = settings.WARDEN["REHEARSE_DB_DIR"]
        for alias in ("default", "harmony"):
            name = str(settings.DATABASES[alias]["NAME"])
            if not name.startswith(db_dir):
                self.stderr.write(f"rehearse: refusing to run: database {alias!r} is {name}, not a scratch file")
                return 3
        current_app.conf.broker_url = "memory://"
        call_command("migrate", verbosity=0, interactive=False)
        prog = Path(opts["child_progress"])

        def progress(fraction: float) -> None:
            prog.write_text(f"{fraction:.4f}")

        try:
            day = json.loads(Path(opts["file"]).read_text())
            result = run_day(day, progress=progress)
        except Exception:  # noqa: BLE001 — the traceback, a distinct exit status
            self.stderr.write(f"rehearse: the simulation crashed:\n{traceback.format_exc()}")
            return 3
        Path(opts["child_out"]).write_text(json.dumps(result, default=str))
        return 0
