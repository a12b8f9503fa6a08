"""Template helpers for the console: roles, ages, demand counts that are never a fake zero."""

import json
import signal
from datetime import UTC, datetime

from django import template

from agent.chat.verdicts import without_verdicts
from agent.models import Approval
from console.users import can_act as rule
from console.users import role_of
from fleet.clock import clock

register = template.Library()


def can_act(user) -> bool:
    """True for operators (group ``operators``) and superusers (the rule: ``console.users``)."""
    return rule(user)


def role(user) -> str:
    """The signed-in user's role: superuser, operator or viewer (``console.users.role_of``)."""
    return role_of(user)


register.filter("role", role)
register.filter("can_act", can_act)


@register.filter
def age(seconds) -> str:
    """``seconds`` (number or None) as a short age: ``"45 s"``, ``"12 min"``, ``"3 h 5 min"``, ``"2 d"``."""
    if seconds is None:
        return "unknown"
    s = int(max(0, float(seconds)))
    if s < 90:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    return f"{s // 86400} d"


@register.filter
def unixtime(seconds) -> str:
    """Unix seconds (a trigger event's ``at``) as ``HH:MM:SS.mmm`` UTC; "–" when not a number."""
    try:
        return datetime.fromtimestamp(float(seconds), UTC).strftime("%H:%M:%S.%f")[:-3]
    except (TypeError, ValueError, OverflowError, OSError):
        return "–"


@register.filter
def count(value) -> str:
    """A demand count: ``"unknown"`` for None (an unreadable queue is never shown as 0)."""
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return str(value)


@register.filter
def yesno_unknown(value) -> str:
    """True/False/None as ``yes``/``no``/``unknown`` (a missing or malformed verdict is unknown)."""
    return {True: "yes", False: "no"}.get(value, "unknown")


@register.filter
def pretty_json(value) -> str:
    """A JSON value as indented text (for args, before/after); ``–`` for None."""
    if value is None:
        return "–"
    return json.dumps(value, indent=1, sort_keys=True, default=str)


@register.filter
def countdown(seconds) -> str:
    """Seconds left as ``"expires in 12 min"``; ``"expired"`` when none are left."""
    if seconds is None:
        return ""
    if float(seconds) <= 0:
        return "expired"
    return f"expires in {age(seconds)}"


@register.filter
def mapget(mapping, key):
    """``mapping[key]`` in a template (None when missing)."""
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.filter
def words(value: str) -> list[str]:
    """``"a b c"`` → ``["a", "b", "c"]`` (option lists written inline in a template)."""
    return str(value).split()


@register.filter
def join_list(value) -> str:
    """A list as ``"6, 600"``; anything else as text."""
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


@register.filter
def without_verdict(text: str) -> str:
    """The planner's answer without its machine-readable ``<verdict>{…}</verdict>`` block."""
    return without_verdicts(text, sep=" ", strip=True).strip()


@register.simple_tag
def waiting_approvals() -> int:
    """How many approvals wait for an operator (status ``waiting``, not yet past their expiry):
    the navigation's badge. One query."""
    return Approval.objects.filter(status="waiting", expires_at__gt=clock.now()).count()


@register.filter
def exit_text(code) -> str:
    """A worker process's exit code in words: ``-9`` → ``"killed by SIGKILL (exit -9)"``, ``0`` →
    ``"exited cleanly (exit 0)"``, ``3`` → ``"exited with code 3"`` (POSIX: a negative code is the
    signal that ended the process, as ``subprocess.Popen.returncode`` reports it)."""
    if code is None or code == "":
        return ""
    try:
        n = int(code)
    except (TypeError, ValueError):
        return f"exit {code}"
    if n < 0:
        try:
            name = signal.Signals(-n).name
        except ValueError:
            name = f"signal {-n}"
        return f"killed by {name} (exit {n})"
    return "exited cleanly (exit 0)" if n == 0 else f"exited with code {n}"
