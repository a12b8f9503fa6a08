"""Side-effect claims: every effect on the fleet happens at most once, and none is lost or hidden.

docs/safety.md invariant 10 and docs/contract.md "Side effects and claims": ``in_flight``, ``duplicate``, ``outcome_unknown`` and
``stale_claim``:

- :func:`open_claim` is the check *and* the claim: one INSERT under two uniqueness constraints
  (a key is claimed once; an instance has at most one open claim) decides, in the same
  transaction as the intent audit row, before the effect. The claim records which process made
  the call (:func:`worker_identity`), so a dead one can be told (:func:`worker_alive`).
- A request sent and not answered (timeout, reset, 5xx, a garbled answer) is never re-sent: the
  claim is marked ``outcome_unknown`` and :func:`resolve_unknown` looks the effect up at the
  provider (a launch by its label, :func:`launch_label`), adopts what exists, and only then
  closes the claim.
- :func:`settle_claims` runs at the start of every cycle and monitor tick: an open claim older
  than ``claim_max_age_min`` (default 30), whose worker is known dead, or whose outcome is
  unknown is settled against the provider. Found there: adopted, the claim completes ``done``.
  Not found: the claim closes ``failed`` with code ``stale_claim`` (its key is free again: the
  call never ran), the ``stale_claim`` alert names it, and an approval behind it goes back to
  ``waiting`` with the reason visible — never void as ``duplicate``, never re-run by the runtime.
"""

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from datetime import timedelta as td

import psutil
from django.db import DatabaseError, IntegrityError, transaction

from agent.models import Approval, SideEffect, Step
from agent.policy.limits import default
from agent.policy.table import effective_limits
from fleet.alerts import raise_alert
from fleet.audit import do_audit
from fleet.clock import clock
from fleet.events import emit
from fleet.models import AuditLog, Instance
from fleet.providers import ProviderError, get_provider
from fleet.secrets import redact, redact_obj

log = logging.getLogger(__name__)

#: what a side-effect tool's effect looks like at the provider, by tool: the instance's status
#: after it (``None``: the instance is gone). A reboot is seen by a start after the claim.
EFFECT_STATUS = {"stop_instance": "stopped", "resume_instance": "running", "destroy_instance": None}


class ClaimRefused(Exception):
    """The claim was not taken: ``code`` is ``duplicate`` (the key was claimed already) or
    ``in_flight`` (another side effect on the instance is open); ``detail`` says which."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


# --- who made the call -----------------------------------------------------------------------------
def worker_identity() -> str:
    """This process as ``host|pid|start time`` (the start time tells a recycled pid apart)."""
    try:
        started = f"{psutil.Process().create_time():.2f}"
    except psutil.Error:
        started = "?"
    return f"{socket.gethostname()}|{os.getpid()}|{started}"


def worker_alive(identity: str) -> bool | None:
    """Whether the process named by ``identity`` (:func:`worker_identity`) still runs.

    ``None`` when it cannot be told: no identity, or another host (the age bound applies then).
    """
    try:
        host, pid, started = identity.split("|")
        pid = int(pid)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    try:
        proc = psutil.Process(pid)
        if started != "?" and abs(proc.create_time() - float(started)) > 0.05:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return None


def launch_label(key: str) -> str:
    """The provider label a launch carries, derived from its idempotency key (vast.ai labels hold at
    most 1,024 characters): what finds the instance when the answer was lost."""
    return f"warden-{key[:40]}"


# --- claiming --------------------------------------------------------------------------------------
def open_claim(*, key: str, tool: str, args: dict, instance_ref: str, actor: str, audit_actor: str | None = None,
               reason: str = "") -> SideEffect:
    """Claim ``key`` for ``tool(args)`` and write its intent audit row, in one transaction.

    ``instance_ref`` is the instance the call acts on ("" for a launch). Raises
    :class:`ClaimRefused` (``duplicate`` or ``in_flight``); nothing is written then. The
    database decides: two concurrent claims cannot both succeed (docs/safety.md, Side effects).
    """
    label = launch_label(key) if tool == "launch_instance" else ""
    try:
        with transaction.atomic():
            claim = SideEffect.objects.create(
                key=key, tool=tool, args=redact_obj(args), instance_ref=redact(instance_ref)[:64], actor=actor[:20],
                worker=worker_identity(), label=label, claimed_at=clock.now(),
            )
            AuditLog.objects.create(
                at=clock.now(), actor=audit_actor or actor, verb=f"{tool}_claimed", target=instance_ref[:200] or label,
                reason=redact(reason or ""), before=None,
                after=redact_obj({"key": key, "claim": claim.pk, "args": args, "worker": claim.worker}),
            )
    except IntegrityError:
        if SideEffect.objects.filter(key=key).exclude(code="stale_claim").exists():
            raise ClaimRefused("duplicate", "this idempotency key already ran; nothing executed") from None
        raise ClaimRefused("in_flight", f"a side effect on {instance_ref} is already in flight") from None
    emit("actions-changed")
    return claim


def close_claim(claim: SideEffect, status: str, result: str, code: str = "") -> bool:
    """Close an open claim (``done`` or ``failed``, with ``code``); a conditional UPDATE, so only
    one settler wins. Returns whether this call closed it."""
    n = SideEffect.objects.filter(pk=claim.pk, status="claimed").update(
        status=status, code=code or claim.code, result=redact(result)[:4000], finished_at=clock.now()
    )
    if n:
        claim.status, claim.code, claim.result = status, code or claim.code, redact(result)[:4000]
    return bool(n)


class EffectNotRecorded(Exception):
    """The effect happened, recording its outcome failed (a database error after the provider
    acted). The message says what happened; the intent audit row and the open claim stand, and
    the next cycle settles the claim against the provider (:func:`settle_claims`). Never shown as a
    failure: an error page must not hide an effect (docs/safety.md, Side effects). ``applied`` is False when
    the intent was recorded but applying it failed (Warden re-applies it next cycle)."""

    def __init__(self, message: str, *, applied: bool = True):
        super().__init__(message)
        self.applied = applied


def finish_claim(claim: SideEffect | None, status: str, result: str) -> None:
    """Close ``claim`` (none: nothing to do). A claim settled as stale while its call still ran
    (past ``claim_max_age_min``) that did take effect raises ``stale_claim``: an approval sent back
    to waiting must not be approved again blind."""
    if claim is None:
        return
    if not close_claim(claim, status, result) and status == "done":
        log.warning("claim %s finished after it was settled", claim.pk)
        raise_alert("stale_claim", f"{claim.tool} {claim.instance_ref or claim.label} (claim {claim.pk}) was settled as "
                    f"never run, but it finished and took effect: {result[:200]}", severity="P1",
                    key=f"stale_claim:late:{claim.pk}")


@dataclass
class Claimed:
    """What :func:`run_claimed` did with one call. ``status``: ``refused`` (the claim was refused:
    ``code``/``detail``, nothing ran), ``done`` (``value`` is what the act returned, ``result`` the
    claim's closing text), ``failed`` (``error`` with a known outcome: nothing took effect, or a
    crash), ``unknown`` (the request was sent and its answer lost: looked up, ``instance`` adopted
    or None, ``detail`` the look-up's note; never re-sent) or ``unrecorded`` (it took effect, its
    record failed: ``error`` is the :class:`EffectNotRecorded`)."""

    status: str
    claim: SideEffect | None = None
    value: object = None
    result: str = ""
    error: BaseException | None = None
    code: str = ""
    detail: str = ""
    instance: object = None


def run_claimed(act, *, key: str, tool: str, args: dict, instance_ref: str, actor: str, audit_actor: str | None = None,
                reason: str = "", done=lambda value: "done") -> Claimed:
    """The one claim → act → settle path of a side effect, for the pipeline (the agent's and the
    monitor's calls, ``agent.runtime.pipeline.execute``) and an operator's instance action
    (``agent.actions.instances.do_operator_instance_action``); the guards run before it.

    With ``key`` the call is claimed first (:func:`open_claim`: one INSERT and the intent audit
    row; a refusal is ``refused`` and ``act`` never runs); without one (a read) it runs unclaimed.
    ``act(claim)`` (claim None when unclaimed) does the work; ``done(value)`` is the claim's closing
    text. A ``ProviderError`` whose outcome is unknown is looked up and adopted
    (:func:`resolve_unknown`), never re-sent. Never raises what ``act`` raised: it is in the answer
    (:class:`Claimed`).
    """
    claim = None
    if key:
        try:
            claim = open_claim(key=key, tool=tool, args=args, instance_ref=instance_ref, actor=actor,
                               audit_actor=audit_actor, reason=reason)
        except ClaimRefused as exc:
            return Claimed("refused", code=exc.code, detail=exc.detail)
    try:
        value = act(claim)
    except ProviderError as exc:
        if claim is not None and exc.outcome_unknown:
            inst, note = resolve_unknown(claim, actor=audit_actor or actor)
            return Claimed("unknown", claim, error=exc, detail=note, instance=inst)
        finish_claim(claim, "failed", str(exc))
        return Claimed("failed", claim, error=exc)
    except EffectNotRecorded as exc:
        try:
            finish_claim(claim, "done", str(exc))
        except DatabaseError:
            pass  # the claim stays open: the next cycle settles it against the provider
        return Claimed("unrecorded", claim, error=exc)
    except Exception as exc:  # noqa: BLE001 — the boundary: the caller reports it (a tool's error, or a crash)
        # a tool's own error (it has a kind) reads as its message; a crash as its repr
        finish_claim(claim, "failed", str(exc) if hasattr(exc, "kind") else repr(exc))
        return Claimed("failed", claim, error=exc)
    result = done(value)
    finish_claim(claim, "done", result)
    return Claimed("done", claim, value=value, result=result)


def our_launch_labels(labels: set[str]) -> set[str]:
    """Those of ``labels`` that a launch of ours carries (:func:`launch_label`, any claim status):
    one query. The monitor's orphan rule asks it (``fleet.monitor.decide``)."""
    return set(SideEffect.objects.filter(label__in=list(labels)).values_list("label", flat=True)) if labels else set()


def open_claims_block(instance_ref: str = "", tool: str = "") -> SideEffect | None:
    """The open claim that blocks a call on ``instance_ref`` (``in_flight``) or, with ``tool``
    ``launch_instance``, another launch (``launch_pending``); the oldest, or None. Settled claims
    block nothing. The one query of open claims the guards ask (``agent.policy.guards.check``)."""
    qs = SideEffect.objects.filter(status="claimed")
    qs = qs.filter(instance_ref=instance_ref) if instance_ref else qs.filter(tool=tool)
    return qs.order_by("claimed_at").first()


# --- looking an effect up at the provider ----------------------------------------------------------
@dataclass
class Lookup:
    """What the provider shows for a claim: ``found`` (the effect happened), the provider's view
    of the instance (``pi``, or None) and a one-line ``note``."""

    found: bool
    pi: object = None
    note: str = ""


def lookup(claim: SideEffect, provider=None) -> Lookup:
    """Look ``claim``'s effect up at the provider (a launch by its label, others by instance).

    Raises ``ProviderError`` when the provider cannot be read (nothing is decided then).
    """
    provider = provider or get_provider()
    if claim.tool == "launch_instance":
        hits = provider.find_by_label(claim.label) if claim.label else []
        if hits:
            return Lookup(True, hits[0], f"found {hits[0].external_id} at the provider by its label {claim.label}")
        return Lookup(False, None, f"no instance labelled {claim.label} at the provider")
    listed = {pi.external_id: pi for pi in provider.list_instances()}
    pi = listed.get(claim.instance_ref)
    if claim.tool in EFFECT_STATUS:
        want = EFFECT_STATUS[claim.tool]
        if want is None:
            found = pi is None
        else:
            found = pi is not None and pi.status == want
    elif claim.tool == "reboot_instance":
        found = pi is not None and pi.started_at is not None and pi.started_at >= claim.claimed_at
    else:
        found = False
    seen = "not listed" if pi is None else f"listed {pi.status}"
    return Lookup(found, pi, f"{claim.instance_ref} is {seen} at the provider")


def adopt(pi, provider_name: str, *, actor: str, reason: str):
    """Record the provider's instance ``pi`` as ours (an :class:`fleet.models.Instance` row, created
    or updated); audited as ``adopt_instance``. Returns the row."""
    now = clock.now()
    inst, created = Instance.objects.update_or_create(
        provider=pi.extra.get("provider", provider_name) if isinstance(pi.extra, dict) else provider_name,
        external_id=pi.external_id,
        defaults=dict(
            label=(pi.label or "")[:100], gpu_name=pi.gpu_name or "", status=pi.status, intended_status=pi.intended_status or "running",
            status_msg=redact(pi.status_msg or ""), dph=pi.dph, ssh_host=pi.ssh_host or "", ssh_port=pi.ssh_port, pid=pi.pid,
            log_path=pi.log_path or "", worker_name=pi.worker_name or pi.external_id, started_at=pi.started_at or now,
        ),
        create_defaults=dict(
            label=(pi.label or "")[:100], gpu_name=pi.gpu_name or "", status=pi.status, intended_status=pi.intended_status or "running",
            status_msg=redact(pi.status_msg or ""), status_since=now, dph=pi.dph, ssh_host=pi.ssh_host or "", ssh_port=pi.ssh_port,
            pid=pi.pid, log_path=pi.log_path or "", worker_name=pi.worker_name or pi.external_id, created_at=now,
            started_at=pi.started_at or now,
        ),
    )
    do_audit(actor, "adopt_instance", inst.external_id, reason, None,
             {"status": inst.status, "label": inst.label, "created": created})
    emit("fleet-changed")
    return inst


def resolve_unknown(claim: SideEffect, *, actor: str):
    """After a request whose answer was lost: look the effect up, adopt it, close the claim.

    Returns ``(instance or None, note)``. Found: the claim completes ``done`` and a launched
    instance is adopted. Not found on a good read: the claim closes ``failed`` (code
    ``outcome_unknown``). The provider unreadable: the claim stays open, marked
    ``outcome_unknown``, and the next cycle settles it (:func:`settle_claims`). Never re-sends.
    """
    SideEffect.objects.filter(pk=claim.pk).update(code="outcome_unknown")
    claim.code = "outcome_unknown"
    provider = get_provider()
    try:
        seen = lookup(claim, provider)
    except ProviderError as exc:
        return None, f"the look-up failed too ({exc.code or exc.kind}: {exc}); the claim stays open and is settled next cycle"
    inst = None
    if seen.found:
        if seen.pi is not None:
            inst = adopt(seen.pi, provider.name, actor=actor, reason=f"{claim.tool} answer lost; {seen.note}")
        close_claim(claim, "done", f"outcome_unknown, then {seen.note}; adopted")
        return inst, f"{seen.note}; adopted"
    if claim.tool != "launch_instance" and seen.pi is not None:
        inst = adopt(seen.pi, provider.name, actor=actor, reason=f"{claim.tool} answer lost; {seen.note}")
    close_claim(claim, "failed", f"outcome_unknown: {seen.note}", code="outcome_unknown")
    return inst, f"{seen.note}; not re-sent"


# --- settling old claims ---------------------------------------------------------------------------
def doubtful(claim: SideEffect, max_age_min: float, now=None) -> str:
    """Why an open claim must be settled now ("" when it may still be running)."""
    now = now or clock.now()
    if claim.code == "outcome_unknown":
        return "its request's answer was lost"
    age = now - claim.claimed_at
    if age > timedelta(minutes=max_age_min):
        return f"claimed {age.total_seconds() / 60:.0f} min ago (limit {max_age_min:g} min)"
    if claim.worker and worker_alive(claim.worker) is False:
        return f"its worker ({claim.worker.split('|')[1] if '|' in claim.worker else claim.worker}) is dead"
    return ""


def settle_claims(max_age_min: float = default("claim_max_age_min")) -> list[SideEffect]:
    """Settle every doubtful open claim against the provider; returns the claims settled.

    Found: adopted (the claim completes ``done``; its step and approval say so). Not found: the
    claim closes ``failed``/``stale_claim``, the ``stale_claim`` alert names it, its step records
    the outcome and an approval behind it goes back to ``waiting``. A provider that cannot be
    read settles nothing (tried again next cycle).
    """
    now = clock.now()
    todo = [(c, why) for c in SideEffect.objects.filter(status="claimed").order_by("claimed_at")
            if (why := doubtful(c, max_age_min, now))]
    if not todo:
        return []
    provider = get_provider()
    settled = []
    for claim, why in todo:
        try:
            seen = lookup(claim, provider)
        except ProviderError as exc:
            log.warning("claim %s not settled: provider read failed: %s", claim.pk, exc)
            continue
        what = f"{claim.tool} {claim.instance_ref or claim.label} (claim {claim.pk}, by {claim.actor})"
        if seen.found:
            if not close_claim(claim, "done", f"settled: {why}; {seen.note}; adopted"):
                continue
            if seen.pi is not None:
                adopt(seen.pi, provider.name, actor="system", reason=f"stale claim of {what} settled: {seen.note}")
            _record(claim, found=True, detail=f"{why}; {seen.note}: the effect happened and was adopted")
        else:
            if not close_claim(claim, "failed", f"stale_claim: {why}; {seen.note}; never re-run", code="stale_claim"):
                continue

            raise_alert("stale_claim", f"{what} never finished: {why}; {seen.note}. It did not run and is not re-run; "
                        "an approval behind it waits for an operator again", severity="P1", key=f"stale_claim:{claim.pk}")
            _record(claim, found=False, detail=f"{why}; {seen.note}: it never ran")
        settled.append(claim)
    if settled:
        emit("runs-changed", "approvals-changed", "fleet-changed", "actions-changed")
    return settled


def _record(claim: SideEffect, *, found: bool, detail: str) -> None:
    """Write a settled claim's outcome to its step, its approval and the audit log."""
    approval = Approval.objects.filter(idempotency_key=claim.key).select_related("step", "run").first()
    step = approval.step if approval else Step.objects.filter(idempotency_key=claim.key).order_by("-pk").first()
    do_audit("system", "settle_claim", claim.instance_ref or claim.label, detail, {"status": "claimed"},
             {"status": claim.status, "code": claim.code, "claim": claim.pk, "tool": claim.tool,
              "approval": approval.pk if approval else None})
    if approval is not None:
        if found:
            Approval.objects.filter(pk=approval.pk).update(status="executed", outcome_detail=f"settled: {detail}")
            if step.outcome in ("", "parked"):
                _set_step(step, "approved_executed", "", f"settled after the worker was lost: {detail}", ok=True)
        else:
            # back to the operator: the call did not run; they decide again, seeing why
            expiry = effective_limits().approval_expiry_min
            Approval.objects.filter(pk=approval.pk).update(
                status="waiting", decided_by=None, decided_at=None, expires_at=clock.now() + td(minutes=expiry),
                outcome_detail=f"stale_claim: {detail}; approved before, but it never ran — decide again",
            )
            if step.outcome in ("", "parked"):
                _set_step(step, "parked", "approval_required",
                          f"stale_claim: {detail}; waiting for an operator again (approval {approval.pk})", ok=None)
            if approval.run.status in ("running", "failed", "parked"):
                type(approval.run).objects.filter(pk=approval.run_id).update(status="parked", ended_at=None)
        return
    if step is not None and step.outcome == "":
        if found:
            _set_step(step, "executed", "", f"settled after the worker was lost: {detail}", ok=True)
        else:
            _set_step(step, "error", "stale_claim", f"stale_claim: {detail}", ok=False)


def _set_step(step: Step, outcome: str, code: str, detail: str, ok) -> None:
    step.outcome, step.reason_code, step.detail, step.ok = outcome, code, redact(detail)[:2000], ok
    step.observation = f"ok: {'true' if ok else 'false'} — {code or outcome}: {redact(detail)[:2000]}"
    step.save(update_fields=["outcome", "reason_code", "detail", "ok", "observation"])
