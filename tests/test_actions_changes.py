"""The Actions page shows what an audit row changed (field: before → after), not two JSON blobs;
the whole before/after stays behind a disclosure.

Real parts: PostgreSQL and the Django test client.
"""

import pytest
from django.utils import timezone

from fleet.models import AuditLog

pytestmark = pytest.mark.django_db


def test_only_the_changed_fields_are_listed(client, alice):
    AuditLog.objects.create(at=timezone.now(), actor="user:alice", verb="stop_instance", target="local-1", reason="cost",
                            before={"status": "running", "intended_status": "running", "gpu_name": "RTX 4090"},
                            after={"status": "stopped", "intended_status": "stopped", "gpu_name": "RTX 4090"})
    client.force_login(alice)
    html = client.get("/actions/").content.decode()
    changed = html.split('<td class="changes">')[1].split("<details")[0]
    assert "<code>intended_status</code> running → stopped" in changed and "<code>status</code> running → stopped" in changed
    assert "gpu_name" not in changed  # unchanged: only in the JSON behind the disclosure
    assert "before / after (JSON)" in html


def test_near_miss_a_row_without_before_lists_what_it_set():
    from console.views.actions import changed_fields

    assert changed_fields(None, {"target": 540}) == [("target", "–", "540")]
    assert changed_fields({"a": 1}, {"a": 1}) == []
    assert changed_fields(None, None) == []
