"""Calls in words: what a tool call asks for, and what it did, as one sentence each.

``{{ a|call_sentence }}`` on anything with ``tool`` and ``args`` (an ``Approval``, a ``Step``):
"Launch an RTX 4090 (offer o-3)", "Destroy local-1". ``{{ a|done_sentence }}`` on an approval
whose call executed: "launched local-3", from the step's observation (the tool's own answer, as
``agent.runtime.tools`` returns it). The JSON stays available behind a disclosure in the templates.
"""

import json
import re

from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

register = template.Library()

#: tool -> (imperative, past tense) for calls on one instance
_VERBS = {"stop_instance": ("Stop", "stopped"), "resume_instance": ("Resume", "resumed"),
          "reboot_instance": ("Reboot", "rebooted"), "destroy_instance": ("Destroy", "destroyed"),
          "diagnose_instance": ("Diagnose", "diagnosed"), "launch_instance": ("Launch", "launched")}


def _article(word: str) -> str:
    """"an" before a vowel sound: "an A100", "an RTX 4090" (letters said by name), "a Tesla"."""
    first = word.split()[0] if word.split() else word
    acronym = first.isupper() or first[:1].isdigit()
    return "an" if first[:1].upper() in ("AEIOUFHLMNRSX8" if acronym else "AEIOU") else "a"


def _args(obj) -> dict:
    args = getattr(obj, "args", None)
    return args if isinstance(args, dict) else {}


@register.filter
def call_sentence(obj) -> str:
    """What the call asks for, in words; the tool's name and its arguments' keys when it has no wording."""
    tool, args = getattr(obj, "tool", "") or "", _args(obj)
    if tool == "launch_instance":
        gpu = args.get("gpu_name")
        what = f"Launch {_article(gpu)} {gpu}" if gpu else "Launch an instance"
        if args.get("dph") is not None:
            what += f" at ${float(args['dph']):.2f}/hr"
        if args.get("offer_id"):
            what += f" (offer {args['offer_id']})"
        return what
    if tool in _VERBS and args.get("instance_id"):
        return f"{_VERBS[tool][0]} {args['instance_id']}"
    if tool == "remember":
        return f"Remember {args.get('category', '?')}/{args.get('key', '?')}"
    if tool == "escalate_human":
        return f"Tell an operator ({args.get('severity', '?')}): {str(args.get('message', ''))[:120]}"
    return f"{tool} ({', '.join(sorted(k for k in args if k != 'reason'))})" if args else tool


def observed(step) -> dict:
    """The tool's own answer on ``step`` (its observation ``ok: true`` + a JSON object) as a dict;
    {} for a failed call, or an answer that is not a JSON object."""
    text = getattr(step, "observation", "") or ""
    if text.startswith("ok: true\n"):
        try:
            body = json.loads(text.removeprefix("ok: true\n"))
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}
    return {}


@register.filter
def done_sentence(approval) -> str:
    """What an executed call did ("launched local-3", "destroyed local-1"), or "" when it did not
    run or its answer names nothing."""
    if getattr(approval, "status", "") != "executed":
        return ""
    step = getattr(approval, "step", None)
    body = observed(step) if step is not None else {}
    tool = getattr(approval, "tool", "")
    ident = body.get("instance_id") or _args(approval).get("instance_id")
    if tool in _VERBS and ident:
        return f"{_VERBS[tool][1]} {ident}"
    return ""


@register.filter
def plain_number(value) -> str:
    """A number as the cards show it: ``540.0`` → ``540``, ``12.5`` stays; a string (what the
    operator typed, sent back with an error) is kept as typed; None → ""."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".")
    return str(value)


_PATH = re.compile(r"/(?:instances/[A-Za-z0-9][A-Za-z0-9_.-]{0,99}|runs/\d{1,9})/")


@register.filter(is_safe=True)
def console_links(text) -> str:
    """``text`` escaped, with each console path in it (``/instances/local-3/``, ``/runs/12/``) a link."""
    out, last = [], 0
    text = str(text or "")
    for m in _PATH.finditer(text):
        out += [escape(text[last:m.start()]), f'<a href="{escape(m.group(0))}">{escape(m.group(0))}</a>']
        last = m.end()
    out.append(escape(text[last:]))
    return mark_safe("".join(out))
