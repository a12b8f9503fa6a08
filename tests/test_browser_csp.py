"""The console works under its Content-Security-Policy (no inline script, no inline style, no eval):
every main page loads in a real browser without one CSP violation, and what the scripts do still
happens — the theme is applied before paint (static/theme.js), the live socket connects
(connect-src 'self'), the approvals' "select all" ticks every card (static/console.js, formerly an
inline onclick), the performance charts are drawn (Chart.js).

Real parts: daphne (``ChannelsLiveServerTestCase``) on the test databases, the Redis channel layer,
Chromium (``/usr/bin/chromium``) driven by Playwright. Violations are caught two ways: the page's
``securitypolicyviolation`` events (recorded by an init script, which the CSP does not govern) and
the browser console's errors that name the Content Security Policy.
"""

import time
from pathlib import Path

import pytest
from django.utils import timezone

from fleet.alerts import raise_alert
from fleet.models import Instance
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase
from tests.perf_support import seed_day, seed_proofs
from tests.test_browser_console_ux import park

PAGES = ["/", "/fleet/", "/runs/", "/runs/1/", "/approvals/", "/alerts/?state=all", "/actions/", "/performance/",
         "/traces/", "/memory/", "/settings/", "/notifications/", "/instances/v-101/"]

RECORD = """window.__csp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__csp.push(e.violatedDirective + ' ' + (e.blockedURI || '') + ' ' + (e.sourceFile || '') + ':' + e.lineNumber));"""


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestConsoleUnderItsCsp(FleetBrowserTestCase):
    def test_the_main_pages_work_without_a_csp_violation(self):
        from playwright.sync_api import sync_playwright

        now = timezone.now()
        seed_day(now)
        seed_proofs(now)
        park(3)
        raise_alert("workers_dead", "1 of 2 expected workers dead; 12 tasks queued", severity="P1",
                    instance=Instance.objects.get(external_id="v-101"))
        errors: list[str] = []
        found: dict[str, list[str]] = {}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context()
                context.add_init_script(RECORD)
                page = context.new_page()
                page.on("console", lambda m: errors.append(f"{m.location.get('url')}:{m.location.get('lineNumber')}: {m.text}")
                        if m.type == "error" and "Content Security Policy" in m.text else None)
                page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
                page.goto(self.live_server_url + "/login/")
                header = page.request.get(self.live_server_url + "/login/").headers["content-security-policy"]
                assert "script-src 'self'" in header and "unsafe-inline" not in header and "unsafe-eval" not in header
                found["/login/"] = page.evaluate("window.__csp")
                page.evaluate("localStorage.setItem('warden-theme', 'dark')")
                page.fill("input[name=username]", "alice")
                page.fill("input[name=password]", "alice-pass-1")
                page.click("button[type=submit]")
                page.wait_for_url(self.live_server_url + "/")
                for path in PAGES:
                    page.goto(self.live_server_url + path)
                    page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)  # the websocket
                    assert page.evaluate("document.documentElement.dataset.theme") == "dark", path  # theme.js
                    if path == "/performance/":
                        # polled with evaluate (the devtools protocol, outside the page's CSP):
                        # wait_for_function's own predicate is eval'd in the page, which the CSP refuses
                        drawn = "() => !!window.Chart && [...document.querySelectorAll('canvas')].some(c => Chart.getChart(c))"
                        deadline = time.monotonic() + 15
                        while not page.evaluate(drawn) and time.monotonic() < deadline:
                            page.wait_for_timeout(200)
                        assert page.evaluate(drawn), "no chart drawn on /performance/"
                    if path == "/approvals/":
                        page.check("#bulk-all")
                        assert page.evaluate("[...document.querySelectorAll('.bulk-pick')].map(c => c.checked)") == [True] * 3
                    found[path] = page.evaluate("window.__csp")
            finally:
                browser.close()
        bad = {p: v for p, v in found.items() if v}
        assert not bad, "\n".join(f"{p}: {line}" for p, lines in bad.items() for line in lines)
        assert not errors, "\n".join(errors)
