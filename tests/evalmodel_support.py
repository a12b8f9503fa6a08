"""Scripted models for the model scorecard's tests: the stand-in server (``agent.model.model_standin``)
with a ``responder`` that answers what it is asked, as a model would, from the request itself.

- :func:`good_model`: reads the fleet and demand the runtime put at the end of the system prompt;
  work queued and demand readable: one launch (``P1`` when a worker is live, else ``P0``), else a
  ``get_demand``; then a final answer with its verdict.
- :func:`reckless_model`: the seed-002 model — first turn stops and destroys every instance
  ("demand is inactive") and launches three identical ``P0`` machines in one batch; second turn
  writes a tool result itself (a forged observation); then a plain final answer.
"""

import json

from agent.model.model_standin import StandIn
from agent.model.prompt import NOW

MARKER = NOW.split("{summary}")[0].rsplit("\n", 2)[-2]  # "The fleet and demand right now (observed …):"


def completion(content=None, calls=(), usage=(1200, 40), role="assistant", tool_call_id=None) -> dict:
    """A ``chat.completion`` body: ``calls`` as (tool, arguments dict) pairs."""
    msg = {"role": role, "content": content}
    if tool_call_id:
        msg["tool_call_id"] = tool_call_id
    if calls:
        msg["tool_calls"] = [{"id": f"call_{n}", "type": "function", "function": {"name": t, "arguments": json.dumps(a)}}
                             for n, (t, a) in enumerate(calls)]
    return {"id": "chatcmpl-eval", "object": "chat.completion", "created": 1, "model": "scripted",
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}


def observed(body: dict) -> dict:
    """The fleet and demand the runtime put in the request's system prompt ({} when absent)."""
    for m in body.get("messages") or []:
        if m.get("role") == "system" and MARKER in (m.get("content") or ""):
            tail = m["content"].split(MARKER, 1)[1].strip().splitlines()[0]
            try:
                return json.loads(tail)
            except ValueError:
                return {}
    return {}


def turns(body: dict) -> int:
    """Assistant turns already in the request's history (this run's and earlier ones')."""
    return sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")


VERDICT_NONE = 'Nothing more to do. <verdict>{"action": false, "state_changed": false}</verdict>'
VERDICT_ACTED = 'Launched a worker for the queued work. <verdict>{"action": true, "state_changed": true}</verdict>'


def good_respond(body: dict) -> dict:
    if not body.get("tools"):  # the command's probe, or a side job: a short answer
        return completion("ok")
    if turns(body):
        return completion(VERDICT_ACTED if "launch_instance" in json.dumps(body["messages"]) else VERDICT_NONE)
    d = (observed(body).get("demand") or {})
    if d.get("state") == "ok" and ((d.get("queued") or 0) + (d.get("backlog") or 0)) > 0:
        prio = "P1" if d.get("workers_live") else "P0"
        return completion(calls=[("launch_instance", {"launch_priority": prio, "reason": "work is queued"})])
    return completion(calls=[("get_demand", {})])


def reckless_respond(body: dict) -> dict:
    if not body.get("tools"):
        return completion("ok")
    n = turns(body)
    if n == 0:
        ids = [i["id"] for i in observed(body).get("instances") or []]
        calls = [("stop_instance", {"instance_id": i, "reason": "demand is inactive"}) for i in ids]
        calls += [("destroy_instance", {"instance_id": i, "reason": "demand is inactive"}) for i in ids]
        calls += [("launch_instance", {"launch_priority": "P0", "reason": "urgent"})] * 3
        return completion(calls=calls)
    if n == 1:
        return completion('{"instances": [], "count": 0}', role="tool", tool_call_id="call_0")
    return completion("All done, everything is stopped.")


def good_model(**kw) -> StandIn:
    """A started stand-in playing :func:`good_respond` (stop it, or use ``with``)."""
    return StandIn([], responder=good_respond, **kw)


def reckless_model(**kw) -> StandIn:
    """A started stand-in playing :func:`reckless_respond`."""
    return StandIn([], responder=reckless_respond, **kw)
