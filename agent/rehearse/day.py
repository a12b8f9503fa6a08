"""The day file: a simulated day a rehearsal runs the product's own code over (docs/rehearse.md).

A day file is one JSON object. It is read strictly, like a replay file (``agent.replay.file_format``):
unknown keys, strings or booleans where a number belongs and numbers out of range are refused with
:class:`DayFileError`, one line naming the field (``market.offers[1].dph``) and what to give instead.
Times in the day are hours since ``start`` (``at_h``); an hourly profile's entry ``i`` is the hour
``i`` since ``start`` (a profile shorter than the horizon repeats).

A complete example (every section optional except ``name``; the defaults are those below)::

    {
      "name": "bursty day",
      "about": "nights empty, three bursts of 200 tasks",
      "start": "2026-06-09T00:00:00Z",
      "horizon_h": 24,
      "heartbeat_s": 300,
      "seed": 7,
      "planner": "rules",
      "model": {"base_url": "http://127.0.0.1:8088/v1", "model": "qwen", "api_key_env": "MY_KEY"},
      "market": {
        "offers": [
          {"gpu_name": "RTX 4090", "dph": 0.45, "count": 20, "disk_gb": 100,
           "disk_usd_gb_month": 0.15, "interruptible": false},
          {"gpu_name": "RTX 3090", "dph": 0.22, "count": 10, "interruptible": true}
        ],
        "loading": {"median_s": 300, "p95_s": 1800},
        "failure_per_hr": 0.01,
        "preemption_per_hr": 0.05,
        "stuck_loading_fraction": 0.0,
        "destroy_fails_fraction": 0.0,
        "stop_s": 30,
        "resume_s": 120,
        "price_changes": [{"at_h": 12, "gpu_name": "RTX 4090", "dph": 0.9}],
        "fleet": [{"gpu_name": "RTX 4090", "count": 2, "status": "running"}],
        "worker_deaths": [{"at_h": 10, "count": null}]
      },
      "work": {
        "queued_at_start": 0,
        "arrivals": {
          "hourly": [0, 0, 0, 0, 0, 0, 20, 40, 60, 60, 60, 60, 60, 60, 60, 60, 60, 40, 20, 0, 0, 0, 0, 0],
          "bursts": [{"at_h": 9, "count": 200, "over_min": 10, "type": "PoRep"}],
          "tasks": [{"at_s": 3600, "count": 5, "type": "PoRep"}]
        },
        "task_types": {"PoRep": 1.0},
        "proof_s": {"RTX 4090": {"median_s": 20, "spread": 0.1}, "RTX 3090": {"median_s": 35, "spread": 0.1}},
        "worker_start_s": 60,
        "looks_dead_s": 600,
        "sealing": {"hourly": [0, 0, 0, 0, 0, 0, 10, 10, 10], "due_after_min": 75, "type": "PoRep"}
      },
      "operator": {
        "approval_delay_min": [null, null, null, null, null, null, null, 5, 2, 2, 2, 2,
                               2, 2, 2, 2, 2, 2, 5, 10, 30, null, null, null],
        "away": [{"from_h": 12, "to_h": 16}],
        "reject_fraction": 0.0,
        "target_changes": [{"at_h": 18, "target_proofs_hr": 100}]
      },
      "objectives": {"target_proofs_hr": 540, "max_instances": 5, "max_dph": 1.0},
      "policy": {"launch_instance": "approval"}
    }

Meaning of each field (units in the names: ``_s`` seconds, ``_min`` minutes, ``_h`` hours,
``dph`` dollars per hour, ``_per_hr`` events per hour per instance, ``_fraction`` 0..1):

- ``market.offers``: what can be rented; ``count`` machines of each (a launch uses one up; a
  destroyed machine comes back to the market). ``disk_usd_gb_month`` × ``disk_gb`` is charged for
  every instance that exists (running, loading or stopped), per hour at /730 of the month.
  ``interruptible`` offers can be preempted (``preemption_per_hr``).
- ``market.loading``: a launch's time from rented to running, lognormal with that median and 95th
  percentile (vast.ai's are long-tailed); ``p95_s`` equal to ``median_s`` is a fixed time.
- ``market.failure_per_hr``: a running instance's chance per hour that it exits (its worker dies
  with it); ``stuck_loading_fraction``: launches that never leave ``loading``;
  ``destroy_fails_fraction``: destroys the provider accepts that do not take (the instance stays
  listed); ``stop_s`` / ``resume_s``: how long a stop or a resume takes to show.
- ``market.fleet``: instances rented before the day starts (``running`` with a live worker, or
  ``stopped``); ``market.worker_deaths``: at ``at_h``, ``count`` live workers (null: every one) die
  while their machines keep running (the seed-002 day).
- ``work.arrivals``: proving tasks queued by the hour (``hourly``: tasks in that hour, spread
  evenly), in ``bursts`` (``count`` tasks over ``over_min`` minutes from ``at_h``) or one by one
  (``tasks``). ``task_types`` maps a task type to its proof-time factor. ``proof_s``: seconds per
  proof per GPU model, lognormal with sigma ``spread``. ``worker_start_s``: from ``running`` to the
  worker's first heartbeat. ``looks_dead_s``: Curio requeues a dead owner's task after this.
- ``work.sealing``: SDR sectors finished per hour whose PoRep becomes due ``due_after_min`` later
  (their seed epoch); until due they are the pipeline's not-due backlog, never queue rows.
- ``operator.approval_delay_min``: minutes an approval waits by hour of the day (24 entries, hour
  of ``start``'s clock; null: nobody answers in that hour, the approval waits or expires);
  ``away`` windows answer nothing; ``reject_fraction`` of decisions are rejections;
  ``target_changes`` set the target as an operator would.
- ``objectives`` and ``policy``: as in a replay file (docs/replay.md): targets, caps, every limit,
  and the policy table's overrides under test.
- ``planner``: ``rules`` (default) or ``llm`` against ``model.base_url`` (an OpenAI-compatible
  server; ``api_key_env`` names the environment variable holding its key — the key itself never
  enters the file).

Source: docs/rehearse.md; the market numbers follow vast.ai's behaviour (long-tailed loading,
interruptible offers, destroys that need confirming), the work rules Curio's (docs/curio.md).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.replay.file_format import Scenario, ScenarioFileError, aware_datetime, check_objectives, read_json

#: the longest day a file may ask for, hours (a week)
MAX_HORIZON_H = 168
#: the most machines, tasks, entries in any one list
MAX_COUNT = 100_000
MAX_LIST = 10_000
MAX_PROBLEMS = 3

Hours = Annotated[float, Field(ge=0, le=MAX_HORIZON_H, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, le=MAX_HORIZON_H * 3600, allow_inf_nan=False)]
PosSeconds = Annotated[float, Field(gt=0, le=MAX_HORIZON_H * 3600, allow_inf_nan=False)]
Minutes = Annotated[float, Field(ge=0, le=MAX_HORIZON_H * 60, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Rate = Annotated[float, Field(ge=0, le=60, allow_inf_nan=False)]
Money = Annotated[float, Field(ge=0, le=1e4, allow_inf_nan=False)]
GpuName = Annotated[str, Field(min_length=1, max_length=64)]
TaskType = Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[A-Za-z][A-Za-z0-9_]{0,31}$")]
Profile = Annotated[list[Annotated[float, Field(ge=0, le=MAX_COUNT, allow_inf_nan=False)]], Field(max_length=MAX_HORIZON_H)]


class DayFileError(Exception):
    """The day file is invalid; ``str(exc)`` is one line naming the file, the field and what to give."""


class _Strict(BaseModel):
    # strict: "0.45" and true are not numbers; unknown keys are errors
    model_config = ConfigDict(extra="forbid", strict=True)


class OfferSpec(_Strict):
    """One kind of machine on the market: ``count`` of them at ``dph`` $/hr plus disk."""

    gpu_name: GpuName
    dph: Money
    count: Count = 10
    disk_gb: Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)] = 50.0
    disk_usd_gb_month: Money = 0.10
    interruptible: bool = False


class LoadingSpec(_Strict):
    """A launch's loading time: lognormal by its median and 95th percentile, seconds."""

    median_s: PosSeconds = 300.0
    p95_s: PosSeconds = 900.0

    @model_validator(mode="after")
    def _ordered(self):
        if self.p95_s < self.median_s:
            raise ValueError(f"p95_s ({self.p95_s:g}) is below median_s ({self.median_s:g}); the 95th percentile is at least the median")
        return self


class PriceChange(_Strict):
    """From ``at_h`` on, offers of ``gpu_name`` cost ``dph`` (instances rented earlier keep their price)."""

    at_h: Hours
    gpu_name: GpuName
    dph: Money


class StartInstance(_Strict):
    """``count`` instances of ``gpu_name`` rented before the day starts (``dph``: the offer's when null)."""

    gpu_name: GpuName
    count: Annotated[int, Field(ge=1, le=MAX_COUNT)] = 1
    dph: Money | None = None
    status: Literal["running", "stopped"] = "running"


class WorkerDeath(_Strict):
    """At ``at_h``, ``count`` live workers die (null: all of them); their machines keep running."""

    at_h: Hours
    count: Count | None = None


class MarketSpec(_Strict):
    """The market: offers, loading times, faults, price changes, the fleet at the start."""

    offers: list[OfferSpec] = Field(default_factory=list, max_length=MAX_LIST)
    loading: LoadingSpec = Field(default_factory=LoadingSpec)
    failure_per_hr: Rate = 0.0
    preemption_per_hr: Rate = 0.0
    stuck_loading_fraction: Fraction = 0.0
    destroy_fails_fraction: Fraction = 0.0
    stop_s: Seconds = 30.0
    resume_s: Seconds = 120.0
    price_changes: list[PriceChange] = Field(default_factory=list, max_length=MAX_LIST)
    fleet: list[StartInstance] = Field(default_factory=list, max_length=MAX_LIST)
    worker_deaths: list[WorkerDeath] = Field(default_factory=list, max_length=MAX_LIST)


class Burst(_Strict):
    """``count`` tasks of ``type`` arriving evenly over ``over_min`` minutes from ``at_h``."""

    at_h: Hours
    count: Count
    over_min: Minutes = 0.0
    type: TaskType = "PoRep"


class TaskArrival(_Strict):
    """``count`` tasks of ``type`` arriving at ``at_s`` seconds after the start."""

    at_s: Seconds
    count: Annotated[int, Field(ge=1, le=MAX_COUNT)] = 1
    type: TaskType = "PoRep"


class Arrivals(_Strict):
    """When proving tasks arrive: an ``hourly`` profile (tasks per hour), ``bursts`` and ``tasks``."""

    hourly: Profile = Field(default_factory=list)
    hourly_type: TaskType = "PoRep"
    bursts: list[Burst] = Field(default_factory=list, max_length=MAX_LIST)
    tasks: list[TaskArrival] = Field(default_factory=list, max_length=MAX_LIST)


class ProofTime(_Strict):
    """Seconds per proof on one GPU model: lognormal, median ``median_s``, sigma ``spread``."""

    median_s: Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)]
    spread: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = 0.0


class Sealing(_Strict):
    """SDR sectors finished per hour (``hourly``); each one's PoRep is due ``due_after_min`` later."""

    hourly: Profile = Field(default_factory=list)
    due_after_min: Minutes = 75.0
    type: TaskType = "PoRep"


class WorkSpec(_Strict):
    """The work: arrivals, task types, proof times, Curio's rules (live window, requeue)."""

    queued_at_start: Count = 0
    arrivals: Arrivals = Field(default_factory=Arrivals)
    task_types: dict[TaskType, Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)]] = Field(
        default_factory=lambda: {"PoRep": 1.0})
    proof_s: dict[GpuName, ProofTime] = Field(default_factory=dict)
    worker_start_s: Seconds = 60.0
    looks_dead_s: Annotated[float, Field(ge=1, le=86_400, allow_inf_nan=False)] = 600.0
    sealing: Sealing | None = None


class AwayWindow(_Strict):
    """From ``from_h`` to ``to_h`` (hours since the start) the operator answers nothing."""

    from_h: Hours
    to_h: Hours

    @model_validator(mode="after")
    def _ordered(self):
        if self.to_h < self.from_h:
            raise ValueError(f"to_h ({self.to_h:g}) comes before from_h ({self.from_h:g}); give the window in order")
        return self


class TargetChange(_Strict):
    """At ``at_h`` the operator sets the target to ``target_proofs_hr``."""

    at_h: Hours
    target_proofs_hr: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]


class OperatorSpec(_Strict):
    """How the operator answers: delay by hour of day (null: absent), away windows, rejections."""

    approval_delay_min: Annotated[list[Minutes | None], Field(min_length=24, max_length=24)] = Field(
        default_factory=lambda: [2.0] * 24)
    away: list[AwayWindow] = Field(default_factory=list, max_length=MAX_LIST)
    reject_fraction: Fraction = 0.0
    target_changes: list[TargetChange] = Field(default_factory=list, max_length=MAX_LIST)


class ModelSpec(_Strict):
    """The ``llm`` planner's server: an OpenAI-compatible ``base_url`` and ``model``; the key by reference."""

    base_url: Annotated[str, Field(min_length=1, max_length=500, pattern=r"^https?://")]
    model: Annotated[str, Field(min_length=1, max_length=200)]
    api_key_env: Annotated[str, Field(max_length=100, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = ""
    timeout_s: Annotated[float, Field(gt=0, le=600, allow_inf_nan=False)] = 60.0


class Day(_Strict):
    """A day file (the module docstring and docs/rehearse.md)."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    about: Annotated[str, Field(max_length=2000)] = ""
    start: datetime = Field(default=datetime.fromisoformat("2026-06-09T00:00:00+00:00"), strict=False)
    horizon_h: Annotated[float, Field(gt=0, le=MAX_HORIZON_H, allow_inf_nan=False)] = 24.0
    heartbeat_s: Annotated[float, Field(ge=10, le=3600, allow_inf_nan=False)] = 300.0
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    planner: Literal["rules", "llm"] = "rules"
    model: ModelSpec | None = None
    market: MarketSpec = Field(default_factory=MarketSpec)
    work: WorkSpec = Field(default_factory=WorkSpec)
    operator: OperatorSpec = Field(default_factory=OperatorSpec)
    objectives: dict[str, Any] = Field(default_factory=dict)
    policy: dict[str, Literal["auto", "approval", "forbidden"]] = Field(default_factory=dict)

    @field_validator("start", mode="before")
    @classmethod
    def _start_text(cls, v):
        if not isinstance(v, str):
            raise ValueError("must be an ISO 8601 date-time string such as 2026-06-09T00:00:00Z")
        return v

    @field_validator("start")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        return aware_datetime(v)

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, v: dict) -> dict:
        return check_objectives(v)

    @field_validator("policy")
    @classmethod
    def _policy_keys(cls, v: dict) -> dict:
        return Scenario._policy_keys(v)

    @model_validator(mode="after")
    def _consistent(self):
        gpus = {o.gpu_name for o in self.market.offers}
        for n, f in enumerate(self.market.fleet):
            if f.dph is None and f.gpu_name not in gpus:
                raise ValueError(f"market.fleet[{n}]: {f.gpu_name!r} has no offer to take its price from; give dph or add the offer")
        for gpu in gpus | {f.gpu_name for f in self.market.fleet}:
            if gpu not in self.work.proof_s:
                raise ValueError(f"work.proof_s: no proof time for {gpu!r}; add \"{gpu}\": {{\"median_s\": N}}")
        types = set(self.work.task_types)
        used = {self.work.arrivals.hourly_type, *(b.type for b in self.work.arrivals.bursts),
                *(t.type for t in self.work.arrivals.tasks)}
        if self.work.sealing is not None:
            used.add(self.work.sealing.type)
        for t in sorted(used - types):
            raise ValueError(f"task type {t!r} is not in work.task_types; add it with its proof-time factor (1.0 = as proof_s)")
        if self.planner == "llm" and self.model is None:
            raise ValueError("planner 'llm' needs model (base_url and model of an OpenAI-compatible server)")
        return self


def _where(err: dict) -> str:
    out = ""
    for part in err["loc"]:
        if isinstance(part, str) and "[" in part and "]" in part:
            continue  # pydantic's validator markers are not keys
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)[:60]
    return out


def _message(err: dict) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key; see docs/rehearse.md for the day file's keys"
    if err["type"] == "too_long" and (err.get("ctx") or {}).get("max_length") is not None:
        return f"more than {err['ctx']['max_length']} entries"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] in ("float_type", "int_type", "bool_type", "string_type") and isinstance(err.get("input"), str | bool):
        msg += f" (got {str(repr(err['input']))[:40]}; strings and booleans are not converted)"
    return msg[:300]


def parse_day(raw: Any, where: str = "day") -> Day:
    """Validate ``raw`` (the file's JSON) as a :class:`Day`; raises :class:`DayFileError`:
    ``WHERE: KEY.PATH: problem`` (the first few problems, ``;``-separated), one line."""
    if not isinstance(raw, dict):
        raise DayFileError(f"{where}: a day file holds one JSON object")
    try:
        return Day.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        problems = [f"{_where(e)}: {_message(e)}" if _where(e) else _message(e) for e in errors[:MAX_PROBLEMS]]
        more = f"; and {len(errors) - MAX_PROBLEMS} more" if len(errors) > MAX_PROBLEMS else ""
        raise DayFileError(f"{where}: " + "; ".join(problems).replace("\n", " ") + more) from None


def load_day(path: str | Path) -> tuple[Day, dict]:
    """Read and validate the day file at ``path``; returns (the model, the raw JSON dict).

    Read under replay's limits (a regular UTF-8 file, JSON only, no repeated keys, no NaN;
    ``agent.replay.file_format.read_json``). Raises :class:`DayFileError` (one line).
    """
    try:
        raw = read_json(path)
    except ScenarioFileError as exc:
        raise DayFileError(str(exc).replace("a scenario file", "a day file")) from None
    return parse_day(raw, str(path)), raw


#: a day's keys that say how the fleet is run rather than what happens to it: what an A/B pair
#: varies (``manage.py rehearse --compare`` brings these from the other file; the rest is the day)
POLICY_KEYS = ("objectives", "policy", "planner", "model", "heartbeat_s")


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}"))
        return out
    return {prefix: value}


def policy_differences(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    """What two day dicts set differently among :data:`POLICY_KEYS`, as ``[(dotted key, value in
    a, value in b)]`` sorted by key (``None`` where a side leaves the key out, so the day's or the
    product's default applies). ``[]`` when both are run the same way."""
    la: dict[str, Any] = {}
    lb: dict[str, Any] = {}
    for key in POLICY_KEYS:
        if key in a:
            la.update(_leaves(a[key], key))
        if key in b:
            lb.update(_leaves(b[key], key))
    return [(k, la.get(k), lb.get(k)) for k in sorted(la.keys() | lb.keys()) if la.get(k) != lb.get(k)]
