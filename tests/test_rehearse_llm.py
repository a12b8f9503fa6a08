"""A rehearsal with the ``llm`` planner: its runs go to an OpenAI-compatible server (the stand-in
here) and the day's model tokens and $ are measured from the model call records."""

import pytest

from agent.model.model_standin import StandIn
from agent.rehearse.sim import run_day

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

DONE = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": 'Nothing to do.\n<verdict>{"action": false, "state_changed": false}</verdict>'}}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 30, "total_tokens": 930}}


def test_the_llm_planner_plans_each_cycle_and_its_tokens_are_counted(settings):
    settings.MODEL = {**settings.MODEL, "PRICE_IN": 1.0, "PRICE_OUT": 2.0}
    with StandIn([DONE] * 50) as standin:
        day = {"name": "quiet day, llm", "planner": "llm", "horizon_h": 0.2, "seed": 1,
               "model": {"base_url": standin.base_url, "model": "standin"},
               "market": {"offers": [{"gpu_name": "RTX 4090", "dph": 0.45}], "fleet": [{"gpu_name": "RTX 4090"}]},
               "work": {"proof_s": {"RTX 4090": {"median_s": 20}}, "arrivals": {"hourly": [30]}}}
        res = run_day(day)
        asked = len(standin.requests)
    s = res["summary"]
    assert res["unsafe"] == []
    assert asked >= 3  # heartbeats at 0, 5 and 10 minutes each asked the model
    assert s["model_tokens_in"] == 900 * asked and s["model_tokens_out"] == 30 * asked
    assert s["model_usd"] == pytest.approx(asked * (900 * 1.0 + 30 * 2.0) / 1e6)
    assert s["launches"] == 0 and s["proofs_delivered"] >= 1
