"""The console in a real browser: log in, see the fleet, press "Trigger observe cycle now", and watch the
new run appear without a reload, pushed over the real websocket.

Real parts: daphne (``ChannelsLiveServerTestCase``, a separate process) on the test databases, the
Redis channel layer (a unique prefix), a real Celery worker subprocess that runs the cycle, and
Chromium (``/usr/bin/chromium``, headless) driven by Playwright. The agent is put in observe-only
mode so the cycle launches nothing.
"""

import json
import os
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from channels.testing import ChannelsLiveServerTestCase
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connections
from django.test.utils import override_settings
from django.utils import timezone

from agent.models import Run, SessionState
from fleet.models import Instance
from tests.console_support import purge_broker
from tests.subprocs import BIN, ROOT, test_db_env

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
PREFIX = f"warden-test-{uuid.uuid4().hex[:8]}"


@pytest.mark.browser
@pytest.mark.integration
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestConsoleInABrowser(ChannelsLiveServerTestCase):
    databases = {"default", "harmony"}

    @classmethod
    def setUpClass(cls):
        # the daphne child re-derives the test database name; give it the one already in use
        settings.DATABASES["default"]["TEST"]["NAME"] = settings.DATABASES["default"]["NAME"]
        layers = {"default": {**settings.CHANNEL_LAYERS["default"],
                              "CONFIG": {**settings.CHANNEL_LAYERS["default"]["CONFIG"], "prefix": PREFIX}}}
        cls._layers = override_settings(CHANNEL_LAYERS=layers)
        cls._layers.enable()
        connections.close_all()  # the server process is forked: share no open connection
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls._layers.disable()

    def setUp(self):
        alice = User.objects.create_user("alice", password="alice-pass-1")
        alice.groups.add(Group.objects.get_or_create(name="operators")[0])
        now = timezone.now()
        Instance.objects.create(provider="local", external_id="local-7", label="browser-worker", status="running",
                                status_since=now, created_at=now, gpu_name="RTX 4090")
        state = SessionState.get()
        state.observe_only = True  # the cycle proposes; nothing executes
        state.save()
        purge_broker()
        self.var_dir = tempfile.mkdtemp(prefix="warden-browser-")
        self.worker = None

    def tearDown(self):
        if self.worker is not None:
            self.worker.terminate()
            try:
                self.worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.worker.kill()
        purge_broker()

    def start_celery_worker(self) -> None:
        env = {**os.environ, **test_db_env(), "WARDEN_CHANNEL_PREFIX": PREFIX, "WARDEN_VAR_DIR": self.var_dir,
               "DJANGO_SETTINGS_MODULE": "console.settings"}
        self.worker = subprocess.Popen(
            [str(BIN / "celery"), "-A", "console", "worker", "-Q", settings.CELERY_TASK_DEFAULT_QUEUE,
             "--pool", "solo", "--without-mingle", "--without-gossip", "-n", f"browser-{PREFIX}@%h",
             "--loglevel", "WARNING"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(Path(self.var_dir) / "celery.log", "w"),
        )

    def test_it_shows_a_new_run_without_a_reload(self):
        from playwright.sync_api import sync_playwright

        assert not Run.objects.exists()
        frames: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.on("websocket", lambda ws: ws.on("framereceived", lambda data: frames.append(str(data))))
                page.goto(self.live_server_url + "/")
                page.fill("input[name=username]", "alice")
                page.fill("input[name=password]", "alice-pass-1")
                page.click("button[type=submit]")
                page.wait_for_url(self.live_server_url + "/")

                # the fleet is there, and the live socket is up
                page.wait_for_selector("#fleet >> text=browser-worker")
                assert "RTX 4090" in page.inner_text("#fleet")
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                page.evaluate("window.__noReload = 'still here'")

                page.click("text=Trigger observe cycle now")
                page.wait_for_selector("#controls >> text=observe cycle queued")
                assert page.query_selector("#run-1") is None  # no worker yet: nothing has run

                # only now a worker takes the task; the run can reach the page only over the socket
                self.start_celery_worker()
                page.wait_for_selector("#runs #run-1", timeout=60_000)
                row = page.inner_text("#runs #run-1")
                assert "operator" in row
                assert page.evaluate("window.__noReload") == "still here"
                triggers = [json.loads(f).get("trigger") for f in frames if f.startswith("{")]
                assert "runs-changed" in triggers, frames
            finally:
                browser.close()
