"""Every limit's name, type, default and range, in one typed schema (:class:`Limits`).

The settings page (``console.forms``, through ``agent.actions.settings.validate_overrides``), replay files'
``objectives`` (``agent.replay.file_format.check_objectives``), the policy merge
(``agent.policy.table.effective_limits``) and the loop all read this class. A limit that is not a field
here is refused where it enters (an operator's override, a file's objective) and when the merged
values are validated; code reading a misspelt limit is caught by ``tests/test_limits_schema.py``,
which holds every ``limits.<name>`` read in the code against these fields.

Five defaults come from the environment (``settings.WARDEN``, read in ``console/settings.py``):
``dwell_min``, ``hold_off_min``, ``max_instances``, ``max_dph``, ``startup_grace_s``; their
range is checked there at start (:func:`env_problem`). ``target_proofs_hr`` is the session's
target (``SessionState.target_proofs_hr``), capped at :data:`MAX_TARGET_PROOFS_HR` everywhere.
"""


from pydantic import BaseModel, ConfigDict, Field, field_validator

#: the largest target proofs/hr an operator or a replay file may set
MAX_TARGET_PROOFS_HR = 1_000_000
#: the lifecycle numbers' cap, minutes
MAX_LIFECYCLE_MIN = 1_000_000

Number = int | float


def _int(default, low, high, *, operator: bool = True):
    return Field(default, json_schema_extra={"kind": "int", "low": low, "high": high, "operator": operator})


def _num(default, low, high, *, operator: bool = True):
    return Field(default, allow_inf_nan=False,
                 json_schema_extra={"kind": "float", "low": low, "high": high, "operator": operator})


class Limits(BaseModel):
    """The effective numbers of one run (defaults < env settings < objectives < operator overrides).

    Minutes end in ``_min``, seconds in ``_s``, hours in ``_h``; ``max_dph`` is $/hr. A field's
    ``kind`` (``int``, ``float``, ``pair``, ``ints``) and its range (``low``, ``high``) are what the
    settings page and replay files accept (:data:`LIMIT_RANGES`, checked where a value enters:
    ``agent.actions.settings.validate_overrides``, ``check_objectives``, :func:`env_problem`);
    ``operator=False`` fields are not on the settings page. Construction raises
    ``pydantic.ValidationError`` for an unknown name, a wrong type or a non-finite number (a
    stored value is not range-checked again: tests and benches may set a shorter wall clock).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # breakers and budgets of one run (docs/contract.md "Reason codes")
    max_steps: int = _int(12, 1, 100)  # planner turns per run
    same_error: int = _int(2, 1, 20)  # halt when the last N errors are the same
    text_only_spiral: int = _int(5, 1, 50)  # consecutive text-only turns
    three_strikes: int = _int(3, 1, 20)  # failures of one tool in a run
    wall_clock_s: Number = _num(300, 10, 86_400)  # run time budget
    token_budget: int = _int(60000, 1000, 10_000_000)  # tokens in + out per run
    tool_timeout_s: Number = _num(30, 1, 3600)  # default per-tool timeout
    retry_attempts: int = _int(3, 1, 10)  # attempts for a transient error (first try included)
    observation_max_chars: int = _int(4000, 200, 200_000)  # longer observations are cut head and tail
    # advisory repeat reminder thresholds: at most 10 ascending whole numbers
    repeat_reminders: list[int] = Field([3, 5, 8], max_length=10, json_schema_extra={"kind": "ints", "low": 1, "high": 100,
                                                                                           "operator": True})
    # the guards and the lifecycle (docs/contract.md)
    diagnosis_fresh_min: Number = _num(15, 1, 1440)  # stop/destroy need a diagnosis this fresh
    # a network-class diagnosis (SSH unreachable) is taken again after this
    network_recheck_min: Number = _num(2, 0, 1440, operator=False)
    approval_expiry_min: Number = _num(30, 1, 10_080)
    provisioning_limit_min: Number = _num(180, 5, 10_080)  # stuck created/loading/scheduling past this is terminal
    offline_grace_min: Number = _num(30, 0, MAX_LIFECYCLE_MIN)  # unknown/offline this long (worker dead) is terminal
    claim_max_age_min: Number = _num(30, 0, MAX_LIFECYCLE_MIN)  # claimed and unfinished this long: a stale claim
    rejection_hold_min: Number = _num(60, 0, MAX_LIFECYCLE_MIN)  # an operator's rejection stands this long
    starve_min: Number = _num(30, 0, MAX_LIFECYCLE_MIN)  # work queued, no live worker: a launch pending this long stops blocking
    destroy_confirm_min: Number = _num(15, 1, 10_080)  # a destroy still listed this long is destroy_unconfirmed
    # at most N launches per S seconds (rate_limited): [launches 1..1000, seconds 1..86400]
    launch_rate: list[int] = Field([6, 600], min_length=2, max_length=2,
                                         json_schema_extra={"kind": "pair", "low": 1, "high": 86_400, "operator": True})
    # a stopped instance still pays for its disk: stopped longer than this, the rules planner
    # proposes destroying it (destroy_instance's policy: approval by default)
    stopped_destroy_h: Number = _num(24, 1, 100_000)
    # the scale-down budget (agent.policy.capacity.retire_budget): at most max(1, floor(pct% of capacity))
    # live or starting instances retired per sliding window; the share is more than 0
    retire_window_min: Number = _num(15, 1, 1440)
    retire_budget_pct: Number = _num(50, 0, 100)
    # from the environment (settings.WARDEN), settable as objectives and on the settings page
    dwell_min: Number = _num(15, 0, 1440)
    hold_off_min: Number = _num(10, 0, 1440)
    max_instances: int = _int(4, 0, 10_000)
    max_dph: Number = _num(10.0, 0, 100_000)
    startup_grace_s: int = _int(60, 0, 3600)
    # the session's target (SessionState.target_proofs_hr; set with agent.actions.session.do_set_target)
    target_proofs_hr: Number = _num(0, 0, MAX_TARGET_PROOFS_HR, operator=False)

    @field_validator("repeat_reminders")
    @classmethod
    def _ascending(cls, v: list[int]) -> list[int]:
        if v != sorted(set(v)):
            raise ValueError("must be at most 10 ascending whole numbers, e.g. [3, 5, 8]")
        return v

    @field_validator("launch_rate")
    @classmethod
    def _rate(cls, v: list[int]) -> list[int]:
        if v[0] < 1 or v[1] < 1:
            raise ValueError("must be [launches, seconds], both at least 1, e.g. [6, 600]")
        return v

    @property
    def values(self) -> dict:
        """Every limit as a plain dict (name → value)."""
        return self.model_dump()


def _extra(name: str) -> dict:
    return Limits.model_fields[name].json_schema_extra or {}


def _bounds(name: str) -> tuple:
    extra = _extra(name)
    return extra["low"], extra["high"]


def default(name: str):
    """The default of limit ``name`` (a copy for the lists). Raises ``KeyError`` for an unknown one."""
    value = Limits.model_fields[name].default
    return list(value) if isinstance(value, list) else value


#: limit name -> its default, for every limit
DEFAULT_LIMITS = {name: default(name) for name in Limits.model_fields}

#: the limits an operator may override: name -> (kind, low, high). ``int``/``float`` are numbers in
#: [low, high]; ``pair`` is ``[launches, seconds]`` (launch_rate); ``ints`` an ascending list of ints
LIMIT_RANGES = {name: (_extra(name)["kind"], *_bounds(name)) for name in Limits.model_fields if _extra(name).get("operator")}

#: the limits whose defaults come from the environment: limit name -> ``settings.WARDEN`` key
FROM_ENV = {"dwell_min": "DWELL_MIN", "hold_off_min": "HOLD_OFF_MIN", "max_instances": "MAX_INSTANCES",
            "max_dph": "MAX_DPH", "startup_grace_s": "STARTUP_GRACE_S"}


def env_problem(warden: dict) -> tuple[str, str] | None:
    """The first environment default out of its limit's range, as ``(WARDEN_NAME, what is allowed)``,
    or ``None``. ``console/settings.py`` stops with one line on it."""
    for name, key in FROM_ENV.items():
        low, high = _bounds(name)
        if not low <= warden[key] <= high:
            return f"WARDEN_{key}", f"must be between {low:g} and {high:,}"
    return None
