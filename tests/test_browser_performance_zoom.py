"""Drag-to-zoom on the Machine Performance charts, in a real browser: dragging across a chart narrows
the time axis of all four charts to the dragged stretch (chartjs-plugin-zoom, vendored beside
Chart.js), a live redraw of the region keeps it, and "Reset zoom" or a double-click on a chart
returns to the whole window. At desktop (1280 px) and phone (390 px) width, with screenshots
written for a person to look at (``var/screenshots/`` or ``WARDEN_SCREENSHOT_DIR``).

Real parts: daphne (``ChannelsLiveServerTestCase``) on the test databases and Chromium
(``/usr/bin/chromium``) driven by Playwright. The page's strict CSP stays on: the test reads the
Chart instances with ``page.evaluate`` and polls.
"""

import os
import time
from pathlib import Path

import pytest
from django.utils import timezone

from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase
from tests.perf_support import seed_day
from tests.subprocs import ROOT

SHOTS = Path(os.environ.get("WARDEN_SCREENSHOT_DIR") or ROOT / "var" / "screenshots")
CHARTS = ["chart-proofs", "chart-queue", "chart-fleet", "chart-dph"]
MINUTE = 60_000

# every chart's visible x-range [min, max] (epoch ms), or null while a chart is not drawn yet
RANGES = """ids => ids.map(id => {
  const c = window.Chart && document.getElementById(id) && Chart.getChart(document.getElementById(id));
  return c ? [c.scales.x.min, c.scales.x.max] : null;
})"""
# the window the page was drawn for: [since, now] (epoch ms) from its #perf-frame
FRAME = """() => { const f = JSON.parse(document.getElementById("perf-frame").textContent); return [f.since, f.now]; }"""


def poll(page, script: str, arg, ok, what: str, timeout: float = 15.0):
    """``page.evaluate(script, arg)`` until ``ok(value)``; the value, or AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = page.evaluate(script, arg)
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {value!r}")
        page.wait_for_timeout(100)


def drag(page, chart_id: str, start: float, end: float) -> list[float]:
    """Drag with the mouse across ``chart_id``'s plot area from ``start`` to ``end`` (fractions of its
    width); returns the time values [ms] under the two points, read from the chart's own x scale."""
    where = page.evaluate("""([id, a, b]) => {
        const canvas = document.getElementById(id), c = Chart.getChart(canvas);
        canvas.scrollIntoView({block: "center"});
        const box = canvas.getBoundingClientRect(), area = c.chartArea;
        const xa = area.left + a * area.width, xb = area.left + b * area.width, y = (area.top + area.bottom) / 2;
        return {x0: box.left + xa, x1: box.left + xb, y: box.top + y,
                values: [c.scales.x.getValueForPixel(xa), c.scales.x.getValueForPixel(xb)]};
    }""", [chart_id, start, end])
    page.mouse.move(where["x0"], where["y"])
    page.mouse.down()
    page.mouse.move(where["x1"], where["y"], steps=8)
    page.mouse.up()
    return where["values"]


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestDragToZoomOnThePerformanceCharts(FleetBrowserTestCase):
    def test_drag_narrows_every_chart_and_reset_restores_the_window(self):
        from playwright.sync_api import sync_playwright

        seed_day(timezone.now())
        SHOTS.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/performance/?hours=24", [])
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                for width, height, name in ((1280, 900, "desktop"), (390, 844, "phone")):
                    self.zoom_and_reset(page, width, height, name)
                assert not errors, errors
            finally:
                browser.close()

    def zoom_and_reset(self, page, width: int, height: int, name: str) -> None:
        """At ``width`` × ``height`` px: drag on one chart (all follow), a live redraw keeps the zoom,
        "Reset zoom" and a double-click each return every chart to the whole window."""
        page.set_viewport_size({"width": width, "height": height})
        page.reload()
        page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
        page.wait_for_load_state("networkidle")
        whole = poll(page, RANGES, CHARTS, lambda r: all(r), "the charts are drawn")
        since, now = whole[0]
        assert now - since == pytest.approx(24 * 60 * MINUTE, abs=MINUTE)
        assert whole == [[since, now]] * 4 and page.evaluate(FRAME) == [since, now]
        assert page.is_hidden("#zoom-reset")

        # drag across the middle of the queue chart: all four show that stretch
        lo, hi = drag(page, "chart-queue", 0.5, 0.75)
        zoomed = poll(page, RANGES, CHARTS, lambda r: r[0] != [since, now] and len({tuple(x) for x in r}) == 1,
                      "every chart zoomed to one range")[0]
        px = (now - since) / 100  # the dragged points, to within a pixel or three of the plot
        assert zoomed[0] == pytest.approx(lo, abs=px) and zoomed[1] == pytest.approx(hi, abs=px)
        assert since < zoomed[0] < zoomed[1] < now
        assert zoomed[1] - zoomed[0] < (now - since) / 3
        assert page.is_visible("#zoom-reset")
        assert page.inner_text("#zoom-range").startswith("zoomed to ")
        ticks = page.evaluate("id => Chart.getChart(document.getElementById(id)).scales.x.ticks.map(t => t.value)",
                              "chart-proofs")
        # ticks follow the zoom: inside the range, on round UTC times (minutes, 6 h wide → hours)
        assert ticks and all(zoomed[0] <= t <= zoomed[1] and t % (60 * MINUTE) == 0 for t in ticks), ticks
        page.screenshot(path=str(SHOTS / f"performance-zoomed-{name}.png"), full_page=True)

        # a live redraw (the region re-fetched: new Chart instances) keeps the zoom
        page.evaluate("id => { Chart.getChart(document.getElementById(id)).$before = true; }", "chart-proofs")
        page.evaluate("() => document.body.dispatchEvent(new CustomEvent('console-resync'))")
        poll(page, "id => { const c = Chart.getChart(document.getElementById(id)); return !!c && !c.$before; }",
             "chart-proofs", bool, "the region was redrawn")
        kept = poll(page, RANGES, CHARTS, lambda r: all(r), "the charts are redrawn")
        assert kept == [zoomed] * 4, kept
        assert page.is_visible("#zoom-reset")

        # "Reset zoom": the whole window again
        page.click("#zoom-reset")
        frame = page.evaluate(FRAME)  # the redraw's window: a few seconds on from the first
        assert frame[1] - frame[0] == now - since
        poll(page, RANGES, CHARTS, lambda r: r == [frame] * 4, "every chart back to the window")
        assert page.is_hidden("#zoom-reset") and page.inner_text("#zoom-range") == ""

        # drag on another chart, then a double-click on a third resets them all
        drag(page, "chart-proofs", 0.1, 0.3)
        poll(page, RANGES, CHARTS, lambda r: r[3] != frame and len({tuple(x) for x in r}) == 1,
             "every chart zoomed again")
        page.locator("#chart-fleet").dblclick()  # scrolled into view, at its centre
        poll(page, RANGES, CHARTS, lambda r: r == [page.evaluate(FRAME)] * 4, "a double-click resets every chart")
        assert page.is_hidden("#zoom-reset")
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= width, f"the page is {overflow} px wide at {width} px"
