"""The Actions page on a phone (390 px) and a desktop (1280 px): the table scrolls sideways inside
the page, the changed fields keep a readable width (they were squeezed to a few characters a line,
each row hundreds of px tall) and a claim's 48-character key breaks instead of widening its column.
Screenshots go to ``var/screenshots/`` (or ``WARDEN_SCREENSHOT_DIR``) for a person to look at.

Real parts: daphne (``ChannelsLiveServerTestCase``) on the test databases and Chromium
(``/usr/bin/chromium``) driven by Playwright; audit rows as the ``do_*`` actions write them.
"""

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from fleet.models import AuditLog
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase
from tests.subprocs import ROOT

SHOTS = Path(os.environ.get("WARDEN_SCREENSHOT_DIR") or ROOT / "var" / "screenshots")
KEY = "33ae004abe67c9932f4a401150d515fe0562b1e4"
REASON = "28 queued, 1 live; want 2 workers for 360 proofs/hr"
#: per row: its height and the changed and target cells' widths (px)
CELLS = """() => [...document.querySelectorAll('table.audit tbody tr.audit-row')].map(tr => ({
  h: tr.getBoundingClientRect().height,
  changed: tr.querySelector('td.changes').getBoundingClientRect().width,
  target: tr.querySelector('td:nth-child(4)').getBoundingClientRect().width}))"""


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestActionsPageOnANarrowScreen(FleetBrowserTestCase):
    def setUp(self):
        super().setUp()
        now = timezone.now()
        for i in range(5):  # a launch: its claim (keyed by a long hash), then the instance it made
            at = now - timedelta(minutes=2 * i)
            AuditLog.objects.create(at=at, actor="agent", verb="launch_instance_claimed", target=f"warden-{KEY}",
                                    reason=REASON, before=None,
                                    after={"args": {"launch_priority": "P1", "reason": REASON}, "claim": 4, "key": KEY,
                                           "worker": "vm|1410|1796173728.10"})
            AuditLog.objects.create(at=at + timedelta(seconds=1), actor="agent", verb="launch_instance",
                                    target=f"local-{i}", reason=REASON, before=None,
                                    after={"intended_status": "running", "killed": False, "status": "running"})

    def test_the_changed_fields_stay_readable_and_the_page_fits(self):
        from playwright.sync_api import sync_playwright

        SHOTS.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/actions/", [])
                for width, name in ((1280, "desktop"), (390, "phone")):
                    page.set_viewport_size({"width": width, "height": 900})
                    page.reload()
                    page.wait_for_selector("table.audit tbody tr.audit-row")
                    cells = page.evaluate(CELLS)
                    assert len(cells) == 10
                    for c in cells:
                        assert c["changed"] >= 200, (name, c)  # about 16 em: "intended_status – → running" on a line
                        assert width > 600 or c["target"] <= 200, (name, c)  # on a phone the 48-character key breaks
                        assert c["h"] <= 300, (name, c)
                    assert page.evaluate("document.documentElement.scrollWidth") <= width, name
                    page.screenshot(path=str(SHOTS / f"actions-{name}.png"), full_page=True)
            finally:
                browser.close()
