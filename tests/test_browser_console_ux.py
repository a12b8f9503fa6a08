"""The console as a new user met it, in a real browser, at desktop width (1280 px) and at phone width (390 px): what the
new user hit, checked where the operator sees it.

- no page is wider than the screen at 390 px (the fleet table was 627 px);
- the instance action menu has no default and an empty choice is never sent silently;
- a refused action shows at the top of the page;
- an empty rejection says why in the card; four stops are approved in one click;
- the navigation counts waiting approvals; the header names the user once, with what they may do;
- the demand's "read N s ago" keeps counting between pushes;
- "observe cycle queued (run N)" goes away instead of staying beside the buttons.

Real parts: daphne (``ChannelsLiveServerTestCase``) on the test databases, the Redis channel layer,
Chromium (``/usr/bin/chromium``) driven by Playwright. Set ``WARDEN_SCREENSHOTS=<dir>`` to keep a
PNG of every page at both widths.
"""

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from agent.models import Approval, Run, SessionState, Step
from fleet.models import AuditLog, DemandSample, Instance
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase

WIDTHS = {"desktop": 1280, "phone": 390}
PAGES = {"dashboard": "/", "fleet": "/fleet/", "runs": "/runs/", "approvals": "/approvals/",
         "instance": "/instances/local-1/", "timeline": "/instances/local-1/timeline/", "run": "/runs/1/",
         "actions": "/actions/", "alerts": "/alerts/", "performance": "/performance/", "traces": "/traces/",
         "memory": "/memory/", "settings": "/settings/", "notifications": "/notifications/"}


#: the element that sticks out furthest to the right (for the assertion's message)
WIDEST = """(() => { let w = null, r = 0; document.querySelectorAll('body *').forEach(e => {
  const x = e.getBoundingClientRect().right; if (x > r) { r = x; w = e.tagName + '#' + e.id + '.' + e.className; } });
  return [w, r]; })()"""


def park(n: int) -> list[Approval]:
    """``n`` waiting stop approvals of one parked run (rows as the loop writes them)."""
    now = timezone.now()
    run = Run.objects.create(number=1, trigger="beat", planner="rules", status="parked", started_at=now)
    SessionState.objects.filter(pk=SessionState.get().pk).update(next_run_id=2)  # as the loop would
    out = []
    for i in range(1, n + 1):
        args = {"instance_id": f"local-{i}", "reason": "idle: queue empty past the 15 min dwell; diagnosed healthy"}
        step = Step.objects.create(run=run, seq=i, turn=0, position=i - 1, batch=n > 1, kind="call",
                                   tool="stop_instance", args=args, outcome="parked", reason_code="approval_required",
                                   created_at=now)
        out.append(Approval.objects.create(run=run, step=step, tool="stop_instance", args=args, reason=args["reason"],
                                           idempotency_key=f"k-{i}", created_at=now,
                                           expires_at=now + timedelta(minutes=30),
                                           situation={"demand": "ok", "queued": 0, "workers_live": 4,
                                                      "workers_expected": 4}))
    return out


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.integration
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestConsoleUxInABrowser(FleetBrowserTestCase):
    def setUp(self):
        super().setUp()
        now = timezone.now()
        for i in range(1, 5):
            Instance.objects.create(provider="local", external_id=f"local-{i}", label="warden", worker_name=f"local-{i}",
                                    status="running" if i < 4 else "exited", intended_status="running",
                                    exit_code=-9 if i == 4 else None, pid=4000 + i, status_since=now, created_at=now,
                                    gpu_name="local-cpu", dph=0.1)
        DemandSample.objects.create(taken_at=now - timedelta(seconds=5), state="ok", queued=0, running=0,
                                    workers_live=3, workers_expected=3, workers_dead=0, proofs_hr=0.0)
        self.approvals = park(4)

    def browser(self, pw):
        return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)

    def test_every_page_fits_the_screen_at_desktop_and_phone_width(self):
        from playwright.sync_api import sync_playwright

        shots = os.environ.get("WARDEN_SCREENSHOTS")
        with sync_playwright() as pw:
            browser = self.browser(pw)
            try:
                page = self.log_in(browser, "/", [])
                for label, width in WIDTHS.items():
                    page.set_viewport_size({"width": width, "height": 900})
                    for name, path in PAGES.items():
                        page.goto(self.live_server_url + path)
                        page.wait_for_selector("main")
                        if shots:
                            Path(shots).mkdir(parents=True, exist_ok=True)
                            page.screenshot(path=f"{shots}/{name}-{label}.png", full_page=True)
                        wide = page.evaluate("document.documentElement.scrollWidth")
                        widest = page.evaluate(WIDEST)
                        assert wide <= width, (label, name, wide, widest)
                    # the header: the user once, and what they may do; the badge counts the waiting calls
                    assert page.inner_text("#who-user") == "alice" and page.inner_text("#who-role") == "can act"
                    assert page.inner_text("#nav-approvals") == "4"
            finally:
                browser.close()

    def test_the_action_menu_has_no_default_and_a_refusal_shows_at_the_top(self):
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = self.browser(pw)
            try:
                page = self.log_in(browser, "/instances/local-1/", [])
                page.on("dialog", lambda d: d.accept())
                posts: list[str] = []
                page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
                for width in WIDTHS.values():
                    page.set_viewport_size({"width": width, "height": 900})
                    page.goto(self.live_server_url + "/instances/local-1/")
                    assert page.title().startswith("local-1 ·") and page.inner_text("h1").startswith("local-1")
                    form = "#actions-local-1 form"
                    assert page.eval_on_selector(f"{form} select[name=action]", "e => e.value") == ""
                    page.fill(f"{form} input[name=reason]", "cost")
                    # counted on the document (capture: ``invalid`` does not bubble), so a live refresh
                    # that swaps the form between here and the click cannot lose the event
                    page.evaluate("() => { window.__invalid = 0; document.addEventListener('invalid', e => {"
                                  " if (e.target.name === 'action') window.__invalid++ }, true) }")
                    posts.clear()
                    page.click(f"{form} button[type=submit]")
                    # nothing chosen: the browser refused the submission on the field (the positive
                    # signal: its ``invalid`` event fired, and a refused form sends nothing after it)...
                    assert page.eval_on_selector(f"{form} select[name=action]", "e => e.validity.valueMissing")
                    page.wait_for_function("window.__invalid >= 1", timeout=10_000)
                    # ...so nothing was sent and nothing came back
                    assert posts == [], posts
                    assert page.evaluate("document.querySelector('#page-alert').textContent.trim()") == ""
                # a stop the guards refuse (no diagnosis; or gone: the local provider never ran local-1)
                # lands at the top of the page, above the instance's title (here at phone width)
                form = "#actions-local-1 form"
                page.select_option(f"{form} select[name=action]", "stop")
                page.fill(f"{form} input[name=reason]", "cost")
                page.click(f"{form} button[type=submit]")
                page.wait_for_selector("#page-alert .refusal", timeout=30_000)
                top = page.eval_on_selector("#page-alert", "e => e.getBoundingClientRect().top")
                assert top < page.eval_on_selector("h1", "e => e.getBoundingClientRect().top")
                assert "stop of local-1 was refused" in page.inner_text("#page-alert")
            finally:
                browser.close()
        # the empty choices were never sent: the only audited action on local-1 is the refused stop
        assert list(AuditLog.objects.filter(target="local-1").values_list("verb", flat=True)) == ["stop_instance_refused"]

    def test_an_empty_rejection_says_why_and_four_stops_take_one_click(self):
        from playwright.sync_api import sync_playwright

        first = self.approvals[0]
        with sync_playwright() as pw:
            browser = self.browser(pw)
            try:
                page = self.log_in(browser, "/approvals/", [])
                page.set_viewport_size({"width": 390, "height": 900})
                card = f"#approval-{first.pk}"
                assert '"instance_id": "local-1"' in page.text_content(f"{card} pre.args")  # JSON behind a disclosure
                assert page.inner_text(f"{card} .call-sentence") == "Stop local-1"
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                # the resync a new socket starts re-fetches the inbox: let it land first, or it replaces
                # the card (and the error on it) right after the click
                page.wait_for_load_state("networkidle")
                page.click(f"{card} .reject-form button")
                page.wait_for_selector(f"{card} .error", timeout=15_000)
                assert "a rejection needs a comment" in page.inner_text(f"{card} .error")

                page.set_viewport_size({"width": 1280, "height": 900})
                page.check("#bulk-all")
                page.click("#bulk-form button.approve")
                if shots := os.environ.get("WARDEN_SCREENSHOTS"):
                    time.sleep(2)
                    page.screenshot(path=f"{shots}/bulk-approved.png", full_page=True)
                page.wait_for_selector(".bulk-line >> text=approved 4", timeout=15_000)
                page.wait_for_function("document.querySelector('#nav-approvals').textContent.trim() === ''",
                                       timeout=15_000)
            finally:
                browser.close()
        assert set(Approval.objects.values_list("status", flat=True)) == {"approved"}

    def test_the_read_age_ticks_and_the_observe_note_goes_away(self):
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = self.browser(pw)
            try:
                page = self.log_in(browser, "/", [])
                errors = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                for width in WIDTHS.values():
                    page.set_viewport_size({"width": width, "height": 900})
                    page.goto(self.live_server_url + "/")
                    before = page.inner_text("#demand-age")
                    time.sleep(2.5)
                    after = page.inner_text("#demand-age")
                    assert before != after and after.startswith("read ") and after.endswith(" s ago"), (before, after)
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                page.click("#observe-now")
                if shots := os.environ.get("WARDEN_SCREENSHOTS"):
                    time.sleep(1)
                    page.screenshot(path=f"{shots}/observe-clicked.png", full_page=True)
                page.wait_for_selector("#controls-flash >> text=observe cycle queued", timeout=15_000), errors
                page.wait_for_selector("#controls-flash", state="detached", timeout=20_000)
            finally:
                browser.close()
