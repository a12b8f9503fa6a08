"""Shared set-up for browser tests that need the live fleet: daphne, Redis layer, Celery, local workers.

``FleetBrowserTestCase`` runs daphne (``ChannelsLiveServerTestCase``) with the Redis channel layer
under a prefix of its own, points ``VAR_DIR`` at a temporary folder, applies the class's
``WARDEN`` settings, and at teardown ends the Celery worker it started and every local worker.
"""

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from channels.testing import ChannelsLiveServerTestCase
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connections
from django.test.utils import override_settings

from tests.console_support import purge_broker
from tests.fleet_support import clear_harmony, kill_recorded_worker
from tests.subprocs import BIN, ROOT, test_db_env

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
FLEET_WARDEN = {"PROVIDER": "local", "DEMAND_SOURCE": "local", "STARTUP_GRACE_S": 0, "HEARTBEAT_S": 1,
                "PROOF_SECONDS": 1.0, "STOP_GRACE_S": 2.0}


class FleetBrowserTestCase(ChannelsLiveServerTestCase):
    """Base class; subclasses set ``warden`` (settings.WARDEN overrides) and ``worker_env``."""

    databases = {"default", "harmony"}
    warden: dict = {}
    worker_env: dict = {}

    @classmethod
    def setUpClass(cls):
        # the daphne child re-derives the test database name; give it the one already in use
        settings.DATABASES["default"]["TEST"]["NAME"] = settings.DATABASES["default"]["NAME"]
        cls.prefix = f"warden-test-{uuid.uuid4().hex[:8]}"
        layers = {"default": {**settings.CHANNEL_LAYERS["default"],
                              "CONFIG": {**settings.CHANNEL_LAYERS["default"]["CONFIG"], "prefix": cls.prefix}}}
        cls.var_dir = Path(tempfile.mkdtemp(prefix="warden-browser-"))
        warden = {**settings.WARDEN, **FLEET_WARDEN, **cls.warden}
        cls._overrides = override_settings(CHANNEL_LAYERS=layers, VAR_DIR=cls.var_dir, WARDEN=warden)
        cls._overrides.enable()
        connections.close_all()  # the server process is forked: share no open connection
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls._overrides.disable()
        shutil.rmtree(cls.var_dir, ignore_errors=True)

    def setUp(self):
        alice = User.objects.create_user("alice", password="alice-pass-1")
        alice.groups.add(Group.objects.get_or_create(name="operators")[0])
        clear_harmony()
        purge_broker()
        self.worker = None

    def tearDown(self):
        from fleet.providers.local import LocalProvider

        if self.worker is not None:
            self.worker.terminate()
            try:
                self.worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.worker.kill()
        provider = LocalProvider()
        for meta in sorted((self.var_dir / "workers").glob("local-*.json")):
            if not meta.name.endswith(".run.json"):
                try:
                    provider.destroy(meta.name[: -len(".json")])
                except Exception:  # noqa: BLE001 — never leave a worker process behind
                    kill_recorded_worker(meta.with_name(meta.name[: -len(".json")] + ".run.json"))
        clear_harmony()
        purge_broker()

    def start_celery_worker(self) -> None:
        """A real Celery worker on the test databases, this class's channel prefix and var dir."""
        env = {**os.environ, **test_db_env(), "WARDEN_CHANNEL_PREFIX": self.prefix, "WARDEN_VAR_DIR": str(self.var_dir),
               "WARDEN_PROVIDER": "local", "WARDEN_DEMAND_SOURCE": "local", "WARDEN_STARTUP_GRACE_S": "0",
               "DJANGO_SETTINGS_MODULE": "console.settings", **self.worker_env}
        self.worker = subprocess.Popen(
            [str(BIN / "celery"), "-A", "console", "worker", "-Q", settings.CELERY_TASK_DEFAULT_QUEUE,
             "--pool", "solo", "--without-mingle", "--without-gossip", "-n", f"{self.prefix}@%h",
             "--loglevel", "WARNING"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(self.var_dir / "celery.log", "w"),
        )

    def log_in(self, browser, path: str, frames: list[str], *, bypass_csp: bool = False):
        """A new page logged in as alice at ``path``; every websocket frame it receives goes to ``frames``.
        ``bypass_csp``: the page ignores the Content-Security-Policy (a test that injects a script)."""
        page = browser.new_page(bypass_csp=bypass_csp)
        page.on("websocket", lambda ws: ws.on("framereceived", lambda data: frames.append(str(data))))
        page.goto(self.live_server_url + path)
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", "alice-pass-1")
        page.click("button[type=submit]")
        page.wait_for_url(self.live_server_url + path)
        return page
