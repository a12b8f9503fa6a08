"""Bulk decisions in the approvals inbox, and the waiting count in the navigation (four stop
requests once took four clicks, and nothing counted what waits)."""

import pytest

from agent.models import Approval
from fleet.models import AuditLog
from tests.console_support import HX, IDLE, park_stops, resume_messages
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])

IDS = ("v-1", "v-2", "v-3", "v-4")


@pytest.fixture
def four(db):
    with scenario_world([entry(i) for i in IDS], IDLE) as provider:
        run, _ = park_stops(*IDS)
        yield run, list(Approval.objects.filter(run=run).order_by("pk")), provider


def test_the_navigation_counts_waiting_approvals(client, alice, four):
    _, approvals, _ = four
    client.force_login(alice)
    html = client.get("/fleet/").content.decode()
    badge = html[html.index('id="nav-approvals"'):].split("</span>")[0]
    assert badge.endswith(">4") and "4 calls waiting" in badge
    Approval.objects.filter(pk=approvals[0].pk).update(status="rejected")
    frag = client.get("/approvals/?partial=count", headers=HX).content.decode()
    assert frag.strip().startswith('<span id="nav-approvals"') and ">3</span>" in frag


def test_four_stops_are_approved_in_one_click(client, alice, four, broker_queue, django_capture_on_commit_callbacks):
    run, approvals, _ = four
    client.force_login(alice)
    page = client.get("/approvals/").content.decode()
    assert 'id="bulk-form"' in page and page.count('class="bulk-pick"') == 4
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post("/approvals/bulk/", {"decision": "approve", "ids": [str(a.pk) for a in approvals]},
                           headers=HX)
    html = resp.content.decode()
    assert resp.status_code == 200 and "approved 4:" in html
    assert set(Approval.objects.filter(run=run).values_list("status", flat=True)) == {"approved"}
    assert AuditLog.objects.filter(verb="approve_call", actor="user:alice").count() == 4
    assert [m["args"] for m in resume_messages()] == [[run.pk]]  # the run resumes once


def test_a_bulk_rejection_needs_a_comment_and_decides_nothing_without_one(client, alice, four):
    run, approvals, _ = four
    client.force_login(alice)
    resp = client.post("/approvals/bulk/", {"decision": "reject", "ids": [str(a.pk) for a in approvals]}, headers=HX)
    assert 'id="bulk-error"' in resp.content.decode() and "a rejection needs a comment" in resp.content.decode()
    assert set(Approval.objects.filter(run=run).values_list("status", flat=True)) == {"waiting"}
    plain = client.post("/approvals/bulk/", {"decision": "reject", "ids": [str(approvals[0].pk)]})
    assert plain.status_code == 400


def test_one_already_decided_is_reported_and_the_others_still_go_through(client, alice, four, broker_queue):
    run, approvals, _ = four
    client.force_login(alice)
    client.post(f"/approvals/{approvals[0].pk}/decide/", {"decision": "approve"})
    resp = client.post("/approvals/bulk/", {"decision": "reject", "comment": "not tonight",
                                            "ids": [str(a.pk) for a in approvals]}, headers=HX)
    html = resp.content.decode()
    assert f"approval {approvals[0].pk} was already approved" in html and "rejected 3:" in html
    assert list(Approval.objects.filter(run=run).order_by("pk").values_list("status", flat=True)) == [
        "approved", "rejected", "rejected", "rejected"]
    assert set(Approval.objects.filter(status="rejected").values_list("comment", flat=True)) == {"not tonight"}


def test_nothing_selected_or_a_bad_id_is_a_clear_400(client, alice, four):
    client.force_login(alice)
    assert "select at least one" in client.post("/approvals/bulk/", {"decision": "approve"}, headers=HX).content.decode()
    bad = client.post("/approvals/bulk/", {"decision": "approve", "ids": ["1; drop"]})
    assert bad.status_code == 400 and "ids must be approval numbers" in bad.content.decode()
