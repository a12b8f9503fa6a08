""""Rehearse this change on yesterday" on the Settings page: the form as posted (not saved) applied to
the day file of the last 24 h of records, stored as an A/B pair of queued rehearsals (the same day
under the current settings and under the change) and one task enqueued; operators only, like
saving; bad input names the field and starts nothing. The task plays both sides, its progress
covering both, and the page shows the two columns and their difference.

Real parts: PostgreSQL, the Django test client, the Redis broker queue the task is sent to, and
for the slow test ``manage.py rehearse``'s scratch children on SQLite.
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
    base, row = Rehearsal.objects.order_by("pk")
    html = resp.content.decode()
    assert f'href="/rehearsals/{row.pk}/"' in html and "nothing was saved" in html
    assert row.status == "queued" and row.started_by == "user:alice"
    assert f"max_instances {before} → 9" in row.name and "stop_instance approval → auto" in row.name
    assert row.day["objectives"]["max_instances"] == 9 and row.day["policy"]["stop_instance"] == "auto"
    assert row.day["horizon_h"] == 24 and row.day["market"]["offers"]  # yesterday's records, not an empty day
    # the other side: the same day under the current settings, linked both ways, played by the same task
    assert base.name == "yesterday under the current settings" and base.status == "queued"
    assert row.compare_to_id == base.pk and base.compare_to_id == row.pk
    same = ("start", "horizon_h", "seed", "market", "work", "operator", "heartbeat_s")
    assert {k: base.day.get(k) for k in same} == {k: row.day.get(k) for k in same}
    assert base.day["objectives"]["max_instances"] == int(before) and base.day["policy"].get("stop_instance") != "auto"
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


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_task_plays_both_sides_and_its_progress_covers_both(client, alice, broker_queue):
    """One task, two scratch children: the current settings first (progress 0..0.5 on the pair),
    then the change (0.5..1); then the change's page shows both columns and their difference."""
    from agent.actions.runs import do_start_rehearsal
    from agent.rehearse.background import play_stored
    from fleet.events import changed
    from tests.days_support import day, window

    a = {**window(day("bursty"), 8.9), "horizon_h": 0.5, "name": "the current settings"}
    b = {**a, "name": "launches by themselves", "policy": {"launch_instance": "auto"}}
    row = do_start_rehearsal(b, b["name"], "user:alice", baseline=a, baseline_name=a["name"])
    seen = []

    def note(topics, **_):
        if "rehearsals-changed" in topics:
            seen.append(tuple(Rehearsal.objects.filter(pk=pk).values_list("status", "progress").get()
                              for pk in (row.compare_to_id, row.pk)))

    changed.connect(note)
    try:
        assert play_stored(row.pk) == "done"
    finally:
        changed.disconnect(note)
    base = Rehearsal.objects.get(pk=row.compare_to_id)
    row.refresh_from_db()
    assert base.status == row.status == "done" and row.progress == 1.0
    during_a = [p for (sa, _), (_, p) in seen if sa == "running"]
    during_b = [p for (sa, _), (sb, p) in seen if sa == "done" and sb == "running"]
    assert during_a and max(during_a) <= 0.5 and during_b and min(during_b) >= 0.5
    assert [p for _, (_, p) in seen] == sorted(p for _, (_, p) in seen)  # the bar never goes back
    sa, sb = base.result["summary"], row.result["summary"]
    assert sa["proofs_arrived"] == sb["proofs_arrived"]  # the same arrivals on both sides
    assert sb["approvals_asked_by_tool"].get("launch_instance", 0) == 0

    client.force_login(alice)
    html = client.get(f"/rehearsals/{row.pk}/").content.decode()
    table = html[html.index('id="rehearsal-compare"'):html.index("</table>", html.index('id="rehearsal-compare"'))]
    assert f"A: #{base.pk}" in table and f"B: #{row.pk}" in table and "difference" in table
    delivered = table[table.index('id="compare-proofs_delivered"'):].split("</tr>", 1)[0]
    diff = sb["proofs_delivered"] - sa["proofs_delivered"]
    assert f"<td>{sa['proofs_delivered']:,}</td><td>{sb['proofs_delivered']:,}</td>" in delivered
    assert f"<td>{'0' if diff == 0 else ('+' if diff > 0 else '−') + format(abs(diff), ',')}</td>" in delivered
