"""What a run did, from the runtime's records, beside the model's verdict (kept as it wrote it):
a run whose side effect executed is "acted" whatever its verdict; a parked run is labelled parked,
never no-op; the dashboard hides quiet runs (no-op heartbeats) with "N quiet runs hidden, show".

Real parts: PostgreSQL and the Django test client; rows as the loop writes them.
"""

import pytest
from django.utils import timezone

from agent.models import Run, Step

pytestmark = pytest.mark.django_db


def make_run(number: int, **kw) -> Run:
    return Run.objects.create(number=number, trigger=kw.pop("trigger", "beat"), planner="rules",
                              started_at=timezone.now(), **kw)


def call(run: Run, seq: int, tool: str, outcome: str, **args) -> Step:
    return Step.objects.create(run=run, seq=seq, kind="call", tool=tool, args=args, outcome=outcome,
                               created_at=timezone.now())


def test_a_monitor_run_that_destroyed_says_acted_beside_no_verdict(client, alice):
    run = make_run(4, status="done")  # the monitor's run: no model, no verdict
    call(run, 1, "destroy_instance", "executed", instance_id="local-1", reason="terminal: exited")
    call(run, 2, "stop_instance", "refused", instance_id="local-2")
    client.force_login(alice)
    html = client.get("/runs/").content.decode()
    did = html.split('id="did-4">')[1].split("</span>\n")[0]
    assert "acted</span> destroy local-1" in did and "stop" not in did
    assert "model gave no verdict" in html and "action unknown" not in html
    page = client.get("/runs/4/").content.decode()
    assert "acted</span> destroy local-1" in page
    acted = client.get("/runs/?verdict=acted").content.decode()
    assert 'id="run-4"' in acted


def test_a_run_that_launched_names_the_instance_it_created(client, alice):
    run = make_run(6, status="done")
    launch = call(run, 1, "launch_instance", "approved_executed", launch_priority="P1", reason="28 queued, 1 live")
    launch.observation = 'ok: true\n{"dph": 0.0, "gpu_name": "local-cpu", "instance_id": "local-3", "status": "running"}'
    launch.save(update_fields=["observation"])
    unnamed = make_run(7, status="done")  # a launch whose answer names nothing: its GPU from the arguments
    call(unnamed, 1, "launch_instance", "executed", gpu_name="RTX 4090")
    client.force_login(alice)
    html = client.get("/runs/").content.decode()
    assert "acted</span> launch local-3" in html.split('id="did-6">')[1].split("</span>\n")[0]
    assert "acted</span> launch RTX 4090" in html.split('id="did-7">')[1].split("</span>\n")[0]


def test_a_parked_run_is_parked_not_no_op(client, alice):
    run = make_run(5, status="parked", included_in_prompt=False)
    call(run, 1, "stop_instance", "parked", instance_id="local-1")
    client.force_login(alice)
    html = client.get("/runs/").content.decode()
    row = html.split('id="run-5"')[1].split("</tr>")[0]
    assert ">parked</span>" in row and ">no-op</span>" not in row and "waits for an approval" in row
    assert 'id="run-5"' not in client.get("/runs/?verdict=noop").content.decode()
    page = client.get("/runs/5/").content.decode()
    assert 'id="skipped-note"' not in page


def test_the_dashboard_hides_quiet_runs_and_shows_them_on_request(client, alice):
    for n in range(1, 18):
        make_run(n, status="done", included_in_prompt=False, verdict_action=False, verdict_state_changed=False)
    make_run(18, status="done", verdict_action=True, verdict_state_changed=True)
    make_run(19, status="parked", included_in_prompt=False)
    acted = make_run(20, status="done", included_in_prompt=False, verdict_action=False, verdict_state_changed=False)
    call(acted, 1, "launch_instance", "approved_executed", offer_id="o-3")  # said no-op, but it launched
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "17 quiet runs hidden" in html and 'href="/?quiet=1">show<' in html
    for n in (18, 19, 20):
        assert f'id="run-{n}"' in html
    assert 'id="run-3"' not in html
    region = client.get("/?partial=runs", HTTP_HX_REQUEST="true").content.decode()
    assert "17 quiet runs hidden" in region
    shown = client.get("/?quiet=1").content.decode()
    assert 'id="run-3"' in shown and "quiet runs hidden" not in shown and 'partial=runs&quiet=1' in shown
    assert 'id="run-3"' in client.get("/?partial=runs&quiet=1", HTTP_HX_REQUEST="true").content.decode()


def test_a_dashboard_of_only_quiet_runs_does_not_say_there_are_no_runs(client, alice):
    # the header names the last run; the table under it must not contradict it with "No runs yet"
    for n in (1, 2):
        make_run(n, status="done", included_in_prompt=False, verdict_action=False, verdict_state_changed=False)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "2 quiet runs hidden" in html and "No runs yet" not in html
    assert "every run so far was a quiet heartbeat" in html
    Run.objects.all().delete()
    assert "No runs yet" in client.get("/").content.decode()
