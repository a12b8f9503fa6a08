"""``python manage.py evaluate-model [FOLDER ...]``: score a model over the incident scenarios.

Contract: docs/model.md "Evaluating a model"; the scoring is :mod:`agent.replay.evaluation`. Flags:
``--base-url URL --model NAME --api-key-ref REF`` (default: the configured model,
``WARDEN_MODEL_*``; REF is an environment variable's name, ``env:NAME``, ``file:/path`` or a
path), ``--timeout-s S`` (per model request; default ``WARDEN_MODEL_TIMEOUT_S``), ``--case GLOB``
(repeatable: only cases whose file stem matches), ``--no-suite`` (only the named folders),
``--repeat N`` (1–100 plays per case), ``--json``, ``--no-store`` (do not save a
``ModelEvaluation``).

Bad input — no model configured or named, a folder that is missing or holds no valid replay
file, a key reference that cannot be resolved, a server that does not answer, refuses the key or
refuses the model name — is one line on stderr and exit 2, before any case runs. The cases run in
a child process whose databases are fresh SQLite files in a temporary folder (each case on its own
copy of a freshly migrated one), whose Redis URL points nowhere and whose Celery broker is in
memory, on the scenario provider and demand source: the operator's fleet and records are never
touched. Only the scorecard itself is written to this installation's database (unless
``--no-store``). Exit 0 when every play was safe, 1 when some play was not safe or crashed (each is
listed) or when the model answered in no play at all (every one fell back to the rules planner, so
nothing was measured of the model), 2 bad input, 130/143 interrupted.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from celery import current_app
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import connections

from agent.management.stopping import Stopped, raise_stopped
from agent.model.model_client import ModelConfig
from agent.replay.evaluation import (
    Case,
    EvaluationInputError,
    format_table,
    key_ref,
    load_cases,
    probe,
    run_case,
    score_case,
    store,
    summarize,
)

CHILD_ENV = "WARDEN_EVALUATE_DIR"
TMP_PREFIX = "warden-evaluate-"


def _parser_error(message):
    """argparse errors (an unknown flag, ``--repeat x``) as one line and exit 2."""
    sys.stderr.write(f"evaluate-model: {message}; see manage.py evaluate-model --help\n")
    raise SystemExit(2)


class Command(BaseCommand):
    help = "Score a model over the incident scenarios (docs/model.md, Evaluating a model)."
    requires_system_checks = []
    requires_migrations_checks = False

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.error = _parser_error
        return parser

    def add_arguments(self, parser):
        parser.add_argument("folders", nargs="*", help="folders of replay files to play besides tests/scenarios/")
        parser.add_argument("--base-url", default="", help="the OpenAI-compatible endpoint (default WARDEN_MODEL_BASE_URL)")
        parser.add_argument("--model", default="", help="the model name the server expects (default WARDEN_MODEL)")
        parser.add_argument("--api-key-ref", default="", help="where the key is: an environment variable's name or a file")
        parser.add_argument("--timeout-s", type=float, default=None, help="seconds one model request may take")
        parser.add_argument("--case", action="append", default=[], help="only cases whose file stem matches (glob)")
        parser.add_argument("--no-suite", action="store_true", help="leave tests/scenarios/ out")
        parser.add_argument("--repeat", type=int, default=1, help="plays per case (1-100)")
        parser.add_argument("--json", action="store_true", help="print the evaluation as JSON")
        parser.add_argument("--no-store", action="store_true", help="do not save the scorecard")
        parser.add_argument("--child", default="", help=argparse_suppress())

    def fail(self, line: str) -> None:
        self.stderr.write(f"evaluate-model: {line}")
        raise SystemExit(2)

    def handle(self, *args, **opts):
        if opts["child"]:
            raise SystemExit(self._child(opts["child"]))

        if not 1 <= opts["repeat"] <= 100:
            self.fail(f"--repeat {opts['repeat']}: give 1 to 100 plays per case")
        cfg = self._config(opts, key_ref)
        try:
            cases = load_cases(opts["folders"], suite=not opts["no_suite"], patterns=opts["case"])
            probe(cfg)
        except EvaluationInputError as exc:
            self.fail(str(exc))
        results = self._play(cases, cfg, opts["repeat"])
        ev = summarize(results, model=cfg.model, base_url=cfg.base_url, repeat=opts["repeat"])
        if not opts["no_store"]:
            ev["id"] = store(ev).pk
        if opts["json"]:
            self.stdout.write(json.dumps(ev, indent=1, default=str))
        else:
            self.stdout.write(format_table(ev))
        s = ev["summary"]
        measured = s["unanswered_plays"] < s["plays"] - s["crashes"] or s["plays"] == s["crashes"]
        raise SystemExit(0 if s["safe"] == s["plays"] and measured else 1)

    def _config(self, opts, key_ref):
        """The model to evaluate: the flags, else the settings (``WARDEN_MODEL_*``)."""
        m = settings.MODEL
        base_url = (opts["base_url"] or m["BASE_URL"] or "").strip()
        model = (opts["model"] or m["MODEL"] or "").strip()
        if not base_url or not model:
            self.fail("no model to evaluate: pass --base-url and --model (or set WARDEN_MODEL_BASE_URL and WARDEN_MODEL)")
        if not base_url.startswith(("http://", "https://")):
            self.fail(f"--base-url {base_url[:100]!r} is not an http(s) URL; give the server's endpoint, e.g. http://127.0.0.1:8080/v1")
        if opts["api_key_ref"]:
            ref = key_ref(opts["api_key_ref"])
        elif opts["base_url"]:
            ref = ""  # a server named on the command line gets only the key named with it
        else:
            ref = f"env:{m['API_KEY_ENV']}" if m["API_KEY_ENV"] else f"file:{m['API_KEY_FILE']}" if m["API_KEY_FILE"] else ""
        timeout = opts["timeout_s"] if opts["timeout_s"] is not None else m["TIMEOUT_S"]
        if not 0 < timeout <= 3600:
            self.fail(f"--timeout-s {timeout}: give 0 to 3600 seconds")
        return ModelConfig(base_url=base_url, model=model, key_ref=ref, timeout_s=float(timeout), max_tokens=m["MAX_TOKENS"],
                           temperature=m["TEMPERATURE"], price_in=m["PRICE_IN"], price_out=m["PRICE_OUT"],
                           context_tokens=m.get("CONTEXT_TOKENS", 0), stream=m.get("STREAM", "auto"),
                           tool_results=m.get("TOOL_RESULTS", "tool"))

    # -- the parent: one child plays every case ---------------------------------------------------
    def _play(self, cases, cfg, repeat: int) -> list[dict]:
        """Run the child on a temporary folder; read its results (one JSON line per play). A play
        the child never reported (it died) is scored as a crash."""
        tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")
        plan = [{"name": c.name, "path": str(c.path.resolve()), "source": c.source} for c in cases for _ in range(repeat)]
        Path(tmp, "plan.json").write_text(json.dumps({
            "cases": plan, "config": {k: getattr(cfg, k) for k in ("base_url", "model", "key_ref", "timeout_s", "max_tokens",
                                                                  "temperature", "price_in", "price_out", "context_tokens",
                                                                  "stream", "tool_results")}}))
        previous = {sig: signal.signal(sig, raise_stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
        proc, code = None, None
        try:
            env = dict(os.environ)
            env.update({
                CHILD_ENV: tmp,
                "DATABASE_URL": f"sqlite:///{tmp}/template.sqlite3",
                "HARMONY_DATABASE_URL": f"sqlite:///{tmp}/harmony.sqlite3",
                "WARDEN_VAR_DIR": tmp,
                "WARDEN_SECRET_KEY": "evaluate-throwaway",
                "REDIS_URL": "redis://127.0.0.1:1/0",  # nothing listens on port 1
                "WARDEN_UNATTENDED": "0",
            })
            cmd = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "evaluate-model", "--child", tmp]
            proc = subprocess.Popen(cmd, env=env, cwd=settings.BASE_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True, errors="replace",
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
            other: list[str] = []  # the child's other output (logs; a traceback if it died): kept for the crash line
            for line in proc.stderr:
                line = line.rstrip("\n")
                if line.startswith("evaluate-model: "):
                    self.stderr.write(line)  # progress, one line per play
                elif line.strip():
                    other = (other + [line])[-20:]
            code = proc.wait()
            if code != 0 and other:
                self.stderr.write(f"evaluate-model: the child process ended with exit {code}; its last output: {other[-1][:300]}")
            results = []
            path = Path(tmp, "results.jsonl")
            if path.exists():
                results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except KeyboardInterrupt:
            self.stderr.write("evaluate-model: interrupted; the cases were stopped and their temporary folder removed")
            raise SystemExit(130) from None
        except Stopped as exc:
            self.stderr.write(f"evaluate-model: stopped by signal {exc.signum}; the temporary folder was removed")
            raise SystemExit(128 + exc.signum) from None
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            shutil.rmtree(tmp, ignore_errors=True)

        for p in plan[len(results):]:
            r = score_case(Case(p["name"], Path(p["path"]), p["source"]), None, None, None,
                           crash=f"the evaluation process ended (exit {code}) before this case finished")
            results.append(r)
        return results

    # -- the child: every play on its own fresh database -----------------------------------------
    def _child(self, tmp: str) -> int:
        if os.environ.get(CHILD_ENV) != tmp:
            self.stderr.write("evaluate-model: --child is the command's own; run it without")
            return 2
        for alias in ("default", "harmony"):
            name = str(settings.DATABASES[alias]["NAME"])
            if not name.startswith(tmp):
                self.stderr.write(f"evaluate-model: refusing to run: database {alias!r} is {name}, not a throwaway file")
                return 2
        current_app.conf.broker_url = "memory://"
        plan = json.loads(Path(tmp, "plan.json").read_text())
        cfg = ModelConfig(**plan["config"])
        template = str(settings.DATABASES["default"]["NAME"])
        call_command("migrate", verbosity=0, interactive=False)
        connections["default"].close()
        out = Path(tmp, "results.jsonl")
        total = len(plan["cases"])
        for n, p in enumerate(plan["cases"], 1):
            case_db = str(Path(tmp, "case.sqlite3"))
            shutil.copyfile(template, case_db)
            connections["default"].settings_dict["NAME"] = case_db
            try:
                result = run_case(Case(p["name"], Path(p["path"]), p["source"]), cfg)
            finally:
                connections["default"].close()
            with out.open("a") as f:
                f.write(json.dumps(result, default=str) + "\n")
            verdict = "crash" if result["crash"] else ("safe" if result["safe"] else "UNSAFE")
            right = {True: "right", False: "not right", None: "not judged"}[result["right"]]
            self.stderr.write(f"evaluate-model: {n}/{total} {p['name']}: {verdict}, {right}, {result['refused']} refused, "
                              f"{result['wall_s']:.1f} s")
        return 0


def argparse_suppress():
    return argparse.SUPPRESS
