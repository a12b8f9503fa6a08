"""Done-when, literally: an idle worker's stop is proposed after a diagnosis, appears in the inbox, is
approved in the browser and executes once.

Real parts: daphne (``ChannelsLiveServerTestCase``), the Redis channel layer (own prefix), a Celery
worker subprocess on the test databases that runs every cycle and the resume, the ``local``
provider (a real demo worker process, launched as the product launches one:
``agent.actions.instances.do_launch_instance`` by ``user:alice``), the ``local`` demand source (HarmonyDB,
empty queue) and Chromium (``/usr/bin/chromium``) driven by Playwright. The planner is the
default one (rules); the policy is the default one (``stop_instance``: approval).

The dwell and hold-off are a few seconds (``WARDEN_DWELL_MIN`` / ``WARDEN_HOLD_OFF_MIN`` in the
Celery worker's environment, the same in ``settings.WARDEN`` here). A first "Trigger observe cycle
now" records the queue empty (it retires nothing: the dwell has not passed); once the dwell and
the hold-off have passed, a second press makes the rules planner diagnose the idle worker and
park ``stop_instance`` for it.
"""

import json
import re
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from django.utils import timezone

from agent.models import Approval, Run, SideEffect, Step
from fleet.models import AuditLog, Diagnosis, Instance
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase
from tests.console_support import broker_idle
from tests.fleet_support import machine_of, wait_for

DWELL_MIN = 0.1  # 6 s: longer than one cycle takes, so the first cycle cannot retire anything
HOLD_OFF_MIN = 0.05  # 3 s after the launch
STOP_CARD = '#approvals article.approval:has(code.tool:text-is("stop_instance"))'
TRACE_ROWS = """() => Array.from(document.querySelectorAll('#run-trace tr.step')).map(tr => ({
    seq: Number(tr.cells[0].innerText.trim()),
    tool: (tr.querySelector('td:nth-child(5) > code') || {}).innerText || '',
    args: (tr.querySelector('td:nth-child(5) pre.args') || {}).textContent || '',  // behind its disclosure
    outcome: (tr.querySelector('td:nth-child(6) > .outcome') || {}).innerText || '',
    obs: (tr.querySelector('td:nth-child(7) pre.obs') || {}).innerText || '',
}))"""


def _process_ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.browser
@pytest.mark.integration
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestIdleStopInABrowser(FleetBrowserTestCase):
    warden = {"STOP_GRACE_S": 5.0, "DWELL_MIN": DWELL_MIN, "HOLD_OFF_MIN": HOLD_OFF_MIN, "UNATTENDED": False}
    worker_env = {"WARDEN_DWELL_MIN": str(DWELL_MIN), "WARDEN_HOLD_OFF_MIN": str(HOLD_OFF_MIN),
                  "WARDEN_STOP_GRACE_S": "5", "WARDEN_UNATTENDED": "0"}

    def celery_log(self) -> str:
        try:
            return (self.var_dir / "celery.log").read_text()[-4000:]
        except OSError:
            return ""

    def launch_idle_worker(self) -> Instance:
        """One real worker process, recorded as the product records a launch; waits for its heartbeat."""
        from agent.actions.instances import do_launch_instance

        inst = do_launch_instance(gpu_name="local-cpu", actor="user:alice", reason="a worker for the idle-stop test")
        assert inst.status == "running" and inst.pid, (inst.status, inst.status_msg)

        def live():
            m = machine_of(inst.worker_name)
            return m is not None and timezone.now() - m.last_contact < timedelta(seconds=2)

        wait_for(live, timeout=30, what=f"{inst.worker_name}'s heartbeat in harmony_machines")
        return inst

    def test_an_idle_workers_stop_is_diagnosed_parked_approved_in_the_browser_and_executed_once(self):
        from playwright.sync_api import sync_playwright  # its loop runs in this thread: no ORM inside the block

        inst = self.launch_idle_worker()
        iid, worker_pid = inst.external_id, inst.pid
        log_path = Path(inst.log_path)
        self.start_celery_worker()
        frames: list[str] = []
        seen: dict = {}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = self.log_in(browser, "/?quiet=1", frames)  # quiet (no-op) runs shown: run 1 is one
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                page.wait_for_selector(f"#fleet >> text={iid}")

                # cycle 1: the queue is empty from now on; the dwell has not passed, nothing is retired
                page.click("text=Trigger observe cycle now")
                page.wait_for_selector("#controls >> text=observe cycle queued")
                page.wait_for_selector("#runs #run-1 .status-done", timeout=60_000)
                assert page.query_selector(STOP_CARD) is None, "the first cycle retired before the dwell"
                # past the dwell (from cycle 1's reading) and the hold-off (from the launch)
                page.wait_for_timeout(DWELL_MIN * 60_000 + 1_500)

                # cycle 2: the rules planner diagnoses the idle worker, then parks its stop
                page.evaluate("window.__noReload = 'still here'")
                page.click("text=Trigger observe cycle now")
                page.wait_for_selector(STOP_CARD, timeout=60_000)  # on the dashboard, live
                card = page.query_selector(STOP_CARD)
                assert f"Stop {iid}" in card.inner_text(), card.inner_text()  # the call in words
                assert f'"instance_id": "{iid}"' in card.text_content()  # its JSON, behind the disclosure
                assert "waiting" in card.inner_text()
                seen["dashboard_card"] = card.inner_text()
                approval_pk = int(card.get_attribute("data-approval"))
                run_number = int(re.search(r"run #(\d+)", card.inner_text()).group(1))
                assert page.evaluate("window.__noReload") == "still here"

                # the run's trace: diagnose_instance executed (healthy) before stop_instance was parked
                page.goto(f"{self.live_server_url}/runs/{run_number}/")
                page.wait_for_selector("#run-trace .outcome-parked")
                rows = page.evaluate(TRACE_ROWS)
                seen["trace_before"] = rows
                diag = [r for r in rows if r["tool"] == "diagnose_instance" and iid in r["args"]]
                stop = [r for r in rows if r["tool"] == "stop_instance" and iid in r["args"]]
                assert len(diag) == 1 and diag[0]["outcome"] == "executed", rows
                assert '"health": "healthy"' in diag[0]["obs"], diag
                assert len(stop) == 1 and stop[0]["outcome"] == "parked", rows
                assert diag[0]["seq"] < stop[0]["seq"], rows

                # the inbox: approve it; the card turns "executed" without a reload
                page.goto(self.live_server_url + "/approvals/")
                page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                a = f"#approval-{approval_pk}"
                page.wait_for_selector(f"{a} >> text=waiting")
                assert page.inner_text(f"{a} code.tool") == "stop_instance"
                assert f'"instance_id": "{iid}"' in page.text_content(f"{a} pre.args")
                csrf = page.input_value(f"{a} form:not(.reject-form) input[name=csrfmiddlewaretoken]")
                page.evaluate("window.__noReload = 'still here'")
                page.click(f"{a} button.approve")
                page.wait_for_selector(f"{a} >> text=approved by alice")
                page.wait_for_selector(f"{a} .status-executed", timeout=90_000)
                assert page.evaluate("window.__noReload") == "still here"
                assert page.query_selector(f"{a} button.approve") is None  # nothing left to click

                # a second click (a replayed POST of the same decision) is refused and enqueues nothing
                replay = page.request.post(f"{self.live_server_url}/approvals/{approval_pk}/decide/",
                                           form={"csrfmiddlewaretoken": csrf, "decision": "approve"},
                                           headers={"Referer": self.live_server_url + "/approvals/"})
                seen["replay"] = (replay.status, replay.text())

                page.goto(f"{self.live_server_url}/runs/{run_number}/")
                page.wait_for_selector("#run-trace .outcome-approved_executed", timeout=30_000)
                page.wait_for_selector("#run-trace h1 .status-done", timeout=60_000)
                seen["trace_after"] = page.evaluate(TRACE_ROWS)
                triggers = [json.loads(f).get("trigger") for f in frames if f.startswith("{")]
                assert "approvals-changed" in triggers, frames
            finally:
                browser.close()

        # --- the database and the real process, after the browser --------------------------------
        status, body = seen["replay"]
        assert status == 409, (status, body)
        assert f"approval {approval_pk} was already executed" in body, body

        run = Run.objects.get(number=run_number)
        assert run.trigger == "operator" and run.planner == "rules"
        approval = Approval.objects.get(pk=approval_pk)
        assert (approval.tool, approval.args["instance_id"], approval.status) == ("stop_instance", iid, "executed")
        assert approval.decided_by.username == "alice"
        steps = list(Step.objects.filter(run=run, tool__in=["diagnose_instance", "stop_instance"]).order_by("seq"))
        assert [(s.tool, s.outcome) for s in steps] == [("diagnose_instance", "executed"),
                                                        ("stop_instance", "approved_executed")], steps
        assert Diagnosis.objects.filter(instance=inst, health="healthy").count() == 1
        assert approval.step_id == steps[1].pk

        # exactly one side effect, done; the provider stopped the instance once; its process ended
        effects = list(SideEffect.objects.all())
        assert [(e.tool, e.status, e.instance_ref) for e in effects] == [("stop_instance", "done", iid)], effects
        inst.refresh_from_db()
        assert (inst.status, inst.intended_status, inst.killed_at) == ("stopped", "stopped", None)
        assert _process_ended(worker_pid)
        from fleet.providers.local import LocalProvider

        listed = {p.external_id: p for p in LocalProvider().list_instances()}
        assert (listed[iid].status, listed[iid].exit_code) == ("stopped", 0), listed[iid]
        assert AuditLog.objects.filter(verb="stop_instance", target=iid).count() == 1

        # replay the resume (the task a decision enqueues): the run is no longer parked, nothing more runs
        from agent.tasks import resume

        resume.apply(args=(run.pk,)).get()
        # the positive signal: the worker has taken every task queued so far and acknowledged it,
        # so nothing left in the broker can still act; then the checks that nothing more ran
        wait_for(broker_idle, timeout=60, what=f"the broker to hold no task; worker log:\n{self.celery_log()}")
        assert SideEffect.objects.count() == 1
        assert SideEffect.objects.get().status == "done"
        assert AuditLog.objects.filter(verb="stop_instance", target=iid).count() == 1
        assert Step.objects.filter(tool="stop_instance").count() == 1
        log_text = log_path.read_text()
        assert log_text.count("stopped (SIGTERM)") == 1, log_text[-2000:]
        assert log_text.count(f"supervisor: worker {worker_pid} exited") == 1, log_text[-2000:]
        inst.refresh_from_db()
        assert inst.status == "stopped"
        assert LocalProvider().list_instances()[0].status == "stopped"
        assert "Traceback" not in self.celery_log(), self.celery_log()
