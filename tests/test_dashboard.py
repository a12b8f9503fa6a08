"""The dashboard: login, summary cards, demand state shown loudly, regions as htmx partials, roles."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent.models import Run, SessionState
from fleet.models import DemandSample, Instance

HX = {"HX-Request": "true"}


def make_instances(n: int, start: int = 0, **kw) -> None:
    now = timezone.now()
    Instance.objects.bulk_create(
        [
            Instance(provider="local", external_id=f"w{start + i}", label=f"worker-{start + i}", status="running",
                     status_since=now, created_at=now, dph=0.5, **kw)
            for i in range(n)
        ]
    )


def test_it_requires_login(client, db):
    resp = client.get("/")
    assert resp.status_code == 302
    assert resp["Location"].startswith("/login/")


def test_it_logs_in_with_the_login_page(client, alice):
    resp = client.post("/login/", {"username": "alice", "password": "alice-pass-1"})
    assert resp.status_code == 302 and resp["Location"] == "/"
    assert client.get("/").status_code == 200


def test_it_shows_summary_cards(client, alice):
    SessionState.objects.update_or_create(pk=1, defaults={"target_proofs_hr": 240})
    make_instances(2)
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(seconds=30), state="ok", queued=7, running=2,
                                workers_expected=2, workers_live=1, workers_dead=1, proofs_hr=88.5)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "demand: OK" in html
    assert 'id="card-target">240<' in html
    assert 'id="card-queued">7' in html
    assert "88.5" in html
    assert "1 / 2" in html and "1 dead" in html
    assert "$1.00" in html  # two running instances at $0.50/hr
    assert "Trigger observe cycle now" in html
    assert 'ws-connect="/ws/console/"' in html
    assert "django_htmx/htmx-2.min.js" in html and "django_htmx/ext/hx-ws-2.min.js" in html
    assert "console.js" in html


def test_it_never_shows_an_unknown_queue_as_zero(client, alice):
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(minutes=4), state="unknown",
                                error="harmony unreadable: connection refused")
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "demand: UNKNOWN" in html
    assert "read 4 min ago" in html
    assert "harmony unreadable" in html
    assert 'id="card-queued">unknown' in html
    assert 'id="card-queued">0' not in html


def test_it_says_unknown_before_the_first_demand_read(client, alice):
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "demand: UNKNOWN" in html and "no demand sample yet" in html
    assert 'id="card-queued">unknown' in html


def test_it_marks_stale_demand(client, alice):
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(hours=2), state="stale", queued=3)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "demand: STALE" in html and "read 2 h ago" in html
    assert 'id="card-queued">3 <span class="badge warn">stale</span>' in html


def test_it_serves_each_region_as_a_partial(client, alice):
    Run.objects.create(number=1, trigger="operator", planner="rules", status="done", started_at=timezone.now())
    client.force_login(alice)
    for name, marker in [("cards", "demand:"), ("runs", "run-1"), ("fleet", "No instances"), ("chat", "No messages yet")]:
        resp = client.get(f"/?partial={name}", headers=HX)
        body = resp.content.decode()
        assert resp.status_code == 200, name
        assert marker in body, name
        assert "<html" not in body, name
    # without htmx the same URL is the whole page (links work without JS)
    assert "<html" in client.get("/?partial=cards").content.decode()


def test_it_disables_actions_for_viewers(client, bob, alice):
    client.force_login(bob)
    html = client.get("/").content.decode()
    assert html.count('disabled title="viewers cannot act"') >= 5
    client.force_login(alice)
    assert "viewers cannot act" not in client.get("/").content.decode()


def test_it_keeps_the_query_count_constant_in_fleet_size(client, alice):
    client.force_login(alice)
    make_instances(3)
    client.get("/")  # warm the anchor row
    with CaptureQueriesContext(connection) as few:
        assert client.get("/").status_code == 200
    make_instances(60, start=3)
    Instance.objects.filter(external_id__in=["w1", "w2"]).update(killed_at=timezone.now(), killed_by="agent")
    with CaptureQueriesContext(connection) as many:
        html = client.get("/").content.decode()
    assert "2 destroyed hidden" in html
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]

@pytest.mark.django_db(transaction=True, databases=["default", "harmony"])
@pytest.mark.django_db(transaction=True, databases=["default", "harmony"])
def test_it_serves_pages_when_redis_and_harmony_are_down(client, alice, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}}
    harmony = __import__("django.db", fromlist=["connections"]).connections["harmony"]
    real_name = harmony.settings_dict["NAME"]
    harmony.close()
    harmony.settings_dict["NAME"] = "warden_no_such_database"
    try:
        client.force_login(alice)
        for url in ["/", "/fleet/", "/runs/", "/?partial=cards"]:
            assert client.get(url).status_code == 200, url
    finally:
        harmony.close()
        harmony.settings_dict["NAME"] = real_name


def test_it_serves_the_static_files_from_the_asgi_app(db):
    """A bare ``daphne console.asgi:application`` must serve htmx, its ws extension and console.js."""
    from asgiref.sync import async_to_sync
    from channels.testing import HttpCommunicator

    from console.asgi import application

    async def status_of(path: str) -> int:
        comm = HttpCommunicator(application, "GET", path)
        await comm.send_input({"type": "http.request", "body": b""})
        start = await comm.receive_output(timeout=5)
        await comm.wait(timeout=5)
        return start["status"]

    for path in ["/static/console.js", "/static/console.css", "/static/django_htmx/ext/hx-ws-2.min.js"]:
        assert async_to_sync(status_of)(path) == 200, path


def test_it_marks_a_good_read_older_than_two_heartbeats_stale(client, alice, settings):
    settings.WARDEN = {**settings.WARDEN, "OBSERVE_INTERVAL_S": 300}
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(minutes=11), state="ok", queued=3, running=0,
                                workers_expected=1, workers_live=1, workers_dead=0)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "demand: STALE" in html
    assert "stale" in html.split('id="card-queued">')[1][:200]


def test_a_fresh_good_read_is_not_stale(client, alice, settings):
    settings.WARDEN = {**settings.WARDEN, "OBSERVE_INTERVAL_S": 300}
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(minutes=9), state="ok", queued=3, running=0,
                                workers_expected=1, workers_live=1, workers_dead=0)
    client.force_login(alice)
    assert "demand: OK" in client.get("/").content.decode()


def test_it_says_how_many_workers_are_still_in_their_startup_grace(client, alice, settings):
    settings.WARDEN = {**settings.WARDEN, "STARTUP_GRACE_S": 60}
    make_instances(2, started_at=timezone.now())
    # the demand read counts who is starting: inside the grace and not heartbeating yet
    DemandSample.objects.create(taken_at=timezone.now(), state="ok", queued=3, running=2, workers_expected=0,
                                workers_live=0, workers_dead=0, detail={"workers_starting": 2})
    client.force_login(alice)
    assert "2 starting (not yet expected)" in client.get("/").content.decode()


def test_it_shows_the_queue_and_the_pipeline_backlog_apart(client, alice):
    DemandSample.objects.create(taken_at=timezone.now(), state="ok", queued=0, running=0, backlog=4,
                                workers_expected=0, workers_live=0, workers_dead=0, proof_s=41.6)
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert 'id="card-queued">0' in html
    assert "backlog 4</div>" in html
    assert "42 s per proof" in html


def test_it_says_an_unknown_backlog_is_unknown(client, alice):
    DemandSample.objects.create(taken_at=timezone.now(), state="ok", queued=2, running=0, backlog=None,
                                workers_expected=0, workers_live=0, workers_dead=0,
                                error="grant: role warden_ro may not read curio.sectors_snap_pipeline")
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "backlog unknown</div>" in html
    assert "partial read: grant: role warden_ro may not read curio.sectors_snap_pipeline" in html


def test_it_lists_worker_rows_no_instance_matches(client, alice):
    DemandSample.objects.create(
        taken_at=timezone.now(), state="ok", queued=0, running=0, backlog=0, workers_expected=1, workers_live=0,
        workers_dead=0, workers_cordoned=1,
        detail={"workers_unmatched": 1,
                "unmatched": [{"host_and_port": "172.17.0.2:12300", "name": "", "live": True, "cordoned": True,
                               "owned_tasks": 0}],
                "shared_host_and_port": {"127.0.0.1:12300": 2}})
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "1 unmatched: 172.17.0.2:12300 cordoned" in html
    assert "shared host:port: 127.0.0.1:12300 ×2" in html
    assert "dead</div>" not in html


def test_it_offers_the_demo_controls_only_for_the_demo_queue(client, alice, settings):
    client.force_login(alice)
    assert "Add tasks" in client.get("/").content.decode()

    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "curio"}
    html = client.get("/").content.decode()
    assert "Add tasks" not in html and "Crash one worker" not in html
    assert "Trigger observe cycle now" in html
def test_workers_heartbeating_inside_the_grace_are_not_starting(client, alice, settings):
    settings.WARDEN = {**settings.WARDEN, "STARTUP_GRACE_S": 60}
    make_instances(2, started_at=timezone.now())
    DemandSample.objects.create(taken_at=timezone.now(), state="ok", queued=3, running=2, workers_expected=2,
                                workers_live=2, workers_dead=0, detail={"workers_starting": 0})
    client.force_login(alice)
    page = client.get("/").content.decode()
    assert "starting (not yet expected)" not in page


def test_it_shows_the_source_its_state_and_age_and_the_rate_with_its_window(client, alice):
    DemandSample.objects.create(taken_at=timezone.now() - timedelta(seconds=40), state="ok", queued=0, running=2,
                                workers_expected=2, workers_live=2, workers_dead=0, proofs_hr=358.3, proof_s=20.0,
                                detail={"source": "curio", "rate_window_s": 900,
                                        "proof_s_by_gpu": {"H200": 11.0, "RTX 4090": 33.0}})
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert "demand: OK" in html and 'id="demand-source"' in html and "source curio" in html and "read 40 s ago" in html
    assert 'id="card-rate-window">(last 15 min)<' in html
    assert "358.3" in html and "20 s per proof" in html
    assert 'id="card-proof-s-gpu"' in html and "H200 11 s · RTX 4090 33 s" in html
