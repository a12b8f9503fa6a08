"""The entailment check knows what the runtime computed itself (the deterministic
planner's "want 4 workers" and "1 min dwell" were flagged as unsupported), and the traces page
shows each flagged claim, not only a count."""

import json

import pytest
from django.utils import timezone

from agent.models import Run, Step
from agent.runtime.report import entailment_flags, flagged_claims

pytestmark = pytest.mark.django_db

OBS = json.dumps({"demand": {"state": "ok", "queued": 3, "workers_live": 1}})


def run_with(planner: str, answer: str, reason: str) -> Run:
    now = timezone.now()
    run = Run.objects.create(number=Run.objects.count() + 1, trigger="chat", planner=planner, status="done",
                             started_at=now, final_answer=answer)
    Step.objects.create(run=run, seq=1, kind="observe", observation=OBS, created_at=now)
    Step.objects.create(run=run, seq=2, kind="call", tool="launch_instance", outcome="refused", reason_code="hold_off",
                        args={"launch_priority": "P1", "reason": reason}, call_reason=reason,
                        detail="on hold: the queue has been empty for 0.5 min; a scale-down waits until it has been "
                               "empty for the dwell (1 min)", created_at=now)
    return run


def test_the_rules_planners_own_numbers_are_not_flagged():
    reason = "3 queued, 1 live; want 4 workers for 30 proofs/hr"
    run = run_with("rules", f"Queue: 3 tasks waiting. Parked: launch_instance ({reason}). Dwell is 1 min.", reason)
    assert entailment_flags(run) == []


def test_a_model_planners_own_arguments_are_no_evidence_for_its_answer():
    reason = "want 4 workers for 30 proofs/hr"
    run = run_with("llm", "I launched 4 workers for 30 proofs/hr.", reason)
    assert entailment_flags(run) == ["30", "4"]


def test_a_refusal_detail_written_by_the_guards_is_evidence_for_every_planner():
    run = run_with("llm", "The stop waits: the queue has been empty for 0.5 min.", "x")
    assert entailment_flags(run) == []


def test_each_flag_comes_with_the_sentence_that_claims_it(client, alice):
    run = run_with("llm", "Queue: 3 tasks waiting. I launched 4 workers for 30 proofs/hr.", "x")
    run.entailment_flags = entailment_flags(run)
    run.save()
    assert flagged_claims(run.final_answer, run.entailment_flags) == [
        {"flag": "30", "claim": "I launched 4 workers for 30 proofs/hr."},
        {"flag": "4", "claim": "I launched 4 workers for 30 proofs/hr."},
    ]
    client.force_login(alice)
    html = client.get("/traces/").content.decode()
    table = html[html.index('id="entailment"'):]
    assert table.count('class="flagged-claim"') == 2
    assert "“I launched 4 workers for 30 proofs/hr.”" in table and "<code>4</code>" in table
