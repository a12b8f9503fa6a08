"""In a real browser, an operator approves one parked call and rejects another (with the required
comment) from the approvals inbox, and sees both outcomes arrive live: the approved launch runs on
a real Celery worker (a real local worker process is launched) and its card turns ``executed``
without a reload; the rejected one stays ``rejected`` and reaches the agent as a rejection.

Real parts: daphne (``ChannelsLiveServerTestCase``), the Redis channel layer (own prefix), a Celery
worker subprocess on the test databases, the ``local`` provider and demand source, and Chromium
(``/usr/bin/chromium``) driven by Playwright. The two calls are parked by a real cycle (script
planner) in this process: a P1 and a P2 launch in one batch (policy: approval).
"""

import json
import time
from pathlib import Path

import pytest

from agent.models import Approval, Run
from agent.planners.script import ScriptPlanner
from agent.runtime.loop import run_cycle
from fleet.models import Instance
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase


@pytest.mark.browser
@pytest.mark.integration
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestApprovalsInABrowser(FleetBrowserTestCase):
    def park_two_launches(self) -> tuple[Run, Approval, Approval]:
        from fleet import demo

        demo.enqueue(1)  # work waits: the approved launch is still needed at dispatch (no_longer_needed)
        run = run_cycle("operator", planner=ScriptPlanner([{"parallel": [
            {"tool": "launch_instance", "args": {"gpu_name": "local-cpu", "launch_priority": "P1", "reason": "queue is growing"}},
            {"tool": "launch_instance", "args": {"gpu_name": "local-cpu", "launch_priority": "P2", "reason": "spare capacity"}},
        ]}]))
        run.refresh_from_db()
        assert run.status == "parked", list(run.steps.values_list("tool", "outcome", "reason_code", "detail"))
        p1 = Approval.objects.get(run=run, args__launch_priority="P1")
        p2 = Approval.objects.get(run=run, args__launch_priority="P2")
        return run, p1, p2

    def test_it_approves_one_call_and_rejects_another_and_sees_both_outcomes_live(self):
        from playwright.sync_api import sync_playwright  # its loop runs in this thread: no ORM inside the block

        run, approve_me, reject_me = self.park_two_launches()
        self.start_celery_worker()
        frames: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/approvals/", frames)
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                a, r = f"#approval-{approve_me.pk}", f"#approval-{reject_me.pk}"
                page.wait_for_selector(f"{a} >> text=waiting")
                assert "expires in" in page.inner_text(f"{a} .countdown")
                page.evaluate("window.__noReload = 'still here'")

                page.click(f"{a} button.approve")
                page.wait_for_selector(f"{a} >> text=approved by alice")
                # the worker executes the approved launch at once (the run stays parked on the other
                # call); the card turns "executed" without a reload, on the pushed approvals-changed
                page.wait_for_selector(f"{a} .status-executed", timeout=90_000)
                assert "waiting" in page.inner_text(r)

                page.fill(f"{r} input[name=comment]", "P2 can wait until the morning")
                page.click(f"{r} button.danger")
                page.wait_for_selector(f"{r} >> text=rejected by alice")
                assert "P2 can wait until the morning" in page.inner_text(r)
                page.wait_for_selector("#approvals >> text=No approvals waiting.")
                assert page.evaluate("window.__noReload") == "still here"
                triggers = [json.loads(f).get("trigger") for f in frames if f.startswith("{")]
                assert "approvals-changed" in triggers, frames

                # the run page: the rejection reaches the agent as ``rejected`` when the worker resumes
                # the run after the second decision; the trace region updates live (runs-changed)
                page.goto(f"{self.live_server_url}/runs/{run.number}/")
                page.wait_for_selector("#run-trace .outcome-approved_executed", timeout=30_000)
                page.wait_for_selector("#run-trace .outcome-rejected", timeout=60_000)
                assert "P2 can wait until the morning" in page.inner_text("#run-trace")
            finally:
                browser.close()

        steps = {s.args["launch_priority"]: s for s in Run.objects.get(pk=run.pk).steps.filter(tool="launch_instance")}
        assert steps["P1"].outcome == "approved_executed"
        assert (steps["P2"].outcome, steps["P2"].reason_code) == ("rejected", "rejected")
        assert "P2 can wait until the morning" in steps["P2"].observation
        deadline = time.monotonic() + 10
        while Instance.objects.filter(provider="local").count() != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert Instance.objects.filter(provider="local").count() == 1  # exactly one real launch
