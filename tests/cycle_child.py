"""A child process for tests that interrupt or kill a run: ``python tests/cycle_child.py MODE``.

Its databases and settings come from its environment (SQLite under ``WARDEN_VAR_DIR`` when
``DATABASE_URL`` is unset, or the test session's PostgreSQL). Modes:

- ``migrate``: migrate the default database (a fresh SQLite file);
- ``cycle``: one observe cycle with the configured planner (the ``llm`` planner against the model
  stand-in at ``WARDEN_MODEL_BASE_URL``, which never answers: the run hangs mid-call);
- ``post TEXT``: an operator's chat message, queued behind the running run;
- ``orphan``: a run left ``running`` with the lock free (what an interrupt whose own failure write
  did not get through leaves behind);
- ``claim``: ``claim_run`` while a run is ``running`` (prints ``busy`` when it is told apart);
- ``state``: the health check of runs, then one heartbeat cycle (rules planner), then every run
  and the lock as JSON on stdout.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

import django  # noqa: E402

django.setup()


def main(mode: str, *rest: str) -> None:
    from agent.models import Run, SessionState

    if mode == "migrate":
        from django.core.management import call_command

        call_command("migrate", database="default", interactive=False, verbosity=0)
    elif mode == "cycle":
        from agent.runtime.loop import run_cycle

        run_cycle("test")
    elif mode == "post":
        from agent.actions.runs import do_post_message

        do_post_message(rest[0], "user:alice")
    elif mode == "orphan":
        from django.db import transaction

        from agent.runtime.runs import _next_run_number
        from fleet.clock import clock

        with transaction.atomic():
            number, epoch = _next_run_number()
            Run.objects.create(number=number, epoch=epoch, trigger="test", planner="llm", status="running",
                               started_at=clock.now())
    elif mode == "claim":
        from agent.runtime.runs import RunBusy, claim_run

        try:
            claim_run("test", None)
        except RunBusy as exc:
            print(f"busy: {exc}")
    elif mode == "state":
        from agent.planners.rules import RulesPlanner
        from agent.runtime.loop import run_cycle
        from console.health import check_runs

        health = check_runs()
        run_cycle("heartbeat", planner=RulesPlanner())
        lock = SessionState.get()
        runs = [{"number": r.number, "status": r.status, "trigger": r.trigger, "halt_detail": r.halt_detail,
                 "report": r.final_report, "answer": r.final_answer,
                 "message": r.steps.filter(kind="message").values_list("text", flat=True).first()}
                for r in Run.objects.order_by("number")]
        print(json.dumps({"health": health, "runs": runs, "lock": lock.lock_token}))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
