"""Approval cards and run entries read as sentences, the JSON behind a disclosure; an executed
approval names what it did ("launched local-3").

Real parts: PostgreSQL and the Django test client; rows as the loop and the pipeline write them.
"""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from agent.models import Approval, Run, Step

pytestmark = pytest.mark.django_db


def _parked(run, seq, tool, args, status="waiting", observation=""):
    now = timezone.now()
    step = Step.objects.create(run=run, seq=seq, kind="call", tool=tool, args=args, created_at=now,
                               outcome="approved_executed" if status == "executed" else "parked", observation=observation)
    return Approval.objects.create(run=run, step=step, tool=tool, args=args, reason=args.get("reason", ""),
                                   idempotency_key=f"k-{seq}", status=status, created_at=now,
                                   expires_at=now + timedelta(minutes=30), decided_at=now if status != "waiting" else None)


def test_cards_say_the_call_in_words_and_what_it_did(client, alice):
    run = Run.objects.create(number=2, trigger="beat", planner="rules", status="parked", started_at=timezone.now())
    waiting = _parked(run, 1, "launch_instance", {"gpu_name": "RTX 4090", "offer_id": "o-3", "launch_priority": "P1",
                                                  "reason": "30 queued, 1 live"})
    done = _parked(run, 2, "launch_instance", {"gpu_name": "RTX 4090", "offer_id": "o-4", "reason": "more"},
                   status="executed",
                   observation="ok: true\n" + json.dumps({"instance_id": "local-3", "status": "loading"}))
    stop = _parked(run, 3, "stop_instance", {"instance_id": "local-1", "reason": "idle"})
    client.force_login(alice)
    html = client.get("/approvals/").content.decode()
    assert f'id="call-{waiting.pk}">Launch an RTX 4090 (offer o-3)</p>' in html
    assert f'id="call-{stop.pk}">Stop local-1</p>' in html
    assert f'id="done-{done.pk}">launched local-3</div>' in html
    # the JSON is still there, behind a disclosure
    assert '<details class="args-json"><summary>arguments (JSON)</summary><pre class="args">' in html
    trace = client.get("/runs/2/").content.decode()
    assert '<div class="call-sentence">Stop local-1</div>' in trace


def test_near_miss_a_rejected_card_names_nothing_done(client, alice):
    run = Run.objects.create(number=2, trigger="beat", planner="rules", status="done", started_at=timezone.now())
    a = _parked(run, 1, "destroy_instance", {"instance_id": "local-1", "reason": "x"}, status="rejected")
    client.force_login(alice)
    html = client.get("/approvals/").content.decode()
    assert f'id="done-{a.pk}"' not in html and f'id="call-{a.pk}">Destroy local-1</p>' in html
