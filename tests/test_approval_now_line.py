"""An approval card's "now" line never lags a decision: it is drawn only while the call
waits, says when it was read, and the inbox and the dashboard's column redraw it when the fleet or
demand changes (not only every 30 s)."""

import re

import pytest

from agent.models import Approval
from tests.console_support import HX, IDLE, park_stops
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def test_a_waiting_card_says_when_now_was_read_and_a_decided_one_has_no_now(client, alice, broker_queue):
    with scenario_world([entry("v-1")], IDLE):
        run, _ = park_stops("v-1")
        approval = Approval.objects.get(run=run)
        client.force_login(alice)
        inbox = client.get("/approvals/").content.decode()
        card = inbox[inbox.index(f'id="approval-{approval.pk}"'):].split("</article>")[0]
        assert re.search(r'<div class="now"><dt [^>]*>now <span class="sub">\(\d\d:\d\d:\d\d\)</span></dt>', card)
        decided = client.post(f"/approvals/{approval.pk}/decide/", {"decision": "approve"}, headers=HX).content.decode()
    assert "approved by alice" in decided and 'class="now"' not in decided and 'class="then"' in decided


def test_the_approval_regions_redraw_on_fleet_and_demand_changes(client, alice):
    client.force_login(alice)
    for url in ("/approvals/", "/"):
        html = client.get(url).content.decode()
        region = html[html.index('id="approvals"'):].split(">")[0]
        assert "fleet-changed from:body" in region and "demand-changed from:body" in region, url


def test_a_refused_decision_does_not_refresh_the_inbox_over_its_error(client, alice):
    with scenario_world([entry("v-1")], IDLE):
        run, _ = park_stops("v-1")
        approval = Approval.objects.get(run=run)
        client.force_login(alice)
        resp = client.post(f"/approvals/{approval.pk}/decide/", {"decision": "reject", "comment": ""}, headers=HX)
    # the card carries the error; no "approvals-changed" (it would re-fetch the inbox and wipe it at once)
    assert "a rejection needs a comment" in resp.content.decode()
    assert "approvals-changed" not in resp.get("HX-Trigger", "")
    assert Approval.objects.get(pk=approval.pk).status == "waiting"
