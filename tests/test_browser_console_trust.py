"""The console an operator can trust, in a real browser at desktop (1280 px) and phone (390 px)
width: an idle page stays quiet, and what the pages say adds up.

Real parts: daphne (``ChannelsLiveServerTestCase``) on the test databases, the Redis channel layer,
Chromium (``/usr/bin/chromium``) driven by Playwright. Set ``WARDEN_SCREENSHOTS=<dir>`` to keep a
PNG of the pages looked at.
"""

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from agent.models import Approval, MemoryFact
from fleet.models import DemandSample, Instance
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase

WIDTHS = {"desktop": 1280, "phone": 390}
#: every page of the navigation (and an instance's), each left open while idle
MAIN_PAGES = {"memory": "/memory/", "dashboard": "/", "fleet": "/fleet/", "runs": "/runs/", "approvals": "/approvals/", "alerts": "/alerts/",
              "actions": "/actions/", "performance": "/performance/", "traces": "/traces/",
              "settings": "/settings/", "notifications": "/notifications/", "instance": "/instances/local-1/",
              "timeline": "/instances/local-1/timeline/"}
#: requests an idle page may send in :data:`IDLE_S` seconds once it is live (a poll, a resync)
IDLE_BUDGET = 4
IDLE_S = 5


def shoot(page, name: str) -> None:
    if shots := os.environ.get("WARDEN_SCREENSHOTS"):
        Path(shots).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=f"{shots}/{name}.png", full_page=True)


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.integration
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestIdlePagesStayQuiet(FleetBrowserTestCase):
    def setUp(self):
        super().setUp()
        now = timezone.now()
        Instance.objects.create(provider="local", external_id="local-1", label="warden", worker_name="local-1",
                                status="running", intended_status="running", pid=4001, status_since=now,
                                created_at=now, gpu_name="local-cpu", dph=0.1)
        DemandSample.objects.create(taken_at=now - timedelta(seconds=5), state="ok", queued=0, running=0,
                                    workers_live=1, workers_expected=1, workers_dead=0, proofs_hr=0.0)
        MemoryFact.objects.create(category="ops", key="k", value="a remembered fact", kind="fact", importance=0.5,
                                  source="operator", created_at=now)

    def test_no_page_sends_more_than_a_handful_of_requests_while_idle(self):
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/", [])
                sent = []
                page.on("request", lambda r: sent.append(r.url))
                for name, path in MAIN_PAGES.items():
                    page.goto(self.live_server_url + path)
                    page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                    page.wait_for_timeout(1500)  # the resync on connect (sleep would hold back the events)
                    sent.clear()
                    page.wait_for_timeout(IDLE_S * 1000)
                    assert len(sent) <= IDLE_BUDGET, (name, len(sent), sent[:10])
            finally:
                browser.close()


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.integration
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestApprovalKeys(FleetBrowserTestCase):
    """On /approvals/: after j, r, a comment and Enter the cursor is on the next waiting card, so
    a approves it; a on a decided card says why nothing happened."""

    def setUp(self):
        super().setUp()
        from tests.test_browser_console_ux import park

        self.approvals = park(3)

    def test_after_a_decision_the_cursor_is_on_the_next_waiting_card(self):
        from playwright.sync_api import sync_playwright

        first, second, _ = self.approvals
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/approvals/", [])
                page.set_viewport_size({"width": 1280, "height": 900})
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                page.wait_for_timeout(1500)  # let the resync on connect redraw the cards first
                page.keyboard.press("j")
                assert page.get_attribute(f"#approval-{first.pk}", "aria-current") == "true"
                page.keyboard.press("r")
                page.wait_for_function("document.activeElement && document.activeElement.name === 'comment'")
                page.keyboard.type("not now: the queue is filling")
                page.keyboard.press("Enter")
                page.wait_for_timeout(2000)
                shoot(page, "approvals-after-enter")
                page.wait_for_selector(f"#approval-{first.pk}.approval-rejected", timeout=15_000)
                page.wait_for_selector(f"#approval-{second.pk}[aria-current=true]", timeout=15_000)
                page.wait_for_timeout(1500)  # the live re-fetch that moves the decided card down
                assert page.get_attribute(f"#approval-{second.pk}", "aria-current") == "true"
                shoot(page, "approvals-keys-desktop")
                page.keyboard.press("a")
                page.wait_for_selector(f"#approval-{second.pk}.approval-approved", timeout=15_000)
                # a on a decided card: said, not silent
                page.set_viewport_size({"width": 390, "height": 844})
                page.evaluate(f"document.getElementById('approval-{first.pk}').focus()")
                page.keyboard.press("k")  # from wherever the cursor is, k moves towards the decided cards
                for _ in range(4):
                    cur = page.evaluate("(document.querySelector('.key-current') || {}).id")
                    if cur == f"approval-{first.pk}":
                        break
                    page.keyboard.press("j")
                assert page.evaluate("document.querySelector('.key-current').id") == f"approval-{first.pk}"
                page.keyboard.press("a")
                page.wait_for_selector("#key-note", timeout=5_000)
                assert f"approval {first.pk} is rejected: nothing to approve" in page.inner_text("#key-note")
                shoot(page, "approvals-keys-phone")
            finally:
                browser.close()
        statuses = dict(Approval.objects.values_list("pk", "status"))
        assert statuses[first.pk] == "rejected" and statuses[second.pk] == "approved"


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.integration
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestPhone(FleetBrowserTestCase):
    """At 390 px the header folds behind "menu" and the fleet's actions are on screen; a long label
    is shortened with the full value on hover."""

    def setUp(self):
        super().setUp()
        now = timezone.now()
        for i in range(1, 4):
            Instance.objects.create(provider="local", external_id=f"local-{i}", label="a-forty-character-label-for-this-machine",
                                    worker_name=f"local-{i}", status="running", intended_status="running", pid=4000 + i,
                                    status_since=now, created_at=now, gpu_name="local-cpu", dph=0.1)

    def test_the_header_folds_and_the_fleet_actions_are_reachable(self):
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/fleet/", [])
                page.set_viewport_size({"width": 1280, "height": 900})
                page.goto(self.live_server_url + "/fleet/")
                assert page.is_visible("#nav-main") and not page.is_visible("#nav-toggle")
                shoot(page, "fleet-desktop")
                page.set_viewport_size({"width": 390, "height": 844})
                page.goto(self.live_server_url + "/fleet/")
                header = page.eval_on_selector("header.topbar", "e => e.getBoundingClientRect().height")
                assert header < 80, header
                assert not page.is_visible("#nav-main")
                act = page.eval_on_selector("#fleet td.act summary, td.act summary", "e => e.getBoundingClientRect().right")
                assert act <= 390, act
                label = page.eval_on_selector(".label-short", "e => [e.title, e.getBoundingClientRect().height]")
                assert label[0] == "a-forty-character-label-for-this-machine" and label[1] < 40, label
                shoot(page, "fleet-phone")
                page.click("#nav-toggle")
                assert page.is_visible("#nav-main") and page.get_attribute("#nav-toggle", "aria-expanded") == "true"
                shoot(page, "fleet-phone-menu")
            finally:
                browser.close()
