"""``token_budget`` counts what a run adds, not the whole prompt again each turn: a real model run
with a large context finishes; a model that runs away (huge completions) is still stopped.

Real parts: the stand-in OpenAI-compatible server over HTTP, the real cycle on the scenario
provider, the API's reported ``usage``.
"""

import json

import pytest

from agent.model.model_standin import StandIn
from agent.planners.base import Turn
from agent.runtime.loop import run_cycle
from tests.scenario_world import entry, scenario_world

IDLE = {"state": "ok", "active": False, "queued": 0, "running": 0, "workers_expected": 1, "workers_live": 1, "idle_min": 5}
VERDICT = '<verdict>{"action": false, "state_changed": false}</verdict>'


def _reply(prompt: int, completion: int, content=None, call=None) -> dict:
    msg = {"role": "assistant", "content": content}
    if call:
        msg["tool_calls"] = [{"id": "c0", "type": "function", "function": {"name": call[0], "arguments": json.dumps(call[1])}}]
    return {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}


CALLS = [("list_instances", {}), ("get_demand", {}), ("list_instances", {"status": "running"}),
         ("search_offers", {"gpu_name": "RTX 4090"}), ("recall", {"query": "v-1"})]


@pytest.fixture
def model_at(settings):
    def point(standin):
        settings.MODEL = {**settings.MODEL, "BASE_URL": standin.base_url, "MODEL": "standin",
                          "API_KEY_ENV": "", "API_KEY_FILE": ""}
    return point


def test_a_turn_counts_its_new_prompt_tokens_and_its_completion():
    assert Turn(tokens_in=25_000, tokens_out=40).budget_tokens() == 25_040  # first request: all of it
    assert Turn(tokens_in=25_300, tokens_out=40, tokens_fresh=300).budget_tokens() == 340
    assert Turn(tokens_in=25_300, tokens_out=40, tokens_fresh=99_999).budget_tokens() == 25_340  # capped at the prompt
    assert Turn(tokens_in=0, tokens_out=40, tokens_fresh=900).budget_tokens() == 940  # no usage: the estimate


@pytest.mark.django_db(transaction=True)
def test_a_model_run_with_a_large_context_is_not_halted_by_its_re_sent_history(model_at):
    # six requests of ~25,000 prompt tokens each: 150,000 in the API's usage, far over 60,000
    responses = [_reply(25_000 + 200 * n, 40, call=c) for n, c in enumerate(CALLS)]
    responses.append(_reply(26_200, 60, content="All quiet: one worker live, nothing queued. " + VERDICT))
    with StandIn(responses) as standin, scenario_world([entry("v-1")], IDLE):
        model_at(standin)
        run = run_cycle("operator")
    run.refresh_from_db()
    assert run.status == "done", (run.halt_reason, run.halt_detail)
    assert run.tokens_in == sum(r["usage"]["prompt_tokens"] for r in responses)  # the whole usage is still shown
    # the first prompt in full, then only what each request added
    assert 25_000 < run.budget_tokens < 60_000, run.budget_tokens


@pytest.mark.django_db(transaction=True)
def test_a_runaway_model_is_still_stopped(model_at):
    # small prompts, but each answer spends 25,000 completion tokens
    responses = [_reply(2_000, 25_000, call=c) for c in CALLS]
    with StandIn(responses) as standin, scenario_world([entry("v-1")], IDLE):
        model_at(standin)
        run = run_cycle("operator")
    run.refresh_from_db()
    assert (run.status, run.halt_reason) == ("halted", "token_budget")
    assert len(standin.requests) == 3  # 27,000, then ~52,000, then ~77,000 > 60,000: no fourth request
    assert "added" in run.halt_detail
