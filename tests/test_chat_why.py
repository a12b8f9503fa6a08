"""Without a model, "why did you launch local-4?" is answered from the trace — the run, the
call, its reason, who approved it — not with a status dump; console paths in answers are links.

Real parts: PostgreSQL, the rules planner and the loop (``run_cycle``), the scenario provider and
demand source (the replay's stand-ins for vast.ai and Curio), the Django test client.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.models import Approval, Run, Step
from agent.runtime.loop import run_cycle
from tests.rails_support import BUSY_DEMAND, fleet_entry, rails_world

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}


def test_why_did_you_launch_an_instance_is_answered_from_the_trace(client, alice, broker_queue):
    client.force_login(alice)
    with rails_world([fleet_entry("local-4")], BUSY_DEMAND):
        now = timezone.now() - timedelta(minutes=10)
        earlier = Run.objects.create(number=90, trigger="beat", planner="rules", status="done", started_at=now)
        step = Step.objects.create(run=earlier, seq=1, kind="call", tool="launch_instance",
                                   args={"gpu_name": "RTX 4090", "offer_id": "o-3", "reason": "30 queued, 1 live"},
                                   call_reason="30 queued, 1 live; the sizing asks for 2", outcome="approved_executed",
                                   observation='ok: true\n{"instance_id": "local-4", "status": "loading"}', created_at=now)
        Approval.objects.create(run=earlier, step=step, tool="launch_instance", args=step.args, idempotency_key="k-90",
                                status="executed", decided_by=alice, comment="go", created_at=now,
                                expires_at=now + timedelta(minutes=30), decided_at=now + timedelta(minutes=1))
        assert client.post("/actions/message/", {"text": "Why did you launch local-4?"}, headers=HX).status_code == 200
        run = run_cycle("chat", actor="user:alice")
        run.refresh_from_db()
        html = client.get("/?partial=chat", headers=HX).content.decode()
    answer = run.final_answer
    assert answer.startswith("No model is configured")
    assert "Run 90 (beat, /runs/90/) called launch_instance" in answer
    assert "because: 30 queued, 1 live; the sizing asks for 2" in answer and "alice approved it at" in answer
    assert "Workers:" not in answer  # not the status dump
    assert '<a href="/instances/local-4/">/instances/local-4/</a>' in html


def test_near_miss_a_why_about_nothing_in_the_trace_says_so(client, alice, broker_queue):
    client.force_login(alice)
    with rails_world([fleet_entry("local-4")], BUSY_DEMAND):
        client.post("/actions/message/", {"text": "why is local-9 here?"}, headers=HX)
        run = run_cycle("chat", actor="user:alice")
        run.refresh_from_db()
    assert "I find no call in the trace that acted on local-9" in run.final_answer
