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


def test_right_after_the_kill_button_the_exited_instance_is_dead_not_live(client, alice):
    _instance("local-1", "running")
    _instance("local-2", "exited", exit_code=-9)
    # the read still saw local-2's last heartbeat inside its window
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(seconds=3), state="ok", queued=2, running=1,
                                workers_expected=2, workers_live=2, workers_dead=0, proofs_hr=10.0)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert 'id="card-workers-value">1 / 2<' in html and 'id="card-dead">1 dead: local-2 exited<' in html
