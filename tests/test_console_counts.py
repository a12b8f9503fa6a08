"""Counts on the console add up: the workers card counts the instances we intend to be running,
dead ones included (the demand read's ``workers_expected`` stays what the guards read).

Real parts: PostgreSQL and the Django test client, rows as ``fleet.sync`` and the demand read
write them.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import DemandSample, Instance

pytestmark = pytest.mark.django_db


def _instance(ext: str, status: str, **kw) -> Instance:
    now = timezone.now()
    return Instance.objects.create(provider="local", external_id=ext, label="warden", worker_name=ext, status=status,
                                   intended_status="running", status_since=now, created_at=now, dph=0.1, **kw)


def test_a_killed_worker_shows_as_one_of_two_and_dead_by_name(client, alice):
    _instance("local-1", "running")
    _instance("local-2", "exited", exit_code=-9)
    # what the demand read says after `demo kill-worker`: the exited instance is not expected any more
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(seconds=3), state="ok", queued=2, running=1,
                                workers_expected=1, workers_live=1, workers_dead=0, proofs_hr=10.0)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert 'id="card-workers-value">1 / 2<' in html
    assert 'id="card-dead">1 dead: local-2 exited<' in html
    assert "The last demand read expected 1" in html


def test_near_miss_a_destroyed_or_stopped_instance_is_not_counted(client, alice):
    _instance("local-1", "running")
    _instance("local-2", "exited", killed_at=timezone.now())  # destroyed: gone
    stopped = _instance("local-3", "stopped")
    Instance.objects.filter(pk=stopped.pk).update(intended_status="stopped")  # stopped on purpose
    _instance("local-4", "exited", destroy_requested_at=timezone.now())  # being destroyed
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(seconds=3), state="ok", queued=0, running=0,
                                workers_expected=1, workers_live=1, workers_dead=0, proofs_hr=10.0)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert 'id="card-workers-value">1 / 1<' in html and 'id="card-dead"' not in html


def test_a_launch_still_provisioning_is_intended_but_not_dead(client, alice):
    _instance("local-1", "running")
    _instance("local-2", "loading")
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(seconds=3), state="ok", queued=0, running=0,
                                workers_expected=1, workers_live=1, workers_dead=0, proofs_hr=10.0)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert 'id="card-workers-value">1 / 2<' in html and 'id="card-dead"' not in html


def test_instances_launched_after_the_last_read_are_starting_not_dead(client, alice):
    # the run read the queue (no instance yet), then launched two: the next read comes a heartbeat later
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(seconds=3), state="ok", queued=20, running=0,
                                workers_expected=0, workers_live=0, workers_dead=0, proofs_hr=0.0)
    _instance("local-1", "running")
    _instance("local-2", "running")
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert 'id="card-workers-value">0 / 2<' in html and 'id="card-dead"' not in html
    assert "2 starting (not yet expected)" in html


def test_near_miss_an_instance_the_read_saw_without_a_worker_is_dead(client, alice):
    _instance("local-1", "running")
    _instance("local-2", "running")
    DemandSample.objects.create(taken_at=timezone.now(), state="ok", queued=20, running=0,
                                workers_expected=2, workers_live=1, workers_dead=1, proofs_hr=0.0)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert 'id="card-workers-value">1 / 2<' in html and 'id="card-dead">1 dead<' in html
    assert "starting (not yet expected)" not in html


def test_right_after_the_kill_button_the_exited_instance_is_dead_not_live(client, alice):
    _instance("local-1", "running")
    _instance("local-2", "exited", exit_code=-9)
    # the read still saw local-2's last heartbeat inside its window
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(seconds=3), state="ok", queued=2, running=1,
                                workers_expected=2, workers_live=2, workers_dead=0, proofs_hr=10.0)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert 'id="card-workers-value">1 / 2<' in html and 'id="card-dead">1 dead: local-2 exited<' in html


def _chips(html: str) -> dict[str, int]:
    import re

    return {m[0]: int(m[1]) for m in re.findall(r'id="fleet-chip-([a-z]+)">[a-z]+ <span class="n">(\d+)</span>', html)}


def test_destroyed_is_one_word_with_its_own_chip_and_the_chips_add_up(client, alice):
    _instance("local-1", "running")
    _instance("local-2", "exited", exit_code=-9)  # the kill button: the process died, the instance is listed
    _instance("local-3", "error")
    _instance("local-4", "exited", killed_at=timezone.now(), killed_by="monitor", kill_reason="terminal: exited")
    client.force_login(alice)
    hidden = client.get("/fleet/").content.decode()
    assert "1 destroyed hidden" in hidden and "<th>destroyed</th>" in hidden and "killed hidden" not in hidden
    chips = _chips(hidden)
    assert chips["all"] == 3 and chips["exited"] == 1 and chips["error"] == 1 and "destroyed" not in chips
    assert sum(v for k, v in chips.items() if k != "all") == chips["all"]
    shown = client.get("/fleet/?killed=1").content.decode()
    chips = _chips(shown)
    assert chips["all"] == 4 and chips["destroyed"] == 1
    assert sum(v for k, v in chips.items() if k != "all") == chips["all"]
    assert '<span class="status status-destroyed">destroyed</span>' in shown
    only = client.get("/fleet/?status=destroyed&killed=1").content.decode()
    assert "local-4" in only and "local-1<" not in only and "local-2<" not in only


def test_a_destroyed_row_says_what_it_was_last_seen_doing_only_when_that_adds_something(client, alice):
    exited = _instance("local-4", "exited", killed_at=timezone.now(), killed_by="monitor", kill_reason="terminal: exited")
    gone = _instance("local-5", "destroyed", killed_at=timezone.now(), killed_by="user:alice", kill_reason="done")
    client.force_login(alice)
    html = client.get("/fleet/?killed=1").content.decode()
    assert "last seen exited" in html.split(f'id="inst-{exited.pk}"')[1].split("</tr>")[0]
    assert "last seen" not in html.split(f'id="inst-{gone.pk}"')[1].split("</tr>")[0]  # never "destroyed … last seen destroyed"


def test_a_destroyed_instance_page_says_destroyed(client, alice):
    _instance("local-4", "exited", killed_at=timezone.now(), killed_by="monitor", kill_reason="terminal: exited")
    client.force_login(alice)
    html = client.get("/instances/local-4/").content.decode()
    assert '<span class="badge muted">destroyed</span>' in html and "<dt>destroyed</dt>" in html
