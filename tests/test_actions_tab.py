"""The Actions tab: the audit log — who or what did what, when, why, before and after."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agent.actions.session import do_set_observe_only, do_set_target
from fleet.audit import do_audit
from tests.console_support import HX

pytestmark = pytest.mark.django_db


def test_it_lists_who_did_what_when_why_before_and_after(client, alice):
    do_set_target(120, "user:alice", "night batch")
    do_audit("agent", "stop_instance", "v-1", "idle past the dwell", {"status": "running"}, {"status": "stopped"})
    do_audit("monitor", "destroy_instance", "v-2", "terminal: provider status exited")
    client.force_login(alice)
    html = client.get("/actions/").content.decode()
    for text in ("user:alice", "set_target", "night batch", "&quot;target_proofs_hr&quot;: 120",
                 "agent", "stop_instance", "idle past the dwell", "&quot;status&quot;: &quot;stopped&quot;",
                 "monitor", "destroy_instance", "terminal: provider status exited"):
        assert text in html, text
    # newest first
    assert html.index("<code>destroy_instance</code>") < html.index("<code>stop_instance</code>") < html.index("<code>set_target</code>")
    assert 'hx-trigger="actions-changed from:body' in html


def test_it_filters_by_actor_verb_and_target(client, alice):
    do_audit("agent", "stop_instance", "v-1", "a")
    do_audit("user:alice", "reboot_instance", "v-2", "b")
    do_set_observe_only(True, "user:alice", "maintenance")
    client.force_login(alice)
    html = client.get("/actions/?actor=agent").content.decode()
    assert "<code>stop_instance</code>" in html and "<code>reboot_instance</code>" not in html
    html = client.get("/actions/?verb=set_observe").content.decode()
    assert "maintenance" in html and "<code>stop_instance</code>" not in html
    html = client.get("/actions/?target=v-2", headers=HX).content.decode()
    assert "<code>reboot_instance</code>" in html and "<code>stop_instance</code>" not in html and "<html" not in html


def test_viewers_see_the_log(client, bob):
    do_audit("agent", "stop_instance", "v-1", "a")
    client.force_login(bob)
    assert "stop_instance" in client.get("/actions/").content.decode()


def test_the_query_count_is_constant_in_the_number_of_rows(client, alice):
    do_audit("agent", "x", "v-1")
    client.force_login(alice)
    client.get("/actions/")
    with CaptureQueriesContext(connection) as few:
        client.get("/actions/")
    for i in range(40):
        do_audit("agent", "stop_instance", f"v-{i}", "r", {"i": i}, {"i": i + 1})
    with CaptureQueriesContext(connection) as many:
        html = client.get("/actions/").content.decode()
    assert html.count('class="audit-row"') == 41
    assert len(many) == len(few)
