"""The run page shows each model call — what was sent (redacted) and what came back, tokens and
cost — and the runs list shows a run's tokens and cost.

The run is a real `llm` cycle against the local stand-in server (tests/scenarios/llm-tool-calls.json).
"""

import json
import re
from pathlib import Path

import pytest
from django.urls import reverse

from agent.models import ModelCall, Run
from agent.replay import load_scenario, run_scenario

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.django_db(transaction=True)
def test_the_run_page_lists_each_model_call_and_the_runs_list_its_cost(client, alice, settings):
    settings.MODEL = {**settings.MODEL, "PRICE_IN": 2.5, "PRICE_OUT": 10.0}
    sc, raw = load_scenario(ROOT / "tests" / "scenarios" / "llm-tool-calls.json")
    assert run_scenario(sc, raw)["ok"]
    run = Run.objects.get()
    client.force_login(alice)
    page = client.get(reverse("run", args=[run.number])).content.decode()
    assert "Model calls (3)" in page
    rows = re.findall(r'<tr id="model-call-(\d+)"', page)
    assert rows == ["1", "2", "3"]
    third = ModelCall.objects.get(run=run, seq=3)
    sent = json.loads(third.request)
    assert sent["messages"][0]["role"] == "system"
    # the request as stored appears on the page (HTML-escaped), and so does the body that came back
    assert "v-101 is healthy and idle." in page
    assert "diagnose_instance" in page and "&quot;role&quot;: &quot;system&quot;" in page
    assert "$0.0102" in page  # 3 × (1200 × 2.5 + 40 × 10) / 1e6 = 0.0102
    listing = client.get(reverse("runs")).content.decode()
    assert "3600 / 120 · $0.0102" in listing


@pytest.mark.django_db
def test_the_dashboard_shows_todays_model_spend(client, alice):
    from datetime import timedelta

    from fleet.clock import clock

    run = Run.objects.create(number=1, trigger="test", planner="llm", started_at=clock.now())
    now = clock.now()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    for n, (at, cost) in enumerate([(now, 0.0125), (now, 0.0025), (midnight - timedelta(seconds=1), 5.0)], 1):
        ModelCall.objects.create(run=run, seq=n, model="m", status="ok", tokens_in=1000, tokens_out=100,
                                 cost_usd=cost, created_at=at)
    client.force_login(alice)
    page = client.get(reverse("dashboard")).content.decode()
    card = page[page.index('id="card-model-spend"'):]
    assert card.split("</div>")[0].endswith("model today $0.0150 · 2 calls, 2000 / 200 tokens")
