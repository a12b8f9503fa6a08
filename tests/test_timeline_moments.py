"""An instance's timeline orders things by when they happened: a parked call is stamped when it
parked, the operator's decision and the call's execution when they were made; destroyed is
"destroyed"; a proof count per hour is labelled as a count, not a rate.

Real parts: PostgreSQL; rows as the loop and ``agent.runtime.approvals`` write them.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.models import Approval, Run, Step
from agent.runtime.timeline import instance_timeline
from fleet.models import Instance

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def test_a_parked_then_approved_destroy_shows_three_moments_in_order(alice):
    now = timezone.now()
    parked_at, decided_at = now - timedelta(minutes=20), now - timedelta(minutes=5)
    inst = Instance.objects.create(provider="local", external_id="local-1", status="exited", status_since=parked_at,
                                   created_at=now - timedelta(hours=1), killed_at=decided_at, killed_by="alice",
                                   kill_reason="terminal")
    run = Run.objects.create(number=13, trigger="beat", planner="rules", status="done", started_at=parked_at)
    args = {"instance_id": "local-1", "reason": "terminal: exited"}
    step = Step.objects.create(run=run, seq=1, kind="call", tool="destroy_instance", args=args,
                               outcome="approved_executed", created_at=parked_at)
    Approval.objects.create(run=run, step=step, tool="destroy_instance", args=args, idempotency_key="k-1",
                            status="executed", decided_by=alice, comment="it is dead", created_at=parked_at,
                            expires_at=parked_at + timedelta(minutes=30), decided_at=decided_at)
    events = instance_timeline(inst)
    titles = [(e.at, e.title) for e in events]
    parked = next(at for at, t in titles if t.startswith("destroy_instance parked for an operator"))
    decision = next(at for at, t in titles if t == "alice approved destroy_instance")
    ran = next(at for at, t in titles if t.startswith("destroy_instance approved_executed"))
    assert parked == parked_at and decision == decided_at and ran == decided_at
    assert any(t == "destroyed by alice" for _, t in titles) and not any("killed" in t for _, t in titles)
    assert [e.at for e in events] == sorted((e.at for e in events), reverse=True)
    assert any(e.kind == "decision" and e.detail == "it is dead" for e in events)


def test_near_miss_a_call_that_ran_without_approval_is_one_moment():
    now = timezone.now()
    inst = Instance.objects.create(provider="local", external_id="local-2", status="running", status_since=now,
                                   created_at=now)
    run = Run.objects.create(number=3, trigger="beat", planner="rules", status="done", started_at=now)
    Step.objects.create(run=run, seq=1, kind="call", tool="reboot_instance", args={"instance_id": "local-2"},
                        outcome="executed", created_at=now)
    titles = [e.title for e in instance_timeline(inst) if e.kind in ("agent", "decision")]
    assert titles == ["reboot_instance executed · run 3"]

