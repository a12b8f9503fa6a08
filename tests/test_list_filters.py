"""Filters and pages in the URL on the fleet and runs lists (lists without end, filters
in the URL): a reload or a shared link shows the same rows; the live region re-fetches
the same URL; a bad filter is a 400 naming it; the query count does not grow with the list."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent.models import Run
from fleet.models import Instance

pytestmark = pytest.mark.django_db


def inst(external_id: str, **kw) -> Instance:
    now = timezone.now()
    return Instance.objects.create(provider="local", external_id=external_id, status=kw.pop("status", "running"),
                                   status_since=now, created_at=now, **kw)


def run(number: int, **kw) -> Run:
    return Run.objects.create(number=number, trigger=kw.pop("trigger", "beat"), planner="rules",
                              status=kw.pop("status", "done"), started_at=timezone.now(), **kw)


def test_the_fleet_filters_by_status_and_search_in_the_url(client, alice):
    inst("local-1", label="alpha")
    inst("local-2", status="stopped", label="beta")
    inst("local-3", status="exited", gpu_name="H200")
    client.force_login(alice)
    html = client.get("/fleet/?status=stopped").content.decode()
    assert "local-2" in html and "local-1" not in html and "local-3" not in html
    assert 'hx-get="/fleet/?status=stopped"' in html  # the live region keeps the filter
    assert 'class="chip on" id="fleet-chip-stopped"' in html
    found = client.get("/fleet/?q=h200").content.decode()
    assert "local-3" in found and "local-1" not in found and 'value="h200"' in found
    assert 'href="/fleet/?q=h200&amp;status=running"' in found  # a chip keeps the search


def test_the_fleet_pages_and_the_links_keep_the_filter(client, alice):
    for i in range(55):
        inst(f"local-{i:03d}")
    client.force_login(alice)
    first = client.get("/fleet/?status=running").content.decode()
    assert "page 1 of 2 · 1–50 of 55" in first and 'href="/fleet/?status=running&amp;page=2"' in first
    second = client.get("/fleet/?status=running&page=2").content.decode()
    assert second.count('class="row-actions"') == 5 and "local-000" in second
    dash = client.get("/").content.decode()  # the dashboard: the newest 20 and the way to the rest
    assert dash.count('class="row-actions"') == 20 and "newest 20 of 55 instances" in dash
    region = client.get("/?partial=fleet", headers={"HX-Request": "true"}).content.decode()
    assert region.count('class="row-actions"') == 20 and re.search(r'name="request_key" value="[0-9a-f]{32}"', region)


def test_a_bad_filter_is_a_400_that_names_it(client, alice):
    client.force_login(alice)
    bad = client.get("/fleet/?status=sideways")
    assert bad.status_code == 400 and b"status must be one of" in bad.content
    assert b"page must be a whole number" in client.get("/runs/?page=-1").content
    assert b"verdict must be one of" in client.get("/runs/?verdict=maybe").content


def test_runs_filter_by_status_trigger_and_verdict(client, alice):
    run(1, trigger="chat")
    run(2, status="halted", halt_reason="max_steps")
    run(3, included_in_prompt=False, verdict_action=False)
    client.force_login(alice)
    halted = client.get("/runs/?status=halted").content.decode()
    assert 'id="run-2"' in halted and 'id="run-1"' not in halted and 'hx-get="/runs/?status=halted"' in halted
    chat = client.get("/runs/?trigger=chat").content.decode()
    assert 'id="run-1"' in chat and 'id="run-2"' not in chat
    noop = client.get("/runs/?verdict=noop").content.decode()
    assert 'id="run-3"' in noop and 'id="run-1"' not in noop


def test_runs_page_by_fifty_and_the_dashboard_links_to_them(client, alice):
    for n in range(1, 121):
        run(n)
    client.force_login(alice)
    html = client.get("/runs/?page=3").content.decode()
    assert "page 3 of 3 · 101–120 of 120" in html and 'id="run-20"' in html and 'id="run-21"' not in html
    dash = client.get("/").content.decode()
    assert 'id="runs-more"' in dash and "newest 20 of 120 runs" in dash


def test_the_query_count_does_not_grow_with_the_lists(client, alice):
    client.force_login(alice)
    inst("a")
    run(1)
    with CaptureQueriesContext(connection) as few_f:
        client.get("/fleet/")
    with CaptureQueriesContext(connection) as few_r:
        client.get("/runs/")
    for i in range(150):
        inst(f"b{i}", status="stopped" if i % 3 else "running")
        run(i + 2)
    with CaptureQueriesContext(connection) as many_f:
        client.get("/fleet/")
    with CaptureQueriesContext(connection) as many_r:
        client.get("/runs/")
    assert len(many_f) == len(few_f) and len(many_r) == len(few_r)


def test_alerts_filter_by_state_and_severity_in_the_url(client, alice):
    from fleet.alerts import raise_alert

    raise_alert("workers_dead", "all workers dead", severity="P0")
    raise_alert("budget", "over budget", severity="P2")
    client.force_login(alice)
    html = client.get("/alerts/?state=firing&severity=P0").content.decode()
    assert "all workers dead" in html and "over budget" not in html
    assert 'hx-get="/alerts/?state=firing&amp;severity=P0"' in html  # the live region keeps both
    assert 'href="?state=all&amp;severity=P0"' in html  # a state chip keeps the severity
