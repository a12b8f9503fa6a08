"""The Machine Performance tab in a real browser, with a day of data: the four Chart.js charts draw
(from the vendored library, nothing fetched elsewhere), the tables show, nothing overflows at phone
width, and screenshots at desktop and 390 px width are written for a person to look at
(``var/screenshots/`` or ``WARDEN_SCREENSHOT_DIR``).

Real parts: daphne (``ChannelsLiveServerTestCase``) on the test databases and Chromium
(``/usr/bin/chromium``) driven by Playwright.
"""

import os
from pathlib import Path

import pytest
from django.utils import timezone

from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase
from tests.perf_support import seed_day, seed_proofs
from tests.subprocs import ROOT

SHOTS = Path(os.environ.get("WARDEN_SCREENSHOT_DIR") or ROOT / "var" / "screenshots")
CHARTS = ("chart-proofs", "chart-queue", "chart-fleet", "chart-dph")


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestPerformanceTabInABrowser(FleetBrowserTestCase):
    def test_it_draws_the_charts_and_fits_desktop_and_phone(self):
        from playwright.sync_api import sync_playwright

        seed_day(timezone.now())
        seed_proofs(timezone.now())
        SHOTS.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/performance/?hours=24", [])
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                outside: list[str] = []
                page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(
                    (self.live_server_url, self.live_server_url.replace("http", "ws"), "data:")) else None)
                for width, height, name in ((1280, 900, "desktop"), (390, 844, "phone")):
                    page.set_viewport_size({"width": width, "height": height})
                    page.reload()
                    # the socket's first open re-fetches every region (console-resync): measure after it
                    page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                    page.wait_for_load_state("networkidle")
                    # one snapshot, taken in the page once every chart is drawn (a live re-fetch may swap the
                    # region at any moment; the charts are redrawn after it)
                    drawn = page.wait_for_function("""ids => {
                        if (!window.Chart) return null;
                        const charts = ids.map(id => document.getElementById(id)).map(c => c && Chart.getChart(c));
                        if (!charts.every(Boolean)) return null;
                        return charts.map(ch => ({
                            sets: ch.data.datasets.map(d => [d.label, d.data.length]),
                            box: ch.canvas.getBoundingClientRect().toJSON(),
                            ticks: ch.scales.x.ticks.map(t => new Date(t.value).toISOString().slice(11, 16)),
                        }));
                    }""", arg=list(CHARTS)).json_value()
                    assert [c["sets"] for c in drawn] == [
                        [["proofs/hr", 144], ["target", 144]],
                        [["queued", 144], ["backlog", 144]],
                        [["instances", 144], ["running", 144], ["instance cap", 2]],
                        [["$/hr", 144], ["$/hr cap", 2]],
                    ]
                    for c in drawn:  # drawn, inside the page's width, with ticks on round UTC hours
                        box = c["box"]
                        assert box["width"] > 200 and box["height"] > 150 and box["x"] + box["width"] <= width, box
                        assert c["ticks"] and all(t.endswith(":00") and int(t[:2]) % 4 == 0 for t in c["ticks"]), c["ticks"]
                    assert "RTX 4090" in page.inner_text("#proof-costs")
                    assert page.inner_text("#inst-cap") == "3 / 4"
                    assert "over the 24 h limit" in page.inner_text("#perf-v-103")
                    page.screenshot(path=str(SHOTS / f"performance-{name}.png"), full_page=True)
                    overflow = page.evaluate("document.documentElement.scrollWidth")
                    wide = page.evaluate("w => [...document.querySelectorAll('body *')].filter(e => !e.closest('.table-wrap') "
                                         "&& e.getBoundingClientRect().right > w + 1).map(e => e.tagName + '#' + e.id + '.' "
                                         "+ e.className).slice(0, 8)", width)
                    assert overflow <= width, f"the page is {overflow} px wide at {width} px: {wide}"
                assert not errors, errors
                assert not outside, outside  # no CDN: everything from the console itself
            finally:
                browser.close()
