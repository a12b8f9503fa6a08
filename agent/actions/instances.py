"""Instance actions: launch, stop, destroy, reboot, resume and cordon, by the agent's tools, the
monitor and an operator (``do_operator_instance_action``: the fleet page, through the same guards).

Each action writes its audit row (``fleet.audit.do_audit``) and announces change topics after
commit (``fleet.events.emit``); see ``agent.actions`` for the other domains.
"""

import hashlib

from django.db import DatabaseError, transaction

from agent.actions.text import check_text
from agent.models import SessionState
from agent.policy.claims import EffectNotRecorded, run_claimed
from agent.policy.guards import check
from agent.policy.table import effective_limits, effective_policy
from fleet.audit import do_audit
from fleet.clock import clock
from fleet.cordon import reapply
from fleet.demand.base import DemandError
from fleet.events import emit
from fleet.harmony import set_unschedulable
from fleet.models import AuditLog, Instance
from fleet.providers import ProviderError, get_provider
from fleet.secrets import redact_obj


def _inst_state(inst) -> dict:
    return {"status": inst.status, "intended_status": inst.intended_status, "killed": inst.killed_at is not None}


def do_launch_instance(*, gpu_name: str = "", offer_id: str = "", actor: str, reason: str = "", label: str = "warden"):
    """Launch one instance through the configured provider and record it.

    ``label`` tags the instance at the provider (the pipeline passes one derived from the call's
    idempotency key, so a launch whose answer is lost can be found: ``agent.policy.claims``). Returns the new :class:`fleet.models.Instance`. Raises ``ProviderError`` when the provider
    refuses or fails (nothing is recorded then).
    """
    provider = get_provider()
    pi = provider.launch(gpu_name=gpu_name, offer_id=offer_id, label=label or "warden")
    try:
        return _record_launch(provider, pi, gpu_name=gpu_name, actor=actor, reason=reason, label=label)
    except DatabaseError as exc:
        raise EffectNotRecorded(f"launched {pi.external_id} at the provider; recording it failed ({type(exc).__name__}: "
                                f"{str(exc)[:160]}); the next cycle adopts it by its label") from exc


def _record_launch(provider, pi, *, gpu_name: str, actor: str, reason: str, label: str):
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
        reapply([inst])  # the worker re-registered schedulable: Warden's cordon stands
    do_audit(actor, f"{action}_instance", inst.external_id, reason, before, _inst_state(inst))
    emit("fleet-changed")


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
    # inside: upward import, listed in pyproject.toml ignore_imports (layers contract)
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

    def act(claim):
        if override:
            do_audit(actor, "override_guard", inst.external_id, override_reason, None,
                     {"overrides": sorted(override), "tool": tool})
        do_instance_action(inst, action, actor=actor, reason=reason)

    # the one claim -> act -> settle path, shared with the pipeline (agent.policy.claims.run_claimed); the
    # claim is the check: one INSERT decides between concurrent requests (in_flight)
    res = run_claimed(act, key=key, tool=tool, args=args, instance_ref=inst.external_id, actor="operator",
                      audit_actor=actor, reason=reason, done=lambda _: f"{action} sent")
    if res.status == "refused":
        do_audit(actor, f"{tool}_refused", inst.external_id, reason, None, {"code": res.code, "detail": res.detail})
        raise ActionRefused(res.code, res.detail)
    if res.status == "unknown":
        exc = res.error
        raise ProviderError(f"{exc}; the request was sent and its answer lost, so it was not re-sent; {res.detail}",
                            kind=exc.kind, code="outcome_unknown") from exc
    if res.status in ("failed", "unrecorded"):
        raise res.error


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


