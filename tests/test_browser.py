"""The console in a real browser: log in, see the fleet, press "Trigger observe cycle now", and watch the
new run appear without a reload, pushed over the real websocket.

Real parts: daphne (``ChannelsLiveServerTestCase``, a separate process) on the test databases, the
Redis channel layer (a unique prefix), a real Celery worker subprocess that runs the cycle, and
Chromium (``/usr/bin/chromium``, headless) driven by Playwright. The agent is put in observe-only
mode so the cycle launches nothing.
"""

import json
from pathlib import Path

import pytest
from django.utils import timezone

from agent.models import Run, SessionState
from fleet.models import Instance
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase


@pytest.mark.browser
@pytest.mark.integration
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestConsoleInABrowser(FleetBrowserTestCase):
    def setUp(self):
        super().setUp()
        now = timezone.now()
        Instance.objects.create(provider="local", external_id="local-7", label="browser-worker", status="running",
                                status_since=now, created_at=now, gpu_name="RTX 4090")
        state = SessionState.get()
        state.observe_only = True  # the cycle proposes; nothing executes
        state.save()

    def test_it_shows_a_new_run_without_a_reload(self):
        from playwright.sync_api import sync_playwright

        assert not Run.objects.exists()
        frames: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/", frames)

                # the fleet is there, and the live socket is up
                page.wait_for_selector("#fleet >> text=browser-worker")
                assert "RTX 4090" in page.inner_text("#fleet")
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                page.evaluate("window.__noReload = 'still here'")

                page.click("text=Trigger observe cycle now")
                page.wait_for_selector("#controls >> text=observe cycle queued")
                # no worker yet: the asked-for cycle waits as a queued run, nothing has run
                page.wait_for_selector("#runs #run-1 .status-queued")
                assert page.query_selector("#runs #run-1 .status-done") is None

                # only now a worker takes the task; its end can reach the page only over the socket
                self.start_celery_worker()
                page.wait_for_selector("#runs #run-1 .status-done", timeout=60_000)
                row = page.inner_text("#runs #run-1")
                assert "operator" in row
                assert page.evaluate("window.__noReload") == "still here"
                triggers = [json.loads(f).get("trigger") for f in frames if f.startswith("{")]
                assert "runs-changed" in triggers, frames
            finally:
                browser.close()
