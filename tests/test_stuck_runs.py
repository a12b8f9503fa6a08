"""A run whose process is gone never leaves the agent stuck: interrupted mid-call (Ctrl-C is a
``KeyboardInterrupt``; SIGTERM and SIGKILL end the process with no clean-up), it is failed with a
report — by the process itself when it can, else by the next cycle — on SQLite and PostgreSQL; a
chat message queued behind it is answered; ``/healthz`` names the stuck run meanwhile.

The interrupted run is a real child process (``tests/cycle_child.py``) whose ``llm`` planner
waits on a model stand-in that never answers (``agent/model/model_standin.py``), so it is stopped
inside that call."""

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta

import pytest

from agent.model.model_standin import StandIn
from agent.models import Run, SessionState
from agent.planners.rules import RulesPlanner
from agent.runtime.loop import run_cycle
from fleet.clock import clock
from tests import fleet_support
from tests.fleet_support import FLEET_DB, wait_for
from tests.subprocs import ROOT, test_db_env

local_fleet = fleet_support.local_fleet
CHILD = [sys.executable, str(ROOT / "tests" / "cycle_child.py")]


def _env(tmp_path, database: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "HARMONY_DATABASE_URL", "WARDEN_MODEL_BASE_URL",
                                                           "WARDEN_MODEL")}
    env.update({"WARDEN_VAR_DIR": str(tmp_path / "var"), "WARDEN_PROVIDER": "local", "WARDEN_DEMAND_SOURCE": "local",
                "WARDEN_EVENT_TRIGGERS": "0", "WARDEN_MODEL_TIMEOUT_S": "120"})
    if database == "postgres":
        env.update(test_db_env())
    else:
        from django.conf import settings

        env["REDIS_URL"] = settings.REDIS_URL
    env.update(extra)
    return env


def _child(env: dict, *args: str, timeout: float = 120) -> str:
    out = subprocess.run([*CHILD, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, f"cycle_child {args} failed:\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.mark.slow
@FLEET_DB
@pytest.mark.parametrize("database", ["sqlite", "postgres"])
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_run_interrupted_mid_call_is_failed_with_a_report_and_the_queued_message_answered(tmp_path, database, how):
    (tmp_path / "var").mkdir()
    env = _env(tmp_path, database)
    if database == "sqlite":
        _child(env, "migrate", timeout=300)
    with StandIn([{"timeout": True}]) as standin:
        cycle_env = {**env, "WARDEN_MODEL_BASE_URL": standin.base_url, "WARDEN_MODEL": "stand-in"}
        proc = subprocess.Popen([*CHILD, "cycle"], cwd=ROOT, env=cycle_env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: standin.requests or proc.poll() is not None, timeout=90, what="the run to call the model")
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            _child(env, "post", "how many workers are live?")  # queued behind the hung run
            proc.send_signal(getattr(signal, how))
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "Traceback" not in err or how == "SIGINT", err[-2000:]

    state = json.loads(_child(env, "state").strip().splitlines()[-1])
    first, chat = state["runs"][0], state["runs"][1]
    assert first["status"] == "failed" and first["report"]
    if how == "SIGINT":  # the process failed its own run on the way out
        assert first["halt_detail"].startswith("interrupted (KeyboardInterrupt)")
        assert state["health"]["up"] is True
    else:  # gone without clean-up: /healthz named it, the next cycle failed it
        assert "died mid-run" in first["halt_detail"]
        assert state["health"]["up"] is False and f"run {first['number']} is running" in state["health"]["detail"]
        assert "holder" in state["health"]["detail"] and "is dead" in state["health"]["detail"]
    assert chat["trigger"] == "chat" and chat["message"] == "how many workers are live?"
    assert chat["status"] == "done" and chat["report"]  # answered, not queued for ever
    assert state["lock"] == ""


@pytest.mark.slow
@FLEET_DB
@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_a_run_left_running_with_the_lock_free_is_told_apart_and_failed_on_either_database(tmp_path, database):
    """What an interrupt whose own failure write did not get through leaves: the run ``running``,
    the lock free. Claiming then meets ``one_running_run`` — on SQLite the error names the columns
    (``UNIQUE constraint failed: agent_run.status``), and it is still read as "busy"."""
    (tmp_path / "var").mkdir()
    env = _env(tmp_path, database)
    if database == "sqlite":
        _child(env, "migrate", timeout=300)
    _child(env, "orphan")
    assert _child(env, "claim").startswith("busy: another run is still running")
    _child(env, "post", "status please")
    state = json.loads(_child(env, "state").strip().splitlines()[-1])
    assert state["health"]["up"] is False and "no process holds the run lock" in state["health"]["detail"]
    orphan, chat = state["runs"][0], state["runs"][1]
    assert orphan["status"] == "failed" and "let go of the run lock without closing the run" in orphan["halt_detail"]
    assert orphan["report"]
    assert chat["status"] == "done" and chat["message"] == "status please"


@FLEET_DB
def test_healthz_names_a_stuck_run_and_the_next_cycle_fails_it(client, alice, local_fleet):
    client.force_login(alice)  # an anonymous caller gets the status and names only
    run = Run.objects.create(number=7, trigger="heartbeat", planner="rules", status="running", started_at=clock.now())
    body = client.get("/healthz").json()
    assert "runs" in body["down"]
    assert body["checks"]["runs"]["detail"].startswith("run 7 is running since") and "no process holds the run lock" in \
        body["checks"]["runs"]["detail"]
    ran = run_cycle("heartbeat", planner=RulesPlanner())
    run.refresh_from_db()
    assert run.status == "failed" and run.final_report and ran.status == "done"
    assert client.get("/healthz").json()["checks"]["runs"] == {"up": True, "detail": ""}


@FLEET_DB
def test_a_running_run_whose_lock_is_held_by_a_live_process_is_not_stuck(client, alice, local_fleet):
    """Near miss: a run working under a live lock holder (this process) is not called stuck."""
    client.force_login(alice)
    from agent.runtime.runs import acquire_lock, release_lock

    token = acquire_lock(ttl_s=600)
    try:
        Run.objects.create(number=8, trigger="heartbeat", planner="rules", status="running", started_at=clock.now())
        assert client.get("/healthz").json()["checks"]["runs"]["up"] is True
        state = SessionState.get()
        SessionState.objects.filter(pk=1).update(lock_expires_at=clock.now() - timedelta(seconds=1))
        detail = client.get("/healthz").json()["checks"]["runs"]["detail"]
        assert "its run lock lapsed" in detail, state.lock_expires_at
    finally:
        release_lock(token)

