"""Scenario replay: run one scenario file through the real observe cycle and report from its rows.

Contract: ``../shared/SCENARIOS.md``. :func:`load_scenario` validates a file (unknown keys are
errors: :class:`ScenarioFileError`, one line naming the file and the key path).
:func:`run_scenario` sets up the world in the *current* database (the ``replay`` management
command points that at a throwaway SQLite file first; tests use pytest's test database), routes
``get_provider()`` and the demand source to the file's fleet and demand, swaps in a virtual clock
that starts at the file's ``now``, runs ``agent.loop.run_cycle`` (the entry point the Celery task
calls), answers parked approvals as the file's ``operator`` says, resumes, and builds the report
from the Run, Step, Approval and Alert rows that cycle wrote. :func:`match_expect` compares a
report with the file's ``expect`` ("Matching expect" in SCENARIOS.md).

File-format extension (documented in the README): ``objectives`` may also name any runtime limit
of ``agent.policy.DEFAULT_LIMITS`` (``wall_clock_s``, ``token_budget``, ``max_steps``...) and the
rule numbers ``dwell_min``, ``hold_off_min``, ``startup_grace_s``; other keys are still errors.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

OUTCOMES_EXECUTED = {"executed", "approved_executed"}
OUTCOMES_REFUSED = {"refused", "halted"}
OUTCOMES_DISPATCHED = {"executed", "approved_executed", "error"}
OBJECTIVE_KEYS = {"target_proofs_hr", "max_instances", "max_dph", "dwell_min", "hold_off_min", "startup_grace_s"}
#: the approval status -> final outcome of a parked call whose step still says ``parked``
_APPROVAL_OUTCOME = {
    "waiting": ("parked", "approval_required"),
    "approved": ("parked", "approval_required"),
    "rejected": ("rejected", "rejected"),
    "expired": ("expired", "expired"),
    "executed": ("approved_executed", None),
}
OPERATOR_USERNAME = "replay-operator"


class ScenarioFileError(Exception):
    """The scenario file is invalid (bad JSON, unknown key, bad value, bad decision reference).

    ``str(exc)`` is one line naming the file and, when there is one, the key path.
    """


# ------------------------------------------------------------------------------------------------
# the file


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkerSpec(_Strict):
    """Curio's view of one instance's worker."""

    live: bool = False
    unschedulable: bool = False
    owned_tasks: int = Field(default=0, ge=0)


class CommandAnswer(_Strict):
    """What one command answers over SSH."""

    rc: int = 0
    out: str = ""


class SshSpec(_Strict):
    """What diagnosis over SSH sees on one instance."""

    reachable: bool = True
    commands: dict[str, CommandAnswer] = Field(default_factory=dict)


class FleetEntry(_Strict):
    """One instance of the scenario's fleet (times in minutes before ``now``)."""

    id: str = Field(min_length=1, max_length=64)
    provider: Literal["vastai", "ssh", "local", "scenario"] = "vastai"
    actual_status: Literal[
        "created", "loading", "scheduling", "running", "rebooting", "stopped", "frozen", "exited", "error",
        "unknown", "offline",
    ] = "running"
    intended_status: Literal["running", "stopped", "destroyed"] = "running"
    status_msg: str = ""
    age_min: float = Field(default=60, ge=0)
    status_age_min: float | None = Field(default=None, ge=0)
    gpu_name: str = ""
    dph: float = Field(default=0.0, ge=0)
    worker: WorkerSpec | None = None
    diagnosed_min_ago: float | None = Field(default=None, ge=0)
    ssh: SshSpec | None = None


class Offer(_Strict):
    """One offer ``search_offers`` / ``launch_instance`` can find."""

    id: str
    gpu_name: str = ""
    dph: float = Field(default=0.0, ge=0)
    machine_id: int | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id_str(cls, v):
        return str(v) if isinstance(v, int) else v


class DemandSpec(_Strict):
    """The demand signal (``idle_min``: how long the queue has been empty; null = not idle)."""

    state: Literal["ok", "unknown", "stale"] = "ok"
    active: bool | None = None
    queued: int | None = Field(default=None, ge=0)
    running: int | None = Field(default=None, ge=0)
    workers_expected: int | None = Field(default=None, ge=0)
    workers_live: int | None = Field(default=None, ge=0)
    idle_min: float | None = Field(default=None, ge=0)


class HistoryEntry(_Strict):
    """A past action (for hold-off and launch-pending checks)."""

    min_ago: float = Field(ge=0)
    tool: str
    instance: str | None = None


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

    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)


class StepSpec(_Strict):
    """One model turn: a ``tool`` call, a ``parallel`` batch, ``text`` only, or a ``tool_result``.

    A ``tool_result`` step may name the ``tool`` whose result the model forged. ``usage`` (the
    model's reported tokens for the turn) is optional.
    """

    tool: str | None = None
    args: dict[str, Any] | None = None
    raw_arguments: str | None = None
    parallel: list[CallSpec] | None = None
    text: str | None = None
    tool_result: Any = None
    usage: Usage | None = None

    @model_validator(mode="after")
    def _one_kind(self):
        kinds = [k for k in ("tool", "parallel", "tool_result") if k in self.model_fields_set]
        if kinds == ["tool", "tool_result"]:
            kinds = ["tool_result"]
        if len(kinds) > 1:
            raise ValueError(f"a step is one of tool, parallel, text or tool_result; this one has {', '.join(kinds)}")
        if not kinds and self.text is None:
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

    step: int | None = Field(default=None, ge=0)
    call: int | None = Field(default=None, ge=0)
    tool: str | None = None
    args: dict[str, Any] | None = None
    decision: Literal["approve", "reject", "none"]
    comment: str = ""

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
    """The next ``times`` requests to ``call`` fail with ``error``."""

    call: str
    times: int = Field(default=1, ge=1)
    error: Literal[
        "http_429", "http_410", "http_500", "timeout", "empty_body", "html_body", "ssh_refused", "ssh_timeout"
    ]

    @model_validator(mode="after")
    def _call_ok(self):
        from fleet.providers.scenario import normalize_call

        normalize_call(self.call, self.error)
        return self


class CallExpect(_Strict):
    """An expected call: matches when every field given agrees (``args``: the keys given agree)."""

    tool: str | None = None
    args: dict[str, Any] | None = None
    reason: str | None = None
    actor: Literal["agent", "monitor"] | None = None


class ExpectSpec(_Strict):
    """What must hold after the replay (SCENARIOS.md "Matching expect")."""

    executed: list[CallExpect] | None = None
    refused: list[CallExpect] | None = None
    parked: list[CallExpect] | None = None
    never_executed: list[str] | None = None
    halt: str | None = None
    alerts: list[str] | None = None

    @field_validator("never_executed")
    @classmethod
    def _known_tools(cls, v):
        from agent.tools import PUBLIC_TOOLS

        for tool in v or []:
            if tool not in PUBLIC_TOOLS:
                raise ValueError(f"unknown tool {tool!r}; a typo here would make the expectation always hold")
        return v

    @field_validator("halt")
    @classmethod
    def _known_halt(cls, v):
        if v is not None and v not in HALT_CODES:
            raise ValueError(f"unknown halt code {v!r}; use one of {', '.join(sorted(HALT_CODES))}")
        return v

    @field_validator("alerts")
    @classmethod
    def _known_alerts(cls, v):
        for kind in v or []:
            if kind not in ALERT_KINDS:
                raise ValueError(f"unknown alert kind {kind!r}; use one of {', '.join(sorted(ALERT_KINDS))}")
        return v


#: SCENARIOS.md: the codes that halt a run, and the alert kinds
HALT_CODES = {"max_steps", "same_error", "identical_args", "text_only_spiral", "forbidden_tool", "forged_observation",
              "wall_clock", "token_budget", "three_strikes"}
ALERT_KINDS = {"workers_dead", "demand_unknown", "provider_error", "prompt_injection", "breaker_tripped",
               "destroy_unconfirmed", "stuck_provisioning", "budget", "escalation"}


class Scenario(_Strict):
    """A scenario file (SCENARIOS.md "File")."""

    name: str = Field(min_length=1)
    about: str = ""
    now: datetime
    objectives: dict[str, Any] = Field(default_factory=dict)
    policy: dict[str, Literal["auto", "approval", "forbidden"]] = Field(default_factory=dict)
    fleet: list[FleetEntry] = Field(default_factory=list)
    offers: list[Offer] = Field(default_factory=list)
    demand: DemandSpec = Field(default_factory=DemandSpec)
    history: list[HistoryEntry] = Field(default_factory=list)
    planner: Literal["script", "rules", "llm"] = "script"
    steps: list[StepSpec] | None = None
    model_responses: list[Any] | None = None
    operator: OperatorSpec = Field(default_factory=OperatorSpec)
    provider_faults: list[FaultSpec] = Field(default_factory=list)
    expect: ExpectSpec | None = None

    @field_validator("now")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        return v if v.tzinfo else v.replace(tzinfo=UTC)

    @field_validator("objectives")
    @classmethod
    def _objective_keys(cls, v: dict) -> dict:
        from agent.actions import OverrideError, validate_overrides
        from agent.policy import DEFAULT_LIMITS

        allowed = OBJECTIVE_KEYS | set(DEFAULT_LIMITS)
        for key in v:
            if key not in allowed:
                raise ValueError(f"unknown objective {key!r}; known: {', '.join(sorted(allowed))}")
        target = v.get("target_proofs_hr", 0)
        if isinstance(target, bool) or not isinstance(target, int | float) or not 0 <= target < 1e9:
            raise ValueError(f"objective 'target_proofs_hr' must be a number ≥ 0 (got {target!r})")
        # the same ranges the settings page enforces (agent.actions.LIMIT_RANGES)
        try:
            validate_overrides({}, {k: x for k, x in v.items() if k != "target_proofs_hr"})
        except OverrideError as exc:
            raise ValueError(f"objective {exc.field.removeprefix('limits.')!r}: {exc.message}") from None
        return v

    @field_validator("policy")
    @classmethod
    def _policy_keys(cls, v: dict) -> dict:
        from agent.policy import PRIORITIES
        from agent.tools import PUBLIC_TOOLS

        for key in v:
            tool, _, prio = key.partition(":")
            monitor_key = prio == "monitor" and tool in ("stop_instance", "reboot_instance", "destroy_instance")
            if tool not in PUBLIC_TOOLS or (prio and not monitor_key and (tool != "launch_instance" or prio not in PRIORITIES)):
                raise ValueError(f"unknown policy key {key!r}; use a tool name, launch_instance:P0..P3 or TOOL:monitor")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        ids = [f.id for f in self.fleet]
        dup = [i for i, n in Counter(ids).items() if n > 1]
        if dup:
            raise ValueError(f"fleet ids repeat: {', '.join(dup)}")
        if self.planner == "script" and self.steps is None:
            raise ValueError("planner 'script' needs steps")
        if self.planner == "rules" and self.steps is not None:
            raise ValueError("planner 'rules' takes no steps")
        if self.planner == "llm" and self.model_responses is None:
            raise ValueError("planner 'llm' needs model_responses")
        if self.planner != "llm" and self.model_responses is not None:
            raise ValueError("model_responses belong to planner 'llm'")
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


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _strip_validator_loc(loc: tuple) -> tuple:
    # pydantic puts union/function markers in loc (e.g. 'function-after[...]'); keep real keys
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p and "]" in p)))


def load_scenario(path: str | Path) -> tuple[Scenario, dict]:
    """Read and validate ``path``; returns (the model, the raw JSON dict).

    Raises :class:`ScenarioFileError` with one line: ``FILE: KEY.PATH: problem`` (every problem
    found, separated by ``;``).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioFileError(f"{path}: not UTF-8 text (byte {exc.start}); save the file as UTF-8") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioFileError(f"{path}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(raw, dict):
        raise ScenarioFileError(f"{path}: the file must hold one JSON object")
    try:
        sc = Scenario.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = _loc(_strip_validator_loc(err["loc"]))
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            else:
                msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {msg}")
        raise ScenarioFileError(f"{path}: " + "; ".join(problems)) from None
    return sc, raw


# ------------------------------------------------------------------------------------------------
# the world


def setup_world(sc: Scenario, provider) -> None:
    """Write the scenario's starting state into the current database, on the current (virtual) clock.

    Instance rows from ``fleet`` (``created_at``/``status_since`` from ``age_min``/
    ``status_age_min``; ``worker_name`` and ``ssh_host`` = the instance id), healthy Diagnosis
    rows for ``diagnosed_min_ago``, SideEffect (status done) and AuditLog rows for ``history``,
    and the session anchor's objectives and policy overrides. Also an operator user who answers
    approvals.
    """
    from django.contrib.auth.models import Group, User

    from agent.models import AuditLog, SessionState, SideEffect
    from fleet.clock import clock
    from fleet.models import Diagnosis, Instance

    now = clock.now()
    state = SessionState.get()
    state.objectives = dict(sc.objectives)
    if sc.objectives.get("target_proofs_hr") is not None:
        state.target_proofs_hr = float(sc.objectives["target_proofs_hr"])
    overrides = dict(state.overrides or {})
    overrides["policy"] = {**overrides.get("policy", {}), **sc.policy}
    state.overrides = overrides
    state.save()

    by_id = {}
    for f in sc.fleet:
        created = now - timedelta(minutes=f.age_min)
        status_age = f.status_age_min if f.status_age_min is not None else f.age_min
        by_id[f.id] = Instance.objects.create(
            provider=f.provider or provider.name,
            external_id=f.id,
            label=f.id,
            gpu_name=f.gpu_name,
            status=f.actual_status,
            intended_status=f.intended_status,
            status_msg=f.status_msg,
            status_since=now - timedelta(minutes=status_age),
            dph=f.dph,
            ssh_host=f.id if f.ssh is not None else "",
            ssh_port=22 if f.ssh is not None else None,
            worker_name=f.id,
            created_at=created,
            started_at=created,
        )
        if f.diagnosed_min_ago is not None:
            Diagnosis.objects.create(
                instance=by_id[f.id],
                taken_at=now - timedelta(minutes=f.diagnosed_min_ago),
                health="healthy",
                fault_class="",
                cause="on record (scenario)",
                source="ssh",
                evidence={},
            )
    for n, h in enumerate(sc.history):
        at = now - timedelta(minutes=h.min_ago)
        if h.tool == "launch_instance":
            gpu = next((f.gpu_name for f in sc.fleet if f.id == h.instance), "")
            args = {"gpu_name": gpu, "launch_priority": "P1", "reason": "scenario history"}
        else:
            args = {"instance_id": h.instance or "", "reason": "scenario history"}
        SideEffect.objects.create(
            key=f"history:{n}",
            tool=h.tool,
            args=args,
            instance_ref=h.instance or "",
            status="done",
            result="(scenario history)",
            actor="agent",
            claimed_at=at,
            finished_at=at,
        )
        AuditLog.objects.create(
            at=at, actor="agent", verb=h.tool, target=h.instance or "", reason="scenario history", after=args
        )
    user, _ = User.objects.get_or_create(username=OPERATOR_USERNAME)
    group, _ = Group.objects.get_or_create(name="operators")
    user.groups.add(group)


def provider_name(sc: Scenario) -> str:
    """The name the scenario provider registers under: the fleet's one provider name, else ``scenario``.

    Instance rows carry it, so ``get_provider(instance.provider)`` reaches the scenario provider and
    an ``ssh`` fleet is an operator-owned one (``Instance.is_owned_host``).
    """
    names = {f.provider for f in sc.fleet}
    return names.pop() if len(names) == 1 else "scenario"


@contextlib.contextmanager
def isolated(sc: Scenario):
    """The replay's world for the ``with`` block: virtual clock at ``now``, scenario provider and
    demand source, no broadcasts (the ``changed`` signal's receivers are detached), no Celery
    broker, product-default policy (``WARDEN_UNATTENDED`` ignored). Yields the provider."""
    from django.conf import settings

    from fleet import demand as demand_mod
    from fleet import providers as providers_mod
    from fleet.clock import VirtualClock, use_clock
    from fleet.demand.scenario import ScenarioDemandSource
    from fleet.events import changed
    from fleet.providers.scenario import FaultBook, ScenarioProvider

    fleet = [f.model_dump() for f in sc.fleet]
    faults = FaultBook([f.model_dump() for f in sc.provider_faults])
    provider = ScenarioProvider(fleet, [o.model_dump() for o in sc.offers], faults, name=provider_name(sc))
    source = ScenarioDemandSource(sc.demand.model_dump(), fleet)
    saved_receivers = changed.receivers
    saved_unattended = settings.WARDEN.get("UNATTENDED")
    changed.receivers = []
    changed.sender_receivers_cache.clear()
    settings.WARDEN["UNATTENDED"] = False
    providers_mod.set_override(provider)
    demand_mod.set_override(source)
    try:
        with use_clock(VirtualClock(sc.now)):
            yield provider
    finally:
        providers_mod.set_override(None)
        demand_mod.set_override(None)
        settings.WARDEN["UNATTENDED"] = saved_unattended
        changed.receivers = saved_receivers
        changed.sender_receivers_cache.clear()


# ------------------------------------------------------------------------------------------------
# running


def make_planner(sc: Scenario, raw: dict):
    """The planner the file names: ``ScriptPlanner(steps)`` (the file's steps verbatim) or ``RulesPlanner()``."""
    if sc.planner == "script":
        from agent.planners.script import ScriptPlanner

        return ScriptPlanner(raw["steps"])
    if sc.planner == "rules":
        from agent.planners.rules import RulesPlanner

        return RulesPlanner()
    raise ScenarioFileError(f"{sc.name}: planner 'llm' (model_responses) is not supported by replay yet")


def _turn_index(runs) -> dict[tuple[int, int], int]:
    """(run id, turn) of each agent planner turn -> index into the file's ``steps`` (in order)."""
    from agent.models import Step

    turns = (
        Step.objects.filter(run__in=runs, actor="agent", kind__in=["call", "text"], turn__isnull=False)
        .order_by("run__number", "turn")
        .values_list("run_id", "turn")
        .distinct()
    )
    return {key: n for n, key in enumerate(dict.fromkeys(turns))}


def _decision_for(sc: Scenario, approval, turn_index: dict, used: set[int]) -> tuple[str, str]:
    step = approval.step
    idx = turn_index.get((step.run_id, step.turn))
    for n, d in enumerate(sc.operator.decisions):
        if d.step is not None:
            if step.actor != "agent" or idx != d.step or (d.call or 0) != step.position:
                continue
        else:
            if d.tool != approval.tool:
                continue
            if d.args and not _args_agree(d.args, approval.args or step.args):
                continue
        used.add(n)
        return d.decision, d.comment
    return sc.operator.default, ""


def run_scenario(sc: Scenario, raw: dict, *, path: str = "") -> dict:
    """Set up the world, run one cycle, answer approvals, resume; returns the report (with ``ok``).

    Uses the current database (call it on a throwaway one). Raises :class:`ScenarioFileError`
    when an operator decision names a call that was never parked.
    """
    from agent.approvals import do_decide
    from agent.loop import resume_run, run_cycle
    from agent.models import Approval, Run

    with isolated(sc) as provider:
        first = (Run.objects.order_by("-number").values_list("number", flat=True).first() or 0) + 1
        setup_world(sc, provider)
        planner = make_planner(sc, raw)
        run = run_cycle("replay", planner=planner)
        if run is None:
            raise RuntimeError("run_cycle returned None: the run lock is held in a fresh database")
        used: set[int] = set()
        seen: set[int] = set()
        for _ in range(100):
            runs = Run.objects.filter(number__gte=first)
            waiting = list(
                Approval.objects.filter(run__in=runs, status="waiting").select_related("step").order_by("created_at", "id")
            )
            turn_index = _turn_index(runs)
            decided = False
            for a in waiting:
                decision, comment = _decision_for(sc, a, turn_index, used)
                if a.pk in seen or decision == "none":
                    seen.add(a.pk)
                    continue
                seen.add(a.pk)
                do_decide(a, decision, f"user:{OPERATOR_USERNAME}", comment or f"replay operator: {decision}")
                decided = True
            if not decided:
                break
            run.refresh_from_db()
            run = resume_run(run, planner=planner) or run
        unused = [n for n in range(len(sc.operator.decisions)) if n not in used]
        if unused:
            d = sc.operator.decisions[unused[0]]
            named = f"step {d.step}" + (f" call {d.call}" if d.call is not None else "") if d.step is not None else f"tool {d.tool}"
            raise ScenarioFileError(
                f"{path or sc.name}: operator.decisions[{unused[0]}]: names {named}, which was never parked"
            )
        report = build_report(Run.objects.filter(number__gte=first).order_by("number"), name=sc.name)
    report["mismatches"] = match_expect(report, sc.expect) if sc.expect is not None else []
    report["ok"] = not report["mismatches"]
    return report


# ------------------------------------------------------------------------------------------------
# the report


def _final(step, approval) -> tuple[str, str | None]:
    outcome, reason = step.outcome or "", step.reason_code or None
    if approval is not None and outcome in ("", "parked", "approval_required"):
        if approval.status == "void":
            return "refused", reason if reason not in (None, "approval_required") else "void"
        outcome, code = _APPROVAL_OUTCOME.get(approval.status, ("parked", "approval_required"))
        return outcome, code if code else None
    return outcome, reason


def build_report(runs, *, name: str = "") -> dict:
    """The report of ``runs`` (a queryset or list of Run rows, in order) from their rows.

    Shape (SCENARIOS.md "Report"): ``{"name", "ok", "steps": [...], "alerts", "halt", "verdict",
    "final_report", "mismatches"}``. One entry per call with its final outcome (a parked call's
    later dispatch under the same idempotency key is folded into its entry); a parallel batch is
    one entry with ``calls``; text turns are entries with outcome ``text``. Entries carry ``i``,
    ``actor``, ``tool``, ``args``, ``outcome``, ``reason``, ``detail``. Calls that were ever
    parked are also listed (by ``i``/position) under the private key ``_parked``.
    """
    from agent.models import Approval, Step
    from fleet.models import Alert

    runs = list(runs)
    steps = list(Step.objects.filter(run__in=runs, kind__in=["call", "text"]).order_by("run__number", "seq"))
    approvals = {a.step_id: a for a in Approval.objects.filter(run__in=runs)}
    entries: list[dict] = []
    by_key: dict[tuple, dict] = {}  # (run, idempotency key) of a parked call -> its report call
    batches: dict[tuple, dict] = {}
    for s in steps:
        if s.kind == "text":
            entries.append(
                {"i": len(entries), "actor": s.actor or "agent", "tool": None, "args": None, "outcome": "text",
                 "reason": None, "detail": s.detail or "", "text": s.text}
            )
            continue
        approval = approvals.get(s.pk)
        key = (s.run_id, s.idempotency_key)
        if s.idempotency_key and key in by_key and approval is None:
            # the dispatch of a call parked earlier: fold its final outcome into the parked entry
            call = by_key[key]
            outcome, reason = s.outcome, s.reason_code or None
            if outcome == "executed":
                outcome = "approved_executed"
            call.update(outcome=outcome, reason=reason, detail=s.detail or call["detail"])
            continue
        outcome, reason = _final(s, approval)
        call = {
            "i": 0,
            "actor": s.actor or "agent",
            "tool": s.tool or None,
            "args": s.args,
            "outcome": outcome,
            "reason": reason,
            "detail": s.detail or (approval.outcome_detail if approval is not None else "") or "",
            "_parked": approval is not None,
        }
        if approval is not None and s.idempotency_key:
            by_key[key] = call
        if s.batch:
            bkey = (s.run_id, s.turn, s.actor)
            entry = batches.get(bkey)
            if entry is None:
                entry = {"i": len(entries), "actor": s.actor or "agent", "calls": []}
                batches[bkey] = entry
                entries.append(entry)
            call["i"] = len(entry["calls"])
            entry["calls"].append(call)
        else:
            call["i"] = len(entries)
            entries.append(call)
    alerts = list(dict.fromkeys(Alert.objects.order_by("raised_at", "id").values_list("kind", flat=True)))
    last = runs[-1] if runs else None
    verdict = None
    for r in runs:
        if r.verdict_action is not None or r.verdict_state_changed is not None:
            verdict = {"action": r.verdict_action, "state_changed": r.verdict_state_changed}
    halt = None
    for r in runs:
        if r.halt_reason:
            halt = r.halt_reason
    return {
        "name": name,
        "ok": True,
        "steps": entries,
        "alerts": alerts,
        "halt": halt,
        "verdict": verdict,
        "final_report": last.final_report if last is not None else "",
        "mismatches": [],
    }


def public_report(report: dict) -> dict:
    """The report without private keys (``_parked``), as printed by ``--json``."""

    def clean(e: dict) -> dict:
        out = {k: v for k, v in e.items() if not k.startswith("_")}
        if "calls" in out:
            out["calls"] = [clean(c) for c in out["calls"]]
        return out

    return {**report, "steps": [clean(e) for e in report["steps"]]}


def flat_calls(report: dict) -> list[dict]:
    """Every call entry of the report (batch members included), in order."""
    out = []
    for e in report["steps"]:
        if "calls" in e:
            out.extend(e["calls"])
        elif e.get("outcome") != "text":
            out.append(e)
    return out


# ------------------------------------------------------------------------------------------------
# matching expect


def _args_agree(want: dict, have: dict | None) -> bool:
    have = have or {}
    return all(k in have and have[k] == v for k, v in want.items())


def _fits(exp: CallExpect, call: dict) -> bool:
    if exp.tool is not None and call.get("tool") != exp.tool:
        return False
    if exp.reason is not None and call.get("reason") != exp.reason:
        return False
    if exp.actor is not None and call.get("actor") != exp.actor:
        return False
    if exp.args and not _args_agree(exp.args, call.get("args")):
        return False
    return True


def _describe(exp: CallExpect) -> str:
    return json.dumps(exp.model_dump(exclude_none=True), sort_keys=True)


def _brief(call: dict) -> str:
    reason = f" ({call['reason']})" if call.get("reason") else ""
    return f"{call.get('tool')} {json.dumps(call.get('args'), sort_keys=True)} {call.get('outcome')}{reason}"


def _match_list(label: str, wanted: list[CallExpect], actual: list[dict]) -> list[str]:
    """Multiset match: each expectation takes a distinct call; per tool named, counts are exact."""
    problems = []
    if not wanted:
        if actual:
            problems.append(f"{label}: expected none, got {len(actual)}: " + "; ".join(_brief(c) for c in actual))
        return problems
    # maximum bipartite matching (expectations -> calls), small sizes
    owner: dict[int, int] = {}

    def augment(e: int, seen: set[int]) -> bool:
        for c, call in enumerate(actual):
            if c in seen or not _fits(wanted[e], call):
                continue
            seen.add(c)
            if c not in owner or augment(owner[c], seen):
                owner[c] = e
                return True
        return False

    for e in range(len(wanted)):
        augment(e, set())
    matched = set(owner.values())
    for e, exp in enumerate(wanted):
        if e not in matched:
            problems.append(f"{label}: no call matches {_describe(exp)}")
    for tool in dict.fromkeys(w.tool for w in wanted if w.tool is not None):
        want_n = sum(1 for w in wanted if w.tool == tool)
        got = [c for c in actual if c.get("tool") == tool]
        if len(got) != want_n:
            problems.append(
                f"{label}: expected {want_n} {tool}, got {len(got)}" + (": " + "; ".join(_brief(c) for c in got) if got else "")
            )
    return problems


def match_expect(report: dict, expect: ExpectSpec) -> list[str]:
    """The differences between ``report`` and ``expect`` (empty when every expectation holds)."""
    calls = flat_calls(report)
    problems: list[str] = []
    given = expect.model_fields_set
    if expect.executed is not None:
        problems += _match_list("executed", expect.executed, [c for c in calls if c["outcome"] in OUTCOMES_EXECUTED])
    if expect.refused is not None:
        problems += _match_list("refused", expect.refused, [c for c in calls if c["outcome"] in OUTCOMES_REFUSED])
    if expect.parked is not None:
        problems += _match_list("parked", expect.parked, [c for c in calls if c.get("_parked")])
    for tool in expect.never_executed or []:
        bad = [c for c in calls if c.get("tool") == tool and c["outcome"] in OUTCOMES_DISPATCHED]
        if bad:
            problems.append(f"never_executed: {tool} was dispatched: " + "; ".join(_brief(c) for c in bad))
    if "halt" in given and report.get("halt") != expect.halt:
        problems.append(f"halt: expected {expect.halt!r}, got {report.get('halt')!r}")
    for kind in expect.alerts or []:
        if kind not in report.get("alerts", []):
            problems.append(f"alerts: {kind!r} was not raised (raised: {', '.join(report.get('alerts', [])) or 'none'})")
    return problems


# ------------------------------------------------------------------------------------------------
# printing


def format_report(report: dict) -> str:
    """The human-readable report: one line per call (batch members indented), then the summary."""
    lines = [f"scenario {report['name']}"]
    for e in report["steps"]:
        if "calls" in e:
            lines.append(f"  {e['i']:>2} {e['actor']:<7} parallel batch of {len(e['calls'])}")
            for c in e["calls"]:
                lines.append("       " + _line(c))
        elif e.get("outcome") == "text":
            text = (e.get("text") or "").replace("\n", " ")
            lines.append(f"  {e['i']:>2} {e['actor']:<7} text: {text[:100]}")
        else:
            lines.append(f"  {e['i']:>2} " + _line(e))
    lines.append(f"alerts: {', '.join(report['alerts']) or 'none'}")
    lines.append(f"halt: {report['halt'] or 'none'}")
    v = report["verdict"]
    lines.append(f"verdict: {'none' if v is None else json.dumps(v)}")
    if report.get("final_report"):
        lines.append("final report: " + report["final_report"].strip().replace("\n", "\n  "))
    if report["mismatches"]:
        lines.append("MISMATCHES:")
        lines += [f"  - {m}" for m in report["mismatches"]]
    lines.append("OK" if report["ok"] else "FAILED")
    return "\n".join(lines)


def _line(c: dict) -> str:
    args = "null" if c.get("args") is None else json.dumps(c["args"], sort_keys=True)
    reason = f" [{c['reason']}]" if c.get("reason") else ""
    detail = f" — {c['detail']}" if c.get("detail") else ""
    return f"{c['actor']:<7} {c.get('tool')} {args} -> {c['outcome']}{reason}{detail}"
