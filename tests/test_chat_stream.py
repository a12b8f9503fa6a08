"""The chat answer streams: model deltas coalesced into frames (about every 100 ms), verdict blocks
never shown, tool calls named as the model starts them; a chat instruction the rails refuse or park
is explained in the runtime's words.

Real parts: the stand-in OpenAI-compatible server (agent/model/model_standin.py, SSE streaming), the real
cycle (``agent.runtime.loop.run_cycle``) on the scenario provider, the frames caught where the console
takes them (``fleet.events.streamed``); the consumer is driven through ``WebsocketCommunicator``.
"""

import json

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from agent.chat.chat_answer import RAILS_HEAD
from agent.chat.chat_stream import ChatStream, VerdictFilter
from agent.chat.verdicts import without_verdicts
from agent.model.model_standin import StandIn
from agent.models import Run, Step
from fleet.events import streamed
from tests.scenario_world import entry, scenario_world
from tests.test_websocket import communicator, memory_layer, session_headers  # noqa: F401 (fixture)

ANSWER = ("Two workers are live: v-5 and v-6. The queue is empty, so nothing needs launching. "
          '<verdict>{"action": false, "state_changed": false}</verdict>')


def _completion(content=None, calls=()) -> dict:
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": f"call_{n}", "type": "function", "function": {"name": t, "arguments": json.dumps(a)}}
                             for n, (t, a) in enumerate(calls)]
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 30, "total_tokens": 930}}


# --- the verdict filter and the coalescing ---------------------------------------------------------
@given(st.text(alphabet="ab<>/verdict{} ", max_size=40), st.text(alphabet="ab <", max_size=20),
       st.lists(st.integers(min_value=0, max_value=120), max_size=12))
def test_the_filter_shows_exactly_the_text_outside_verdict_blocks_however_it_is_split(before, after, cuts):
    text = before + '<verdict>{"action": true}</verdict>' + after
    f = VerdictFilter()
    shown, pos = [], 0
    for cut in sorted(set(c for c in cuts if c < len(text))) + [len(text)]:
        shown.append(f.feed(text[pos:cut]))
        pos = cut
    shown.append(f.end())
    assert "".join(shown) == without_verdicts(text)


def test_the_models_words_are_told_apart_from_the_runtimes_note():
    from agent.chat.chat_answer import model_words

    assert model_words(f"Stopped.\n\n{RAILS_HEAD}\n- stop_instance v-5 was refused") == "Stopped."
    assert model_words(f"{RAILS_HEAD}\n- stop_instance v-5 was not run") == ""
    assert model_words("no note here") == "no note here"


def test_an_unclosed_verdict_is_never_shown():
    f = VerdictFilter()
    assert f.feed("done. <verd") == "done. "
    assert f.feed('ict>{"action": tr') == ""
    assert f.end() == ""


def test_deltas_are_coalesced_into_about_one_frame_per_interval():
    now = [0.0]
    frames = []
    s = ChatStream(7, send=frames.append, interval=0.1, now=lambda: now[0])
    s.begin_turn(2)
    pieces = [f"w{i} " for i in range(100)]
    for piece in pieces:  # one token every 10 ms for a second
        now[0] += 0.01
        s("text", piece)
    s("tool", "get_demand")
    s.flush(final=True)
    assert 9 <= len(frames) <= 12, len(frames)  # not 100 frames: one per 100 ms
    assert "".join(f["text"] for f in frames) == "".join(pieces)
    assert [t for f in frames for t in f["tools"]] == ["get_demand"]
    assert {(f["run"], f["turn"]) for f in frames} == {(7, 2)}


# --- a chat cycle against the stand-in -------------------------------------------------------------
@pytest.fixture
def model_at(settings):
    def point(standin):
        settings.MODEL = {**settings.MODEL, "BASE_URL": standin.base_url, "MODEL": "standin",
                          "API_KEY_ENV": "", "API_KEY_FILE": ""}
    return point


@pytest.fixture
def frames():
    got = []

    def catch(sender, frame=None, **kwargs):
        got.append(frame)

    streamed.connect(catch, dispatch_uid="test_chat_stream")
    yield got
    streamed.disconnect(dispatch_uid="test_chat_stream")


IDLE = {"state": "ok", "active": False, "queued": 0, "running": 0, "workers_expected": 2, "workers_live": 2, "idle_min": 5}


@pytest.mark.django_db(transaction=True)
def test_a_chat_question_streams_its_answer_without_the_verdict(model_at, frames):
    from agent.runtime.loop import run_cycle

    with StandIn([_completion(ANSWER)]) as standin, scenario_world([entry("v-5"), entry("v-6")], IDLE):
        model_at(standin)
        run = run_cycle("chat", message="how many workers are live and why?", actor="user:alice")
    run.refresh_from_db()
    assert run.planner == "llm" and run.status == "done" and standin.requests[0]["stream"] is True
    text = "".join(f["text"] for f in frames if f["run"] == run.number)
    assert text == without_verdicts(ANSWER)
    assert "verdict" not in text
    assert RAILS_HEAD not in run.final_answer  # nothing was refused: no note


@pytest.mark.django_db(transaction=True)
def test_a_refused_or_parked_instruction_is_explained_from_the_runtimes_record(model_at, frames):
    from agent.runtime.loop import run_cycle

    responses = [_completion("Stopping v-5 as you asked.", calls=[("stop_instance", {"instance_id": "v-5", "reason": "operator asked"})]),
                 _completion('I asked to stop v-5. <verdict>{"action": false, "state_changed": false}</verdict>')]
    with StandIn(responses) as standin, scenario_world([entry("v-5"), entry("v-6")], IDLE):
        model_at(standin)
        run = run_cycle("chat", message="stop v-5", actor="user:alice")
    run.refresh_from_db()
    [call] = Step.objects.filter(run=run, kind="call", actor="agent")
    assert call.outcome in ("refused", "parked"), (call.outcome, call.reason_code, call.detail)
    # the tool call was shown as the model made it
    assert [t for f in frames for t in f["tools"]] == ["stop_instance"]
    head, _, note = run.final_answer.partition(RAILS_HEAD)
    assert note, run.final_answer
    assert "stop_instance v-5" in note and call.detail in note  # the runtime's words, not the model's
    if call.outcome == "refused":
        assert call.reason_code in note
    assert run.entailment_flags == []  # the runtime's note is not a claim of the model's to check
    # the model sees its own words in the next prompt, not the note
    from agent.memory.context import build_context

    assert RAILS_HEAD not in json.dumps(build_context(run=None).messages)


@pytest.mark.django_db(transaction=True)
def test_the_chat_log_shows_a_running_chat_run_and_its_calls(client, alice):
    from django.utils import timezone

    run = Run.objects.create(number=3, trigger="chat", planner="llm", status="running", started_at=timezone.now())
    Step.objects.create(run=run, seq=1, kind="message", actor="user:alice", text="stop v-5", created_at=timezone.now())
    Step.objects.create(run=run, seq=2, kind="call", actor="agent", turn=0, tool="stop_instance",
                        args={"instance_id": "v-5"}, outcome="refused", reason_code="diagnosis_required",
                        created_at=timezone.now())
    client.force_login(alice)
    html = client.get("/?partial=chat", headers={"HX-Request": "true"}).content.decode()
    assert 'id="chat-live-3"' in html and 'data-turns="0"' in html
    assert "stop_instance" in html and "diagnosis_required" in html


# --- the socket ------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_the_socket_forwards_stream_frames_as_chat_frames(alice, memory_layer):  # noqa: F811
    from console.broadcast import on_streamed

    headers = session_headers(Client(), alice)

    async def scenario():
        ws = communicator(headers)
        assert (await ws.connect())[0]
        assert await ws.receive_nothing(timeout=0.1)  # the consumer joins its groups after accept
        from channels.db import database_sync_to_async

        await database_sync_to_async(on_streamed)(None, frame={"run": 4, "turn": 0, "text": "hel", "tools": []})
        got = json.loads(await ws.receive_from(timeout=2))
        await ws.disconnect()
        return got

    assert async_to_sync(scenario)() == {"chat": {"run": 4, "turn": 0, "text": "hel", "tools": []}}


@pytest.mark.django_db(transaction=True)
def test_a_parked_instruction_says_which_approval_it_waits_for(model_at, frames):
    from agent.models import Approval
    from agent.runtime.loop import run_cycle

    busy = {**IDLE, "active": True, "queued": 12, "running": 2}
    launch = {"gpu_name": "RTX 4090", "launch_priority": "P1", "reason": "the operator asked for one more"}
    with StandIn([_completion("Launching one more.", calls=[("launch_instance", launch)])]) as standin, \
            scenario_world([entry("v-5"), entry("v-6")], busy):
        model_at(standin)
        run = run_cycle("chat", message="launch one more worker", actor="user:alice")
    run.refresh_from_db()
    approval = Approval.objects.get(run=run)
    assert run.status == "parked" and len(standin.requests) == 1  # the model is not asked again while it waits
    head, _, note = run.final_answer.partition(RAILS_HEAD)
    assert head == "" and f"launch_instance was not run: it needs an operator's approval — waiting for an operator " \
                          f"(approval {approval.pk}, expires in 30 min)" in note
    assert run.entailment_flags == []  # "30" and the approval id are the runtime's words, not claims to check
