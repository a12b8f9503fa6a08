"""The Rehearsals pages: the list and one rehearsal's page, for operators and viewers; a running
rehearsal shows its progress and re-fetches itself, a finished one shows its outcome in words and
units, its unsafe decisions, the chart series (queue and backlog, live capacity against the target,
cumulative $) with their markers, and stops listening for changes."""

import json
import re

import pytest
from django.utils import timezone

from agent.models import Rehearsal
from tests.console_support import HX

pytestmark = pytest.mark.django_db


def done_result() -> dict:
    return {
        "summary": {"proofs_delivered": 1234, "usd_total": 12.4, "usd_per_proof": 0.01234, "queue_wait_p95_s": 240,
                    "unsafe": 1, "approvals_asked_by_tool": {"launch_instance": 3}, "some_new_measure": 7},
        "hourly": [
            {"hour": 0, "proofs": 50, "target": 60, "queued": 10, "backlog": 12, "live_capacity": 0.5, "spend_usd": 0.5},
            {"hour": 1, "proofs": 60, "target": 60, "queued": 2, "backlog": 3, "live_capacity": 1.25, "spend_usd": 0.7},
            {"hour": 2, "proofs": 58, "target": 60, "queued": None, "backlog": None, "live_capacity": 1.0, "spend_usd": 0.8},
        ],
        "unsafe": [{"invariant": "no_scale_down_while_work_waits", "cycle": 17, "run": 17, "call": "stop_instance",
                    "detail": "stopped sc-2 with 4 tasks queued"}],
        "markers": [{"at_s": 1800, "kind": "approval_waited", "detail": "launch_instance waited 25 min"},
                    {"at_s": 5400, "kind": "unsafe", "detail": "stop_instance in cycle 17"}],
    }


def series(html: str) -> dict:
    return json.loads(re.search(r'<script id="rh-series" type="application/json">(.*?)</script>', html, re.S).group(1))


def test_the_list_shows_each_rehearsal_with_its_headline_numbers(client, bob):
    done = Rehearsal.objects.create(name="bursty.json", status="done", progress=1, result=done_result(),
                                    started_by="cli", ended_at=timezone.now())
    running = Rehearsal.objects.create(name="yesterday under max_instances 6", status="running", progress=0.42,
                                       started_by="user:alice")
    failed = Rehearsal.objects.create(name="bad.json", status="failed", error="the market has no offers")
    client.force_login(bob)  # a viewer sees rehearsals
    html = client.get("/rehearsals/").content.decode()
    row = re.search(rf'<tr id="rehearsal-{done.pk}">.*?</tr>', html, re.S).group(0)
    assert "bursty.json" in row and "1,234" in row and "$12.40" in row and "$0.0123" in row
    assert 'class="bad">1<' in row  # the unsafe count stands out
    row = re.search(rf'<tr id="rehearsal-{running.pk}">.*?</tr>', html, re.S).group(0)
    assert 'value="42"' in row and "42%" in row and "user:alice" in row
    assert "the market has no offers" in re.search(rf'<tr id="rehearsal-{failed.pk}">.*?</tr>', html, re.S).group(0)
    assert html.index(f'id="rehearsal-{failed.pk}"') < html.index(f'id="rehearsal-{done.pk}"')  # newest first
    assert 'href="/rehearsals/"' in html  # the navigation has the entry

    region = client.get("/rehearsals/", headers=HX).content.decode()
    assert "<html" not in region and f'id="rehearsal-{done.pk}"' in region
    assert client.get("/rehearsals/?page=x").status_code == 400


def test_an_empty_list_says_how_to_start_one(client, alice):
    client.force_login(alice)
    assert "No rehearsals yet" in client.get("/rehearsals/").content.decode()


def test_a_done_rehearsal_shows_its_outcome_in_words_and_its_charts(client, bob):
    r = Rehearsal.objects.create(name="bursty.json", status="done", progress=1, result=done_result(),
                                 day={"horizon_h": 3, "seed": 7, "heartbeat_s": 300,
                                      "work": {"proof_s": {"RTX 4090": {"median_s": 20}, "A100": {"median_s": 40},
                                                           "L4": {"median_s": 60}}}}, ended_at=timezone.now())
    client.force_login(bob)
    html = client.get(f"/rehearsals/{r.pk}/").content.decode()
    summary = re.search(r'<table class="grid" id="rehearsal-summary">.*?</table>', html, re.S).group(0)
    assert "proofs delivered</th><td>1,234<" in summary
    assert "spent, GPU and disk</th><td>$12.40<" in summary
    assert "queue wait, arrival to claim: 95th percentile</th><td>4 min (240 s)<" in summary
    assert "approvals asked, by tool</th><td>launch_instance 3<" in summary and "some new measure</th><td>7<" in summary
    assert "no_scale_down_while_work_waits" in html and "stop_instance" in html and ">17<" in html
    assert "3 h" in html and "random seed" in html

    s = series(html)
    assert s["queued"] == [[0, 10], [1, 2], [2, None], [3, None]]  # an hour that did not measure is a gap, not 0
    assert s["live_workers"] == [[0, 0.5], [1, 1.25], [2, 1.0], [3, 1.0]]  # steps: the last reaches the day's end
    assert s["target"] == [[0, 60], [1, 60], [2, 60], [3, 60]]
    assert s["capacity"] == [[0, 45.0], [1, 112.5], [2, 90.0], [3, 90.0]]  # workers × 3600 / 40 s, the day's median proof time
    assert "live workers × 3600 / 40 s" in html
    assert s["spend_cum"] == [[0, 0], [1, 0.5], [2, 1.2], [3, 2.0]]  # spent by each hour's end
    assert s["approval"] == [[0.5, "launch_instance waited 25 min"]]
    assert s["unsafe"] == [[1.5, "stop_instance in cycle 17"]]
    assert 'src="/static/rehearsal.js"' in html and 'src="/static/vendor/chart.umd.min.js"' in html
    assert "<script>" not in html  # the strict CSP: no inline script
    # done: the region no longer re-fetches itself
    region = re.search(r'<section id="rehearsal"[^>]*>', html).group(0)
    assert "hx-trigger" not in region and 'data-status="done"' in region
    assert '<progress' not in html


def test_a_running_rehearsal_shows_its_progress_and_listens(client, alice):
    r = Rehearsal.objects.create(name="yesterday", status="running", progress=0.25)
    client.force_login(alice)
    html = client.get(f"/rehearsals/{r.pk}/").content.decode()
    region = re.search(r'<section id="rehearsal"[^>]*>', html).group(0)
    assert "rehearsals-changed from:body" in region and f'hx-get="/rehearsals/{r.pk}/"' in region
    assert '<progress id="rehearsal-progress" max="100" value="25">' in html
    assert 'id="rh-series"' not in html  # no charts before the outcome

    Rehearsal.objects.filter(pk=r.pk).update(progress=0.8)
    region_html = client.get(f"/rehearsals/{r.pk}/", headers=HX).content.decode()
    assert region_html.lstrip().startswith("{#") is False and "<html" not in region_html
    assert 'value="80"' in region_html and "80%" in region_html


def test_a_failed_rehearsal_says_why(client, alice):
    r = Rehearsal.objects.create(name="bad", status="failed", error="day file: market.offers is empty")
    client.force_login(alice)
    html = client.get(f"/rehearsals/{r.pk}/").content.decode()
    assert "The rehearsal failed: day file: market.offers is empty" in html
    assert "hx-trigger" not in re.search(r'<section id="rehearsal"[^>]*>', html).group(0)


def test_unknown_rehearsal_is_404_and_anonymous_goes_to_login(client, alice):
    assert client.get("/rehearsals/").status_code == 302
    client.force_login(alice)
    assert client.get("/rehearsals/999999/").status_code == 404
    assert client.post("/rehearsals/").status_code == 405


def test_a_big_day_lists_its_key_markers_and_counts_the_rest(client, alice, settings):
    from console.views import rehearsals

    result = done_result()
    result["markers"] += [{"at_s": 60 * i, "kind": "launch", "detail": f"sc-{i}"} for i in range(300)]
    r = Rehearsal.objects.create(name="big", status="done", result=result)
    client.force_login(alice)
    html = client.get(f"/rehearsals/{r.pk}/").content.decode()
    table = re.search(r'<table class="grid" id="rehearsal-markers">.*?</table>', html, re.S).group(0)
    assert table.count("<tr class=") == rehearsals.MARKERS_SHOWN
    assert "launch_instance waited 25 min" in table and "stop_instance in cycle 17" in table  # the key ones, always
    assert f"Not listed: {300 - (rehearsals.MARKERS_SHOWN - 2)} launch" in html


def _pair(day_a: dict, day_b: dict, result_a: dict, result_b: dict) -> tuple[Rehearsal, Rehearsal]:
    a = Rehearsal.objects.create(name="the current settings", status="done", progress=1, result=result_a, day=day_a,
                                 ended_at=timezone.now())
    b = Rehearsal.objects.create(name="the change", status="done", progress=1, result=result_b, day=day_b,
                                 ended_at=timezone.now(), compare_to=a)
    a.compare_to = b
    a.save(update_fields=["compare_to"])
    return a, b


def test_an_ab_pair_says_what_b_changed_and_when_the_change_never_bound(client, alice):
    day = {"horizon_h": 3, "seed": 7, "objectives": {"target_proofs_per_hour": 60, "max_instances": 4}}
    changed = {**day, "objectives": {**day["objectives"], "max_instances": 7}, "policy": {"launch_instance": "auto"}}
    _, b = _pair(day, changed, done_result(), done_result())
    client.force_login(alice)
    html = client.get(f"/rehearsals/{b.pk}/").content.decode()
    line = re.search(r'<p id="rehearsal-changed">(.*?)</p>', html, re.S).group(1)
    assert "<code>objectives.max_instances</code> 7 (A: 4)" in line
    assert "<code>policy.launch_instance</code> auto (A: default)" in line
    assert "target_proofs_per_hour" not in line  # the same on both sides
    assert 'id="rehearsal-same"' in html and "never bound" in html

    other = done_result()
    other["summary"] = {**other["summary"], "proofs_delivered": 1300}
    _, d = _pair(day, changed, done_result(), other)
    html = client.get(f"/rehearsals/{d.pk}/").content.decode()
    assert 'id="rehearsal-changed"' in html and 'id="rehearsal-same"' not in html
    assert '<td>+66</td>' in html

    _, f = _pair(day, dict(day), done_result(), done_result())
    html = client.get(f"/rehearsals/{f.pk}/").content.decode()
    assert "set the same objectives, policy" in html and 'id="rehearsal-same"' not in html
