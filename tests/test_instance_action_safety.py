"""The instance action form has no default action, and a refusal lands at the top of the page with
its code and a detail that says what the code means."""

import re

import pytest

from fleet.clock import clock
from fleet.models import AuditLog, Diagnosis, Instance
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}
#: the queue emptied 2 minutes ago; the default dwell is longer: a stop is on hold
JUST_IDLE = {"state": "ok", "active": False, "queued": 0, "running": 0, "workers_expected": 1, "workers_live": 1,
             "idle_min": 2}


def test_the_action_menu_selects_nothing_by_default(client, alice):
    with scenario_world([entry("v-1")], JUST_IDLE):
        client.force_login(alice)
        html = client.get("/instances/v-1/").content.decode()
    start = html.index('<select name="action"')
    select = html[start:html.index("</select>", start)]
    assert "required" in select.split(">")[0]
    assert re.findall(r'<option value="([a-z]*)"[^>]*selected', select) == [""]  # "choose…", never reboot


def test_a_post_without_an_action_does_nothing_and_says_so(client, alice):
    with scenario_world([entry("v-1")], JUST_IDLE) as provider:
        client.force_login(alice)
        before = AuditLog.objects.count()
        resp = client.post("/instances/v-1/act/", {"action": "", "reason": "x"})
    assert resp.status_code == 400 and "choose an action" in resp.content.decode()
    assert AuditLog.objects.count() == before and provider.calls == []


def test_a_refused_stop_is_shown_at_the_top_of_the_page_with_what_hold_off_means(client, alice):
    with scenario_world([entry("v-1")], JUST_IDLE) as provider:
        Diagnosis.objects.create(instance=Instance.objects.get(external_id="v-1"), taken_at=clock.now(), health="healthy")
        client.force_login(alice)
        resp = client.post("/instances/v-1/act/", {"action": "stop", "reason": "cost"}, headers=HX)
        html = resp.content.decode()
        assert "stop_instance" not in [c for c, _ in provider.calls]
        # htmx: the form's answer, plus the page's alert slot swapped out of band
        oob = html[html.index('id="page-alert"'):]
        assert 'hx-swap-oob="true"' in oob.split(">")[0]
        assert "stop of v-1 was refused" in oob and '<code class="reason">hold_off</code>' in oob
        assert "on hold: the queue has been empty for 2.0 min" in oob and "dwell" in oob
        assert "override" in oob
        # a plain browser gets the page with the refusal in the same slot, above everything else
        page = client.post("/instances/v-1/act/", {"action": "stop", "reason": "cost"})
        body = page.content.decode()
    assert page.status_code == 409
    top = body[body.index('id="page-alert"'):body.index('id="instance"')]
    assert "hold_off" in top and "stop of v-1 was refused" in top


def test_a_successful_action_clears_the_alert_slot(client, alice):
    with scenario_world([entry("v-1")], {**JUST_IDLE, "idle_min": 600}):
        Diagnosis.objects.create(instance=Instance.objects.get(external_id="v-1"), taken_at=clock.now(), health="healthy")
        client.force_login(alice)
        html = client.post("/instances/v-1/act/", {"action": "reboot", "reason": "wedged"}, headers=HX).content.decode()
    slot = html[html.index('id="page-alert"'):]
    assert slot.split("</div>")[0].endswith('hx-swap-oob="true">')  # emptied
