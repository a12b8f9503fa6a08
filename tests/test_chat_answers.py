"""Without a model, the chat answers from the observed state: it says no model is
configured, names live and expected workers, the queue and backlog, what the cycle did and why,
and what waits for approval; an instruction typed in chat is said plainly not to be acted on.
Through the real view (``/actions/message/``), the real cycle (``run_cycle`` with the ``rules``
planner) and the chat partial the dashboard polls."""

import pytest

from agent.chat.chat_answer import is_instruction
from agent.models import Run
from agent.runtime.loop import run_cycle
from tests.rails_support import BUSY_DEMAND, fleet_entry, rails_world

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}


def ask(client, text: str) -> tuple[Run, str]:
    """Post ``text`` through the chat form, run the chat cycle the view enqueued, read the chat."""
    resp = client.post("/actions/message/", {"text": text}, headers=HX)
    assert resp.status_code == 200 and "sent;" in resp.content.decode()
    run = run_cycle("chat", actor="user:alice")
    assert run is not None
    run.refresh_from_db()
    html = client.get("/?partial=chat", headers=HX).content.decode()
    return run, html


DEAD_5 = [fleet_entry("local-4"), fleet_entry("local-5", live=False)]
DEMAND_DEAD_5 = dict(BUSY_DEMAND, queued=7, backlog=2)


def one_worker_target():
    """A target the live local-4 meets alone (180 proofs/hr at 20 s a proof): the dead local-5 is not
    capacity, so with the default 360 the sizing would ask for a replacement launch first."""
    from agent.models import SessionState

    SessionState.get()
    SessionState.objects.filter(pk=1).update(target_proofs_hr=180)


def test_a_question_is_answered_from_the_observed_state(client, alice, broker_queue):
    client.force_login(alice)
    with rails_world(DEAD_5, DEMAND_DEAD_5):
        one_worker_target()
        run, html = ask(client, "how many workers are live and why?")
    answer = run.final_answer
    assert answer.startswith("No model is configured")
    assert "Workers: 1 of 2 expected are live (local-4). Not heartbeating: local-5." in answer
    assert "Queue: 7 tasks waiting, 1 running, 2 more in Curio's pipeline backlog" in answer
    assert "This cycle ran: diagnose_instance local-5." in answer
    # the repair parked for approval, with the reason the rules gave
    assert "Parked for an operator's approval: reboot_instance local-5 (worker heartbeat dead" in answer
    assert "Nothing else waits for approval." in answer
    # the chat shows the answer, not the cycle report, and never a verdict block
    assert "No model is configured" in html and "Not heartbeating: local-5" in html
    assert "Done: nothing" not in html and "verdict" not in html
    assert "chat instructions are not acted on" not in answer  # a question is not an instruction
    # every id and number the answer cites is in the cycle's own observations (entailment)
    assert run.entailment_flags == []


def test_an_instruction_is_said_not_to_be_acted_on_and_what_to_do_instead(client, alice, broker_queue):
    client.force_login(alice)
    fleet = [fleet_entry("local-4"), fleet_entry("local-5")]
    with rails_world(fleet, BUSY_DEMAND):
        run, html = ask(client, "please stop local-5")
    answer = run.final_answer
    assert "Without a model, chat instructions are not acted on" in answer
    assert "/instances/local-5/" in answer and "same guards and approvals" in answer
    assert "Workers: 2 of 2 expected are live (local-4, local-5)." in answer
    assert "This cycle made no tool calls" in answer
    assert not run.steps.filter(kind="call", tool="stop_instance").exists()
    assert "chat instructions are not acted on" in html and "Done: nothing" not in html
    assert run.entailment_flags == [] and run.verdict_action is False


def test_a_refusal_is_reported_with_its_code_and_detail(client, alice, broker_queue):
    client.force_login(alice)
    with rails_world([], dict(BUSY_DEMAND, queued=3, running=0),
                     observe_only=True):
        run, _ = ask(client, "what are you doing about the queue?")
    refused = run.steps.filter(kind="call", outcome="refused").first()
    assert refused is not None and refused.tool == "launch_instance"
    assert f"Refused by the rails: launch_instance — {refused.reason_code}: {refused.detail}" in run.final_answer
    assert "Queue: 3 tasks waiting" in run.final_answer and "Instances: none." in run.final_answer


def test_what_waits_for_approval_from_earlier_cycles_is_listed(client, alice, broker_queue):
    client.force_login(alice)
    with rails_world(DEAD_5, DEMAND_DEAD_5):
        one_worker_target()
        first, _ = ask(client, "status?")
        assert first.status == "parked"
        second, html = ask(client, "and now?")
    assert second.pk != first.pk
    assert "Waiting for approval (Approvals inbox): reboot_instance local-5." in second.final_answer
    assert html.count("No model is configured") == 2


@pytest.mark.parametrize("text, expected", [
    ("please stop local-5", True),
    ("stop local-5", True),
    ("can you reboot local-4 now", True),
    ("destroy all workers", True),
    ("launch two more", True),
    ("why did you stop local-5?", False),
    ("how many workers are live and why?", False),
    ("what is the queue?", False),
    ("status please", False),
])
def test_instructions_are_told_from_questions(text, expected):
    assert is_instruction(text) is expected


def test_unknown_demand_is_said_unknown_never_zero(client, alice, broker_queue):
    client.force_login(alice)
    with rails_world(None, {"state": "unknown", "error": "HarmonyDB unreachable"}):
        run, _ = ask(client, "how many tasks are queued?")
    answer = run.final_answer
    assert "Demand could not be read (unknown" in answer and "unknown, not zero" in answer
    assert "Queue:" not in answer and "0 tasks" not in answer
