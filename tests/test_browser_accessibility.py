"""axe-core (vendored from the npm registry: ``make vendor`` → ``tests/vendor/axe.min.js``) on the
console's main pages in a real browser, with data on them: no WCAG 2.1 A/AA violation (labels,
names, contrast, ARIA), no positive ``tabindex``, and the Tab key walks the page in document order
from the header on.

Real parts: daphne (``ChannelsLiveServerTestCase``), the test databases, Chromium driven by
Playwright. The login page is checked signed out, the rest signed in as an operator.
"""

from pathlib import Path

import pytest
from django.utils import timezone

from fleet.alerts import raise_alert
from fleet.models import Instance
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase
from tests.perf_support import seed_day, seed_proofs

AXE = Path(__file__).with_name("vendor") / "axe.min.js"
#: the rules' tags axe runs (WCAG 2.0 and 2.1, levels A and AA)
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
PAGES = ["/", "/fleet/", "/runs/", "/approvals/", "/alerts/?state=all", "/actions/", "/performance/", "/traces/",
         "/memory/", "/settings/", "/instances/v-101/"]


def violations(page) -> list[str]:
    """axe's violations on ``page`` as one line each: rule, impact, the first offending nodes."""
    page.add_script_tag(path=str(AXE))
    found = page.evaluate("tags => axe.run(document, {runOnly: {type: 'tag', values: tags}})"
                          ".then(r => r.violations.map(v => [v.id, v.impact, v.nodes.length, "
                          "v.nodes.slice(0, 3).map(n => n.target.join(' ') + ': ' + n.failureSummary.split('\\n')[1])]))", TAGS)
    return [f"{rule} ({impact}, {n} node(s)): {'; '.join(nodes)}" for rule, impact, n, nodes in found]


def tab_walk(page, steps: int = 8) -> list[str]:
    """The first ``steps`` elements the Tab key reaches, as ``tag#id`` or their text."""
    page.evaluate("document.activeElement && document.activeElement.blur()")
    seen = []
    for _ in range(steps):
        page.keyboard.press("Tab")
        seen.append(page.evaluate("(e => e.tagName.toLowerCase() + ':' + (e.id || e.textContent.trim().slice(0, 30)))"
                                  "(document.activeElement)"))
    return seen


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestAccessibility(FleetBrowserTestCase):
    def test_the_main_pages_pass_axe_and_tab_in_document_order(self):
        from playwright.sync_api import sync_playwright

        now = timezone.now()
        seed_day(now)
        seed_proofs(now)
        raise_alert("workers_dead", "1 of 2 expected workers dead; 12 tasks queued", severity="P1",
                    instance=Instance.objects.get(external_id="v-101"))
        found: dict[str, list[str]] = {}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                # axe is injected as an inline script, which the console's CSP refuses: bypassed here only
                anon = browser.new_page(bypass_csp=True)
                anon.goto(self.live_server_url + "/login/")
                found["/login/"] = violations(anon)
                page = self.log_in(browser, "/", [], bypass_csp=True)
                for path in PAGES:
                    page.goto(self.live_server_url + path)
                    page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                    found[path] = violations(page)
                    assert page.evaluate("document.querySelectorAll('[tabindex]:not([tabindex=\"0\"]):not([tabindex=\"-1\"])').length") == 0, path
                page.goto(self.live_server_url + "/performance/")
                walk = tab_walk(page)
            finally:
                browser.close()
        bad = {p: v for p, v in found.items() if v}
        assert not bad, "\n".join(f"{p}: {line}" for p, lines in bad.items() for line in lines)
        assert walk[0] == "a:Warden" and walk[1] == "a:Dashboard", walk  # the header first, in reading order
