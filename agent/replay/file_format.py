# Over 500 lines on purpose: the replay format (docs/replay.md) read top to bottom; REASON_CODES the one list.
"""The scenario file: its shape, its limits, and how a file is read and checked.

A replay file (``docs/replay.md``) is read by :func:`load_scenario`, which refuses anything it
cannot accept with :class:`ScenarioFileError` — one line naming the file, the field (as a key
path such as ``fleet[3].dph``) and the problem; never a traceback, never a guess:

- only a regular file of at most :data:`MAX_FILE_BYTES` is opened (``/dev/zero``, a FIFO or a
  directory is refused from ``stat`` alone, before anything is read), as UTF-8 text;
- JSON only: ``Infinity``/``NaN``, numbers that overflow a float, integers longer than 20
  digits, a key given twice in one object and nesting deeper than :data:`MAX_DEPTH` are refused;
- unknown keys are errors; no string or boolean is coerced to a number (``"0.45"``, ``true``);
- ranges: ``now`` in the years 2000–2100; minutes and ages finite and at most
  :data:`MAX_MINUTES`; counts at most :data:`MAX_COUNT`; at most :data:`MAX_FLEET` fleet entries
  and :data:`agent.policy.tool_specs.MAX_BATCH_CALLS` calls in a ``parallel`` step;
- ``now`` carries a time zone; ids (fleet, offers, history, timeline) hold no control characters;
- a step is one kind of turn (``text`` beside a call is refused, as ``args`` beside
  ``raw_arguments``); ``history`` names only instances of ``fleet``;
- names in ``expect`` are known: tools, reason codes (:data:`REASON_CODES`, the one list), halt
  codes, alert kinds, statuses, operations — a typo exits 2, it never turns into a mismatch.

Source: docs/replay.md (A file, Version 2, Files replay refuses).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import stat
import unicodedata
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agent.actions.settings import OverrideError, validate_overrides
from agent.policy.limits import LIMIT_RANGES, MAX_LIFECYCLE_MIN, MAX_TARGET_PROOFS_HR, Limits
from agent.policy.table import PRIORITIES
from agent.policy.tool_specs import MAX_BATCH_CALLS
from agent.runtime.tools import PUBLIC_TOOLS, TOOLS
from fleet.numbers import NumberError, parse_number
from fleet.providers.scenario import EFFECT_CALLS, normalize_call

MAX_FILE_BYTES = 32 * 1024 * 1024
MAX_DEPTH = 64
MAX_MINUTES = 1e6
MAX_COUNT = 10**9
MAX_FLEET = 10_000
MAX_TIMELINE = 1_000
#: the most ``steps`` (or ``model_responses``) a file may hold: a run plays at most ``max_steps``
#: (at most 100) turns, plus its resumes; more is never played, only validated (10^6 took minutes)
MAX_STEPS = 1_000
#: the most operator decisions a file may hold (top level and every timeline moment together)
MAX_DECISIONS = 1_000
#: the most work a file may ask for, in instance × cycle × turn units (:func:`work_units`)
MAX_WORK = 500_000
MAX_PROBLEMS = 3

Minutes = Annotated[float, Field(ge=0, le=MAX_MINUTES, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Money = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]

#: docs/contract.md "Reason codes" (and docs/replay.md's table): every code a call or a run may carry,
#: mapped to whether it halts the run. The one list: ``expect`` may name no other code.
REASON_CODES: dict[str, bool] = {
    "max_steps": True, "same_error": True, "identical_args": True, "text_only_spiral": True,
    "forbidden_tool": True, "observe_only": False, "batch_too_large": False, "forged_observation": True,
    "wall_clock": True, "token_budget": True, "lock_lost": True, "three_strikes": True, "unknown_tool": False,
    "invalid_args": False, "rate_limited": False, "tool_timeout": False, "aborted_before_dispatch": False,
    "owned_host": False, "demand_guard": False, "owned_tasks": False, "hold_off": False,
    "launch_pending": False, "instance_cap": False, "budget_cap": False, "priority_required": False,
    "diagnosis_required": False, "in_flight": False, "duplicate": False, "target_gone": False,
    "rejected_recently": False, "no_longer_needed": False, "outcome_unknown": False, "stale_claim": False,
    "already_running": False, "disruption_budget": False,
    "approval_required": False, "rejected": False, "expired": False,
}
#: the codes that halt a run
HALT_CODES = {code for code, halts in REASON_CODES.items() if halts}
#: docs/contract.md "Alert kinds"
ALERT_KINDS = {"workers_dead", "demand_unknown", "provider_error", "prompt_injection", "breaker_tripped",
               "destroy_unconfirmed", "stuck_provisioning", "budget", "escalation", "stale_claim", "instance_exited",
               "planner_fallback"}
PROVIDER_STATUSES = (
    "created", "loading", "scheduling", "running", "rebooting", "stopped", "frozen", "exited", "error", "unknown",
    "offline",
)
ProviderStatus = Literal[
    "created", "loading", "scheduling", "running", "rebooting", "stopped", "frozen", "exited", "error", "unknown", "offline",
]
#: the operations ``expect.provider_requests`` may count (``search`` is our extension)
OPERATIONS = ("launch", "stop", "resume", "reboot", "destroy", "list", "search")
#: limits whose value is a list of numbers
LIST_LIMITS = {name for name, (kind, _, _) in LIMIT_RANGES.items() if kind in ("pair", "ints")}


def _unknown(what: str, value: str, known, why: str) -> ValueError:
    """A ``ValueError`` naming an unknown ``value``, the closest known spelling, and ``why`` it matters."""
    close = difflib.get_close_matches(str(value), sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"unknown {what} {_clip(value, 40)!r}{hint}; {why}")


def _known_tool(tool: str, why: str = "a typo here would make the expectation always hold") -> str:
    if tool not in PUBLIC_TOOLS:
        raise _unknown("tool", tool, PUBLIC_TOOLS, why)
    return tool


def _known_reason(reason: str | list[str] | None) -> str | list[str] | None:
    """A reason code (or a non-empty list of them) of :data:`REASON_CODES`; ``ValueError`` naming the unknown one."""
    if isinstance(reason, list) and not reason:
        raise ValueError("an empty list accepts no reason code; give one code or several")
    for code in reason if isinstance(reason, list) else [] if reason is None else [reason]:
        if code not in REASON_CODES:
            raise _unknown("reason code", code, REASON_CODES, 'the codes are those of docs/replay.md "Reason codes"')
    return reason


#: control characters (C0, DEL, C1), format characters (zero-width, bidi overrides), line and
#: paragraph separators and lone surrogates: never part of an instance or offer id
_UNPRINTABLE = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def _printable_id(v: str) -> str:
    for n, ch in enumerate(v):
        if unicodedata.category(ch) in _UNPRINTABLE:
            raise ValueError(f"holds the control character U+{ord(ch):04X} at position {n}; an id is printable text")
    return v


#: an instance or offer id: 1 to 64 printable characters
Ident = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_printable_id)]



def aware_datetime(v: datetime) -> datetime:
    """``v`` when it has a time zone and lies in the years 2000..2100; ``ValueError`` naming what to
    do otherwise (a replay file's ``now``, a day file's ``start``)."""
    if not 2000 <= v.year <= 2100:
        raise ValueError(f"must lie between the years 2000 and 2100 (got year {v.year})")
    if v.tzinfo is None or v.utcoffset() is None:
        raise ValueError("has no time zone; end it with Z (UTC) or an offset such as +02:00")
    return v

class FieldProblem(ValueError):
    """A problem found across fields, raised inside a model validator with the key path it concerns
    (``where``, e.g. ``history[2].instance``); :func:`load_scenario` reports it at that path."""

    def __init__(self, where: str, message: str):
        super().__init__(message)
        self.where = where


class ScenarioFileError(Exception):
    """The scenario file is invalid (unreadable, not JSON, unknown key, bad value, bad decision reference).

    ``str(exc)`` is one line naming the file and, when there is one, the key path.
    """


class _Strict(BaseModel):
    # strict: "0.45" and true are not numbers; 1 is not true
    model_config = ConfigDict(extra="forbid", strict=True)


class WorkerSpec(_Strict):
    """Curio's view of one instance's worker."""

    live: bool = False
    unschedulable: bool = False
    owned_tasks: Count = 0


class CommandAnswer(_Strict):
    """What one command answers over SSH."""

    rc: int = Field(default=0, ge=-MAX_COUNT, le=MAX_COUNT)
    out: str = ""


class SshSpec(_Strict):
    """What diagnosis over SSH sees on one instance."""

    reachable: bool = True
    commands: dict[str, CommandAnswer] = Field(default_factory=dict)


class FleetEntry(_Strict):
    """One instance of the scenario's fleet (times in minutes before ``now``).

    ``known: false``: the provider lists it but our database has no row. ``listed: false``: our
    database has a row but the provider does not list it (docs/replay.md, Version 2).
    """

    id: Ident
    provider: Literal["vastai", "ssh", "local", "scenario"] = "vastai"
    actual_status: ProviderStatus = "running"
    intended_status: Literal["running", "stopped", "destroyed"] = "running"
    status_msg: str = Field(default="", max_length=10_000)
    age_min: Minutes = 60
    status_age_min: Minutes | None = None
    gpu_name: str = Field(default="", max_length=64)
    dph: Money = 0.0
    worker: WorkerSpec | None = None
    diagnosed_min_ago: Minutes | None = None
    ssh: SshSpec | None = None
    known: bool = True
    listed: bool = True

    @model_validator(mode="after")
    def _exists_somewhere(self):
        if not self.known and not self.listed:
            raise ValueError("an entry with known: false and listed: false exists nowhere; drop it")
        if not self.known and self.diagnosed_min_ago is not None:
            raise ValueError("diagnosed_min_ago needs our database row, which known: false says is missing")
        return self


class Offer(_Strict):
    """One offer ``search_offers`` / ``launch_instance`` can find (an integer ``id`` is read as its digits)."""

    id: Ident
    gpu_name: str = Field(default="", max_length=64)
    dph: Money = 0.0
    machine_id: Count | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id_str(cls, v):
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v


class DemandSpec(_Strict):
    """The demand signal (``idle_min``: how long the queue has been empty; null = not idle).

    ``backlog``: proving work in Curio's pipeline tables with no queue row yet; ``proof_s``:
    measured median seconds per proof per worker (null: not measured). Both Version 2.
    """

    state: Literal["ok", "unknown", "stale"] = "ok"
    active: bool | None = None
    queued: Count | None = None
    running: Count | None = None
    workers_expected: Count | None = None
    workers_live: Count | None = None
    idle_min: Minutes | None = None
    backlog: Count | None = None
    proof_s: Annotated[float, Field(gt=0, le=MAX_MINUTES, allow_inf_nan=False)] | None = None


class HistoryEntry(_Strict):
    """A past action (for hold-off, launch-pending and claim checks).

    ``state``: ``done`` (default) or ``claimed`` — started ``min_ago`` minutes ago, never finished.
    """

    min_ago: Minutes
    tool: str
    instance: Ident | None = None
    state: Literal["done", "claimed"] = "done"

    @field_validator("tool")
    @classmethod
    def _side_effect_tool(cls, v):
        return _known_tool(v, "history records calls of Warden's tools")

    @model_validator(mode="after")
    def _names_its_instance(self):
        if self.instance is None and TOOLS[self.tool].instance_arg:
            raise FieldProblem("instance", f"{self.tool} acts on one instance; name it (an id of fleet)")
        return self


class CallSpec(_Strict):
    """One call inside a parallel batch."""

    tool: str
    args: dict[str, Any] | None = None
    raw_arguments: str | None = None

    @model_validator(mode="after")
    def _one_args(self):
        if self.args is not None and self.raw_arguments is not None:
            raise ValueError("give either args or raw_arguments, not both")
        return self


class Usage(_Strict):
    """Tokens the model reported for one turn (the script planner counts them toward ``token_budget``)."""

    prompt_tokens: Count = 0
    completion_tokens: Count = 0


class StepSpec(_Strict):
    """One model turn: a ``tool`` call, a ``parallel`` batch, ``text`` only, or a ``tool_result``.

    Exactly one kind per step (docs/replay.md, The planner and the operator): ``text`` beside a call, a
    batch or a ``tool_result`` is refused, as are ``args`` beside ``raw_arguments`` — the script
    planner would play one and drop the other. A ``tool_result`` step may name the ``tool`` whose
    result the model forged. ``usage`` (the model's reported tokens for the turn) is optional. A
    batch holds at most 16 calls. Raises ``ValueError`` naming the keys that clash.
    """

    tool: str | None = None
    args: dict[str, Any] | None = None
    raw_arguments: str | None = None
    parallel: list[CallSpec] | None = Field(default=None, max_length=MAX_BATCH_CALLS)
    text: str | None = None
    tool_result: Any = None
    usage: Usage | None = None

    @model_validator(mode="after")
    def _one_kind(self):
        kinds = [k for k in ("tool", "parallel", "text", "tool_result") if k in self.model_fields_set]
        if kinds[:1] == ["tool"] and "tool_result" in kinds:
            kinds.remove("tool")  # a tool_result may name the tool whose result it forges
        if len(kinds) > 1:
            raise ValueError(
                f"a step is one of tool, parallel, text or tool_result (one model turn); this one has {', '.join(kinds)}"
            )
        if not kinds or (kinds[0] != "tool_result" and getattr(self, kinds[0]) is None):
            raise ValueError("a step needs tool, parallel, text or tool_result")
        if (self.args is not None or self.raw_arguments is not None) and (self.tool is None or "tool_result" in kinds):
            raise ValueError("args/raw_arguments belong to a tool step")
        if self.args is not None and self.raw_arguments is not None:
            raise ValueError("give either args or raw_arguments, not both")
        if self.parallel is not None and not self.parallel:
            raise ValueError("parallel needs at least one call")
        return self


class Decision(_Strict):
    """An operator answer for one parked call, named by ``step``(+``call``) or by ``tool``(+``args``)."""

    step: Count | None = None
    call: Count | None = None
    tool: str | None = None
    args: dict[str, Any] | None = None
    decision: Literal["approve", "reject", "none"]
    comment: str = ""

    @field_validator("tool")
    @classmethod
    def _parks(cls, v):
        return None if v is None else _known_tool(v, "only Warden's tools park for an operator")

    @model_validator(mode="after")
    def _named(self):
        if self.step is None and self.tool is None:
            raise ValueError("name the call by step (and call, in a batch) or by tool (and args)")
        if self.step is not None and self.tool is not None:
            raise ValueError("name the call by step or by tool, not both")
        if self.call is not None and self.step is None:
            raise ValueError("call is an index into a step's parallel batch; give step too")
        if self.args is not None and self.tool is None:
            raise ValueError("args narrow a decision named by tool; give tool too")
        return self


class OperatorSpec(_Strict):
    """How parked calls are answered."""

    default: Literal["approve", "reject", "none"] = "none"
    decisions: list[Decision] = Field(default_factory=list)


class FaultSpec(_Strict):
    """The next ``times`` requests to ``call`` (after the first ``skip``) fail with ``error``;
    with ``after_effect`` each takes effect at the provider first."""

    call: str
    times: Annotated[int, Field(ge=1, le=MAX_COUNT)] = 1
    error: Literal[
        "http_429", "http_410", "http_500", "timeout", "empty_body", "html_body", "ssh_refused", "ssh_timeout"
    ]
    skip: Count = 0
    after_effect: bool = False

    @model_validator(mode="after")
    def _call_ok(self):
        call = normalize_call(self.call, self.error)
        if self.after_effect and call not in EFFECT_CALLS:
            raise ValueError(f"after_effect applies to launch, stop, resume, reboot or destroy, not {self.call!r}")
        return self


class SessionSpec(_Strict):
    """The console's switches as set before the first cycle."""

    observe_only: bool = False


class TimelineFleetEntry(_Strict):
    """A change to one instance at the provider: the fields given change; a new id appears;
    ``gone: true`` removes it from the provider's list. ``worker`` changes Curio's view of it."""

    id: Ident
    provider: Literal["vastai", "ssh", "local", "scenario"] | None = None
    actual_status: ProviderStatus | None = None
    intended_status: Literal["running", "stopped", "destroyed"] | None = None
    status_msg: str | None = Field(default=None, max_length=10_000)
    age_min: Minutes | None = None
    gpu_name: str | None = Field(default=None, max_length=64)
    dph: Money | None = None
    worker: WorkerSpec | None = None
    ssh: SshSpec | None = None
    gone: bool = False


class TimelineDecision(_Strict):
    """An operator's answer at a timeline moment to an approval waiting then (named by tool and args)."""

    tool: str
    args: dict[str, Any] | None = None
    decision: Literal["approve", "reject"]
    comment: str = ""

    @field_validator("tool")
    @classmethod
    def _parks(cls, v):
        return _known_tool(v, "only Warden's tools park for an operator")


class TimelineOperator(_Strict):
    decisions: list[TimelineDecision] = Field(default_factory=list)


class Moment(_Strict):
    """One later moment of the timeline (``at_min`` minutes after ``now``)."""

    at_min: Minutes
    demand: DemandSpec | None = None
    fleet: list[TimelineFleetEntry] | None = Field(default=None, max_length=MAX_FLEET)
    objectives: dict[str, Any] | None = None
    operator: TimelineOperator | None = None
    run: Literal["heartbeat", "none"] = "heartbeat"

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, v):
        return None if v is None else check_objectives(v)


class CallExpect(_Strict):
    """An expected call: matches when every field given agrees (``args``: the keys given agree;
    ``reason``: one code of :data:`REASON_CODES` or a non-empty list of accepted codes).

    ``tool`` must be one of Warden's tools: no call of another can be executed, parked or
    errored, so a typo would only ever show up as a mismatch. Raises ``ValueError`` naming the
    unknown tool or code.
    """

    #: whether a tool Warden lacks may be named (with reason ``unknown_tool``; see RefusedExpect)
    unknown_tool_expected: ClassVar[bool] = False

    # reason comes before tool: the tool check reads it
    args: dict[str, Any] | None = None
    reason: str | list[str] | None = None
    actor: Literal["agent", "monitor"] | None = None
    outcome: Literal["executed", "approved_executed", "refused", "parked", "rejected", "expired", "error", "halted"] | None = None
    tool: str | None = None

    @field_validator("reason")
    @classmethod
    def _known_codes(cls, v):
        return _known_reason(v)

    @field_validator("tool")
    @classmethod
    def _tool_known(cls, v, info: ValidationInfo):
        if v is None:
            return v
        reason = info.data.get("reason")
        if cls.unknown_tool_expected and "unknown_tool" in (reason if isinstance(reason, list) else [reason]):
            return v  # the model may call a tool that does not exist; that refusal is expected by name
        why = ("a tool Warden lacks is expected refused only with reason 'unknown_tool'" if cls.unknown_tool_expected
               else "Warden has no such tool, so this expectation could only fail")
        return _known_tool(v, why)


class RefusedExpect(CallExpect):
    """An expected refusal: as :class:`CallExpect`, and a tool Warden lacks may be named when the
    ``reason`` says ``unknown_tool`` (the model calling a tool that does not exist)."""

    unknown_tool_expected: ClassVar[bool] = True


def _alert_kinds(v):
    for kind in v or []:
        if kind not in ALERT_KINDS:
            raise ValueError(f"unknown alert kind {kind!r}; use one of {', '.join(sorted(ALERT_KINDS))}")
    return v


#: docs/replay.md ``expect``: the outcomes each call list holds (``parked`` holds any final outcome)
LIST_OUTCOMES = {"executed": ("executed", "approved_executed"), "refused": ("refused", "halted"), "errored": ("error",)}


class ExpectSpec(_Strict):
    """What must hold after the replay (docs/replay.md ``expect`` and Version 2).

    Every name is checked (tools, reason codes, halt codes, alert kinds, statuses, operations),
    and an item's ``outcome`` must be one its list can hold; raises ``ValueError`` naming it.
    """

    executed: list[CallExpect] | None = None
    refused: list[RefusedExpect] | None = None
    parked: list[CallExpect] | None = None
    errored: list[CallExpect] | None = None
    never_executed: list[str] | None = None
    halt: str | None = None
    alerts: list[str] | None = None
    alerts_any: list[str] | None = None
    no_alerts: list[str] | None = None
    report_contains: list[str] | None = None
    report_lacks: list[str] | None = None
    final_fleet: dict[str, Literal[(*PROVIDER_STATUSES, "absent")]] | None = None  # type: ignore[valid-type]
    provider_requests: dict[Literal[OPERATIONS], Count] | None = None  # type: ignore[valid-type]

    @field_validator("never_executed")
    @classmethod
    def _known_tools(cls, v):
        for tool in v or []:
            _known_tool(tool)
        return v

    @field_validator("halt")
    @classmethod
    def _known_halt(cls, v):
        if v is not None and v not in HALT_CODES:
            raise _unknown("halt code", v, HALT_CODES, f"use one of {', '.join(sorted(HALT_CODES))}")
        return v

    @field_validator("alerts", "alerts_any", "no_alerts")
    @classmethod
    def _known_alerts(cls, v):
        return _alert_kinds(v)

    @model_validator(mode="after")
    def _outcomes_fit_their_list(self):
        for key, outcomes in LIST_OUTCOMES.items():
            for n, item in enumerate(getattr(self, key) or []):
                if item.outcome is not None and item.outcome not in outcomes:
                    raise FieldProblem(
                        f"{key}[{n}].outcome",
                        f"{key} holds calls whose outcome is {' or '.join(outcomes)}, never {item.outcome!r}",
                    )
        return self


def check_objectives(v: dict) -> dict:
    """Objectives as a file (or a timeline moment) sets them; raises ``ValueError`` naming the key.

    Every key a limit of the one schema (``agent.policy.limits.Limits``); numbers only (no strings, no
    booleans), finite, in the settings page's ranges (``agent.policy.limits.LIMIT_RANGES``: the lifecycle
    numbers ``offline_grace_min`` … at most 10^6 minutes); ``target_proofs_hr`` at most
    ``MAX_TARGET_PROOFS_HR`` (10^6, the operator's cap).
    """
    allowed = set(Limits.model_fields)
    for key, value in v.items():
        if key not in allowed:
            raise ValueError(f"unknown objective {key!r}; known: {', '.join(sorted(allowed))}")
        if isinstance(value, list) and key not in LIST_LIMITS:
            raise ValueError(f"objective {key!r} must be a number, not a list")
        numbers = value if isinstance(value, list) else [value]
        for x in numbers:
            if isinstance(x, list | dict):
                raise ValueError(f"objective {key!r} must be a flat list of numbers, not a nested list")
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise ValueError(f"objective {key!r} must be a number (got {x!r}; strings and booleans are not read as numbers)")
            if x != x or x in (float("inf"), float("-inf")):
                raise ValueError(f"objective {key!r} must be finite")
            try:  # the operator-number rule, on the number as the file wrote it (1e-320, -0 refused)
                parse_number(x, f"objective {key!r}", low=0, high=float("inf"))
            except NumberError as exc:
                raise ValueError(str(exc)) from None
    target = v.get("target_proofs_hr", 0)
    if not 0 <= target <= MAX_TARGET_PROOFS_HR:
        raise ValueError(f"objective 'target_proofs_hr' must be a number between 0 and 10^6 (got {target!r})")
    for key in v:
        if LIMIT_RANGES.get(key, ("", 0, 0))[2] == MAX_LIFECYCLE_MIN and not 0 <= v[key] <= MAX_LIFECYCLE_MIN:
            raise ValueError(f"objective {key!r} must be between 0 and 10^6 minutes (got {v[key]!r})")
    # the same ranges the settings page enforces
    try:
        validate_overrides({}, {k: x for k, x in v.items() if k in LIMIT_RANGES})
    except OverrideError as exc:
        raise ValueError(f"objective {exc.field.removeprefix('limits.')!r}: {exc.message}") from None
    return v


class Scenario(_Strict):
    """A scenario file (docs/replay.md: A file, Version 2)."""

    name: str = Field(min_length=1, max_length=200)
    about: str = ""
    now: datetime = Field(strict=False)
    objectives: dict[str, Any] = Field(default_factory=dict)
    policy: dict[str, Literal["auto", "approval", "forbidden"]] = Field(default_factory=dict)
    fleet: list[FleetEntry] = Field(default_factory=list, max_length=MAX_FLEET)
    offers: list[Offer] = Field(default_factory=list, max_length=MAX_FLEET)
    demand: DemandSpec = Field(default_factory=DemandSpec)
    history: list[HistoryEntry] = Field(default_factory=list, max_length=MAX_FLEET)
    planner: Literal["script", "rules", "llm"] = "script"
    steps: list[StepSpec] | None = None
    model_responses: list[Any] | None = None
    operator: OperatorSpec = Field(default_factory=OperatorSpec)
    provider_faults: list[FaultSpec] = Field(default_factory=list)
    session: SessionSpec = Field(default_factory=SessionSpec)
    timeline: list[Moment] = Field(default_factory=list, max_length=MAX_TIMELINE)
    expect: ExpectSpec | None = None

    @field_validator("now", mode="before")
    @classmethod
    def _now_text(cls, v):
        if not isinstance(v, str):
            raise ValueError("must be an ISO 8601 date-time string such as 2026-06-09T16:50:00Z")
        return v

    @field_validator("now")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        return aware_datetime(v)

    @field_validator("model_responses")
    @classmethod
    def _model_responses(cls, v):
        """Each entry is a JSON object: a body (served 200), ``{"http_status": 100..599, "body"}``
        or ``{"timeout": true}`` (docs/replay.md ``model_responses``)."""
        for n, entry in enumerate(v or []):
            if not isinstance(entry, dict):
                raise ValueError(f"[{n}] must be a JSON object: a chat-completion body, "
                                 '{"http_status": N, "body": ...} or {"timeout": true}')
            if "timeout" in entry and entry["timeout"] is not True:
                raise ValueError(f'[{n}].timeout must be true (a request that never answers); leave it out otherwise')
            if "http_status" in entry:
                code = entry["http_status"]
                if isinstance(code, bool) or not isinstance(code, int) or not 100 <= code <= 599:
                    raise ValueError(f"[{n}].http_status must be an HTTP status between 100 and 599 (got {_clip(repr(code))})")
        return v

    @field_validator("objectives")
    @classmethod
    def _objective_keys(cls, v: dict) -> dict:
        return check_objectives(v)

    @field_validator("policy")
    @classmethod
    def _policy_keys(cls, v: dict) -> dict:
        for key in v:
            tool, _, qual = key.partition(":")
            ok = tool in PUBLIC_TOOLS and (not qual or qual == "monitor" or (tool == "launch_instance" and qual in PRIORITIES))
            if not ok:
                raise ValueError(f"unknown policy key {key!r}; use a tool name, TOOL:monitor or launch_instance:P0..P3")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        ids = [f.id for f in self.fleet]
        dup = [i for i, n in Counter(ids).items() if n > 1]
        if dup:
            raise ValueError(f"fleet ids repeat: {', '.join(dup[:5])}")
        # history is about the starting fleet: an instance gone before now is still a fleet entry,
        # with "listed": false (our database has its row, the provider no longer lists it)
        known = set(ids)
        for n, h in enumerate(self.history):
            if h.instance is not None and h.instance not in known:
                raise FieldProblem(
                    f"history[{n}].instance",
                    f"{_clip(h.instance)!r} is not in fleet; add it there (with \"listed\": false if the provider "
                    "no longer lists it)",
                )
        if self.planner == "script" and self.steps is None:
            raise ValueError("planner 'script' needs steps")
        if self.planner == "rules" and self.steps is not None:
            raise ValueError("planner 'rules' takes no steps")
        if self.planner == "llm" and self.model_responses is None:
            raise ValueError("planner 'llm' needs model_responses")
        if self.planner != "llm" and self.model_responses is not None:
            raise ValueError("model_responses belong to planner 'llm'")
        last = 0.0
        for n, m in enumerate(self.timeline):
            if m.at_min < last:
                raise ValueError(f"timeline[{n}].at_min: {m.at_min:g} comes before the moment above it ({last:g}); list moments in order")
            last = m.at_min
        for n, d in enumerate(self.operator.decisions):
            where = f"operator.decisions[{n}]"
            if d.step is None:
                continue
            if self.steps is None:
                raise ValueError(f"{where}: names step {d.step}, but planner {self.planner!r} has no steps; name it by tool and args")
            if d.step >= len(self.steps):
                raise ValueError(f"{where}: step {d.step} does not exist (the file has {len(self.steps)} steps)")
            s = self.steps[d.step]
            if s.parallel is not None:
                if d.call is None:
                    raise ValueError(f"{where}: step {d.step} is a parallel batch; say which call (0..{len(s.parallel) - 1})")
                if d.call >= len(s.parallel):
                    raise ValueError(f"{where}: step {d.step} has {len(s.parallel)} calls; call {d.call} does not exist")
            elif s.tool is None or "tool_result" in s.model_fields_set:
                raise ValueError(f"{where}: step {d.step} makes no call")
            elif d.call not in (None, 0):
                raise ValueError(f"{where}: step {d.step} is a single call; call {d.call} does not exist")
        return self


# ------------------------------------------------------------------------------------------------
# reading a file


class _Bad:
    """A JSON value replay refuses, kept in place so the error can name where it was."""

    def __init__(self, why: str):
        self.why = why


class _Pairs(dict):
    """A JSON object whose keys repeat (the repeated keys are in ``repeated``)."""

    repeated: list[str]


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    counts = Counter(k for k, _ in pairs)
    if all(n == 1 for n in counts.values()):
        return dict(pairs)
    out = _Pairs(pairs)
    out.repeated = [k for k, n in counts.items() if n > 1]
    return out


class JsonFloat(float):
    """A JSON number with a fraction or exponent, with the ``text`` it was written as (objectives
    are judged by that text: ``fleet.numbers``)."""

    text: str = ""


class JsonInt(int):
    """A JSON integer with the ``text`` it was written as (``-0`` is 0, but was typed with a sign)."""

    text: str = ""


def _float(text: str):
    value = float(text)
    if value in (float("inf"), float("-inf")):
        return _Bad(f"{text} is out of range for a number")
    out = JsonFloat(value)
    out.text = text
    return out


def _int(text: str):
    if len(text.lstrip("-")) > 20:
        return _Bad(f"an integer of {len(text.lstrip('-'))} digits is out of range")
    out = JsonInt(text)
    out.text = text
    return out


def _constant(name: str):
    return _Bad(f"{name} is not a JSON number; give a finite number")


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def _too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether brackets nest deeper than ``limit`` (brackets inside strings do not count).

    Linear: strings are cut out by an unrolled pattern (no backtracking), then only the bracket
    characters are walked; no recursion, whatever the input.
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for m in _BRACKET.finditer(_STRING.sub("", text)):
        if m.group() in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


_SURROGATE = re.compile("[\ud800-\udfff]")
#: a ``\\uD800``–``\\uDFFF`` escape in the text: only then can a parsed string hold a lone surrogate
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_NOT_TEXT = "holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is not text; write a valid pair or the character"


def _first_bad(obj, where: str = "", surrogates: bool = False) -> tuple[str, str] | None:
    """The key path and problem of the first refused value inside ``obj`` (depth is bounded).

    ``surrogates``: also look for strings (keys included) holding a lone surrogate, which no
    database or terminal can store or print.
    """
    if isinstance(obj, _Bad):
        return where or "(top level)", obj.why
    if isinstance(obj, str):
        return (where or "(top level)", _NOT_TEXT) if surrogates and _SURROGATE.search(obj) else None
    if isinstance(obj, dict):
        if isinstance(obj, _Pairs):
            key = obj.repeated[0]
            return where or "(top level)", f"key {_clip(key)!r} appears twice; a key may be given once"
        for k, v in obj.items():
            at = f"{where}.{_clip(k)}" if where else _clip(k)
            if surrogates and _SURROGATE.search(k):
                return at, "the key " + _NOT_TEXT
            found = _first_bad(v, at, surrogates)
            if found:
                return found
    elif isinstance(obj, list):
        for n, v in enumerate(obj):
            found = _first_bad(v, f"{where}[{n}]", surrogates)
            if found:
                return found
    return None


def _clip(text, limit: int = 60) -> str:
    """One short line: control characters escaped, long text cut."""
    text = str(text).encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``, read under the limits above; raises :class:`ScenarioFileError`."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ScenarioFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        raise ScenarioFileError(f"{path}: {kind}; give a scenario file (JSON)")
    if st.st_size > MAX_FILE_BYTES:
        raise ScenarioFileError(f"{path}: {st.st_size} bytes; a scenario file may hold at most {MAX_FILE_BYTES} bytes")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ScenarioFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ScenarioFileError(f"{path}: more than {MAX_FILE_BYTES} bytes; a scenario file may hold at most that")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioFileError(f"{path}: not UTF-8 text (byte {exc.start}); save the file as UTF-8") from None
    if _too_deep(text):
        raise ScenarioFileError(f"{path}: brackets nest deeper than {MAX_DEPTH} levels; a scenario file is shallow")
    try:
        raw = json.loads(text, object_pairs_hook=_pairs, parse_float=_float, parse_int=_int, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise ScenarioFileError(f"{path}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:
        raise ScenarioFileError(f"{path}: not JSON: {_clip(exc, 120)}") from None
    bad = _first_bad(raw, surrogates=bool(_SURROGATE_ESCAPE.search(text)))
    if bad:
        raise ScenarioFileError(f"{path}: {bad[0]}: {bad[1]}")
    return raw


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + _clip(part)
    return out or "(top level)"


def _strip_validator_loc(loc: tuple) -> tuple:
    # pydantic puts union/function markers in loc (e.g. 'function-after[...]'); keep real keys
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p and "]" in p)))


def _where(err: dict) -> str:
    """The key path of one pydantic error (a :class:`FieldProblem` names its own, below the model's)."""
    at = _loc(_strip_validator_loc(err["loc"]))
    problem = (err.get("ctx") or {}).get("error")
    if isinstance(problem, FieldProblem):
        return problem.where if at == "(top level)" else f"{at}.{problem.where}"
    return at


def _message(err: dict) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "too_long" and err.get("ctx", {}).get("max_length") is not None:
        return f"more than {err['ctx']['max_length']} entries"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] in ("float_type", "int_type", "bool_type", "string_type") and isinstance(err.get("input"), str | bool):
        msg += f" (got {_clip(repr(err['input']), 40)}; strings and booleans are not converted)"
    return _clip(msg, 300)


def _count(value) -> int:
    return len(value) if isinstance(value, list) else 0


def work_units(raw: dict) -> tuple[int, int, int, int]:
    """``(units, instances, cycles, turns)``: an upper bound of the work the file ``raw`` (its JSON,
    not yet validated) asks of a replay, ``instances × cycles × turns``.

    ``instances``: the fleet, plus every offer (a launch rents one) and every timeline fleet entry
    (each may add one); ``cycles``: cycle 0 plus one per timeline moment; ``turns``: the planner
    turns of a run, ``1 + min(steps, max_steps)`` for ``script`` (``model_responses`` for ``llm``),
    ``max_steps`` for ``rules`` (``max_steps`` from the objectives when it is a whole number from 1
    to 100, else the default 12). Each cycle syncs and judges every instance, and each turn may list
    them all, so the product bounds the rows written and read."""
    timeline = [m for m in raw.get("timeline") or [] if isinstance(m, dict)] if isinstance(raw.get("timeline"), list) else []
    instances = _count(raw.get("fleet")) + _count(raw.get("offers")) + sum(_count(m.get("fleet")) for m in timeline)
    cycles = 1 + _count(raw.get("timeline"))
    objectives = raw.get("objectives") if isinstance(raw.get("objectives"), dict) else {}
    max_steps = objectives.get("max_steps")
    max_steps = max_steps if isinstance(max_steps, int) and not isinstance(max_steps, bool) and 1 <= max_steps <= 100 else 12
    played = max(_count(raw.get("steps")), _count(raw.get("model_responses")))
    turns = max_steps if raw.get("planner") == "rules" else 1 + min(played, max_steps)
    instances = max(1, instances)
    return instances * cycles * turns, instances, cycles, turns


def check_bounds(raw: dict, path) -> None:
    """Refuse a file that asks for more than a replay does, before it is validated or run: more
    than :data:`MAX_STEPS` steps or model responses, :data:`MAX_DECISIONS` decisions, or
    :data:`MAX_WORK` units of :func:`work_units`. Raises :class:`ScenarioFileError` (one line)."""
    for key in ("steps", "model_responses"):
        if _count(raw.get(key)) > MAX_STEPS:
            raise ScenarioFileError(f"{path}: {key}: {_count(raw.get(key)):,} entries; a replay plays at most {MAX_STEPS:,} "
                                    "(a run takes at most max_steps turns, 100 at most, plus its resumes)")
    operator = raw.get("operator") if isinstance(raw.get("operator"), dict) else {}
    timeline = raw.get("timeline") if isinstance(raw.get("timeline"), list) else []
    decisions = _count(operator.get("decisions")) + sum(
        _count(m["operator"].get("decisions")) for m in timeline if isinstance(m, dict) and isinstance(m.get("operator"), dict))
    if decisions > MAX_DECISIONS:
        raise ScenarioFileError(f"{path}: operator decisions: {decisions:,} in all (top level and timeline); a replay reads "
                                f"at most {MAX_DECISIONS:,}")
    units, instances, cycles, turns = work_units(raw)
    if units > MAX_WORK:
        raise ScenarioFileError(
            f"{path}: the file asks for too much work: {instances:,} instances (fleet, offers and timeline fleet entries) "
            f"× {cycles:,} cycles × {turns:,} planner turns = {units:,} units; a replay does at most {MAX_WORK:,} "
            "(docs/replay.md \"Bounds\"): use fewer moments, a smaller fleet or fewer steps")


def load_scenario(path: str | Path) -> tuple[Scenario, dict]:
    """Read and validate ``path``; returns (the model, the raw JSON dict).

    Raises :class:`ScenarioFileError` with one line: ``FILE: KEY.PATH: problem`` (the first
    few problems found, separated by ``;``).
    """
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ScenarioFileError(f"{path}: the file must hold one JSON object")
    check_bounds(raw, path)  # the work it asks for, before any of it (validation included) is done
    try:
        sc = Scenario.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        problems = [f"{_where(e)}: {_message(e)}" for e in errors[:MAX_PROBLEMS]]
        more = f"; and {len(errors) - MAX_PROBLEMS} more" if len(errors) > MAX_PROBLEMS else ""
        raise ScenarioFileError(f"{path}: " + "; ".join(problems) + more) from None
    return sc, raw
