"""``make run`` under supervisor: one dead process does not take the console down.

The stack is started exactly as an operator starts it — ``make run`` in its own session, with the
embedded defaults (SQLite and the bundled Redis under a temporary ``WARDEN_VAR_DIR``, free ports) —
then the Celery worker and beat are SIGKILLed in turn: the console keeps answering, ``/healthz``
names what is down meanwhile, and supervisor brings the dead process back (a new pid, ``RUNNING``,
``/healthz`` 200 again) within 30 s. Ctrl-C (SIGINT to the session) then stops every process.
"""

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import psutil
import pytest

from console.health import supervised_processes
from tests.subprocs import ROOT, free_port

pytestmark = pytest.mark.slow

BACK_WITHIN_S = 30


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class MakeRun:
    """A running ``make run``: its process, port, var dir and supervisor socket."""

    def __init__(self, var, port: int, redis_port: int):
        self.var, self.port = var, port
        self.url = f"http://127.0.0.1:{port}"
        self.sock = f"unix://{var}/supervisor/supervisor.sock"
        self.log = var / "make-run.log"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("DATABASE_URL", "HARMONY_DATABASE_URL", "REDIS_URL", "WARDEN_TEST_DB_NAME",
                                 "DJANGO_SETTINGS_MODULE", "SUPERVISOR_SERVER_URL", "MAKEFLAGS", "MAKELEVEL")}
        self.env.update({"WARDEN_VAR_DIR": str(var), "WARDEN_PORT": str(port), "WARDEN_EMBEDDED_REDIS_PORT": str(redis_port),
                         "WARDEN_CELERY_QUEUE": f"warden-makerun-{port}", "WARDEN_MAX_INSTANCES": "0",
                         "WARDEN_ADMIN_PASSWORD": "make-run-test-pass-1"})
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen([shutil.which("make") or "make", "run"], cwd=ROOT, env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def processes(self) -> dict[str, dict]:
        return {p["name"]: p for p in supervised_processes(self.sock) or []}

    def health(self) -> tuple[int, dict]:
        status, body = _get(f"{self.url}/healthz")
        return status, json.loads(body)

    def wait_healthy(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"make run exited ({self.proc.returncode}):\n{self.output()}"
            try:
                status, body = self.health()
                last = body
                if status == 200:
                    return body
            except (OSError, ValueError):
                pass
            time.sleep(1)
        raise AssertionError(f"/healthz never answered 200: {last}\n{self.output()}")

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for info in self.processes().values():  # supervisor already gone: its children may not be
            if info.get("pid"):
                try:
                    os.killpg(info["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "manage.py", "bootstrap", "--stop-workers", "--stop-redis"],
                       cwd=ROOT, env=self.env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def make_run(tmp_path_factory):
    stack = MakeRun(tmp_path_factory.mktemp("mr"), free_port(), free_port())
    stack.start()
    try:
        stack.wait_healthy(300)  # bootstrap migrates a new SQLite database first
        yield stack
    finally:
        stack.cleanup()


def _kill_and_watch(stack: MakeRun, name: str, named_down: set[str]) -> None:
    """SIGKILL supervised program ``name``; assert the console answers throughout, /healthz names
    one of ``named_down`` meanwhile and the program is back (new pid, RUNNING, /healthz 200)."""
    before = stack.processes()[name]
    assert before["statename"] == "RUNNING", before
    os.kill(before["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    seen_down: set[str] = set()
    back = False
    while time.monotonic() - killed_at < BACK_WITHIN_S:
        status, _ = _get(f"{stack.url}/login/")
        assert status == 200, f"the console stopped answering after {name} died"
        code, body = stack.health()
        seen_down |= set(body["down"]) & named_down
        now = stack.processes().get(name, {})
        if code == 200 and now.get("statename") == "RUNNING" and now.get("pid") not in (None, before["pid"]):
            back = True
            break
        time.sleep(0.3)
    assert back, f"{name} was not back within {BACK_WITHIN_S} s: {stack.processes().get(name)}\n{stack.output()}"
    assert seen_down, f"/healthz never named {sorted(named_down)} down while {name} was dead"
    assert stack.processes()["web"]["pid"] != 0 and stack.proc.poll() is None


def test_a_killed_worker_is_restarted_while_the_console_keeps_serving(make_run):
    web_pid = make_run.processes()["web"]["pid"]
    _kill_and_watch(make_run, "worker", {"celery", "process:worker"})
    assert make_run.processes()["web"]["pid"] == web_pid  # daphne kept serving: never restarted


def test_a_killed_beat_is_restarted_while_the_console_keeps_serving(make_run):
    web_pid = make_run.processes()["web"]["pid"]
    _kill_and_watch(make_run, "beat", {"beat", "process:beat"})
    assert make_run.processes()["web"]["pid"] == web_pid


def test_the_login_lockout_holds_under_daphne(make_run):
    """The throttle on the real ASGI path (daphne runs axes' middleware async): the right password
    after too many wrong ones is refused with the login page's lockout line."""
    import httpx
    from django.conf import settings

    def attempt(password: str) -> httpx.Response:
        with httpx.Client(base_url=make_run.url, timeout=10) as client:
            client.get("/login/")
            return client.post("/login/", data={"username": "operator", "password": password,
                                                "csrfmiddlewaretoken": client.cookies["csrftoken"]},
                               headers={"Referer": f"{make_run.url}/login/"})

    codes = [attempt(f"wrong-{i}").status_code for i in range(settings.AXES_FAILURE_LIMIT)]
    assert codes[-1] == 429 and set(codes[:-1]) == {200}, codes
    resp = attempt(make_run.env["WARDEN_ADMIN_PASSWORD"])
    assert resp.status_code == 429 and "sessionid" not in resp.cookies
    assert 'id="login-locked"' in resp.text and "even with the right password" in resp.text


def test_ctrl_c_stops_every_process(make_run):
    pids = [p["pid"] for p in make_run.processes().values()]
    assert len(pids) == 3 and all(pids)
    os.killpg(make_run.proc.pid, signal.SIGINT)  # what a terminal sends the foreground group on Ctrl-C
    make_run.proc.wait(timeout=30)

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 15
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)], make_run.output()
    assert "Warden console stopped." in make_run.output()
