"""In a real browser, an operator types a question in the chat and sees the model's tool call and then
its answer arrive live, as the model writes it, before the run ends; the verdict is never shown.

Real parts: daphne (``ChannelsLiveServerTestCase``), the Redis channel layer (own prefix), a Celery
worker subprocess running the chat cycle with the ``llm`` planner, the stand-in OpenAI-compatible
server (agent/model/model_standin.py) streaming server-sent events at a human-visible pace, and Chromium
(``/usr/bin/chromium``) driven by Playwright.
"""

import json
from pathlib import Path

import pytest

from agent.model.model_standin import StandIn
from agent.models import Run
from tests.browser_support import CHROMIUM, CHROMIUM_ARGS, FleetBrowserTestCase

ANSWER = ("No worker is live right now and the queue is empty, so there is nothing to prove and nothing "
          "to launch. When tasks arrive I will size the fleet to the queue within your budget of $6/hr.")


def _completion(content=None, calls=()) -> dict:
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": f"call_{n}", "type": "function", "function": {"name": t, "arguments": a}}
                             for n, (t, a) in enumerate(calls)]
    return {"id": "chatcmpl-b", "object": "chat.completion", "created": 1, "model": "standin",
            "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 800, "completion_tokens": 60, "total_tokens": 860}}


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.integration
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium")
class TestChatStreamsInABrowser(FleetBrowserTestCase):
    def test_a_question_gets_a_tool_call_and_a_streamed_answer_live(self):
        from playwright.sync_api import sync_playwright  # its loop runs in this thread: no ORM inside the block

        responses = [_completion("Let me read the demand first.", calls=[("get_demand", "{}")]),
                     _completion(ANSWER + ' <verdict>{"action": false, "state_changed": false}</verdict>')]
        frames: list[str] = []
        with StandIn(responses, chunk_delay_s=0.03) as standin:
            self.worker_env = {"WARDEN_MODEL_BASE_URL": standin.base_url, "WARDEN_MODEL": "standin"}
            self.start_celery_worker()
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                try:
                    page = self.log_in(browser, "/", frames)
                    page.wait_for_selector('#live-pill[data-state="live"]', timeout=15_000)
                    page.fill("#chat-form textarea[name=text]", "how many workers are live and why?")
                    page.click("#chat-form button[type=submit]")
                    # the model's tool call shows in the run's live bubble while the run goes on
                    page.wait_for_selector(".msg-live .chat-call:has-text('get_demand')", timeout=60_000)
                    # the answer arrives in pieces: seen part-written, before the run has ended
                    partial = page.wait_for_function(
                        """full => {
                          for (const el of document.querySelectorAll('.msg-live .streaming .text')) {
                            const t = el.textContent.trim();
                            if (t.startsWith('No worker') && t.length < full.length) return t;
                          }
                          return null;
                        }""", arg=ANSWER, timeout=30_000).json_value()
                    assert ANSWER.startswith(partial), partial
                    # then the stored answer replaces the live bubble
                    page.wait_for_selector(".msg-report:not(.msg-live) >> text=within your budget of $6/hr",
                                           timeout=30_000)
                    log = page.inner_text("#chat-log")
                    assert "verdict" not in log and "get_demand" in log
                finally:
                    browser.close()
        run = Run.objects.get(trigger="chat")
        assert run.status == "done" and run.planner == "llm"
        chat = [json.loads(f)["chat"] for f in frames if f.startswith('{"chat"')]
        text = "".join(f["text"] for f in chat if f["turn"] == 1)
        assert text.strip() == ANSWER
        chunks = len(ANSWER) // 8  # the stand-in streams 8 characters a chunk
        # coalesced: about one frame per 100 ms while a chunk comes every 30 ms (tests/test_chat_stream.py checks
        # the count exactly on a fake clock; here a loaded machine may stretch the pace)
        assert 3 <= len([f for f in chat if f["turn"] == 1]) < chunks * 0.75, len(chat)
        assert [t for f in chat for t in f["tools"]] == ["get_demand"]
