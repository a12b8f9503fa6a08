"""Every change of agent or fleet state an operator, the agent or the monitor makes: one ``do_*`` each.

Each action writes its :class:`~agent.models.AuditLog` row and announces change topics after
commit (``fleet.events.emit``), so the UI, CLI, Celery tasks and the agent's tool layer all log
and push the same way (Zulip's ``zerver/actions`` pattern: one door for writes).
"""

import hashlib

from celery import current_app
from django.db import DatabaseError, transaction

from agent.models import Run, SessionState, Step
from agent.policy.limits import LIMIT_RANGES, MAX_TARGET_PROOFS_HR
from fleet.audit import do_audit
from fleet.clock import clock
from fleet.events import emit, trigger
from fleet.models import AuditLog
from fleet.numbers import NumberError, parse_number, parse_number_list
from fleet.secrets import redact, redact_obj


class EffectNotRecorded(Exception):
    """The effect happened, recording its outcome failed (a database error after the provider
    acted). The message says what happened; the intent audit row and the open claim stand, and
    the next cycle settles the claim against the provider (``agent.policy.claims``). Never shown as a
    failure: an error page must not hide an effect (docs/safety.md, Side effects). ``applied`` is False when
    the intent was recorded but applying it failed (Warden re-applies it next cycle)."""

    def __init__(self, message: str, *, applied: bool = True):
        super().__init__(message)
        self.applied = applied


@transaction.atomic
def do_set_target(target: float, actor: str, reason: str = "") -> SessionState:
    """Set the target proofs/hr on the session anchor. Raises ValueError for a non-number, a
    negative (``-0.0`` too), a non-finite, an above-MAX_TARGET_PROOFS_HR (10^6) or a vanishing (between 0 and 0.01)
    target. Text from operators is parsed first by ``console.forms.parse_target``."""
    if isinstance(target, bool) or not isinstance(target, (int, float)):
        raise ValueError("target proofs/hr must be a number, e.g. 120")
    try:  # the operator-number rule: -0.0, 1e-320, inf are refused as their typed forms are
        target = float(parse_number(target, "target proofs/hr", low=0, high=MAX_TARGET_PROOFS_HR, example="120"))
    except NumberError as exc:
        raise ValueError(str(exc)) from None
    if 0 < target < 0.01:
        raise ValueError("target proofs/hr must be 0 or at least 0.01, e.g. 120")
    state = SessionState.get()
    before = state.target_proofs_hr
    state.target_proofs_hr = target
    state.save(update_fields=["target_proofs_hr", "updated_at"])
    do_audit(actor, "set_target", "session", reason, {"target_proofs_hr": before}, {"target_proofs_hr": target})
    emit("demand-changed", "settings-changed")
    if target != before:
        trigger("target", f"target {before:g} → {target:g} proofs/hr by {actor}")
    return state


@transaction.atomic
def do_post_message(text: str, actor: str) -> Step:
    """Record an operator's chat message as a ``message`` step of a holding run for chat.

    The message is stored (redacted) on a run of trigger ``chat`` created for it; the cycle the
    view then starts picks it up as the operator's instruction. Raises ValueError when empty.
    """
    text = (text or "").strip()
    if not text:
        raise ValueError("the message is empty; type what the agent should do")
    if len(text) > 4000:
        raise ValueError("the message is longer than 4,000 characters; shorten it")
    state = SessionState.objects.select_for_update().get(pk=SessionState.get().pk)
    run = Run.objects.create(
        number=state.next_run_id,
        epoch=state.epoch,
        trigger="chat",
        planner="",
        status="queued",
        started_at=clock.now(),
    )
    state.next_run_id += 1
    state.save(update_fields=["next_run_id", "updated_at"])
    step = Step.objects.create(
        run=run, seq=0, kind="message", actor=actor, text=redact(text), created_at=clock.now()
    )
    do_audit(actor, "chat_message", f"run {run.number}", "", None, {"text": redact(text)[:500]})
    emit("chat-changed", "runs-changed")
    return step


@transaction.atomic
def do_queue_cycle(actor: str, trigger: str = "operator") -> Run:
    """An observe cycle someone asked for, as a ``queued`` run with its audit row (one
    transaction, before anything is enqueued). The next cycle to start runs it — the Celery task
    enqueued for it, or any later heartbeat — so a cycle the console calls "queued" does run."""
    state = SessionState.objects.select_for_update().get(pk=SessionState.get().pk)
    run = Run.objects.create(number=state.next_run_id, epoch=state.epoch, trigger=trigger, planner="", status="queued",
                             started_at=clock.now())
    state.next_run_id += 1
    state.save(update_fields=["next_run_id", "updated_at"])
    do_audit(actor, "observe_now", "agent", "operator pressed Trigger observe cycle now", None, {"run": run.number})
    emit("runs-changed")
    return run


def _inst_state(inst) -> dict:
    return {"status": inst.status, "intended_status": inst.intended_status, "killed": inst.killed_at is not None}


def do_launch_instance(*, gpu_name: str = "", offer_id: str = "", actor: str, reason: str = "", label: str = "warden"):
    """Launch one instance through the configured provider and record it.

    ``label`` tags the instance at the provider (the pipeline passes one derived from the call's
    idempotency key, so a launch whose answer is lost can be found: ``agent.policy.claims``). Returns the new :class:`fleet.models.Instance`. Raises ``ProviderError`` when the provider
    refuses or fails (nothing is recorded then).
    """
    from fleet.providers import get_provider

    provider = get_provider()
    pi = provider.launch(gpu_name=gpu_name, offer_id=offer_id, label=label or "warden")
    try:
        return _record_launch(provider, pi, gpu_name=gpu_name, actor=actor, reason=reason, label=label)
    except DatabaseError as exc:
        raise EffectNotRecorded(f"launched {pi.external_id} at the provider; recording it failed ({type(exc).__name__}: "
                                f"{str(exc)[:160]}); the next cycle adopts it by its label") from exc


def _record_launch(provider, pi, *, gpu_name: str, actor: str, reason: str, label: str):
    from fleet.models import Instance

    now = clock.now()
    # a sync between the launch and this save may already have adopted the row
    inst, _ = Instance.objects.update_or_create(
        provider=pi.extra.get("provider") or provider.name,  # owned hosts launched beside a rented provider
        external_id=pi.external_id,
        defaults=dict(
            label=(pi.label or label or "")[:100],
            gpu_name=pi.gpu_name or gpu_name,
            status=pi.status,
            intended_status="running",
            status_msg=pi.status_msg,
            status_since=now,
            dph=pi.dph,
            ssh_host=pi.ssh_host,
            ssh_port=pi.ssh_port,
            pid=pi.pid,
            log_path=pi.log_path,
            worker_name=pi.worker_name or pi.external_id,
            created_at=now,
            started_at=pi.started_at or now,
            machine_id=str((pi.extra or {}).get("machine_id") or "")[:64],
            adopted_at=None,  # ours: a sync that ran between the launch and this save adopted it
        ),
    )
    do_audit(actor, "launch_instance", inst.external_id, reason, None, _inst_state(inst))
    emit("fleet-changed")
    return inst


def do_instance_action(inst, action: str, *, actor: str, reason: str = "") -> None:
    """Stop, resume, reboot or destroy ``inst`` through its provider; audit and announce.

    ``action``: stop | resume | reboot | destroy. A destroy counts only once a re-list confirms
    the instance is gone (an autoscaler counts a deletion only once the provider no longer lists it): then it is marked killed; until then
    ``destroy_requested_at`` is set and the monitor keeps checking. Raises ``ProviderError``.
    """
    from fleet.providers import get_provider

    provider = get_provider(inst.provider)
    before = _inst_state(inst)
    now = clock.now()
    getattr(provider, action)(inst.external_id)
    try:
        _record_instance_action(provider, inst, action, actor=actor, reason=reason, before=before, now=now)
    except DatabaseError as exc:
        raise EffectNotRecorded(f"{action} of {inst.external_id} was sent to the provider; recording its outcome failed "
                                f"({type(exc).__name__}: {str(exc)[:160]}); Warden re-reads the fleet next cycle") from exc


def _record_instance_action(provider, inst, action: str, *, actor: str, reason: str, before: dict, now) -> None:
    fields = ["status", "intended_status", "status_since", "pid", "exit_code"]
    if action == "stop":
        inst.intended_status, inst.status = "stopped", "stopped"
    elif action == "resume":
        inst.intended_status = "running"
    elif action == "reboot":
        inst.status = "rebooting"
    elif action == "destroy":
        inst.intended_status = "destroyed"
        inst.destroy_requested_at = now
        fields.append("destroy_requested_at")
    # a re-list says what the action did (and confirms a destroy: gone only once it is no longer listed)
    try:
        listed = {pi.external_id: pi for pi in provider.list_instances()}
    except Exception:  # noqa: BLE001 — unconfirmed; the next sync and the monitor re-check
        listed = None
    if listed is not None and action != "destroy" and inst.external_id in listed:
        seen = listed[inst.external_id]
        inst.status, inst.pid, inst.exit_code = seen.status, seen.pid, seen.exit_code
    if action == "destroy":
        confirmed = listed is not None and inst.external_id not in listed
        if confirmed:
            inst.killed_at, inst.killed_by, inst.kill_reason = now, actor, reason or "destroyed"
            inst.status = "destroyed"
            fields += ["killed_at", "killed_by", "kill_reason"]
    inst.status_since = now
    inst.save(update_fields=fields)
    if action in ("reboot", "resume") and inst.cordoned:
        from fleet.cordon import reapply

        reapply([inst])  # the worker re-registered schedulable: Warden's cordon stands
    do_audit(actor, f"{action}_instance", inst.external_id, reason, before, _inst_state(inst))
    emit("fleet-changed")


@transaction.atomic
def do_reset_session(actor: str, reason: str = "") -> SessionState:
    """Clear the conversation: a new epoch, so earlier runs and chat leave the model's context and
    the chat (they stay on the Runs pages), and the short-term buffer is flushed (important
    messages promoted to long-term memory, ``agent.memory.store.flush_buffer``).

    The anchor keeps the run-id sequence, the objectives, the target, the overrides and the fleet
    snapshot; long-term memory stays (run ids must not restart after a reset: docs/agent.md). The
    console asks first, server-side (``console.views.settings.reset_session``: a confirmation step
    that says what is kept and cleared, and works without JavaScript).
    """
    from agent.memory.store import flush_buffer

    state = SessionState.objects.select_for_update().get(pk=SessionState.get().pk)
    before = state.epoch
    state.epoch += 1
    state.save(update_fields=["epoch", "updated_at"])
    promoted = flush_buffer()
    do_audit(actor, "reset_session", "session", reason, {"epoch": before},
             {"epoch": state.epoch, "next_run_id": state.next_run_id, "promoted_memories": len(promoted)})
    emit("runs-changed", "chat-changed")
    return state


@transaction.atomic
def do_set_observe_only(on: bool, actor: str, reason: str = "") -> SessionState:
    """Switch observe-only mode: the agent observes and proposes; no side effect executes."""
    state = SessionState.objects.select_for_update().get(pk=SessionState.get().pk)
    before = state.observe_only
    state.observe_only = bool(on)
    state.save(update_fields=["observe_only", "updated_at"])
    do_audit(actor, "set_observe_only", "session", reason, {"observe_only": before}, {"observe_only": state.observe_only})
    emit("settings-changed", "runs-changed")
    return state


OPERATOR_ACTIONS = {"stop", "destroy", "reboot", "resume"}
OVERRIDABLE = {"demand_guard", "hold_off"}


class ActionRefused(Exception):
    """An operator action was refused by a guard: ``code`` (a reason code of docs/contract.md), ``detail``.

    ``status`` is the HTTP status the API answers with (428 for ``diagnosis_required``).
    """

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail
        self.status = 428 if code == "diagnosis_required" else 409


def do_operator_instance_action(inst, action: str, *, actor: str, reason: str, override_reason: str = "",
                                request_key: str = "") -> None:
    """An operator's stop/destroy/reboot/resume from the fleet page, through the same guards.

    ``override_reason`` (typed by the operator) lets the action pass ``demand_guard`` and
    ``hold_off`` only; the override is audited. ``request_key`` (a form token) makes a replayed
    POST a ``duplicate``. Raises :class:`ActionRefused`, ``ValueError`` for bad input, or
    ``ProviderError`` when the provider fails.
    """
    from agent.policy.claims import ClaimRefused, close_claim, open_claim
    from agent.policy.guards import check
    from agent.policy.table import effective_limits, effective_policy
    from agent.runtime.observe import observe

    if action not in OPERATOR_ACTIONS:
        raise ValueError(f"unknown action {action!r}; use one of {', '.join(sorted(OPERATOR_ACTIONS))}")
    reason = check_text("reason", reason, required=True)
    override_reason = check_text("override reason", override_reason)
    request_key = check_text("request key", request_key, limit=200)
    tool = f"{action}_instance"
    args = {"instance_id": inst.external_id, "reason": reason}
    override = OVERRIDABLE if override_reason else set()
    state = SessionState.get()
    world = observe(effective_limits(state), effective_policy(state))
    key = "op:" + hashlib.sha256(f"{actor}|{tool}|{inst.external_id}|{request_key or clock.now().isoformat()}".encode()).hexdigest()[:36]
    refusal = check(tool, args, key, world, actor=actor, override=override)
    if refusal is not None:
        do_audit(actor, f"{tool}_refused", inst.external_id, reason, None, {"code": refusal.code, "detail": refusal.detail})
        raise ActionRefused(refusal.code, refusal.detail)
    # the claim is the check: one INSERT decides between concurrent requests (in_flight)
    try:
        claim = open_claim(key=key, tool=tool, args=args, instance_ref=inst.external_id, actor="operator",
                           audit_actor=actor, reason=reason)
    except ClaimRefused as exc:
        do_audit(actor, f"{tool}_refused", inst.external_id, reason, None, {"code": exc.code, "detail": exc.detail})
        raise ActionRefused(exc.code, exc.detail) from None
    if override:
        do_audit(actor, "override_guard", inst.external_id, override_reason, None,
                 {"overrides": sorted(override), "tool": tool})
    try:
        do_instance_action(inst, action, actor=actor, reason=reason)
    except EffectNotRecorded:
        try:
            close_claim(claim, "done", f"{action} sent; its outcome was not recorded")
        except DatabaseError:
            pass  # the claim stays open: the next cycle settles it against the provider
        raise
    except Exception as exc:
        from fleet.providers import ProviderError

        if isinstance(exc, ProviderError) and exc.outcome_unknown:
            from agent.policy.claims import resolve_unknown

            _, note = resolve_unknown(claim, actor=actor)
            raise ProviderError(f"{exc}; the request was sent and its answer lost, so it was not re-sent; {note}",
                                kind=exc.kind, code="outcome_unknown") from exc
        close_claim(claim, "failed", str(exc))
        raise
    close_claim(claim, "done", f"{action} sent")


def check_text(field: str, value, *, required: bool = False, limit: int = 2000) -> str:
    """``value`` stripped, or ValueError naming ``field`` when it is not storable text.

    Refused before any effect (docs/secrets.md, Text operators type): not a string, a NUL byte (PostgreSQL cannot store
    it), a lone surrogate such as ``\\ud800`` (not encodable as UTF-8), longer than ``limit``
    characters, or empty when ``required``.
    """
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise ValueError(f"{field} must be text")
    if "\x00" in value:
        raise ValueError(f"{field} contains a NUL byte; remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{field} contains an unpaired surrogate (not valid Unicode text); retype it") from None
    value = value.strip()
    if len(value) > limit:
        raise ValueError(f"{field} is longer than {limit:,} characters; shorten it")
    if required and not value:
        raise ValueError(f"say why: the {field} goes to the audit log")
    return value


def do_cordon(inst, on: bool, *, actor: str, reason: str = "") -> int:
    """Cordon (or uncordon) ``inst``'s Curio worker: it drains and takes no new tasks.

    The cordon is Warden's state (``Instance.cordoned``, docs/curio.md): recorded with its audit
    row (intent) in one transaction before the worker is touched, then applied to the worker
    (``harmony_machines.unschedulable``) and to the provider (the local provider starts the worker
    cordoned), and re-applied after every reboot, resume and re-registration (``fleet.cordon``).
    The audit row gets the outcome after. Returns the number of worker rows changed (0 when the
    worker has not registered yet: it is cordoned when it does). Raises ValueError for a bad
    reason (nothing done); ``DemandError`` naming the grant when Curio's database refuses the write
    (the record is put back: it could never apply); :class:`EffectNotRecorded` when applying failed
    otherwise (the audit row says so; Warden's record stands and is re-applied next cycle).
    """
    from fleet.demand.base import DemandError
    from fleet.harmony import set_unschedulable
    from fleet.models import Instance
    from fleet.providers import ProviderError, get_provider

    reason = check_text("reason", reason, required=True)
    verb = "cordon" if on else "uncordon"
    with transaction.atomic():
        before = Instance.objects.select_for_update().values_list("cordoned", flat=True).get(pk=inst.pk)
        Instance.objects.filter(pk=inst.pk).update(cordoned=on)
        row = do_audit(actor, verb, inst.external_id, reason, {"cordoned": before}, {"cordoned": on, "applied": "pending"})
    inst.cordoned = on
    try:
        n = set_unschedulable(inst.worker_name or inst.external_id, on)
        try:
            get_provider(inst.provider).set_cordon(inst.external_id, on)
        except ProviderError as exc:
            if exc.code != "not_found":
                raise
    except Exception as exc:
        refused = isinstance(exc, DemandError)  # Curio's database refused it (a missing grant): it never applies
        try:
            AuditLog.objects.filter(pk=row.pk).update(after=redact_obj({"cordoned": before if refused else on,
                                                                        "applied": False, "error": str(exc)[:300]}))
            if refused:
                Instance.objects.filter(pk=inst.pk).update(cordoned=before)
                inst.cordoned = before
        except DatabaseError:
            pass
        if refused:
            raise
        raise EffectNotRecorded(
            f"{verb} of {inst.external_id} is recorded (audit row {row.pk}) but applying it to the worker failed "
            f"({type(exc).__name__}: {str(exc)[:160]}); Warden re-applies it at the next cycle", applied=False) from exc
    try:
        AuditLog.objects.filter(pk=row.pk).update(after={"cordoned": on, "unschedulable": on, "rows": n, "applied": True})
    except DatabaseError as exc:
        raise EffectNotRecorded(f"{verb}ed {inst.external_id}; recording the outcome on audit row {row.pk} failed "
                                f"({type(exc).__name__})") from exc
    emit("fleet-changed", "demand-changed", "actions-changed")
    return n


# --- settings overrides and alert acknowledgement (appended for the console) -----------------
POLICY_VALUES = ("auto", "approval", "forbidden")

class OverrideError(ValueError):
    """A settings value is not acceptable; ``field`` names it (``policy.stop_instance``,
    ``limits.max_dph``) and the message says what is allowed. Nothing was saved."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def policy_keys() -> list[str]:
    """Every policy key an operator may set: the tools' defaults plus ``launch_instance:P0`` … ``:P3``."""
    from agent.policy.table import DEFAULT_POLICY, PRIORITIES

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
    from agent.policy.table import effective_limits, effective_policy

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


@transaction.atomic
def do_ack_alert(alert, actor: str, comment: str):
    """Acknowledge a firing alert with a comment (who is on it, and why); audited.

    A conditional UPDATE ``firing → acknowledged``: a second acknowledgement, or one of a resolved
    alert, raises ValueError saying its current state. An empty comment raises ValueError.
    Returns the refreshed alert; announces ``alerts-changed``.
    """
    from fleet.models import Alert

    comment = (comment or "").strip()
    if not comment:
        raise ValueError("say what you are doing about it (the comment is shown to other operators)")
    n = Alert.objects.filter(pk=alert.pk, state="firing").update(
        state="acknowledged", acknowledged_by=actor[:150], ack_comment=redact(comment)[:2000]
    )
    if n != 1:
        current = Alert.objects.get(pk=alert.pk)
        raise ValueError(f"alert {alert.pk} is already {current.state}")
    alert.refresh_from_db()
    do_audit(actor, "ack_alert", f"alert {alert.pk}", comment, {"state": "firing"},
             {"state": "acknowledged", "kind": alert.kind, "key": alert.key})
    emit("alerts-changed")
    return alert


#: the silences an operator can pick (minutes)
SILENCE_CHOICES = (15, 60, 240, 1440)


@transaction.atomic
def do_silence_alert(alert, actor: str, minutes: float, comment: str = ""):
    """Silence ``alert`` (and any new episode of its key) for ``minutes``: until then it neither
    notifies nor shows as firing (like Grafana's "silence notifications").

    ``minutes`` must be between 1 and 10,080 (a week); a resolved alert cannot be silenced; a
    silence replaces the alert's previous one. Raises ValueError saying what was wrong. Audited as
    ``silence_alert`` with the end time; announces ``alerts-changed``. Returns the refreshed alert.
    """
    from datetime import timedelta

    from fleet.models import Alert

    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not 1 <= minutes <= 10_080:
        raise ValueError("silence for between 1 minute and 7 days (10,080 minutes)")
    comment = check_text("comment", comment)
    until = clock.now() + timedelta(minutes=minutes)
    before = Alert.objects.select_for_update().filter(pk=alert.pk).values("state", "silenced_until").first()
    if before is None or before["state"] == "resolved":
        raise ValueError(f"alert {alert.pk} is resolved; there is nothing to silence")
    Alert.objects.filter(pk=alert.pk).update(silenced_until=until, silenced_by=actor[:150],
                                             silence_comment=redact(comment)[:2000])
    alert.refresh_from_db()
    do_audit(actor, "silence_alert", f"alert {alert.pk}", comment,
             {"silenced_until": before["silenced_until"].isoformat() if before["silenced_until"] else None},
             {"silenced_until": until.isoformat(), "minutes": minutes, "kind": alert.kind, "key": alert.key})
    emit("alerts-changed")
    return alert


@transaction.atomic
def do_unsilence_alert(alert, actor: str):
    """End ``alert``'s silence now (it shows as firing again and later episodes notify). Raises
    ValueError when it is not silenced. Audited as ``unsilence_alert``."""
    from fleet.models import Alert

    now = clock.now()
    n = Alert.objects.filter(pk=alert.pk, silenced_until__gt=now).update(silenced_until=now)
    if n != 1:
        raise ValueError(f"alert {alert.pk} is not silenced")
    Alert.objects.filter(key=alert.key, silenced_until__gt=now).update(silenced_until=now)
    alert.refresh_from_db()
    do_audit(actor, "unsilence_alert", f"alert {alert.pk}", "", None, {"silenced_until": now.isoformat()})
    emit("alerts-changed")
    return alert


@transaction.atomic
def do_ack_alerts(pks: list[int], actor: str, comment: str) -> list:
    """Acknowledge several firing alerts with one comment (bulk acknowledge, Grafana PR #105363):
    one :func:`do_ack_alert` each, so each writes its own audit row, all in one transaction.

    Raises ValueError, with nothing acknowledged, when no alert is selected, more than 500 are, the
    comment is empty, or one of them is not firing any more (the message names it)."""
    from fleet.models import Alert

    pks = sorted({int(pk) for pk in pks})
    if not pks:
        raise ValueError("select at least one alert to acknowledge")
    if len(pks) > 500:
        raise ValueError("acknowledge at most 500 alerts at once")
    alerts = list(Alert.objects.filter(pk__in=pks).order_by("pk"))
    missing = sorted(set(pks) - {a.pk for a in alerts})
    if missing:
        raise ValueError(f"no alert {missing[0]}; reload the page")
    return [do_ack_alert(a, actor, comment) for a in alerts]


@transaction.atomic
def do_save_notification_settings(user, *, email: str, webhook_ref: str, kinds: list[str], actor: str):
    """Store ``user``'s notification settings: an email address (or empty), a webhook reference
    (``env:NAME`` / ``file:/path``, or empty; never a URL: ``agent.notify.notifications.check_webhook_ref``)
    and the kinds wanted (``agent.notify.notifications.KINDS``). Raises ValueError naming the field.
    Audited as ``notification_settings`` (the reference's name only). Returns the settings row."""
    from django.core.exceptions import ValidationError
    from django.core.validators import validate_email

    from agent.models import NotificationSettings
    from agent.notify.notifications import KINDS, check_webhook_ref

    email = check_text("email", email, limit=254)
    if email:
        try:
            validate_email(email)
        except ValidationError:
            raise ValueError(f"email: {email!r} is not an email address") from None
    webhook_ref = check_webhook_ref(check_text("webhook", webhook_ref, limit=500))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"kinds: unknown kind {unknown[0]!r}; known: {', '.join(KINDS)}")
    prefs, _ = NotificationSettings.objects.select_for_update().get_or_create(user=user)
    before = {"email": prefs.email, "webhook_ref": prefs.webhook_ref, "kinds": prefs.kinds}
    prefs.email, prefs.webhook_ref, prefs.kinds = email, webhook_ref, [k for k in KINDS if k in kinds]
    prefs.save()
    do_audit(actor, "notification_settings", f"user:{user.get_username()}", "", before,
             {"email": prefs.email, "webhook_ref": prefs.webhook_ref, "kinds": prefs.kinds})
    return prefs


@transaction.atomic
def do_start_rehearsal(day: dict, name: str, actor: str, reason: str = "", change: dict | None = None):
    """Store a rehearsal of ``day`` (a day file's JSON, docs/rehearse.md) as ``queued`` and enqueue its
    playing once this commits (``agent.tasks.rehearse``: a throwaway database, progress and outcome
    stored on the row). ``name`` says what is rehearsed ("yesterday under max_instances 4 → 6");
    ``change`` is the change under test (``{"policy": {...}, "limits": {...}}``), audited with it.
    The day is checked first: ``agent.rehearse.day.DayFileError`` (one line) and nothing stored.
    Audited as ``start_rehearsal``; announces ``rehearsals-changed``. Returns the ``Rehearsal`` row."""
    from agent.models import Rehearsal
    from agent.rehearse.day import parse_day

    parse_day(day, "the day to rehearse")
    row = Rehearsal.objects.create(name=redact(str(name or "rehearsal"))[:200], day=day, started_by=str(actor)[:150])
    do_audit(actor, "start_rehearsal", f"rehearsal:{row.pk}", reason, None, {"name": row.name, "change": change or {}})
    emit("rehearsals-changed")
    # by name: agent.tasks (the top of agent) imports actions
    transaction.on_commit(lambda: current_app.tasks["agent.tasks.rehearse"].delay(row.pk))
    return row
