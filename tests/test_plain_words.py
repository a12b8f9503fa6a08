"""State that no longer lies by omission and no jargon: exit codes in words, no
process id on a stopped instance, instance pages titled by id, no "needs a diagnosis (428)" on a
destroyed instance, turns counted from 1 and arguments shown as JSON."""

import pytest
from django.utils import timezone

from agent.models import Run, Step
from console.templatetags.console_extras import exit_text
from fleet.models import Instance

pytestmark = pytest.mark.django_db


def make(external_id: str, **kw) -> Instance:
    now = timezone.now()
    defaults = {"provider": "local", "status": "running", "status_since": now, "created_at": now, "dph": 0.25}
    return Instance.objects.create(external_id=external_id, **{**defaults, **kw})


def test_exit_codes_read_as_words():
    assert exit_text(-9) == "killed by SIGKILL (exit -9)"
    assert exit_text(-15) == "killed by SIGTERM (exit -15)"
    assert exit_text(0) == "exited cleanly (exit 0)"
    assert exit_text(3) == "exited with code 3"
    assert exit_text(None) == ""


def test_an_exited_worker_says_what_happened_and_what_was_wanted(client, alice):
    make("local-3", status="exited", intended_status="running", exit_code=-9, pid=4242)
    client.force_login(alice)
    html = client.get("/fleet/").content.decode()
    row = html[html.index('href="/instances/local-3/"'):].split("</tr>")[0]
    assert "wanted running" in row and "worker killed by SIGKILL (exit -9)" in row
    assert "→" not in row and "4242" not in row  # no old process id on a process that is gone


def test_a_stopped_instance_shows_no_process_id(client, alice):
    make("local-4", status="stopped", intended_status="stopped", pid=5151, worker_name="local-4")
    make("local-5", pid=6161, worker_name="local-5")
    client.force_login(alice)
    assert "5151" not in client.get("/fleet/").content.decode()
    assert "5151" not in client.get("/instances/local-4/").content.decode()
    assert "(pid 6161)" in client.get("/instances/local-5/").content.decode()


def test_the_instance_page_is_titled_by_its_id_not_its_label(client, alice):
    make("local-6", label="warden")
    client.force_login(alice)
    html = client.get("/instances/local-6/").content.decode()
    assert "<title>local-6 · Warden</title>" in html
    assert "<h1>local-6 <span" in html and "<dt>label</dt><dd>warden</dd>" in html


def test_a_destroyed_instance_does_not_ask_for_a_diagnosis(client, alice):
    make("local-7", status="exited", killed_at=timezone.now(), killed_by="user:alice", kill_reason="destroyed")
    make("local-8")
    client.force_login(alice)
    gone = client.get("/instances/local-7/").content.decode()
    assert "Never diagnosed." in gone and "428" not in gone
    assert "Diagnose first: stop and destroy need a diagnosis" in client.get("/instances/local-8/").content.decode()


def test_turns_count_from_one_and_arguments_are_json(client, alice):
    now = timezone.now()
    run = Run.objects.create(number=1, trigger="beat", planner="rules", status="done", started_at=now)
    Step.objects.create(run=run, seq=1, turn=0, kind="call", tool="stop_instance", batch=True, position=1,
                        args={"instance_id": "v-1", "reason": "idle"}, outcome="parked", created_at=now)
    client.force_login(alice)
    html = client.get("/runs/1/").content.decode()
    row = html[html.index('id="step-1"'):].split("</tr>")[0]
    assert "<td>1<div class=\"sub\">call 2 of its batch</div></td>" in row and "0.1" not in row
    assert "&quot;instance_id&quot;: &quot;v-1&quot;" in row and "&#x27;instance_id&#x27;" not in row


def test_an_instance_without_events_does_not_claim_to_show_the_newest_zero(client, alice):
    make("local-9")
    client.force_login(alice)
    html = client.get("/instances/local-9/").content.decode()
    assert "Nothing recorded." in html and "showing the newest 0" not in html
