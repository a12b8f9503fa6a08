"""With a model configured, the running summary of older history and memory consolidation are the
model's (extractive summary and rule-made facts otherwise, and when the model fails).

Real parts: the stand-in OpenAI-compatible server (agent/model/model_standin.py) over HTTP, the context
builder on stored steps, ``agent.memory.model_digest.after_run`` on the test database.
"""

import json

import pytest

from agent.memory import model_digest
from agent.memory import store as memory
from agent.memory.context import build_context
from agent.memory.model_digest import _CACHE, ModelSummarizer, consolidate_by_model
from agent.model.model_client import ModelConfig
from agent.model.model_standin import StandIn
from agent.models import Approval, MemoryFact, ModelCall, Run, Step
from tests.rails_support import NOW

pytestmark = pytest.mark.django_db

SUMMARY = "Operators asked twice to keep v-1 warm; list_instances ran 12 times, all executed."


def _answer(content: str) -> dict:
    return {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 700, "completion_tokens": 50, "total_tokens": 750}}


def _cfg(standin) -> ModelConfig:
    return ModelConfig(base_url=standin.base_url, model="standin", timeout_s=5, price_in=1.0, price_out=2.0)


@pytest.fixture(autouse=True)
def _empty_cache():
    _CACHE.clear()
    yield
    _CACHE.clear()


def _long_history() -> Run:
    """One run with 12 calls of 2,000-character results: twice a 3,000-token budget (all of it read)."""
    run = Run.objects.create(number=1, trigger="chat", planner="llm", status="running", started_at=NOW)
    Step.objects.create(run=run, seq=1, kind="message", actor="user:alice", text="keep v-1 warm please", created_at=NOW)
    for i in range(12):
        Step.objects.create(run=run, seq=2 + i, kind="call", actor="agent", turn=i, tool="list_instances", args={},
                            raw_arguments="{}", outcome="executed", observation="ok: true\n" + "x" * 2000,
                            created_at=NOW)
    return run


def test_older_history_is_summarised_by_the_model_once_per_omitted_history():
    run = _long_history()
    with StandIn([_answer(SUMMARY)]) as standin:
        summarize = ModelSummarizer(_cfg(standin), run)
        ctx = build_context(run=run, budget_tokens=3000, summarize=summarize)
        again = build_context(run=run, budget_tokens=3000, summarize=ModelSummarizer(_cfg(standin), run))
    assert ctx.omitted > 0 and summarize.used_model
    assert ctx.summary == SUMMARY and SUMMARY in ctx.messages[1]["content"]
    assert again.summary == SUMMARY and len(standin.requests) == 1  # the same omitted history: no second call
    sent = standin.requests[0]["messages"]
    assert "running summary" in sent[0]["content"] and "user:alice: keep v-1 warm please" in sent[1]["content"]
    assert "tools" not in standin.requests[0]
    assert ctx.tokens <= 3000
    # the call is the run's, and so are its tokens and cost
    assert ModelCall.objects.filter(run=run, status="ok").count() == 1
    assert (run.tokens_in, run.tokens_out) == (700, 50) and run.cost_usd == pytest.approx((700 + 100) / 1e6)


def test_when_the_model_cannot_summarise_the_summary_is_extractive():
    run = _long_history()
    with StandIn([{"http_status": 400, "body": {"error": {"message": "bad request"}}}]) as standin:
        summarize = ModelSummarizer(_cfg(standin), run)
        ctx = build_context(run=run, budget_tokens=3000, summarize=summarize)
    assert not summarize.used_model
    assert "- user:alice: keep v-1 warm please" in ctx.summary
    assert "list_instances() → executed" in ctx.summary


def _fifth_run() -> Run:
    return Run.objects.create(number=memory.CONSOLIDATE_EVERY, trigger="chat", planner="llm", status="done",
                              started_at=NOW, ended_at=NOW, final_answer="v-1 stays up")


def test_every_fifth_run_the_model_extracts_the_facts(settings):
    facts = {"facts": [
        {"category": "provider_note", "key": "vast host 5512", "value": "host 5512 drops SSH under load",
         "importance": 0.7, "kind": "memory"},
        {"category": "rule_learned", "key": "keep v-1 warm", "value": "operators want v-1 kept warm overnight",
         "importance": 0.9, "kind": "fact"},
        {"category": "incident", "key": "", "value": "no key: skipped"}]}
    run = _fifth_run()
    Step.objects.create(run=run, seq=1, kind="message", actor="user:alice", text="keep v-1 warm overnight",
                        created_at=NOW)
    with StandIn([_answer(json.dumps(facts))]) as standin:
        settings.MODEL = {**settings.MODEL, "BASE_URL": standin.base_url, "MODEL": "standin", "PRICE_IN": 1.0}
        model_digest.after_run(run)
    stored = {(f.category, f.key): f for f in MemoryFact.objects.filter(source="consolidation")}
    assert set(stored) == {("provider_note", "vast host 5512"), ("rule_learned", "keep v-1 warm")}
    assert stored[("rule_learned", "keep v-1 warm")].kind == "fact"
    evidence = standin.requests[0]["messages"][1]["content"]
    assert "user:alice: keep v-1 warm overnight" in evidence and "agent: v-1 stays up" in evidence
    run.refresh_from_db()
    assert ModelCall.objects.filter(run=run).count() == 1 and run.tokens_in == 700


def test_an_unusable_answer_falls_back_to_rule_made_facts(settings):
    run = _fifth_run()
    other = Run.objects.create(number=2, trigger="beat", planner="rules", status="done", started_at=NOW)
    step = Step.objects.create(run=other, seq=1, kind="call", actor="agent", tool="stop_instance",
                               args={"instance_id": "v-1"}, outcome="rejected", created_at=NOW)
    from fleet.clock import clock

    Approval.objects.create(run=other, step=step, tool="stop_instance", args={"instance_id": "v-1"},
                            status="rejected", comment="keep it warm", created_at=clock.now(),
                            decided_at=clock.now(), expires_at=clock.now(), idempotency_key="k1")
    with StandIn([_answer("Sure! Here are some facts: v-1 is nice.")]) as standin:
        made = consolidate_by_model(_cfg(standin), run)
    assert [(f.category, f.key) for f in made] == [("rule_learned", "operators reject stop_instance v-1")]
    assert "keep it warm" in made[0].value
