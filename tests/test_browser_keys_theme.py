"""In a real browser: the keyboard (j/k move, a approves, r opens the reject comment box, / searches,
? lists the keys) on the approvals inbox, and the colour theme (system, light, dark), remembered
per browser.

Real parts: daphne (``ChannelsLiveServerTestCase``), the Redis channel layer, Chromium
(``/usr/bin/chromium``) driven by Playwright; the two approvals are parked by a real cycle (script
planner) in this process.
"""

from pathlib import Path

import pytest

from agent.models import Approval
from agent.planners.script import ScriptPlanner
from agent.runtime.loop import run_cycle
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase

DARK_BG = "rgb(15, 17, 21)"
LIGHT_BG = "rgb(247, 247, 248)"


def _bg(page) -> str:
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestKeysAndTheme(FleetBrowserTestCase):
    def park_two_launches(self) -> tuple[Approval, Approval]:
        from fleet import demo

        demo.enqueue(1)
        run = run_cycle("operator", planner=ScriptPlanner([{"parallel": [
            {"tool": "launch_instance", "args": {"gpu_name": "local-cpu", "launch_priority": "P1", "reason": "queue grows"}},
            {"tool": "launch_instance", "args": {"gpu_name": "local-cpu", "launch_priority": "P2", "reason": "spare"}},
        ]}]))
        first, second = Approval.objects.filter(run=run).order_by("created_at", "pk")
        return first, second

    def test_j_k_a_r_and_slash_on_the_lists(self):
        from playwright.sync_api import sync_playwright  # its loop runs in this thread: no ORM inside the block

        first, second = self.park_two_launches()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/approvals/", [])
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                cards = page.locator("#approvals article.approval")
                top, below = cards.nth(0).get_attribute("id"), cards.nth(1).get_attribute("id")
                page.keyboard.press("j")
                assert page.get_attribute(f"#{top}", "class").count("key-current") == 1
                page.keyboard.press("j")
                assert "key-current" in page.get_attribute(f"#{below}", "class")
                assert "key-current" not in page.get_attribute(f"#{top}", "class")
                page.keyboard.press("k")
                assert "key-current" in page.get_attribute(f"#{top}", "class")

                page.keyboard.press("a")  # approve the current card
                page.wait_for_selector(f"#{top} >> text=approved by alice")

                page.wait_for_selector(f"#{below} .reject-form input[name=comment]")
                page.click("h1")  # nothing focused; the current card is kept by id across the re-fetch
                # the decided card may have moved below the waiting one ("Recently decided"): walk to it
                for key in ["k"] * 3 + ["j"] * 3:
                    if "key-current" in (page.get_attribute(f"#{below}", "class") or ""):
                        break
                    page.keyboard.press(key)
                page.keyboard.press("r")  # the comment box of the current card
                assert page.evaluate("document.activeElement.name") == "comment"
                assert page.evaluate("document.activeElement.closest('article').id") == below
                page.keyboard.type("P2 can wait")  # typed keys go to the box, not to the shortcuts
                page.keyboard.press("Enter")
                page.wait_for_selector(f"#{below} >> text=rejected by alice")

                page.keyboard.press("?")
                assert page.is_visible("#key-help")
                page.keyboard.press("Escape")
                assert not page.is_visible("#key-help")

                page.goto(self.live_server_url + "/memory/")
                page.keyboard.press("/")
                assert page.evaluate("document.activeElement.id") == "memory-q"
            finally:
                browser.close()
        assert Approval.objects.get(pk=first.pk).status in ("approved", "executed", "failed", "void")
        assert (Approval.objects.get(pk=second.pk).status, Approval.objects.get(pk=second.pk).comment) == (
            "rejected", "P2 can wait")

    def test_j_starts_on_the_dashboards_approval_cards_though_the_fleet_table_comes_first(self):
        from playwright.sync_api import sync_playwright

        from fleet.clock import clock
        from fleet.models import Instance

        Instance.objects.create(provider="local", external_id="local-9", status="stopped", intended_status="stopped",
                                worker_name="local-9", status_since=clock.now(), created_at=clock.now())
        first, second = self.park_two_launches()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/", [])
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                assert page.locator("main table.grid tbody tr").count() >= 1  # rows precede the inbox in the page
                cards = page.locator("article.approval")
                ids = [cards.nth(i).get_attribute("id") for i in range(2)]
                for card_id in ids:
                    page.keyboard.press("j")
                    assert page.evaluate("document.querySelector('.key-current').id") == card_id
                page.keyboard.press("j")  # then the table rows
                assert page.evaluate("document.querySelector('.key-current').tagName") == "TR"
            finally:
                browser.close()

    def test_the_theme_follows_the_system_or_the_choice_remembered_in_this_browser(self):
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/", [])
                page.emulate_media(color_scheme="light")
                assert page.input_value("#theme-select") == "system" and _bg(page) == LIGHT_BG
                page.emulate_media(color_scheme="dark")
                assert _bg(page) == DARK_BG  # system: follows the OS
                page.select_option("#theme-select", "light")
                assert _bg(page) == LIGHT_BG and page.get_attribute("html", "data-theme") == "light"
                page.select_option("#theme-select", "dark")
                page.emulate_media(color_scheme="light")
                page.goto(self.live_server_url + "/runs/")  # remembered across pages and reloads
                assert page.get_attribute("html", "data-theme") == "dark" and _bg(page) == DARK_BG
                assert page.input_value("#theme-select") == "dark"
                page.select_option("#theme-select", "system")
                page.reload()
                assert page.get_attribute("html", "data-theme") is None and _bg(page) == LIGHT_BG
            finally:
                browser.close()
