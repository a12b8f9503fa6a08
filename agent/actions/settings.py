"""The settings page's writes: policy and limits overrides, validated against the one limits
schema (``agent.policy.limits.Limits``) before they are stored.

Each ``do_*`` writes its audit row and announces change topics after commit (``agent.actions``).
"""


from django.db import transaction

from agent.models import SessionState
from agent.policy.limits import LIMIT_RANGES
from agent.policy.table import DEFAULT_POLICY, PRIORITIES, effective_limits, effective_policy
from fleet.audit import do_audit
from fleet.events import emit
from fleet.numbers import NumberError, parse_number, parse_number_list

POLICY_VALUES = ("auto", "approval", "forbidden")


class OverrideError(ValueError):
    """A settings value is not acceptable; ``field`` names it (``policy.stop_instance``,
    ``limits.max_dph``) and the message says what is allowed. Nothing was saved."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def policy_keys() -> list[str]:
    """Every policy key an operator may set: the tools' defaults plus ``launch_instance:P0`` … ``:P3``."""
    keys = list(DEFAULT_POLICY)
    keys += [f"launch_instance:{p}" for p in PRIORITIES if f"launch_instance:{p}" not in DEFAULT_POLICY]
    keys += [f"{t}:monitor" for t in ("stop_instance", "reboot_instance", "destroy_instance") if f"{t}:monitor" not in keys]
    return keys


def _number(field: str, value, kind: str, low, high):
    """One limit read by the operator-number rule (``fleet.numbers.parse_number``: plain ASCII
    decimals only); :class:`OverrideError` naming ``field`` otherwise."""
    try:
        return parse_number(value, field, low=low, high=high, whole=kind == "int")
    except NumberError as exc:
        raise OverrideError(field, exc.message) from None


def _clean_limit(key: str, value):
    field = f"limits.{key}"
    kind, low, high = LIMIT_RANGES[key]
    if kind in ("int", "float"):
        num = _number(field, value, kind, low, high)
        if key == "retire_budget_pct" and num <= 0:
            raise OverrideError(field, "must be more than 0 and at most 100 (a share of capacity, in percent)")
        return num
    try:
        if kind == "pair":
            launches, seconds = parse_number_list(value, field, low=1, high=high, length=2)
            if launches > 1000:
                raise OverrideError(field, f"the launches must be between 1 and 1,000 (got {launches})")
            if seconds < low:
                raise OverrideError(field, f"the seconds must be between {low:g} and {high:,} (got {seconds})")
            return [launches, seconds]
        items = parse_number_list(value, field, low=low, high=high)
    except NumberError as exc:
        message = exc.message.replace("must be 2 numbers", "must be [launches, seconds], e.g. [6, 600]; 2 numbers")
        raise OverrideError(field, message) from None
    if items != sorted(set(items)):
        raise OverrideError(field, "must be at most 10 ascending whole numbers, e.g. [3, 5, 8]")
    return items


def validate_overrides(policy: dict | None, limits: dict | None) -> tuple[dict, dict]:
    """Check operator overrides; returns them cleaned (numbers typed). ``None`` values mean "back
    to the default". Raises :class:`OverrideError` naming the first bad field."""
    policy, limits = policy or {}, limits or {}
    if not isinstance(policy, dict):
        raise OverrideError("policy", "must be a mapping of tool to auto/approval/forbidden")
    if not isinstance(limits, dict):
        raise OverrideError("limits", "must be a mapping of limit name to number")
    known = policy_keys()
    clean_policy = {}
    for key, value in policy.items():
        if key not in known:
            raise OverrideError(f"policy.{key}", f"unknown policy key; known: {', '.join(known)}")
        if value is not None and value not in POLICY_VALUES:
            raise OverrideError(f"policy.{key}", f"must be one of {', '.join(POLICY_VALUES)} (got {value!r})")
        clean_policy[key] = value
    clean_limits = {}
    for key, value in limits.items():
        if key not in LIMIT_RANGES:
            raise OverrideError(f"limits.{key}", f"unknown limit; known: {', '.join(LIMIT_RANGES)}")
        clean_limits[key] = None if value is None else _clean_limit(key, value)
    return clean_policy, clean_limits


def baseline_settings(state: SessionState | None = None) -> tuple[dict, dict]:
    """The policy table and limits with no operator override (defaults < env < objectives)."""
    state = state or SessionState.get()
    bare = SessionState(target_proofs_hr=state.target_proofs_hr, objectives=state.objectives, overrides={})
    return effective_policy(bare), effective_limits(bare).values


@transaction.atomic
def do_update_overrides(policy: dict, limits: dict, actor: str, reason: str = "") -> SessionState:
    """Change the operator's policy and limit overrides (the settings page); audited with who and why.

    ``policy`` maps policy keys (:func:`policy_keys`) to ``auto``/``approval``/``forbidden``;
    ``limits`` maps :data:`LIMIT_RANGES` keys to numbers in their range. Keys not given keep
    their current value; ``None``, or a value equal to the default, removes the override.
    Everything is validated before anything is saved: bad input raises :class:`OverrideError`
    (a ValueError naming the field) and changes nothing. Announces ``settings-changed``.
    """
    clean_policy, clean_limits = validate_overrides(policy, limits)
    state = SessionState.objects.select_for_update().get(pk=SessionState.get().pk)
    base_policy, base_limits = baseline_settings(state)
    overrides = dict(state.overrides or {})
    before = {"policy": dict(overrides.get("policy", {})), "limits": dict(overrides.get("limits", {}))}
    new_policy, new_limits = dict(before["policy"]), dict(before["limits"])
    for key, value in clean_policy.items():
        # a per-priority launch key absent from the defaults follows ``launch_instance`` unless set
        if value is None or (key in base_policy and value == base_policy[key]):
            new_policy.pop(key, None)
        else:
            new_policy[key] = value
    for key, value in clean_limits.items():
        if value is None or value == base_limits.get(key):
            new_limits.pop(key, None)
        else:
            new_limits[key] = value
    after = {"policy": new_policy, "limits": new_limits}
    if after == before:
        return state
    overrides.update(after)
    state.overrides = overrides
    state.save(update_fields=["overrides", "updated_at"])
    changed = {
        f"{part}.{k}": {"from": before[part].get(k), "to": after[part].get(k)}
        for part in ("policy", "limits")
        for k in sorted(set(before[part]) | set(after[part]))
        if before[part].get(k) != after[part].get(k)
    }
    do_audit(actor, "update_overrides", "settings", reason, before, {**after, "changed": changed})
    emit("settings-changed")
    return state
