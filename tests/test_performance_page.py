"""The Machine Performance tab: spend to date and in the window, caps against their use, $ per proof
per GPU model, the chart series (an unknown demand read is a gap, not zero) and the per-instance
table, for operators and viewers alike."""

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.console_support import HX
from tests.perf_support import seed_day, seed_proofs

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def series(html: str) -> dict:
    m = re.search(r'<script id="perf-series" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def test_it_shows_spend_caps_and_a_row_per_instance(client, alice):
    seed_day(timezone.now())
    client.force_login(alice)
    html = client.get("/performance/").content.decode()

    # v-101: 0.5 h loading at $0.02 + 23.5 h running at $0.40; v-102: 0.25 h × 0.05 + 11.75 h × 1.60 + 8 h × 0.05;
    # v-103 (created 40 h ago): 10 h × 0.45 + 30 h × 0.03; v-104: 6 h × 1.50 until it was killed
    total = (0.01 + 9.4) + (0.0125 + 18.8 + 0.4) + (4.5 + 0.9) + 9.0
    assert f'id="spend-total">${total:.2f}<' in html
    assert 'id="burn">$0.48<' in html  # v-101 running, v-102 and v-103 stopped (storage only)
    assert 'id="dph-cap">$2.45 / $10.00<' in html  # the budget guard counts GPU rates
    assert 'id="inst-cap">3 / 4<' in html
    for ext in ("v-101", "v-102", "v-103", "v-104"):
        assert f'id="perf-{ext}"' in html
    row = re.search(r'<tr id="perf-v-103".*?</tr>', html, re.S).group(0)
    assert "stopped 30.0 h" in row and "over the 24 h limit" in row
    assert "over the" not in re.search(r'<tr id="perf-v-102".*?</tr>', html, re.S).group(0)
    assert 'class="killed"' in re.search(r'<tr id="perf-v-104"[^>]*>', html).group(0)
    # one word per state: an instance gone from the provider is destroyed, as on the fleet page
    destroyed = re.search(r'<tr id="perf-v-104".*?</tr>', html, re.S).group(0)
    assert ">destroyed</span>" in destroyed and ">killed<" not in destroyed


def test_the_series_cover_the_window_and_unknown_is_a_gap(client, bob):
    seed_day(timezone.now())
    client.force_login(bob)  # a viewer sees the tab
    s = series(client.get("/performance/?hours=24").content.decode())
    assert len(s["proofs_hr"]) == len(s["instances"]) == 144  # every 10 min; the one exactly 24 h old is just out
    gaps = [v for _, v in s["proofs_hr"] if v is None]
    assert len(gaps) == 3 and [v for _, v in s["queued"] if v is None] == gaps
    assert {v for _, v in s["target"]} == {120.0, 180.0}
    assert all(v is not None and v >= 0 for _, v in s["dph"])

    six = series(client.get("/performance/?hours=6").content.decode())
    assert len(six["instances"]) == 36
    assert series(client.get("/performance/?hours=nonsense").content.decode()) == s  # falls back to 24 h


def test_an_htmx_fetch_gets_the_region_only(client, alice):
    seed_day(timezone.now())
    client.force_login(alice)
    html = client.get("/performance/", headers=HX).content.decode()
    assert "<html" not in html and 'id="perf-cards"' in html and 'id="perf-series"' in html


def test_without_task_history_it_says_so(client, alice):
    from tests.scenario_world import scenario_world

    client.force_login(alice)
    with scenario_world([], {"state": "ok", "queued": 0}):  # a demand source without HarmonyDB
        html = client.get("/performance/").content.decode()
    assert "Not measured: the demand source in use (ScenarioDemandSource) has no task history" in html
    assert "No samples in this window yet" in html


def test_it_shows_dollars_per_proof_per_gpu_model(client, alice):
    seed_day(timezone.now())
    seed_proofs(timezone.now())
    client.force_login(alice)
    html = client.get("/performance/").content.decode()
    table = re.search(r'<table class="grid" id="proof-costs">.*?</table>', html, re.S).group(0)
    rows = re.findall(r"<tr><td>(.*?)</td>\s*<td>(\d+)</td><td>([\d.]+)</td>\s*<td>\$([\d.]+)</td>\s*<td>\$([\d.]+)</td></tr>", table)
    # A100: median of 25..32 s = 28.5 s at $1.60/hr; RTX 4090: median of 55..66 s = 60.5 s at $0.40/hr
    assert rows == [("RTX 4090", "12", "60.5", "0.400", f"{0.40 * 60.5 / 3600:.4f}"),
                    ("A100", "8", "28.5", "1.600", f"{1.60 * 28.5 / 3600:.4f}")]


def test_its_query_count_does_not_grow_with_the_fleet(client, alice):
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from tests.perf_support import _instance

    now = timezone.now()
    seed_day(now)
    client.force_login(alice)

    def queries() -> int:
        with CaptureQueriesContext(connections["default"]) as d, CaptureQueriesContext(connections["harmony"]) as h:
            assert client.get("/performance/").status_code == 200
        return len(d) + len(h)

    queries()  # the first request also sets up what later ones reuse
    before = queries()
    for n in range(20):
        _instance(f"w-{n}", "L40S", 0.9, 0.02, now - timedelta(hours=5), [(now - timedelta(hours=5), "running")])
    assert queries() == before
