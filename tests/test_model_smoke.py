"""Smoke test against a real model server: the `llm` planner's request is accepted and its answer
becomes a turn. Skipped unless ``WARDEN_TEST_MODEL_URL`` names an OpenAI-compatible base URL
(``make test-model`` serves SmolLM2-135M with llama-cpp-python's server and sets it; or e.g.
``http://127.0.0.1:8080/v1`` for ``llama-server --jinja -m MODEL.gguf``);
``WARDEN_TEST_MODEL_NAME`` names the model (default ``local``), ``WARDEN_TEST_MODEL_TIMEOUT_S``
bounds each request (default 240: a loaded 2-core machine reads a 2,000-token prompt in minutes).
"""

import os

import pytest

from agent.model.model_client import ModelConfig, chat
from agent.model.prompt import system_prompt
from agent.planners.llm import tool_schemas, turn_from_message

URL = os.environ.get("WARDEN_TEST_MODEL_URL", "")
TIMEOUT_S = float(os.environ.get("WARDEN_TEST_MODEL_TIMEOUT_S", "240"))

# a CPU server may time out once and be asked again: more than pytest's default 300 s per test
pytestmark = [pytest.mark.model, pytest.mark.skipif(not URL, reason="WARDEN_TEST_MODEL_URL is not set"),
              pytest.mark.timeout(4 * TIMEOUT_S)]


@pytest.mark.django_db
def test_a_real_model_answers_a_question_as_a_turn():
    from django.utils import timezone

    from agent.models import ModelCall, Run

    run = Run.objects.create(number=1, trigger="test", planner="llm", started_at=timezone.now())
    cfg = ModelConfig(base_url=URL, model=os.environ.get("WARDEN_TEST_MODEL_NAME", "local"), timeout_s=TIMEOUT_S, max_tokens=256)
    summary = {"instances": [{"id": "local-1", "status": "running"}], "demand": {"state": "ok", "queued": 3}}
    messages = [{"role": "system", "content": system_prompt(summary)},
                {"role": "user", "content": "How many instances are running? Answer in one sentence."}]
    reply = chat(cfg, messages, tool_schemas(), run=run)
    turn = turn_from_message(reply.message)
    assert turn.text or turn.calls
    # a request that timed out is retried (a CPU server under load may need more than one try)
    calls = list(ModelCall.objects.filter(run=run).order_by("seq").values_list("status", flat=True))
    assert calls[-1] == "ok" and set(calls[:-1]) <= {"timeout"}, calls


def _prompt_tokens(mode: str, result: str) -> int:
    """The prompt tokens the real server counts for a short history ending in one tool result."""
    cfg = ModelConfig(base_url=URL, model=os.environ.get("WARDEN_TEST_MODEL_NAME", "local"), timeout_s=TIMEOUT_S,
                      max_tokens=1, tool_results=mode)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_demand", "arguments": "{}"}}
    messages = [{"role": "user", "content": "How many tasks are queued?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": result}]
    reply = chat(cfg, messages, [])
    assert reply.usage_reported
    return reply.tokens_in


def test_the_real_server_sees_a_tool_result_only_as_a_user_message():
    """llama-cpp-python's chatml-function-calling template renders no ``tool`` message: the
    result's length changes nothing in the prompt the server counts. Sent as a ``user`` message
    (``WARDEN_MODEL_TOOL_RESULTS=user``) it is in the prompt. (``make test-model`` serves that
    template; ``llama-server --jinja`` renders tool messages, and fails the last line.)"""
    short, long = "queued: 7", "queued: 7; " + " ".join(f"task{n} waiting" for n in range(60))
    as_user = _prompt_tokens("user", long) - _prompt_tokens("user", short)
    assert as_user >= 60, as_user
    assert _prompt_tokens("tool", long) == _prompt_tokens("tool", short)
