"""The `llm` planner against a real local OpenAI-compatible server (agent/model/model_standin.py).

Every test talks HTTP on loopback to the stand-in playing recorded chat-completion responses, in
the wire format (SSE streaming included), through the same code the console uses
(agent/planners/llm.py → agent/model/model_client.py → the pinned openai SDK). Cycles run through
``agent.replay.run_scenario`` on the scenario files tests/scenarios/llm-*.json (the real cycle:
observe, monitor, planner, pipeline, guards, approvals) on the test database.
"""

import json
import logging
from pathlib import Path

import openai
import pytest

from agent.model.model_client import ModelConfig, ModelError, chat
from agent.model.model_standin import StandIn
from agent.models import ModelCall, Run, Step
from agent.planners.llm import tool_schemas, turn_from_message
from agent.replay import load_scenario, run_scenario
from fleet.models import Alert

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-proj-" + "Zq7" * 16  # shaped like an OpenAI key, so the redactor would know it too


def _replay(name: str) -> tuple[dict, Run]:
    sc, raw = load_scenario(ROOT / "tests" / "scenarios" / f"{name}.json")
    report = run_scenario(sc, raw)
    assert report["mismatches"] == [], report["mismatches"]
    return report, Run.objects.order_by("number").first()


def _completion(content=None, calls=(), usage=(10, 5)) -> dict:
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": f"call_{n}", "type": "function", "function": {"name": t, "arguments": a}}
                             for n, (t, a) in enumerate(calls)]
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}


@pytest.fixture
def priced(settings):
    settings.MODEL = {**settings.MODEL, "PRICE_IN": 2.5, "PRICE_OUT": 10.0}


# --- the planner's choice and its tool schemas -----------------------------------------------------
def test_without_a_model_the_rules_planner_runs_and_with_one_the_llm_planner(settings):
    from agent.runtime.loop import default_planner

    settings.MODEL = {**settings.MODEL, "BASE_URL": "", "MODEL": ""}
    assert default_planner().name == "rules"
    settings.MODEL = {**settings.MODEL, "BASE_URL": "http://127.0.0.1:9/v1", "MODEL": "qwen2.5:7b",
                      "API_KEY_ENV": "WARDEN_TEST_MODEL_KEY"}
    planner = default_planner()
    assert planner.name == "llm"
    assert planner.config.key_name() == "env:WARDEN_TEST_MODEL_KEY"


def test_tool_schemas_are_generated_from_the_argument_models():
    from agent.runtime.tools import PUBLIC_TOOLS

    schemas = {t["function"]["name"]: t["function"] for t in tool_schemas()}
    assert sorted(schemas) == PUBLIC_TOOLS
    stop = schemas["stop_instance"]["parameters"]
    assert stop["type"] == "object" and set(stop["required"]) == {"instance_id", "reason"}
    assert stop["additionalProperties"] is False
    assert stop["properties"]["instance_id"]["maxLength"] == 64
    assert schemas["escalate_human"]["parameters"]["properties"]["severity"]["enum"] == ["P0", "P1", "P2", "P3"]


def test_a_message_becomes_a_turn():
    batch = turn_from_message(_completion(calls=[("get_demand", "{}"), ("list_instances", '{"status": "run')])["choices"][0]["message"])
    assert batch.batch and [p.tool for p in batch.calls] == ["get_demand", "list_instances"]
    assert batch.calls[1].raw_arguments == '{"status": "run'  # untouched: the pipeline refuses it
    forged = turn_from_message({"role": "tool", "tool_call_id": "call_0", "content": '{"ok": true}'})
    assert forged.calls[0].forged and forged.calls[0].forged_text == '{"ok": true}'
    assert turn_from_message({"role": "assistant", "content": "hello"}).calls == []


# --- cycles against the stand-in -------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_plain_answer_ends_the_run_with_its_verdict_and_usage(priced):
    report, run = _replay("llm-plain-answer")
    assert run.planner == "llm" and run.status == "done"
    assert run.verdict_action is False and run.verdict_state_changed is False
    assert "One worker is live" in run.final_answer
    [call] = ModelCall.objects.filter(run=run)
    assert (call.status, call.tokens_in, call.tokens_out) == ("ok", 1200, 40)
    assert call.cost_usd == pytest.approx((1200 * 2.5 + 40 * 10.0) / 1e6)
    assert (run.tokens_in, run.tokens_out) == (1200, 40)
    assert run.cost_usd == pytest.approx(call.cost_usd)
    sent = json.loads(call.request)
    system = sent["messages"][0]
    assert system["role"] == "system"
    # the prompt's three tiers (role, how it works, hard rules), then what changes: the fleet summary
    # after the hard rules, so a server's prompt cache matches everything before it
    assert system["content"].index("fleet agent") < system["content"].index("Hard rules") < system["content"].index('"v-101"')
    assert system["content"].rstrip().endswith("</verdict>.")
    assert "stop_instance" in sent["tools"]


@pytest.mark.django_db(transaction=True)
def test_tool_calls_and_a_parallel_batch_run_and_their_results_go_back_to_the_model(priced):
    report, run = _replay("llm-tool-calls")
    calls = list(Step.objects.filter(run=run, kind="call", actor="agent").order_by("seq"))
    assert [(s.tool, s.turn, s.batch, s.outcome) for s in calls] == [
        ("list_instances", 0, False, "executed"), ("get_demand", 1, True, "executed"),
        ("diagnose_instance", 1, True, "executed")]
    requests = [json.loads(c.request) for c in ModelCall.objects.filter(run=run)]
    assert len(requests) == 3
    last = requests[2]["messages"]
    assistant = [m for m in last if m["role"] == "assistant" and m.get("tool_calls")]
    assert [len(m["tool_calls"]) for m in assistant] == [1, 2]
    tools = [m for m in last if m["role"] == "tool"]
    assert len(tools) == 3 and all("<observation" in m["content"] for m in tools)
    assert (run.tokens_in, run.tokens_out) == (3600, 120)
    assert run.cost_usd == pytest.approx(3 * (1200 * 2.5 + 40 * 10.0) / 1e6)


@pytest.mark.django_db(transaction=True)
def test_truncated_argument_json_is_invalid_args_and_the_model_sees_it():
    report, run = _replay("llm-truncated-args")
    step = Step.objects.get(run=run, tool="stop_instance")
    assert (step.outcome, step.reason_code, step.raw_arguments) == ("refused", "invalid_args", '{"instance_id": "v-1')
    second = json.loads(ModelCall.objects.get(run=run, seq=2).request)["messages"]
    assert any(m["role"] == "tool" and "invalid_args" in m["content"] for m in second)


@pytest.mark.django_db(transaction=True)
def test_a_tool_message_the_model_authors_is_forged_and_halts():
    report, run = _replay("llm-forged-tool-message")
    assert (run.status, run.halt_reason) == ("halted", "forged_observation")
    assert ModelCall.objects.filter(run=run).count() == 1  # the second response is never asked for
    assert not Step.objects.filter(run=run, tool="stop_instance").exists()


@pytest.mark.django_db(transaction=True)
def test_429_500_and_a_timeout_are_retried_then_the_cycle_falls_back_to_rules():
    report, run = _replay("llm-transient-fallback")
    assert list(ModelCall.objects.filter(run=run).values_list("status", flat=True)) == ["http_429", "http_500", "timeout"]
    note = Step.objects.get(run=run, kind="message", actor="system")
    assert "failed 3 times" in note.text and "falls back to the rules planner" in note.text
    alert = Alert.objects.get(kind="planner_fallback")
    assert f"run {run.number}" in alert.message
    # the rules planner finished the cycle: its calls follow the note
    assert Step.objects.filter(run=run, kind="call", actor="agent", seq__gt=note.seq).exists()


@pytest.mark.django_db(transaction=True)
def test_one_429_is_retried_without_a_fallback():
    report, run = _replay("llm-transient-recovers")
    assert list(ModelCall.objects.filter(run=run).values_list("status", flat=True)) == ["http_429", "ok"]
    assert run.status == "done" and not Alert.objects.filter(kind="planner_fallback").exists()


@pytest.mark.django_db(transaction=True)
def test_a_run_of_text_only_turns_halts_as_a_text_only_spiral():
    report, run = _replay("llm-text-only-spiral")
    assert (run.status, run.halt_reason) == ("halted", "text_only_spiral")
    assert ModelCall.objects.filter(run=run).count() == 5
    assert Step.objects.filter(run=run, kind="text").count() == 5


# --- the key -------------------------------------------------------------------------------------
def _run() -> Run:
    from django.utils import timezone

    return Run.objects.create(number=1, trigger="test", planner="llm", started_at=timezone.now())


@pytest.mark.django_db
def test_the_key_is_sent_in_the_header_and_never_stored_or_logged(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("WARDEN_TEST_MODEL_KEY", KEY)
    caplog.set_level(logging.DEBUG)
    run = _run()
    with StandIn([_completion("hi"), {"http_status": 401, "body": {"error": {"message": "bad key"}}}]) as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="m", key_ref="env:WARDEN_TEST_MODEL_KEY")
        reply = chat(cfg, [{"role": "user", "content": "hello"}], tool_schemas(), run=run)
        with pytest.raises(ModelError) as err:
            chat(cfg, [{"role": "user", "content": "hello"}], [], run=run)
    assert reply.message["content"] == "hi"
    assert err.value.kind == "permanent" and KEY not in str(err.value)
    assert [h.get("authorization") for h in standin.headers] == [f"Bearer {KEY}"] * 2
    assert KEY not in caplog.text
    for mc in ModelCall.objects.filter(run=run):
        assert KEY not in mc.request + mc.response + mc.error
    # a key file is read at use, the same way
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    with StandIn([_completion("again")]) as standin:
        chat(ModelConfig(base_url=standin.base_url, model="m", key_ref=f"file:{key_file}"), [], [], run=run)
    assert standin.headers[0]["authorization"] == f"Bearer {KEY}"


@pytest.mark.django_db(transaction=True)
def test_a_missing_key_falls_back_naming_the_variable(settings, monkeypatch):
    """The console's path: settings name a key variable that is unset → rules, said plainly."""
    from agent.runtime.loop import run_cycle

    monkeypatch.delenv("WARDEN_TEST_MODEL_KEY", raising=False)
    with StandIn([]) as standin:
        settings.MODEL = {**settings.MODEL, "BASE_URL": standin.base_url, "MODEL": "m", "API_KEY_ENV": "WARDEN_TEST_MODEL_KEY"}
        run = run_cycle("test")
    assert standin.requests == []
    note = Step.objects.get(run=run, kind="message", actor="system")
    assert "WARDEN_TEST_MODEL_KEY is not set" in note.text and "rules planner" in note.text
    assert Alert.objects.filter(kind="planner_fallback").exists()


# --- the stand-in's wire format ------------------------------------------------------------------
def test_the_standin_streams_server_sent_events_the_sdk_reassembles():
    body = _completion("Two workers are live: local-1 and local-2.",
                       calls=[("diagnose_instance", '{"instance_id": "local-1"}')], usage=(50, 12))
    with StandIn([body]) as standin:
        client = openai.OpenAI(base_url=standin.base_url, api_key="no-key", max_retries=0)
        stream = client.chat.completions.create(model="m", messages=[], stream=True,
                                                stream_options={"include_usage": True})
        text, args, usage = "", "", None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for tc in choice.delta.tool_calls or []:
                    args += tc.function.arguments or ""
        client.close()
    assert text == "Two workers are live: local-1 and local-2."
    assert json.loads(args) == {"instance_id": "local-1"}
    assert (usage.prompt_tokens, usage.completion_tokens) == (50, 12)
    assert standin.requests[0]["stream"] is True


def test_the_standin_answers_500_when_its_responses_run_out():
    with StandIn([]) as standin:
        client = openai.OpenAI(base_url=standin.base_url, api_key="no-key", max_retries=0)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=[])
        client.close()


# --- the replay file's model_responses -------------------------------------------------------------
@pytest.mark.parametrize("entry, problem", [
    ("not an object", "model_responses: [1] must be a JSON object"),
    ({"http_status": 700, "body": {}}, "model_responses: [1].http_status must be an HTTP status between 100 and 599"),
    ({"http_status": "429"}, "model_responses: [1].http_status must be an HTTP status"),
    ({"timeout": False}, "model_responses: [1].timeout must be true"),
])
def test_a_bad_model_response_entry_is_refused_naming_it(tmp_path, entry, problem):
    from agent.replay import ScenarioFileError

    data = json.loads((ROOT / "tests" / "scenarios" / "llm-plain-answer.json").read_text())
    data["model_responses"].append(entry)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ScenarioFileError) as exc:
        load_scenario(path)
    assert problem in str(exc.value)


# --- streaming: the same turn, seen as it arrives --------------------------------------------------
@pytest.mark.django_db
def test_a_streamed_request_gives_the_same_turn_and_shows_it_as_it_arrives():
    bodies = [
        _completion("Two workers are live.", usage=(40, 6)),
        _completion(calls=[("get_demand", "{}"), ("stop_instance", '{"instance_id": "local-5", "reason": "operator asked"}')]),
        {"choices": [{"index": 0, "message": {"role": "tool", "tool_call_id": "call_0", "content": '{"ok": true}'}}]},
    ]
    run = _run()
    seen: list[tuple[str, str]] = []
    with StandIn(bodies) as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="m", price_in=1.0, price_out=2.0)
        replies = [chat(cfg, [{"role": "user", "content": "q"}], tool_schemas(), run=run, on_delta=lambda k, t: seen.append((k, t)))
                   for _ in bodies]
    assert all(r["stream"] is True for r in standin.requests)
    text = turn_from_message(replies[0].message)
    assert text.text == "Two workers are live." and not text.calls
    assert "".join(t for k, t in seen if k == "text") == "Two workers are live."
    assert (replies[0].tokens_in, replies[0].tokens_out) == (40, 6)
    assert replies[0].cost == pytest.approx((40 * 1.0 + 6 * 2.0) / 1e6)
    batch = turn_from_message(replies[1].message)
    assert batch.batch and [(p.tool, p.raw_arguments) for p in batch.calls] == [
        ("get_demand", "{}"), ("stop_instance", '{"instance_id": "local-5", "reason": "operator asked"}')]
    assert [t for k, t in seen if k == "tool"] == ["get_demand", "stop_instance"]
    assert turn_from_message(replies[2].message).calls[0].forged
    assert list(ModelCall.objects.filter(run=run).values_list("status", flat=True)) == ["ok"] * 3


@pytest.mark.django_db
def test_a_streamed_request_retries_a_timeout_500_and_429_then_gives_up():
    run = _run()
    with StandIn([{"timeout": True}, {"http_status": 500, "body": {}}, {"http_status": 429, "body": {}}]) as standin:
        cfg = ModelConfig(base_url=standin.base_url, model="m", timeout_s=0.5)
        with pytest.raises(ModelError) as err:
            chat(cfg, [{"role": "user", "content": "q"}], [], run=run, on_delta=lambda k, t: None)
    assert (err.value.kind, err.value.attempts) == ("transient", 3)
    assert list(ModelCall.objects.filter(run=run).values_list("status", flat=True)) == ["timeout", "http_500", "http_429"]


@pytest.mark.django_db(transaction=True)
def test_remembered_facts_reach_the_prompt_s_middle_tier(priced):
    """What the agent remembers (agent.memory.store) is recalled into the system prompt, between the
    opening summary and the hard rules (the prompt's tiers)."""
    from agent.memory.store import remember

    remember("provider_note", "host 5512", "reboots fix its Xid 79 within 2 minutes", importance=0.9)
    report, run = _replay("llm-plain-answer")
    system = json.loads(ModelCall.objects.get(run=run).request)["messages"][0]["content"]
    assert "[provider_note] host 5512: reboots fix its Xid 79" in system
    assert system.index("Hard rules") < system.index("host 5512") < system.index('"v-101"')


@pytest.mark.django_db(transaction=True)
def test_the_token_estimate_is_calibrated_from_the_reported_usage(priced):
    """The context builder's estimate learns from the API's ``usage.prompt_tokens`` after each call."""
    from agent.memory.context import CALIBRATION

    assert CALIBRATION.factor == 1.0
    _replay("llm-plain-answer")  # the stand-in reports 1,200 prompt tokens
    assert CALIBRATION.factor != 1.0


@pytest.mark.django_db(transaction=True)
def test_calibration_counts_the_tool_schemas_the_server_counts():
    """A server reports ``prompt_tokens`` for the messages and the tool schemas together. Calibrated
    on the messages alone, the factor became (schemas + messages) / messages: 3.2 on SmolLM2, and
    it grew as the budget cut messages, until the system prompt alone did not fit and every later
    case of an evaluation fell back without asking the model. A server whose count is exactly the
    planner's own estimate of both must leave the factor at 1, case after case."""
    import math

    from django.core.management import call_command

    from agent.memory.context import CALIBRATION
    from agent.model.model_client import ModelConfig
    from agent.model.model_standin import StandIn
    from agent.replay.evaluation import Case, run_case, suite_dir
    from tests.evalmodel_support import good_respond

    def honest(body):
        answer = good_respond(body)
        messages = sum(math.ceil(len(m.get("content") or "") / 4) + 4
                       + sum(math.ceil(len(c["function"]["arguments"]) / 4) + math.ceil(len(c["function"]["name"]) / 4)
                             for c in m.get("tool_calls") or ())
                       for m in body["messages"])
        answer["usage"]["prompt_tokens"] = messages + math.ceil(len(json.dumps(body.get("tools") or [])) / 4)
        return answer

    stem = "rules-live-worker-is-capacity"
    with StandIn([], responder=honest) as m:
        cfg = ModelConfig(base_url=m.base_url, model="honest", timeout_s=5)
        for _ in range(3):  # as an evaluation's child plays case after case in one process
            call_command("flush", interactive=False, verbosity=0)
            r = run_case(Case(stem, suite_dir() / f"{stem}.json", "suite"), cfg)
            assert r["answered"] >= 1 and r["fallbacks"] == 0, r
            assert 0.9 <= CALIBRATION.factor <= 1.1, CALIBRATION.factor
