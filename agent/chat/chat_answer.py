"""The chat's answer when no model is configured: plain words from the observed state.

Without a model the chat says so (docs/agent.md), and answers from what the cycle observed — live and
expected workers by name, the queue (and backlog), what the cycle did and why (from its steps:
executed, refused with the reason code and detail, parked), and what waits for approval. Never
"Done: nothing". An instruction typed in chat ("please stop local-5") is not acted on without a
model: the answer says so plainly and points at the instance's buttons, which pass the same
guards and approvals.

:func:`state_answer` is called by the ``rules`` planner's final turn for a ``chat`` run; the
numbers and ids it writes come from the run's own observation (``world.observed``) and steps, so
the entailment check (``agent.runtime.report.entailment_flags``) finds them.
"""

import re

from django.db.models import Q

from agent.models import Approval, Run, Step

#: verbs that change the fleet: with an instance id or "all/every/the workers" after them, or
#: first in the message, they make it an instruction rather than a question
VERBS = {"stop", "start", "launch", "destroy", "kill", "terminate", "reboot", "restart", "resume", "retire",
         "scale", "cordon", "uncordon", "rent", "shut", "add", "remove"}
QUESTION_WORDS = {"why", "what", "how", "when", "which", "who", "is", "are", "did", "does", "do", "was", "were"}
#: polite words skipped before the verb ("please stop …", "can you reboot …")
_POLITE = {"please", "pls", "now", "kindly", "can", "could", "would", "you", "just"}
_NOUNS = {"worker", "workers", "instance", "instances", "machine", "machines"}
#: an instance id as Warden names them (bounded repeats: tests/test_regex_fuzz.py)
_ID = re.compile(r"\b[a-z]{1,40}-\d{1,20}\b", re.I)
_PUNCT = str.maketrans({c: " " for c in ".,;:!?()[]{}\"'`"})

#: how the run's system step announcing a planner fallback begins (the ``llm`` planner writes it;
#: ``agent.runtime.report`` and evaluation find it)
FALLBACK_NOTE = "Planner fallback"
NO_MODEL = "No model is configured, so I answer from the observed state (the built-in rules planner ran this cycle)."
#: the first line when a model is configured but failed this cycle (``{what}``: how it failed)
MODEL_FAILED = ("The model failed this cycle ({what}), so the built-in rules planner stood in and I answer from "
                "the observed state.")


def is_instruction(text: str) -> bool:
    """Whether an operator message asks for a fleet change ("please stop local-5", "launch two
    more") rather than a question. A question that merely mentions a verb ("why did you stop
    local-5?") is a question. Word-based, linear in the text."""
    words = (text or "").lower().translate(_PUNCT).split()
    if not words or words[0] in QUESTION_WORDS:
        return False
    first = next((w for w in words if w not in _POLITE), "")
    if first in VERBS:
        return True
    for i, w in enumerate(words):
        if w not in VERBS:
            continue
        after = words[i + 1:i + 7]
        if any(_ID.fullmatch(t) for t in after):
            return True
        if any(t in ("all", "every", "the") and n in _NOUNS for t, n in zip(after, after[1:], strict=False)):
            return True
    return False


def _n(value) -> str:
    return "unknown" if value is None else str(value)


def _call(s) -> str:
    ident = (s.args or {}).get("instance_id")
    return f"{s.tool} {ident}" if ident else s.tool


def _why(s) -> str:
    reason = (s.args or {}).get("reason") or s.call_reason
    return f" ({reason})" if reason else ""


def workers_line(world) -> str:
    """Live/expected workers with their names, from the cycle's observation."""
    d = world.observed
    if d.state != "ok":
        why = f": {d.error}" if d.error else ""
        return f"Demand could not be read ({d.state}{why}); worker and queue counts are unknown, not zero."
    live = sorted(name for name, w in (d.workers or {}).items() if w.live and not w.unschedulable)
    dead = sorted(name for name, w in (d.workers or {}).items() if not w.live and not w.unschedulable)
    cordoned = sorted(name for name, w in (d.workers or {}).items() if w.unschedulable)
    line = f"Workers: {_n(d.workers_live)} of {_n(d.workers_expected)} expected are live"
    line += f" ({', '.join(live)})." if live else "."
    if dead:
        line += f" Not heartbeating: {', '.join(dead)}."
    if cordoned:
        line += f" Cordoned (draining): {', '.join(cordoned)}."
    return line


def queue_line(world) -> str:
    """The queue, the backlog and the work running, from the cycle's observation."""
    d = world.observed
    if d.state != "ok":
        return ""
    line = f"Queue: {_n(d.queued)} tasks waiting, {_n(d.running)} running"
    if d.backlog:
        line += f", {d.backlog} more in Curio's pipeline backlog (counted as demand)"
    return line + "."


def fleet_line(world) -> str:
    """The instances the cycle saw, by id and provider status."""
    if world.provider_error:
        return f"The fleet could not be read ({world.provider_error}); the instances below are the last known state."
    insts = [i for i in world.instances if i.killed_at is None]
    if not insts:
        return "Instances: none."
    return "Instances: " + ", ".join(f"{i.external_id} {i.status}" for i in insts) + "."


def cycle_lines(steps) -> list[str]:
    """What this cycle did and why, from its call steps (``agent.models.Step``, in order)."""
    calls = [s for s in steps if s.kind == "call"]
    if not calls:
        return ["This cycle made no tool calls: nothing needed changing."]
    done = [s for s in calls if s.outcome in ("executed", "approved_executed")]
    refused = [s for s in calls if s.outcome in ("refused", "halted")]
    parked = [s for s in calls if s.outcome == "parked"]
    failed = [s for s in calls if s.outcome == "error"]
    not_approved = [s for s in calls if s.outcome in ("rejected", "expired")]
    out = []
    if done:
        out.append("This cycle ran: " + "; ".join(_call(s) + _why(s) for s in done) + ".")
    if refused:
        out.append("Refused by the rails: " + "; ".join(f"{_call(s)} — {s.reason_code}: {s.detail}" for s in refused) + ".")
    if failed:
        out.append("Failed: " + "; ".join(f"{_call(s)} — {s.detail}" for s in failed) + ".")
    if not_approved:
        out.append("Not approved: " + "; ".join(f"{_call(s)} — {s.outcome}" for s in not_approved) + ".")
    if parked:
        out.append("Parked for an operator's approval: " + "; ".join(_call(s) + _why(s) for s in parked) + ".")
    return out


def approvals_line(run) -> str:
    """Calls of other runs that wait for an operator's approval (this run's own are in its steps)."""
    waiting = list(Approval.objects.filter(status="waiting").exclude(run=run).order_by("created_at")[:10])
    if not waiting:
        return "Nothing else waits for approval."
    listed = "; ".join(f"{a.tool} {(a.args or {}).get('instance_id', '')}".strip() for a in waiting)
    return f"Waiting for approval (Approvals inbox): {listed}."


def instruction_line(message: str, *, model_failed: bool = False) -> str:
    """What an operator can do instead of a chat instruction when no model is configured (or,
    ``model_failed``, when the configured one failed this cycle)."""
    ids = sorted(set(m.lower() for m in _ID.findall(message or "")))
    where = (" on " + ", ".join(f"/instances/{i}/" for i in ids)) if ids else " on each instance's page (Fleet)"
    head = "With the model failing, this chat instruction was not acted on" if model_failed else \
        "Without a model, chat instructions are not acted on"
    return (f"{head}: I did not do what you asked, and nothing was "
            f"changed because of your message. To act, use the instance's buttons{where} (stop, reboot, resume, "
            "destroy); they pass the same guards and approvals. To change how many workers run, set the target "
            "on the dashboard.")


_RUN = re.compile(r"\brun {0,3}#?(\d{1,9})\b", re.I)


def is_why(text: str) -> bool:
    """Whether the message asks why ("why did you launch local-4?", "why run 12?")."""
    words = (text or "").lower().translate(_PUNCT).split()
    return bool(words) and words[0] == "why"


def _acted_on(ident: str):
    """The newest call step that acted on instance ``ident``: one naming it in its arguments, or a
    launch whose answer names it. None when the trace has none."""
    return (Step.objects.filter(kind="call").filter(Q(args__instance_id=ident) | Q(tool="launch_instance",
                                                                                  observation__contains=f'"{ident}"'))
            .exclude(outcome__in=("", "proposed")).select_related("run").order_by("-created_at", "-id").first())


def _step_story(s) -> str:
    """One call in words from the trace: the run, the call, its reason, its outcome, who approved."""
    line = (f"Run {s.run.number} ({s.run.trigger}, /runs/{s.run.number}/) called {_call(s)} at "
            f"{s.created_at:%Y-%m-%d %H:%M:%S} UTC")
    why = s.call_reason or (s.args or {}).get("reason") or ""
    if why:
        line += f" because: {why}"
    line += f". Outcome: {s.outcome}" + (f" ({s.reason_code})" if s.reason_code else "") + "."
    a = Approval.objects.filter(step=s).select_related("decided_by").first()
    if a is not None:
        if a.decided_by is not None and a.decided_at is not None:
            line += (f" {a.decided_by.get_username()} {'rejected' if a.status == 'rejected' else 'approved'} it at "
                     f"{a.decided_at:%H:%M:%S} UTC" + (f": \u201c{a.comment}\u201d" if a.comment else "") + ".")
        else:
            line += f" Its approval is {a.status}."
    return line


def why_lines(message: str) -> list[str]:
    """The answer to a why-question from the trace: for each instance id or run number in
    ``message``, the call that acted (run, call, reason, outcome, who approved it) and the
    instance's page. Returns [] when the message names neither."""
    out = []
    for ident in sorted(set(m.lower() for m in _ID.findall(message or ""))):
        s = _acted_on(ident)
        out.append(_step_story(s) + f" See /instances/{ident}/." if s is not None
                   else f"I find no call in the trace that acted on {ident} (/instances/{ident}/).")
    for number in sorted(set(int(n) for n in _RUN.findall(message or ""))):
        run = Run.objects.filter(number=number).first()
        if run is None:
            out.append(f"There is no run {number}.")
            continue
        calls = list(run.steps.filter(kind="call").order_by("seq"))
        out.append(f"Run {number} started by {run.trigger} at {run.started_at:%Y-%m-%d %H:%M:%S} UTC, "
                   f"status {run.status}." + ("" if calls else " It made no call."))
        out += [_step_story(c) for c in calls[:5]]
    return out


def state_answer(ctx) -> str:
    """The chat answer (without the verdict) for a ``chat`` run planned by ``rules``.

    ``ctx`` is the loop's ``TurnContext``: its ``message``, ``world``, ``run`` and
    ``extra["model_failure"]`` (set by the ``llm`` planner when it fell back: how the model
    failed) are read. Returns plain text of a few sentences; raises nothing.
    """
    world = ctx.world
    failure = (getattr(ctx, "extra", None) or {}).get("model_failure")
    lines = [MODEL_FAILED.format(what=failure) if failure else NO_MODEL]
    if is_why(ctx.message):
        told = why_lines(ctx.message)
        if told:  # a why-question about an instance or a run: the trace answers it, not a status dump
            return "\n".join([lines[0], *told])
    if is_instruction(ctx.message):
        lines.append(instruction_line(ctx.message, model_failed=bool(failure)))
    lines.append(workers_line(world))
    q = queue_line(world)
    if q:
        lines.append(q)
    lines.append(fleet_line(world))
    lines += cycle_lines(ctx.call_steps())
    lines.append(approvals_line(ctx.run))
    return "\n".join(lines)


#: how the runtime's own lines in a model's chat answer begin (never the model's wording)
RAILS_HEAD = "From the runtime's record of this run:"


def rails_note(steps) -> str:
    """What the rails did with the run's calls, in the runtime's words, for a model's chat answer.

    ``steps``: the run's ``agent.models.Step`` rows in order. One line per call that was refused or
    halted (reason code and detail), parked for approval (the approval and its expiry, from the
    step's detail), rejected or left to expire — when the rails refuse or park an
    instruction, the answer says so and why, whatever the model wrote. The same line twice is said
    once with its count ("(×3)"). Returns "" when every call ran (or none was made).
    """
    lines = []
    for s in steps:
        if s.kind != "call":
            continue
        if s.outcome in ("refused", "halted"):
            lines.append(f"- {_call(s)} was {s.outcome} by the rails ({s.reason_code}): {s.detail}")
        elif s.outcome == "parked":
            lines.append(f"- {_call(s)} was not run: it needs an operator's approval — {s.detail}")
        elif s.outcome in ("rejected", "expired"):
            lines.append(f"- {_call(s)} was not run: {s.detail or s.outcome}")
    if not lines:
        return ""
    counted: dict[str, int] = {}  # the same refusal said once, with how many times (a model may repeat a call)
    for line in lines:
        counted[line] = counted.get(line, 0) + 1
    return RAILS_HEAD + "\n" + "\n".join(f"{line} (×{n})" if n > 1 else line for line, n in counted.items())


def model_words(answer: str) -> str:
    """``answer`` without the runtime's note (:func:`rails_note`): what the model itself wrote."""
    text = answer or ""
    if text.startswith(RAILS_HEAD):  # the note alone (a parked run the model had not answered yet)
        return ""
    return text.split("\n\n" + RAILS_HEAD)[0]


def with_rails_note(answer: str, steps) -> str:
    """``answer`` followed by :func:`rails_note` of ``steps`` (a previous note replaced, not repeated)."""
    answer = model_words(answer)
    note = rails_note(steps)
    if not note:
        return answer
    return f"{answer}\n\n{note}" if answer.strip() else note
