"""A rehearsal's page in a real browser: while it runs the progress bar advances as the task stores
its progress (each store announces ``rehearsals-changed`` over the websocket and the region
re-fetches itself); once it is done the page shows the outcome and draws its three Chart.js charts
with the markers, and then stops fetching: a later ``rehearsals-changed`` fetches nothing. Nothing
overflows at phone width; screenshots at 1280 px and 390 px are written for a person to look at
(``var/screenshots/`` or ``WARDEN_SCREENSHOT_DIR``).

Real parts: daphne (``ChannelsLiveServerTestCase``), the Redis channel layer, Chromium
(``/usr/bin/chromium``) driven by Playwright; progress and outcome stored by the task's own
functions (``agent.rehearse.background``).
"""

import json
import os
import threading
from pathlib import Path

import pytest
from django.db import connections

from agent.models import Rehearsal
from agent.rehearse.background import _store_end, _store_progress
from fleet.events import emit
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase
from tests.subprocs import ROOT

SHOTS = Path(os.environ.get("WARDEN_SCREENSHOT_DIR") or ROOT / "var" / "screenshots")
CHARTS = ("chart-rh-queue", "chart-rh-capacity", "chart-rh-spend")


def result() -> dict:
    hourly = []
    spend = [0.0, 0.0, 0.4, 0.9, 1.3, 1.3, 1.4, 1.2, 0.8, 0.6, 0.2, 0.1]
    for h in range(12):
        queued = [0, 0, 40, 120, 80, 30, 10, 5, 0, 0, 0, 0][h]
        hourly.append({"hour": h, "proofs": [0, 0, 20, 140, 160, 150, 60, 20, 10, 0, 0, 0][h], "target": 120 if h < 8 else 60,
                       "arrived": queued, "queued": queued, "backlog": queued // 2,
                       "live_capacity": [0, 0, 1, 2.5, 3, 3, 2, 1, 1, 0.5, 0, 0][h], "spend_usd": spend[h]})
    return {
        "summary": {"hours": 12, "proofs_delivered": 560, "proofs_arrived": 565, "queue_wait_p50_s": 95,
                    "queue_wait_p95_s": 1260, "usd_total": 8.2, "usd_per_proof": 0.01464, "oracle_ratio": 1.41,
                    "approvals_asked": 3, "approvals_asked_by_tool": {"launch_instance": 3}, "launches": 4, "unsafe": 1},
        "hourly": hourly,
        "unsafe": [{"invariant": "no_scale_down_while_work_waits", "cycle": 61, "run": 61, "call": "stop_instance",
                    "detail": "stopped sc-2 with 30 tasks queued"}],
        "markers": [{"at_s": 9000, "kind": "approval_approved", "detail": "launch_instance decided after 25 min"},
                    {"at_s": 11000, "kind": "approval_approved", "detail": "launch_instance decided after 4 min"},
                    {"at_s": 18300, "kind": "unsafe", "detail": "stop_instance in cycle 61"},
                    {"at_s": 28800, "kind": "target", "detail": "target 60/hr"}],
    }


def in_thread(fn, *args, **kwargs):
    """Run ``fn`` outside Playwright's event loop (the ORM refuses to run inside it), on a connection of its own."""
    failed: list[BaseException] = []

    def run():
        try:
            fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 — re-raised in the test's thread
            failed.append(exc)
        finally:
            connections.close_all()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if failed:
        raise failed[0]


def poll(page, script: str, want, tries: int = 150):
    """Evaluate ``script`` every 100 ms until it returns ``want`` (string predicates are refused by the CSP)."""
    got = None
    for _ in range(tries):
        got = page.evaluate(script)
        if got == want:
            return got
        page.wait_for_timeout(100)
    raise AssertionError(f"{script!r} stayed {got!r}, never {want!r}")


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestRehearsalPageInABrowser(FleetBrowserTestCase):
    def test_progress_advances_then_the_charts_draw_and_the_page_goes_quiet(self):
        from playwright.sync_api import sync_playwright

        r = Rehearsal.objects.create(name="yesterday under max_instances 4 → 6", status="running", progress=0.1,
                                     started_by="user:alice",
                                     day={"name": "yesterday", "horizon_h": 12, "seed": 3, "heartbeat_s": 300,
                                          "work": {"proof_s": {"RTX 4090": {"median_s": 60}}}})
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = f"/rehearsals/{r.pk}/"
        frames: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, path, frames)
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                requests: list[str] = []
                page.on("request", lambda q: requests.append(q.url.removeprefix(self.live_server_url)))
                page.set_viewport_size({"width": 1280, "height": 900})
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                page.wait_for_load_state("networkidle")
                assert page.get_attribute("#rehearsal-progress", "value") == "10"

                for pct in (35, 70):  # the task stores progress: the bar follows without a reload
                    in_thread(_store_progress, [r.pk], pct / 100)
                    poll(page, "document.getElementById('rehearsal-progress')?.getAttribute('value')", str(pct))
                    assert page.inner_text("#rehearsal-pct") == f"{pct}%"
                page.screenshot(path=str(SHOTS / "rehearsal-running-desktop.png"), full_page=True)

                in_thread(_store_end, r.pk, result=result())
                poll(page, "document.getElementById('rehearsal')?.dataset.status", "done")
                drawn = poll(page, """(() => {
                    if (!window.Chart) return null;
                    const ids = IDS;
                    const charts = ids.map(id => document.getElementById(id)).map(c => c && Chart.getChart(c));
                    return charts.every(Boolean) ? charts.map(ch => ch.data.datasets.map(d => [d.label, d.data.length])) : null;
                })()""".replace("IDS", json.dumps(list(CHARTS))), [
                    [["queued", 13], ["backlog", 13], ["approval waited", 2], ["unsafe decision", 1]],
                    [["live capacity (proofs/hr)", 13], ["proofs delivered", 13], ["target (proofs/hr)", 13],
                     ["approval waited", 2], ["unsafe decision", 1]],
                    [["$ spent", 13], ["approval waited", 2], ["unsafe decision", 1]],
                ])
                assert drawn
                assert page.evaluate("document.getElementById('rehearsal-progress')") is None
                summary = page.inner_text("#rehearsal-summary")
                assert "proofs delivered\t560" in summary and "$ per proof\t$0.0146" in summary
                assert "no_scale_down_while_work_waits" in page.inner_text("#rehearsal-unsafe")

                # done: a later announcement fetches nothing. The positive signal: the navigation's
                # approvals count, announced after it, was fetched (the page handled both frames)
                seen = len(requests)
                in_thread(lambda: emit("rehearsals-changed", "approvals-changed"))
                for _ in range(100):
                    if any("partial=count" in u for u in requests[seen:]):
                        break
                    page.wait_for_timeout(100)
                after = requests[seen:]
                assert any("partial=count" in u for u in after), after
                assert not [u for u in after if u.startswith(path)], after
                assert len(after) <= 3, after  # idle: a handful at most

                for width, height, name in ((1280, 900, "desktop"), (390, 844, "phone")):
                    page.set_viewport_size({"width": width, "height": height})
                    page.wait_for_timeout(300)  # Chart.js resizes on the next frame
                    page.screenshot(path=str(SHOTS / f"rehearsal-{name}.png"), full_page=True)
                    overflow = page.evaluate("document.documentElement.scrollWidth")
                    assert overflow <= width, f"the page is {overflow} px wide at {width} px"
                assert not errors, errors
            finally:
                browser.close()


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestRehearseThisChangeEndToEnd(FleetBrowserTestCase):
    """Settings → "Rehearse this change on yesterday" (the last hour, to keep it short) → a real Celery
    worker plays the day twice in ``manage.py rehearse``'s scratch children, under the current
    settings and under the change → the change's page follows both to the outcome: the two columns,
    their difference and the charts."""

    def test_an_operator_rehearses_a_change_and_watches_it_finish(self):
        from playwright.sync_api import sync_playwright

        self.start_celery_worker()
        frames: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/settings/", frames)
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                page.wait_for_load_state("networkidle")
                page.fill("#f-limits__max_instances", "7")
                page.select_option("#rehearse-hours", "1")
                page.click("#rehearse-change-button")
                page.wait_for_selector("#rehearse-started a", timeout=15_000)
                assert "max_instances" in page.inner_text("#rehearse-started") and "7" in page.inner_text("#rehearse-started")
                page.click("#rehearse-started a")
                page.wait_for_selector("#rehearsal")
                # the worker plays it (migrating the scratch database first): wait for the outcome
                poll(page, "document.getElementById('rehearsal')?.dataset.status", "done", tries=2400)
                poll(page, "!!(window.Chart && Chart.getChart(document.getElementById('chart-rh-queue')))", True)
                summary = page.inner_text("#rehearsal-summary")
                assert "hours rehearsed\t1 h" in summary and "unsafe decisions\t0" in summary
                head = page.inner_text("#rehearsal-compare thead")
                assert "A: #" in head and "the current settings" in head and "B: #" in head and "difference" in head
                assert page.inner_text("#compare-hours").split("\t")[1:] == ["1 h", "1 h", "0"]
                assert page.inner_text("#compare-oracle").split("\t")[1:3] == ["delivered-work lower bound"] * 2
                page.screenshot(path=str(SHOTS / "rehearsal-from-settings.png"), full_page=True)
            finally:
                browser.close()
        pushed = sum('"rehearsals-changed"' in f for f in frames)
        assert pushed >= 3, frames  # queued, running, progress… and done: each announced over the socket
        base, row = Rehearsal.objects.order_by("pk")
        assert base.status == "done" and base.compare_to_id == row.pk and base.day["objectives"].get("max_instances") != 7
        assert row.status == "done" and row.progress == 1.0 and row.day["objectives"]["max_instances"] == 7
        assert row.started_by == "user:alice" and row.name.startswith("the last 1 h under max_instances")
