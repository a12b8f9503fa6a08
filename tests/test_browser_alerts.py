"""In a real browser, an operator works the Alerts tab: acknowledges one alert with a comment,
silences another for 15 minutes (it leaves "firing" and shows under "silenced"), then selects
every remaining firing alert and acknowledges them at once with one comment — each without a
page reload (htmx swaps the table).

Real parts: daphne (``ChannelsLiveServerTestCase``), the Redis channel layer and Chromium
(``/usr/bin/chromium``) driven by Playwright.
"""

from pathlib import Path

import pytest

from fleet.alerts import raise_alert
from fleet.models import Alert, AuditLog
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestAlertsInABrowser(FleetBrowserTestCase):
    def test_acknowledge_silence_and_bulk_acknowledge(self):
        from playwright.sync_api import sync_playwright  # its loop runs in this thread: no ORM inside the block

        alerts = [raise_alert("workers_dead", "0 of 2 workers live", severity="P0"),
                  raise_alert("demand_unknown", "harmony unreadable", severity="P1"),
                  raise_alert("provider_error", "vast.ai 500", key="provider:vast"),
                  raise_alert("budget", "over the $/hr cap", severity="P1"),
                  raise_alert("stale_claim", "a reboot never finished", key="claim:7")]
        ack, silence, *rest = [f"#alert-{a.pk}" for a in alerts]
        frames: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/alerts/", frames)
                # connected and resynced first: a resync answered after a decision would redraw the old table
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                page.wait_for_load_state("networkidle")
                page.evaluate("window.__noReload = 'still here'")
                assert page.inner_text("#chip-firing .n") == "5"

                page.fill(f"{ack} .ack-form input[name=comment]", "alice: restarting the worker")
                page.click(f"{ack} .ack-form button")
                page.wait_for_selector(ack, state="detached")
                assert page.inner_text("#chip-acknowledged .n") == "1"

                page.select_option(f"{silence} .silence-form select[name=minutes]", "15")
                page.fill(f"{silence} .silence-form input[name=comment]", "known outage, vendor on it")
                page.click(f"{silence} .silence-form button")
                page.wait_for_selector(silence, state="detached")
                assert page.inner_text("#chip-silenced .n") == "1" and page.inner_text("#chip-firing .n") == "3"

                page.check("#alerts-select-all")
                assert all(page.is_checked(f"{sel} .alert-pick") for sel in rest)
                page.fill("#bulk-ack-comment", "bob and alice on these")
                page.click("#bulk-ack-submit")
                page.wait_for_selector("td.empty >> text=No firing alerts.")
                assert page.inner_text("#chip-acknowledged .n") == "4"
                assert page.evaluate("window.__noReload") == "still here"  # every step was an htmx swap

                page.click("#chip-silenced")
                page.wait_for_selector(f"{silence} >> text=known outage, vendor on it")
                assert "End silence" in page.inner_text(silence)
            finally:
                browser.close()
        states = dict(Alert.objects.values_list("pk", "state"))
        assert [states[a.pk] for a in alerts] == ["acknowledged", "firing"] + ["acknowledged"] * 3
        assert Alert.objects.get(pk=alerts[1].pk).silence_comment == "known outage, vendor on it"
        bulk = AuditLog.objects.filter(verb="ack_alert", reason="bob and alice on these")
        assert sorted(int(r.target.split()[1]) for r in bulk) == sorted(a.pk for a in alerts[2:])
