"""The model judge (agent/runtime/diagnosis.py) against the local OpenAI-compatible stand-in server: its own
domain prompt, the evidence shown as untrusted data, and its verdict validated against the same
schema as the rules' (fleet.diagnostics.Verdict). An answer outside the schema, or no answer,
keeps the rules' verdict."""

import json

import pytest

from agent.model.model_standin import StandIn
from agent.runtime.diagnosis import JUDGE_PROMPT, diagnose_instance
from fleet.models import Instance
from tests.rails_support import fleet_entry, rails_world

pytestmark = pytest.mark.django_db

NVML = {"reachable": True, "commands": {"nvidia-smi": {"rc": 255, "out": "Failed to initialize NVML: Unknown Error"},
                                        "uptime": {"rc": 0, "out": " 10:00 up 3 days"}}}


def completion(content: str) -> dict:
    return {"id": "c1", "object": "chat.completion", "created": 1, "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 60, "total_tokens": 960}}


def judged(settings, responses):
    with StandIn(responses) as standin, rails_world([fleet_entry("v-1", ssh=NVML)]):
        settings.MODEL = {**settings.MODEL, "BASE_URL": standin.base_url, "MODEL": "judge", "API_KEY_ENV": ""}
        d = diagnose_instance(Instance.objects.get(external_id="v-1"))
        return d, standin.requests


def test_a_valid_model_verdict_is_stored_as_the_models(settings):
    verdict = {"health": "failed", "class": "container", "cause": "the container lost its GPU device access",
               "evidence": ["nvidia-smi rc 255: Failed to initialize NVML: Unknown Error"], "confidence": 0.85}

    d, requests = judged(settings, [completion(json.dumps(verdict))])

    assert (d.judge, d.health, d.fault_class, d.confidence) == ("model", "failed", "container", 0.85)
    assert d.findings == verdict["evidence"] and d.cause == verdict["cause"]
    [req] = requests
    assert req["messages"][0] == {"role": "system", "content": JUDGE_PROMPT}
    user = req["messages"][1]["content"]
    assert 'trust="untrusted-data"' in user and "Failed to initialize NVML" in user
    assert "tools" not in req  # a judge, not a planner: it can call nothing


def test_a_fenced_answer_is_read(settings):
    verdict = {"health": "healthy", "class": "none", "cause": "no fault seen", "evidence": [], "confidence": 0.4}

    d, _ = judged(settings, [completion("```json\n" + json.dumps(verdict) + "\n```")])

    assert (d.judge, d.health, d.fault_class) == ("model", "healthy", "")


@pytest.mark.parametrize("answer", [
    {"health": "failed", "class": "hardware", "cause": "x", "evidence": [], "confidence": 0.9},  # class outside the schema
    {"health": "failed", "class": "host", "cause": "x", "evidence": [], "confidence": 1.7},  # confidence outside 0..1
    {"health": "failed", "class": "host", "cause": "x", "evidence": [], "confidence": 0.9, "action": "destroy"},  # extra key
    "the GPU looks broken to me",  # not JSON
])
def test_an_answer_outside_the_schema_keeps_the_rules_verdict(settings, answer):
    content = answer if isinstance(answer, str) else json.dumps(answer)

    d, requests = judged(settings, [completion(content)])

    assert len(requests) == 1
    assert (d.judge, d.health, d.fault_class) == ("rules", "failed", "container")
    assert "recreate the container" in d.cause


def test_a_model_that_fails_keeps_the_rules_verdict(settings):
    d, requests = judged(settings, [{"http_status": 500, "body": {"error": "down"}}] * 3)

    assert len(requests) == 3  # retried (transient), then given up
    assert (d.judge, d.health, d.fault_class) == ("rules", "failed", "container")
