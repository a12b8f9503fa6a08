"""The fleet table: destroyed instances hidden by default with "N destroyed hidden, show"; constant queries."""

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.models import Instance

HX = {"HX-Request": "true"}


def make(external_id: str, **kw) -> Instance:
    now = timezone.now()
    defaults = {"provider": "local", "status": "running", "status_since": now, "created_at": now, "dph": 0.25}
    return Instance.objects.create(external_id=external_id, **{**defaults, **kw})


def test_it_hides_killed_instances_by_default(client, alice):
    make("live-1", label="alpha", gpu_name="RTX 4090", worker_name="w-alpha")
    make("gone-1", label="beta", status="exited", killed_at=timezone.now(), killed_by="agent", kill_reason="terminal: exited")
    client.force_login(alice)
    html = client.get("/fleet/").content.decode()
    assert "alpha" in html and "RTX 4090" in html and "w-alpha" in html
    assert "beta" not in html
    assert "1 destroyed hidden" in html and 'href="/fleet/?killed=1">show<' in html


def test_it_shows_killed_instances_with_who_and_why(client, alice):
    make("gone-1", label="beta", status="exited", exit_code=-9, killed_at=timezone.now(), killed_by="agent",
         kill_reason="terminal: exited")
    client.force_login(alice)
    html = client.get("/fleet/?killed=1").content.decode()
    assert "beta" in html and "by agent" in html and "terminal: exited" in html and "worker killed by SIGKILL (exit -9)" in html
    assert 'hx-get="/fleet/?killed=1"' in html  # the live region keeps the filter


def test_it_shows_intended_status_when_it_differs(client, alice):
    make("i-1", label="gamma", status="loading", intended_status="running")
    client.force_login(alice)
    assert '<div class="sub intended">wanted running</div>' in client.get("/fleet/").content.decode()


def test_it_serves_the_table_alone_to_htmx(client, bob):
    make("live-1", label="alpha")
    client.force_login(bob)  # viewers see the fleet
    resp = client.get("/fleet/", headers=HX)
    body = resp.content.decode()
    assert resp.status_code == 200 and "alpha" in body and "<html" not in body


def test_it_keeps_the_query_count_constant_in_fleet_size(client, alice):
    client.force_login(alice)
    make("a")
    with CaptureQueriesContext(connection) as few:
        client.get("/fleet/?killed=1")
    for i in range(80):
        make(f"b{i}", killed_at=timezone.now() if i % 2 else None)
    with CaptureQueriesContext(connection) as many:
        client.get("/fleet/?killed=1")
    assert len(many) == len(few)
