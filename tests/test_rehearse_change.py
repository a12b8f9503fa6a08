""""Rehearse this change on yesterday" on the Settings page: the form as posted (not saved) applied to
the day file of the last 24 h of records, stored as a queued rehearsal and its task enqueued;
operators only, like saving; bad input names the field and starts nothing.

Real parts: PostgreSQL, the Django test client, the Redis broker queue the task is sent to.
"""

import pytest
from django.utils import timezone

from agent.models import Rehearsal, SessionState
from fleet.models import AuditLog
from tests.console_support import HX, broker_messages
from tests.perf_support import seed_day
from tests.test_settings_page import _form

pytestmark = pytest.mark.django_db


def test_an_operator_rehearses_the_change_without_saving_it(client, alice, broker_queue,
                                                             django_capture_on_commit_callbacks):
    seed_day(timezone.now())
    client.force_login(alice)
    data = _form(client)
    before = data["limits__max_instances"]
    data.update({"limits__max_instances": "9", "policy__stop_instance": "auto", "reason": ""})
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post("/settings/rehearse/", data, headers=HX)
    assert resp.status_code == 200
    row = Rehearsal.objects.get()
    html = resp.content.decode()
    assert f'href="/rehearsals/{row.pk}/"' in html and "nothing was saved" in html
    assert row.status == "queued" and row.started_by == "user:alice"
    assert f"max_instances {before} → 9" in row.name and "stop_instance approval → auto" in row.name
    assert row.day["objectives"]["max_instances"] == 9 and row.day["policy"]["stop_instance"] == "auto"
    assert row.day["horizon_h"] == 24 and row.day["market"]["offers"]  # yesterday's records, not an empty day
    assert [m["args"] for m in broker_messages() if m["task"] == "agent.tasks.rehearse"] == [[row.pk]]
    audit = AuditLog.objects.get(verb="start_rehearsal")
    assert audit.actor == "user:alice" and audit.after["change"]["limits"]["max_instances"] == 9
    assert (SessionState.get().overrides or {}).get("limits", {}).get("max_instances") is None  # not saved
    assert not AuditLog.objects.filter(verb="update_overrides").exists()

    # the settings page offers it to operators
    page = client.get("/settings/").content.decode()
    assert 'id="rehearse-change-button"' in page and 'hx-post="/settings/rehearse/"' in page


def test_without_javascript_it_goes_to_the_rehearsal_page(client, alice, broker_queue):
    client.force_login(alice)
    resp = client.post("/settings/rehearse/", _form(client))
    row = Rehearsal.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/rehearsals/{row.pk}/"
    assert row.name == "yesterday under the current settings"


def test_a_shorter_span_can_be_chosen(client, alice, broker_queue):
    client.force_login(alice)
    client.post("/settings/rehearse/", {**_form(client), "rehearse_hours": "6"})
    row = Rehearsal.objects.get()
    assert row.day["horizon_h"] == 6 and row.name == "the last 6 h under the current settings"
    html = client.post("/settings/rehearse/", {**_form(client), "rehearse_hours": "48"}, headers=HX).content.decode()
    assert "rehearse_hours must be 24, 6 or 1" in html and Rehearsal.objects.count() == 1


def test_bad_input_names_the_field_and_starts_nothing(client, alice, broker_queue):
    client.force_login(alice)
    data = _form(client)
    data["limits__max_instances"] = "-3"
    html = client.post("/settings/rehearse/", data, headers=HX).content.decode()
    assert "Not rehearsed:" in html and "max_instances" in html
    assert client.post("/settings/rehearse/", data).status_code == 400
    assert not Rehearsal.objects.exists() and not broker_messages()


def test_viewers_cannot_rehearse_and_see_the_button_disabled(client, bob, broker_queue):
    client.force_login(bob)
    page = client.get("/settings/").content.decode()
    button = page[page.index('id="rehearse-change-button"'):].split(">", 1)[0]
    assert "disabled" in button
    assert client.post("/settings/rehearse/", _form(client), headers=HX).status_code == 403
    assert client.get("/settings/rehearse/").status_code in (403, 405)
    assert not Rehearsal.objects.exists()
