"""The approvals inbox and the inline approvals of the dashboard: approve, reject with a required
comment, expiry countdown, the resume enqueued after a decision, and a constant query count."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent.models import Approval, Run
from agent.runtime.loop import expire_approvals, resume_run
from fleet.clock import clock
from fleet.models import AuditLog
from tests.console_support import HX, IDLE, park_stops, purge_broker, resume_messages
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker_queue():
    purge_broker()
    yield
    purge_broker()


@pytest.fixture
def parked():
    """One run parked on ``stop_instance(v-1)``; yields ``(run, planner, provider)`` inside the world."""
    with scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider:
        run, planner = park_stops("v-1")
        yield run, planner, provider


def test_it_lists_waiting_approvals_with_their_expiry(client, alice, parked):
    run, _, _ = parked
    approval = Approval.objects.get(run=run)
    client.force_login(alice)
    html = client.get("/approvals/").content.decode()
    assert f'id="approval-{approval.pk}"' in html
    assert "stop_instance" in html and "v-1" in html and "idle past the dwell" in html
    assert re.search(r"expires in (29|30) min", html)  # approval_expiry_min is 30
    assert f'data-expires="{approval.expires_at.isoformat()[:19]}' in html
    # no native 'required': an empty rejection reaches the server, which says why in the card
    assert "Approve" in html and "Reject" in html and 'name="comment" maxlength="2000" aria-required="true"' in html
    assert f"run #{run.number}" in html


def test_it_shows_waiting_approvals_inline_on_the_dashboard(client, alice, parked):
    run, _, _ = parked
    approval = Approval.objects.get(run=run)
    client.force_login(alice)
    assert f'id="approval-{approval.pk}"' in client.get("/").content.decode()
    region = client.get("/?partial=approvals", headers=HX).content.decode()
    assert f'id="approval-{approval.pk}"' in region and "<html" not in region
    assert 'hx-trigger="approvals-changed from:body' in client.get("/").content.decode()


def test_it_says_so_when_nothing_waits(client, alice):
    client.force_login(alice)
    assert "No approvals waiting." in client.get("/approvals/").content.decode()


def test_approving_decides_once_and_enqueues_the_resume(client, alice, parked, broker_queue,
                                                        django_capture_on_commit_callbacks):
    run, planner, provider = parked
    approval = Approval.objects.get(run=run)
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post(f"/approvals/{approval.pk}/decide/", {"decision": "approve"})
    assert resp.status_code == 302 and resp["Location"] == "/approvals/"
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by) == ("approved", alice)
    assert [m["args"] for m in resume_messages()] == [[run.pk]]
    row = AuditLog.objects.get(verb="approve_call")
    assert row.actor == "user:alice" and row.after["tool"] == "stop_instance"

    # what the worker then does with the task: the call executes once
    resume_run(run, planner=planner)
    step = run.steps.get(tool="stop_instance")
    assert step.outcome == "approved_executed"
    assert [c for c, _ in provider.calls].count("stop_instance") == 1
    html = client.get("/approvals/").content.decode()
    assert "No approvals waiting." in html and "executed" in html and "approved by alice" in html


def test_a_rejection_needs_a_comment(client, alice, parked, broker_queue, django_capture_on_commit_callbacks):
    run, _, _ = parked
    approval = Approval.objects.get(run=run)
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post(f"/approvals/{approval.pk}/decide/", {"decision": "reject", "comment": "  "})
    assert resp.status_code == 400
    assert "a rejection needs a comment" in resp.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == "waiting"
    assert resume_messages() == []


def test_a_rejection_goes_back_to_the_agent_as_rejected(client, alice, parked, broker_queue,
                                                        django_capture_on_commit_callbacks):
    run, planner, provider = parked
    approval = Approval.objects.get(run=run)
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post(f"/approvals/{approval.pk}/decide/",
                           {"decision": "reject", "comment": "keep it for the night batch"}, headers=HX)
    assert resp.status_code == 200
    body = resp.content.decode()
    assert f'id="approval-{approval.pk}"' in body and "rejected by alice" in body and "night batch" in body
    assert "approvals-changed" in resp["HX-Trigger"]
    assert len(resume_messages()) == 1
    resume_run(run, planner=planner)
    step = run.steps.get(tool="stop_instance")
    assert (step.outcome, step.reason_code) == ("rejected", "rejected")
    assert step.observation.startswith("ok: false") and "keep it for the night batch" in step.observation
    assert "stop_instance" not in [c for c, _ in provider.calls]
    run_page = client.get(f"/runs/{run.number}/").content.decode()
    assert "outcome-rejected" in run_page and "keep it for the night batch" in run_page


def test_an_expired_approval_cannot_be_decided_and_resumes_as_expired(client, alice, parked, broker_queue,
                                                                     django_capture_on_commit_callbacks):
    run, planner, provider = parked
    approval = Approval.objects.get(run=run)
    Approval.objects.filter(pk=approval.pk).update(expires_at=clock.now() - timedelta(seconds=1))
    client.force_login(alice)
    html = client.get("/approvals/").content.decode()
    assert "status-expired" in html and 'name="decision" value="approve"' not in html
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post(f"/approvals/{approval.pk}/decide/", {"decision": "approve"})
    assert resp.status_code == 409 and "has expired" in resp.content.decode()
    assert resume_messages() == []
    assert [r.pk for r in expire_approvals()] == [run.pk]
    resume_run(run, planner=planner)
    step = Run.objects.get(pk=run.pk).steps.get(tool="stop_instance")
    assert (step.outcome, step.reason_code) == ("expired", "expired")
    assert "stop_instance" not in [c for c, _ in provider.calls]


def test_it_shows_the_parked_call_inline_on_the_run_page(client, alice, parked):
    run, _, _ = parked
    approval = Approval.objects.get(run=run)
    client.force_login(alice)
    html = client.get(f"/runs/{run.number}/").content.decode()
    assert f'id="approval-{approval.pk}"' in html and "Approve" in html


def test_the_inbox_query_count_is_constant_in_the_number_of_approvals(client, alice):
    client.force_login(alice)
    with scenario_world([entry(f"v-{i}") for i in range(1, 6)], IDLE):
        park_stops("v-1")
        client.get("/approvals/")
        with CaptureQueriesContext(connection) as few:
            assert client.get("/approvals/").status_code == 200
            assert client.get("/?partial=approvals", headers=HX).status_code == 200
        park_stops("v-2", "v-3", "v-4", "v-5")
        decided = Approval.objects.filter(step__args__instance_id="v-1").get()
        Approval.objects.filter(pk=decided.pk).update(status="rejected", comment="no", decided_by=alice,
                                                      decided_at=clock.now())
        with CaptureQueriesContext(connection) as many:
            html = client.get("/approvals/").content.decode()
            assert client.get("/?partial=approvals", headers=HX).status_code == 200
    assert html.count('class="approval approval-waiting') == 4
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]
