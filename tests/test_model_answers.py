# Over 500 lines on purpose: one behaviour (docs/model.md): a test per kind of model answer.
"""What a model server answers, and how Warden speaks to it (docs/model.md).

Every test talks HTTP on loopback to the stand-in (agent/model/model_standin.py), which plays recorded
answers and, with ``server=``, imitates one server kind's documented quirks (llama.cpp, OpenAI,
vLLM, Ollama, OpenRouter). Cycles run for real: the replay files tests/scenarios/llm-*.json through
``agent.replay.run_scenario``, or ``agent.runtime.loop.run_cycle`` with the ``llm`` planner on the rails
test world (tests/rails_support.py).
"""

import json
import os
import time
from pathlib import Path

import openai
import pytest

from agent.model import model_client
from agent.model.model_client import ModelConfig, ModelError, chat, code_kind, context_window, failed_answer
from agent.model.model_standin import StandIn
from agent.models import ModelCall, Run, Step
from agent.planners.llm import LlmPlanner, tool_schemas, turn_from_message
from agent.replay import load_scenario, run_scenario
from fleet.models import Alert
from tests.rails_support import BUSY_DEMAND, fleet_entry, rails_world

ROOT = Path(__file__).resolve().parent.parent


def _replay(name: str) -> tuple[dict, Run]:
    sc, raw = load_scenario(ROOT / "tests" / "scenarios" / f"{name}.json")
    report = run_scenario(sc, raw)
    assert report["mismatches"] == [], report["mismatches"]
    return report, Run.objects.order_by("number").first()


def _completion(content=None, calls=(), usage=(10, 5), finish="stop") -> dict:
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": f"call_{n}", "type": "function", "function": {"name": t, "arguments": a}}
                             for n, (t, a) in enumerate(calls)]
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}]}
    if usage:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return body


def _run(number=1) -> Run:
    from django.utils import timezone

    return Run.objects.create(number=number, trigger="test", planner="llm", started_at=timezone.now())


VERDICT = '<verdict>{"action": false, "state_changed": false}</verdict>'


# --- 1. a failed answer is a failure (HTTP 200 or not) ----------------------------------------------
@pytest.mark.parametrize("body, kind", [
    ({"error": {"message": "upstream", "code": 502}, "choices": []}, "transient"),
    ({"error": {"message": "rate", "code": 429}}, "transient"),
    ({"error": {"message": "no code"}}, "transient"),
    ({"error": {"message": "bad model", "code": 400}, "choices": [{"message": {"role": "assistant"}}]}, "permanent"),
    ({"error": {"message": "named", "code": "invalid_api_key"}}, "permanent"),
    ({"choices": [{"index": 0, "finish_reason": "error", "message": {"role": "assistant", "content": ""}}]}, "transient"),
    ({"choices": [{"index": 0, "finish_reason": "error", "error": {"code": 401}, "message": {}}]}, "permanent"),
    ({"choices": []}, "transient"),
    ({"object": "chat.completion"}, "transient"),
    ([1, 2], "transient"),
])
def test_a_200_body_with_an_error_or_no_answer_is_a_failed_answer(body, kind):
    what, got = failed_answer(body)
    assert got == kind and what


def test_a_usable_body_is_not_a_failed_answer_even_with_an_empty_error_field():
    assert failed_answer(_completion("hi")) is None
    assert failed_answer({**_completion("hi"), "error": None}) is None
    assert [code_kind(c) for c in (None, 429, "503", 500, 599, 404, "x")] == [
        "transient", "transient", "transient", "transient", "transient", "permanent", "permanent"]


@pytest.mark.django_db(transaction=True)
def test_three_failed_200_answers_fall_back_to_rules_which_launches_and_no_call_of_them_runs():
    report, run = _replay("llm-error-body-fallback")
    assert list(ModelCall.objects.filter(run=run).values_list("status", flat=True)) == ["model_error"] * 3
    # the stop_instance inside the failed answers never became a step, let alone a dispatch
    assert not Step.objects.filter(tool="stop_instance").exists()
    assert Step.objects.get(tool="launch_instance", actor="agent").outcome == "executed"
    assert Alert.objects.get(kind="planner_fallback").state == "firing"
    assert not run.halt_reason and not Step.objects.filter(kind="text", text="").exists()


@pytest.mark.django_db(transaction=True)
def test_one_failed_200_answer_is_retried_and_the_model_goes_on():
    report, run = _replay("llm-error-body-recovers")
    assert list(ModelCall.objects.filter(run=run).values_list("status", flat=True)) == ["model_error", "ok", "ok"]
    assert not Alert.objects.filter(kind="planner_fallback").exists()


@pytest.mark.django_db(transaction=True)
def test_a_failed_200_answer_with_a_client_error_code_is_not_retried():
    report, run = _replay("llm-error-body-permanent")
    assert list(ModelCall.objects.filter(run=run).values_list("status", flat=True)) == ["model_error"]
    assert not Step.objects.filter(tool="stop_instance").exists()


@pytest.mark.django_db(transaction=True)
def test_empty_or_blank_arguments_mean_no_arguments():
    _replay("llm-empty-arguments")
    assert set(Step.objects.filter(tool__in=["get_demand", "list_instances"]).values_list("outcome", flat=True)) == {"executed"}


@pytest.mark.django_db(transaction=True)
def test_empty_arguments_for_a_tool_that_needs_some_are_refused_by_the_schema():
    _replay("llm-empty-arguments-schema")
    step = Step.objects.get(tool="stop_instance")
    assert (step.outcome, step.reason_code) == ("refused", "invalid_args") and "instance_id" in step.detail


def test_blank_arguments_become_an_empty_object_and_broken_ones_stay_broken():
    turn = turn_from_message(_completion(calls=[("get_demand", ""), ("list_instances", " \n\t"), ("stop_instance", "{")])
                             ["choices"][0]["message"])
    assert [p.raw_arguments for p in turn.calls] == ["{}", "{}", "{"]


# --- 3. every unusable streamed answer is a failed request with its record --------------------------
GARBAGE = {
    "empty stream": {"raw": "", "content_type": "text/event-stream"},
    "html 200": {"raw": "<html><body><h1>502 Bad Gateway</h1></body></html>", "content_type": "text/html"},
    "plain json": {"raw": json.dumps(_completion("a whole body, not events")), "content_type": "application/json"},
    "malformed sse": {"raw": "data: {not json\n\n", "content_type": "text/event-stream"},
    "error event": {"raw": 'data: {"error": {"message": "upstream died", "code": 502}}\n\n', "content_type": "text/event-stream"},
    "finish error": {"raw": "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": "error"}]}) + "\n\ndata: [DONE]\n\n",
                     "content_type": "text/event-stream"},
    "cut short": {"raw": "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                  "choices": [{"index": 0, "delta": {"content": "half an ans"}, "finish_reason": None}]}) + "\n\n",
                  "content_type": "text/event-stream"},
}


@pytest.mark.django_db
@pytest.mark.parametrize("what", sorted(GARBAGE))
def test_an_unusable_streamed_answer_is_a_failed_request_with_a_record(what):
    run = _run()
    with StandIn([GARBAGE[what]] * 3) as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="m")
        with pytest.raises(ModelError) as err:
            chat(cfg, [{"role": "user", "content": "q"}], [], run=run, on_delta=lambda k, t: None)
    assert err.value.kind == "transient" and err.value.attempts == 3
    assert list(ModelCall.objects.filter(run=run).values_list("status", flat=True)) == ["bad_stream"] * 3
    assert all(c.error for c in ModelCall.objects.filter(run=run))


@pytest.mark.django_db
def test_a_well_formed_stream_is_still_an_answer():
    """Near-miss twin of the garbage above: the same stand-in streaming a real answer."""
    run = _run()
    with StandIn([_completion("Two workers are live.")]) as standin:
        reply = chat(ModelConfig(base_url=standin.base_url, model="m"), [{"role": "user", "content": "q"}], [],
                     run=run, on_delta=lambda k, t: None)
    assert reply.message["content"] == "Two workers are live."
    assert ModelCall.objects.get(run=run).status == "ok"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("what, said", [("html 200", "Content-Type text/html"), ("empty stream", "no server-sent event"),
                                        ("plain json", "Content-Type application/json"), ("malformed sse", "is not JSON")])
def test_a_chat_run_whose_stream_is_garbage_falls_back_and_says_the_model_failed(settings, what, said):
    """The console's path: a chat message, a model streaming HTML: three failed requests, the
    rules planner answers, and the answer says the model failed and how (not "No model is
    configured"); the run names the llm planner from the start (the live bubble)."""
    from agent.runtime.loop import run_cycle

    garbage = GARBAGE[what]
    with rails_world(demand=BUSY_DEMAND), StandIn([garbage] * 3) as standin:
        settings.MODEL = {**settings.MODEL, "BASE_URL": standin.base_url, "MODEL": "m", "API_KEY_ENV": "", "API_KEY_FILE": ""}
        run = run_cycle("chat", message="please stop v-1", actor="user:alice")
    run.refresh_from_db()
    assert run.planner == "llm"
    assert list(ModelCall.objects.filter(run=run).values_list("status", flat=True)) == ["bad_stream"] * 3
    answer = run.final_answer
    assert "The model failed this cycle" in answer and said in answer
    assert "No model is configured" not in answer
    assert "With the model failing, this chat instruction was not acted on" in answer
    assert not Step.objects.filter(tool="stop_instance").exists()


@pytest.mark.django_db(transaction=True)
def test_a_queued_chat_run_names_the_planner_that_will_answer_it(settings):
    from agent.runtime.runs import claim_run

    settings.MODEL = {**settings.MODEL, "BASE_URL": "http://127.0.0.1:9/v1", "MODEL": "smollm2"}
    assert claim_run("chat", None).planner == "llm"
    Run.objects.update(status="done")
    settings.MODEL = {**settings.MODEL, "BASE_URL": "", "MODEL": ""}
    assert claim_run("chat", None).planner == "rules"


# --- 1. the request shape the common servers accept ----------------------------------------------
HISTORY = [
    {"role": "system", "content": "You run a fleet."},
    {"role": "user", "content": "how many workers are live?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_r1_s2", "type": "function", "function": {"name": "get_demand", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_r1_s2", "content": "<observation>1 live</observation>"},
]


@pytest.mark.django_db
@pytest.mark.parametrize("server", ["llamacpp", "openai", "vllm", "ollama", "openrouter"])
def test_each_server_kind_accepts_the_request_and_sees_the_tools(server):
    run = _run()
    answers = [_completion(calls=[("get_demand", "{}")]), _completion("One worker is live. " + VERDICT),
               _completion('{"facts": []}')]
    with StandIn(answers, server=server) as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="m")
        first = chat(cfg, HISTORY[:2], tool_schemas(), run=run)
        second = chat(cfg, HISTORY, tool_schemas(), run=run)  # the history holds a call (content null)
        side = chat(cfg, HISTORY[:2], [], run=run)  # a side call without tools (summary, memory)
    assert turn_from_message(first.message).calls[0].tool == "get_demand"  # the tools reached the prompt
    assert "One worker is live" in second.message["content"] and side.message["content"]
    sent = standin.requests
    assert sent[0]["tool_choice"] == "auto" and "tool_choice" not in sent[2]
    assert "minLength" not in json.dumps(sent[0]["tools"]) and "maxLength" not in json.dumps(sent[0]["tools"])
    assert all(m["content"] is not None for r in sent for m in r["messages"])
    assert list(ModelCall.objects.filter(run=run).values_list("status", flat=True)) == ["ok"] * 3


def test_the_llamacpp_standin_refuses_what_a_naive_request_sends():
    """Near-miss twin: the same exchange as the OpenAI SDK sends it by default (content null, no
    tool_choice, the schema's length bounds, streaming with tools) is refused or loses its tools."""
    with StandIn([_completion(calls=[("get_demand", "{}")])] * 4, server="llamacpp") as standin:
        client = openai.OpenAI(base_url=standin.base_url, api_key="no-key", max_retries=0)
        from agent.model.model_client import wire_schema

        bare = [wire_schema(t) for t in tool_schemas()]
        plain = client.chat.completions.create(model="m", messages=HISTORY[:2], tools=bare)
        assert plain.choices[0].message.tool_calls is None  # no tool_choice: the tools were left out
        with pytest.raises(openai.InternalServerError, match="null content"):
            client.chat.completions.create(model="m", messages=HISTORY)
        assert "maxLength" in json.dumps(tool_schemas())
        with pytest.raises(openai.InternalServerError, match="minLength"):
            client.chat.completions.create(model="m", messages=HISTORY[:2], tools=tool_schemas(), tool_choice="auto")
        client.close()


@pytest.mark.django_db
def test_a_server_that_will_not_stream_with_tools_is_asked_unstreamed_and_its_usage_estimated():
    run = _run()
    answers = [_completion("First.", usage=None), _completion("Second.", usage=None), _completion("Third, no tools.", usage=None)]
    seen = []
    with StandIn(answers, server="llamacpp") as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="m", price_in=1.0, price_out=2.0)
        first = chat(cfg, HISTORY[:2], tool_schemas(), run=run, on_delta=lambda k, t: seen.append(t))
        second = chat(cfg, HISTORY[:2], tool_schemas(), run=run, on_delta=lambda k, t: seen.append(t))
        third = chat(cfg, HISTORY[:2], [], run=run, on_delta=lambda k, t: seen.append(t))
    assert [r.get("stream") for r in standin.requests] == [True, None, None, True]
    assert [first.message["content"], second.message["content"], third.message["content"]] == ["First.", "Second.", "Third, no tools."]
    calls = list(ModelCall.objects.filter(run=run))
    assert [c.status for c in calls] == ["http_500", "ok", "ok", "ok"]
    # llama.cpp sends no usage when streaming (nor here): both counts estimated, and marked so
    ok = [c for c in calls if c.status == "ok"]
    assert all(c.tokens_estimated and c.tokens_in > 0 and c.tokens_out > 0 and c.cost_usd > 0 for c in ok)
    assert not first.usage_reported and first.tokens_in > 1000  # the tool schemas are counted too


@pytest.mark.django_db
def test_reported_usage_is_not_marked_an_estimate():
    run = _run()
    with StandIn([_completion("hi", usage=(40, 6))]) as standin:
        reply = chat(ModelConfig(base_url=standin.base_url, model="m"), HISTORY[:2], [], run=run)
    call = ModelCall.objects.get(run=run)
    assert (call.tokens_in, call.tokens_out, call.tokens_estimated) == (40, 6, False) and reply.usage_reported


# --- 2. the context window ------------------------------------------------------------------------
@pytest.mark.parametrize("server, where", [("llamacpp", "/props n_ctx"), ("vllm", "max_model_len"),
                                           ("openrouter", "context_length")])
def test_the_context_window_is_read_from_the_server(server, where):
    with StandIn([], server=server, context=6144) as standin:
        tokens, source = context_window(ModelConfig(base_url=standin.base_url, model="standin"), with_source=True)
    assert tokens == 6144 and where in source


def test_a_server_that_does_not_answer_is_asked_for_its_window_again_later():
    with StandIn([], server="llamacpp", context=6144) as standin:
        url = standin.base_url
    cfg = ModelConfig(base_url=url, model="standin", timeout_s=1)
    tokens, source = context_window(cfg, with_source=True)  # the port is closed now
    assert tokens == 8192 and "did not answer" in source
    assert (url, "standin") not in model_client._WINDOWS


def test_the_context_window_setting_wins_and_an_unknown_window_is_the_default():
    with StandIn([], server="llamacpp", context=6144) as standin:
        assert context_window(ModelConfig(base_url=standin.base_url, model="standin", context_tokens=16384)) == 16384
    with StandIn([], server="openai") as standin:
        tokens, source = context_window(ModelConfig(base_url=standin.base_url, model="standin"), with_source=True)
    assert tokens == 8192 and "default" in source


def test_the_context_budget_fits_inside_the_window():
    from agent.memory.context import DEFAULT_BUDGET_TOKENS

    with StandIn([], server="llamacpp", context=8192) as standin:
        planner = LlmPlanner(ModelConfig(base_url=standin.base_url, model="standin", max_tokens=512))
        budget = planner.budget()
    assert budget < 8192 - 512 - 1000  # the tool schemas (~1,100 tokens) and the answer have room
    with StandIn([], server="vllm", context=131072) as standin:
        assert LlmPlanner(ModelConfig(base_url=standin.base_url, model="standin")).budget() == DEFAULT_BUDGET_TOKENS


def _plant_history(chars: int) -> None:
    """An earlier run of the session whose operator message and answer are ``chars`` long each."""
    from django.utils import timezone

    old = Run.objects.create(number=90, trigger="chat", planner="llm", status="done", started_at=timezone.now(),
                             ended_at=timezone.now(), included_in_prompt=True, final_answer="x " * (chars // 2) + VERDICT)
    Step.objects.create(run=old, seq=1, kind="message", actor="user:alice", text="y " * (chars // 2), created_at=timezone.now())
    Step.objects.create(run=old, seq=2, kind="text", actor="agent", text=old.final_answer, outcome="text", created_at=timezone.now())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["vllm", "llamacpp"])
def test_a_context_length_answer_shrinks_the_context_and_asks_again(server):
    from agent.runtime.loop import run_cycle

    with rails_world(), StandIn([_completion("Fine. " + VERDICT)], server=server, context=5000) as standin:
        _plant_history(24_000)  # ~12,000 tokens of history: over the server's real window
        # misconfigured: the setting claims a window the server does not have
        cfg = ModelConfig(base_url=standin.base_url, model="standin", context_tokens=32768, max_tokens=256)
        run = run_cycle("test", planner=LlmPlanner(cfg))
    run.refresh_from_db()
    statuses = list(ModelCall.objects.filter(run=run).values_list("status", flat=True))
    assert statuses[0] == "http_400" and statuses[-1] == "ok" and len(statuses) <= 3
    assert run.status == "done" and not Alert.objects.filter(kind="planner_fallback").exists()
    assert Step.objects.filter(run=run, kind="message", text__contains="exceeds its context window").exists()
    sizes = [len(json.dumps(r["messages"])) for r in standin.requests]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0]


@pytest.mark.django_db(transaction=True)
def test_a_window_too_small_for_the_prompt_falls_back_instead_of_failing_the_run():
    """Near-miss twin: shrinking cannot help (the window is smaller than the system prompt)."""
    from agent.runtime.loop import run_cycle

    with rails_world(), StandIn([_completion("Fine. " + VERDICT)] * 3, server="vllm", context=600) as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="standin", max_tokens=256)
        run = run_cycle("test", planner=LlmPlanner(cfg))
    run.refresh_from_db()
    assert run.status in ("done", "parked") and Alert.objects.filter(kind="planner_fallback").exists()
    assert standin.requests == [] or all(c.status == "http_400" for c in ModelCall.objects.filter(run=run))


# --- tool results as `tool` or `user` messages (WARDEN_MODEL_TOOL_RESULTS) ----------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["tool", "user"])
def test_a_tool_result_reaches_the_next_request_as_the_setting_says(mode):
    """llama-cpp-python's chatml-function-calling template renders no ``tool`` message, so there a
    result must go as a ``user`` message; the default stays OpenAI's ``tool`` message."""
    from agent.model.model_client import TOOL_RESULT_AS_USER
    from agent.runtime.loop import run_cycle

    answers = [_completion(calls=[("get_demand", "{}")]), _completion("Demand read. " + VERDICT)]
    with rails_world(demand=BUSY_DEMAND), StandIn(answers) as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="standin", tool_results=mode)
        run = run_cycle("test", planner=LlmPlanner(cfg))
    run.refresh_from_db()
    assert run.status == "done"
    sent = standin.requests[1]["messages"]
    call_id = next(m for m in sent if m.get("tool_calls"))["tool_calls"][0]["id"]
    after = sent[next(i for i, m in enumerate(sent) if m.get("tool_calls")) + 1]
    observation = Step.objects.get(run=run, tool="get_demand").observation
    assert observation and observation in after["content"]
    if mode == "tool":
        assert (after["role"], after["tool_call_id"]) == ("tool", call_id)
    else:
        assert after["role"] == "user" and "tool_call_id" not in after
        assert after["content"].startswith(TOOL_RESULT_AS_USER.format(call_id=call_id))
        assert not any(m["role"] == "tool" for m in sent)


def test_an_unknown_tool_results_mode_is_refused():
    from agent.model.model_client import wire_messages

    with pytest.raises(ValueError, match="give 'tool' or 'user'"):
        wire_messages([{"role": "user", "content": "q"}], "system")


@pytest.mark.django_db
def test_a_timed_out_request_closes_its_connection():
    """The client gives up by closing the connection (the openai SDK over httpx, then the client
    is closed): a server that stops work on a disconnect can stop (llama-cpp-python's server does
    not when it answers unstreamed: docs/model.md)."""
    with StandIn([{"timeout": True}] * 3) as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="standin", timeout_s=0.5)
        with pytest.raises(ModelError) as err:
            chat(cfg, [{"role": "user", "content": "q"}], [], run=_run())
        deadline = time.monotonic() + 5
        while standin.abandoned < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert err.value.attempts == 3
    assert standin.abandoned == 3
    assert list(ModelCall.objects.values_list("status", flat=True)) == ["timeout"] * 3


# --- 4. the model sees its last words and its refusals; a refused call repeated halts ---------------
@pytest.mark.django_db(transaction=True)
def test_a_text_turn_without_a_verdict_stays_in_front_of_the_model():
    from agent.runtime.loop import run_cycle

    answers = [_completion("Let me think about the fleet."), _completion("One worker is live. " + VERDICT)]
    with rails_world(), StandIn(answers) as standin:
        run = run_cycle("test", planner=LlmPlanner(ModelConfig(base_url=standin.base_url, model="standin")))
    first, second = standin.requests
    assert first["messages"] != second["messages"]
    tail = second["messages"][-2:]
    assert tail[0] == {"role": "assistant", "content": "Let me think about the fleet."}
    assert tail[1]["role"] == "user" and "no tool call and no <verdict>" in tail[1]["content"]
    run.refresh_from_db()
    assert run.status == "done"


@pytest.mark.django_db(transaction=True)
def test_a_refused_call_proposed_again_with_the_same_arguments_is_identical_args():
    from agent.runtime.loop import run_cycle

    stop = json.dumps({"instance_id": "v-1", "reason": "looks idle"})
    answers = [_completion(calls=[("stop_instance", stop)]), _completion(calls=[("stop_instance", stop)]),
               _completion("Stopped nothing. " + VERDICT)]
    with rails_world(demand=BUSY_DEMAND), StandIn(answers) as standin:
        run = run_cycle("test", planner=LlmPlanner(ModelConfig(base_url=standin.base_url, model="standin")))
    run.refresh_from_db()
    steps = list(Step.objects.filter(run=run, tool="stop_instance").order_by("seq"))
    assert [(s.outcome, s.reason_code) for s in steps] == [("refused", "demand_guard"), ("halted", "identical_args")]
    assert "was refused (demand_guard)" in steps[1].detail
    assert (run.status, run.halt_reason) == ("halted", "identical_args")
    # the refusal was in front of the model when it asked again
    assert any(m["role"] == "tool" and "demand_guard" in m["content"] for m in standin.requests[1]["messages"])


@pytest.mark.django_db(transaction=True)
def test_a_refused_call_asked_again_with_other_arguments_is_scored_afresh():
    """Near-miss twin: another instance is another call; the guard answers again. (A different
    ``reason`` alone is the same call: canonical arguments leave the reason out.)"""
    from agent.runtime.loop import run_cycle

    answers = [_completion(calls=[("stop_instance", json.dumps({"instance_id": "v-1", "reason": "looks idle"}))]),
               _completion(calls=[("stop_instance", json.dumps({"instance_id": "v-2", "reason": "looks idle"}))]),
               _completion("Stopped nothing. " + VERDICT)]
    demand = BUSY_DEMAND
    with rails_world([fleet_entry("v-1"), fleet_entry("v-2")], demand), StandIn(answers) as standin:
        run = run_cycle("test", planner=LlmPlanner(ModelConfig(base_url=standin.base_url, model="standin")))
    run.refresh_from_db()
    assert [s.reason_code for s in Step.objects.filter(run=run, tool="stop_instance")] == ["demand_guard", "demand_guard"]
    assert run.status == "done" and not run.halt_reason


@pytest.mark.django_db(transaction=True)
def test_a_no_op_run_with_a_refusal_stays_in_the_next_runs_prompt():
    from agent.runtime.loop import run_cycle

    stop = json.dumps({"instance_id": "v-1", "reason": "looks idle"})
    answers = [_completion(calls=[("stop_instance", stop)]), _completion("Nothing to do. " + VERDICT),
               _completion("Still nothing. " + VERDICT)]
    with rails_world(demand=BUSY_DEMAND), StandIn(answers) as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="standin")
        first = run_cycle("test", planner=LlmPlanner(cfg))
        run_cycle("test", planner=LlmPlanner(cfg))
    first.refresh_from_db()
    assert first.included_in_prompt and first.verdict_action is False
    assert any(m["role"] == "tool" and "demand_guard" in m["content"] for m in standin.requests[2]["messages"])


# --- 5 and 8. the prompt ------------------------------------------------------------------------
def test_the_prompt_shows_the_verdict_with_single_braces():
    from agent.model.prompt import CLOSING, system_prompt

    text = system_prompt({"queued": 3}, objectives={"target_proofs_hr": 40}, recalled="[rule] keep {x} warm")
    verdict = '<verdict>{"action": true|false, "state_changed": true|false}</verdict>'
    assert f"End your final answer with {verdict}." in CLOSING and "{{" not in CLOSING
    assert text.count(verdict) == 2 and "{{" not in text and "[rule] keep {x} warm" in text


def test_what_changes_goes_last_so_the_prompt_prefix_is_stable():
    from agent.model.prompt import system_prompt

    a = system_prompt({"instances": [{"id": "v-1"}], "demand": {"queued": 3}}, objectives={"target_proofs_hr": 40})
    b = system_prompt({"instances": [{"id": "v-2"}], "demand": {"queued": 90}}, objectives={"target_proofs_hr": 400},
                      recalled="[incident] host 5512 drops SSH")
    common = 0
    while a[common] == b[common]:
        common += 1
    assert common > 0.6 * len(a)  # everything up to the objectives is the same text
    assert a.index("Hard rules") < a.index("Current objectives") < common


def test_max_tokens_has_a_small_default():
    from django.conf import settings

    assert ModelConfig(base_url="x", model="m").max_tokens == 512
    if not os.environ.get("WARDEN_MODEL_MAX_TOKENS"):
        assert settings.MODEL["MAX_TOKENS"] == 512


@pytest.mark.django_db(transaction=True)
def test_each_model_call_is_bounded_by_what_is_left_of_the_wall_clock():
    """The timeout the client applied is recorded with the request: at most the time left."""
    from agent.runtime.loop import run_cycle

    with rails_world(limits={"wall_clock_s": 2}), StandIn([{"timeout": True}] * 3) as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="standin", timeout_s=600)
        run = run_cycle("test", planner=LlmPlanner(cfg))
    timeouts = [json.loads(c.request)["timeout_s"] for c in ModelCall.objects.filter(run=run)]
    assert timeouts and all(t <= 2 for t in timeouts)
    assert Alert.objects.filter(kind="planner_fallback").exists()


@pytest.mark.django_db
def test_memory_consolidation_by_the_model_runs_after_the_answer(settings, django_capture_on_commit_callbacks):
    from agent.memory import model_digest
    from agent.memory import store as memory
    from agent.tasks import consolidate_memory

    with StandIn([_completion('{"facts": [{"category": "provider_note", "key": "host 5512", '
                              '"value": "drops SSH under load", "importance": 0.5, "kind": "memory"}]}')]) as standin:
        settings.MODEL = {**settings.MODEL, "BASE_URL": standin.base_url, "MODEL": "standin"}
        run = _run(number=memory.CONSOLIDATE_EVERY)
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            model_digest.after_run(run, deferred=True)
        assert standin.requests == [] and len(callbacks) == 1  # nothing asked of the model inside the run
        assert consolidate_memory(run.pk) == 1
    assert len(standin.requests) == 1


# --- 10. one alert per condition, with a count, resolved when it ends --------------------------------
@pytest.mark.django_db(transaction=True)
def test_planner_fallback_is_one_alert_with_a_count_resolved_when_the_model_answers_again():
    from agent.runtime.loop import run_cycle

    failing = [{"http_status": 500, "body": {"error": {"message": "down"}}}] * 3
    with rails_world():
        for _ in range(3):
            with StandIn(failing) as standin:
                run_cycle("test", planner=LlmPlanner(ModelConfig(base_url=standin.base_url, model="standin")))
        [alert] = Alert.objects.filter(kind="planner_fallback")
        assert (alert.state, alert.count) == ("firing", 3)
        with StandIn([_completion("Back. " + VERDICT)]) as standin:
            run_cycle("test", planner=LlmPlanner(ModelConfig(base_url=standin.base_url, model="standin")))
    alert.refresh_from_db()
    assert alert.state == "resolved" and Alert.objects.filter(kind="planner_fallback").count() == 1


@pytest.mark.django_db(transaction=True)
def test_breaker_tripped_is_one_alert_per_code_with_a_count_resolved_by_a_clean_run():
    from agent.runtime.loop import run_cycle

    spiral = [_completion("Let me think.")] * 5
    with rails_world():
        for _ in range(2):
            with StandIn(spiral) as standin:
                run_cycle("test", planner=LlmPlanner(ModelConfig(base_url=standin.base_url, model="standin")))
        [alert] = Alert.objects.filter(kind="breaker_tripped")
        assert (alert.key, alert.count, alert.state) == ("breaker:text_only_spiral", 2, "firing")
        assert "halted: text_only_spiral" in alert.message
        with StandIn([_completion("All calm. " + VERDICT)]) as standin:
            run_cycle("test", planner=LlmPlanner(ModelConfig(base_url=standin.base_url, model="standin")))
    alert.refresh_from_db()
    assert alert.state == "resolved"


# --- a real server, when one is named ------------------------------------------------------------
REAL = os.environ.get("WARDEN_TEST_MODEL_URL", "")
REAL_NAME = os.environ.get("WARDEN_TEST_MODEL_NAME", "local")
#: seconds per request against the real server (a loaded 2-core machine is slow to read a prompt)
REAL_TIMEOUT_S = float(os.environ.get("WARDEN_TEST_MODEL_TIMEOUT_S", "240"))


@pytest.mark.model
@pytest.mark.skipif(not REAL, reason="WARDEN_TEST_MODEL_URL is not set")
@pytest.mark.timeout(4 * REAL_TIMEOUT_S)  # a CPU server may time out once and be asked again
@pytest.mark.django_db
def test_a_real_server_accepts_the_request_shape_with_a_call_in_the_history():
    """The shape the stand-in's quirks test, against the real thing: tools with tool_choice, a
    history holding an assistant call (content ""), streamed; each answer is an answer or a
    recorded failed request, never an exception other than ModelError."""
    run = _run()
    cfg = ModelConfig(base_url=REAL, model=REAL_NAME, timeout_s=REAL_TIMEOUT_S, max_tokens=64)
    for messages in (HISTORY[:2], HISTORY):
        try:
            reply = chat(cfg, messages, tool_schemas(), run=run, on_delta=lambda k, t: None)
        except ModelError:
            continue
        turn = turn_from_message(reply.message)
        assert turn.text is not None or turn.calls
    assert ModelCall.objects.filter(run=run).exclude(status__in=["http_500"]).exists()
    assert context_window(cfg) > 0


@pytest.mark.model
@pytest.mark.skipif(not REAL, reason="WARDEN_TEST_MODEL_URL is not set")
@pytest.mark.timeout(4 * REAL_TIMEOUT_S)  # a CPU server may time out once and be asked again
@pytest.mark.django_db
def test_a_real_server_refuses_a_prompt_beyond_its_window_as_context_length():
    """A prompt longer than the server's window (``WARDEN_TEST_MODEL_CONTEXT``, the ``--n_ctx``
    the server runs with; 8,192 unless said) is a ``context_length`` failure the planner shrinks
    for, not a transient error retried three times; the window is the one the answer names when
    it names one (llama-cpp-python's and vLLM's "maximum context length is N tokens";
    llama-server's wording names none). The server tokenizes and refuses before it evaluates."""
    window = int(os.environ.get("WARDEN_TEST_MODEL_CONTEXT", "8192"))
    run = _run()
    cfg = ModelConfig(base_url=REAL, model=REAL_NAME, timeout_s=REAL_TIMEOUT_S, max_tokens=16)
    with pytest.raises(ModelError) as raised:
        chat(cfg, [{"role": "user", "content": "fleet " * (window + 512)}], [], run=run)
    assert raised.value.kind == "context_length" and raised.value.attempts == 1
    assert raised.value.window in (None, window)
    [call] = ModelCall.objects.filter(run=run)
    assert call.status in ("http_400", "http_413")


# --- 8. demand is not STALE while the run that read it is still at work ---------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("run_started_min_ago, shown", [(4, "demand: OK"), (None, "demand: STALE"), (2, "demand: STALE")])
def test_demand_read_by_a_run_still_at_work_is_not_stale(client, alice, settings, run_started_min_ago, shown):
    """A 3-minute-old read at a 60 s heartbeat: OK while the run that took it (started before it)
    is still running; STALE with no run at work, or when the running run started after the read."""
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import DemandSample

    settings.WARDEN = {**settings.WARDEN, "OBSERVE_INTERVAL_S": 60}
    now = timezone.now()
    if run_started_min_ago is not None:
        Run.objects.create(number=7, trigger="chat", planner="llm", status="running",
                           started_at=now - timedelta(minutes=run_started_min_ago))
    DemandSample.objects.create(taken_at=now - timedelta(minutes=3), state="ok", queued=3, running=0,
                                workers_expected=1, workers_live=1, workers_dead=0)
    client.force_login(alice)
    assert shown in client.get("/").content.decode()


def test_the_chat_answer_says_a_repeated_refusal_once_with_its_count():
    from agent.chat.chat_answer import rails_note

    same = [Step(kind="call", outcome="refused", tool="stop_instance", args={"instance_id": "v-1"},
                 reason_code="demand_guard", detail="5 tasks queued") for _ in range(3)]
    other = Step(kind="call", outcome="refused", tool="stop_instance", args={"instance_id": "v-2"},
                 reason_code="demand_guard", detail="5 tasks queued")
    note = rails_note(same + [other])
    assert note.count("stop_instance v-1 was refused") == 1 and "(demand_guard): 5 tasks queued (×3)" in note
    assert "stop_instance v-2 was refused by the rails (demand_guard): 5 tasks queued" in note.splitlines()[-1]
    assert not note.splitlines()[-1].endswith(")")


@pytest.mark.django_db(transaction=True)
def test_a_run_that_shrank_below_the_system_prompt_does_not_silence_the_model_for_later_runs():
    """One run's context-length answers (a bloated history) shrink its budget until the system
    prompt no longer fits, and that run falls back. The next run must ask the model again from the
    window's budget: kept for the process, the shrunk budget made every later run fall back
    without a request (seen in an evaluation of SmolLM2: 137 of 150 cases unasked)."""
    from agent.runtime.loop import run_cycle

    too_long = {"http_status": 400, "body": {"error": {"message": "This model's maximum context length is exceeded",
                                                       "type": "invalid_request_error", "code": "context_length_exceeded"}}}
    left = {"too_long": 1}  # the first request of the first run: its shrink cannot hold the system prompt

    def respond(body):
        if not body.get("tools"):  # the running summary's own request
            return _completion("An earlier run looked at the fleet.")
        if left["too_long"]:
            left["too_long"] -= 1
            return too_long
        return _completion("Fine. " + VERDICT)

    from agent.memory.context import CALIBRATION

    CALIBRATION.factor = 2.0  # a tokenizer denser than 4 characters a token: the system prompt passes 1,024
    with rails_world(), StandIn([], responder=respond) as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="standin", context_tokens=8192, max_tokens=256)
        first = run_cycle("test", planner=LlmPlanner(cfg))
        second = run_cycle("test", planner=LlmPlanner(cfg))
    assert list(ModelCall.objects.filter(run=first).values_list("status", flat=True))[0] == "http_400"
    assert Alert.objects.filter(kind="planner_fallback").exists()  # the first run fell back
    assert list(ModelCall.objects.filter(run=second).values_list("status", flat=True))[-1:] == ["ok"]
    assert not ModelCall.objects.filter(run=second).exclude(status="ok").exists()
