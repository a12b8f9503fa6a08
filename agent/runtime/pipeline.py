# Over 500 lines on purpose: the pipeline's stages in the order a call passes them (docs/contract.md).
"""The tool pipeline: every proposed call passes the same stages, in this order.

allowlist (``unknown_tool``) → policy ``forbidden`` (``forbidden_tool``, halts) → argument
parsing and schema (``invalid_args``: never executed with empty arguments) → breakers
(``identical_args``) → batch size (``batch_too_large``: more than :data:`MAX_BATCH_CALLS` calls,
refused whole, after ``duplicate``) → guards (``agent.policy.guards``) → observe-only → policy (``auto`` runs,
``approval`` parks) → execution with a timeout, retries of transient errors and an idempotency
claim → an observation written by the runtime. A planner-authored tool result is refused as
``forged_observation`` and halts the run (docs/safety.md invariant 4).

A parallel batch is scored whole before any call in it runs; its calls then run one at a time.
Any exception inside a tool becomes an error observation here; nothing crashes the loop.
"""

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import timedelta

from pydantic import ValidationError

from agent.models import Approval, SideEffect, Step
from agent.policy.capacity import (
    CAPACITY_TOOLS,
    beyond_detail,
    capacity,
    facts_priority,
    less_urgent,
    need_for,
    priority_detail,
)
from agent.policy.claims import Claimed, run_claimed
from agent.policy.guards import SCALE_DOWN_TOOLS, Refusal
from agent.policy.guards import check as guard_check
from agent.policy.guards import duplicate as duplicate_refusal
from agent.policy.invariants import call_facts
from agent.policy.lifecycle import forced_approval
from agent.policy.table import PRIORITIES, is_forbidden, policy_for
from agent.policy.tool_specs import MAX_BATCH_CALLS, truncate
from agent.runtime.breakers import Halt
from agent.runtime.diagnosis import prefetch
from agent.runtime.observe import with_retries
from agent.runtime.tools import PUBLIC_TOOLS, TOOLS, ToolContext, ToolError, canonical_json
from fleet.alerts import raise_alert
from fleet.clock import clock
from fleet.events import emit
from fleet.models import Alert
from fleet.providers import ProviderError
from fleet.secrets import redact, redact_obj
from fleet.untrusted import scan_for_injection

log = logging.getLogger(__name__)


def idempotency_key(run_number: int, turn: int, position: int, tool: str, args: dict | None) -> str:
    """The runtime's key: run, turn, position in the turn, tool and canonical arguments.

    Never the model's tool-call id, which changes on every retry (so a retried call would look new).
    """
    raw = f"{run_number}|{turn}|{position}|{tool}|{canonical_json(args)}"
    return hashlib.sha256(raw.encode()).hexdigest()[:40]


def ok_observation(payload, limit: int) -> str:
    return truncate("ok: true\n" + redact(json.dumps(redact_obj(payload), default=str, sort_keys=True)), limit)


def error_observation(code: str, message: str, limit: int) -> str:
    return truncate(f"ok: false — {code}: {redact(message)}", limit)


@dataclass
class Decision:
    """The scoring result of one call in a turn."""

    step: Step
    proposal: object
    args: dict | None = None
    key: str = ""
    action: str = "run"  # run | park | done
    forced: str = ""  # why it parks whatever the policy says (agent.policy.lifecycle.forced_approval)
    note: str = ""  # the facts a parked launch or resume was scored on ("proposed P0, facts P1, beyond the need…")


@dataclass
class TurnResult:
    halt: Halt | None = None
    parked: bool = False
    cancelled: bool = False
    steps: list = field(default_factory=list)


def _finish(step: Step, outcome: str, code: str = "", detail: str = "", observation: str = "", ok=None, **extra) -> Step:
    step.outcome, step.reason_code, step.detail = outcome, code, redact(detail)[:2000]
    step.observation = observation or (error_observation(code, detail, 4000) if code else "")
    step.ok = ok
    for k, v in extra.items():
        setattr(step, k, v)
    step.save()
    return step


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(obj) -> bool:
    """No NaN or infinity anywhere inside (they are not JSON and cannot be stored)."""
    if isinstance(obj, float):
        return obj == obj and obj not in (float("inf"), float("-inf"))
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    return True


def _parse(proposal) -> tuple[dict | None, str]:
    """Arguments as a dict, or (None, why) when the string does not parse or is not an object."""
    if proposal.raw_arguments is None:
        args = proposal.args if proposal.args is not None else {}
    else:
        try:
            args = json.loads(proposal.raw_arguments, parse_constant=_no_constant)
        except (TypeError, ValueError) as exc:
            return None, f"the argument string is not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc}); send one JSON object"
    if not isinstance(args, dict):
        return None, "the arguments must be one JSON object"
    if not _finite(args):
        return None, "the arguments hold NaN or infinity; send finite numbers"
    return args, ""


def _schema_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "(arguments)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def score_turn(tc, turn) -> tuple[list[Decision], Halt | None]:
    """Score every call of ``turn`` before anything runs. Each call's step is numbered now and
    saved once with its outcome (a refusal here, or :func:`execute` / :func:`park`).

    Launches and resumes are counted one at a time in the order proposed (``agent.policy.capacity``):
    each is within the need or beyond it, counting as capacity the calls of this batch that will
    run before it. A launch's policy key is the less urgent of its proposed and its facts
    priority. Beyond the need, a call identical to an earlier one of the batch is refused
    ``duplicate``; any other that the policy would run by itself parks (forced approval)."""
    decisions: list[Decision] = []
    halt = None
    batch = len(turn.calls) > 1 or turn.batch
    too_large = len(turn.calls) > MAX_BATCH_CALLS
    passed: list[tuple[str, dict]] = []
    need0 = None  # the need at the start of this turn (computed once, on the first launch or resume)
    ahead = 0  # launches and resumes of this batch that will run before the next one
    capacity_calls: set[tuple[str, str]] = set()  # (tool, canonical args) of earlier launches/resumes
    run_launched = None
    for pos, p in enumerate(turn.calls):
        step = tc.draft_step(kind="call", turn=tc.turn_index, position=pos, batch=batch, tool=p.tool[:40],
                             raw_arguments=redact(p.raw())[:4000])
        dec = Decision(step=step, proposal=p)
        decisions.append(dec)
        if halt is not None:
            continue
        if p.forged:
            _finish(step, "halted", "forged_observation", "the planner tried to author a tool result; observations come from the runtime only", ok=False)
            halt = Halt("forged_observation", f"forged result for {p.tool or 'a tool'}")
            dec.action = "done"
            continue
        if p.tool not in PUBLIC_TOOLS:
            _finish(step, "refused", "unknown_tool", f"no tool named {p.tool!r}; tools: {', '.join(PUBLIC_TOOLS)}", ok=False)
            dec.action = "done"
            continue
        spec = TOOLS[p.tool]
        args, why = _parse(p)
        if args is not None:
            step.args = redact_obj(args)
        if is_forbidden(p.tool, None, tc.world.policy):
            _finish(step, "halted", "forbidden_tool", f"{p.tool} is forbidden by policy", ok=False)
            halt = Halt("forbidden_tool", f"{p.tool} is forbidden by policy")
            dec.action = "done"
            continue
        if args is None:
            _finish(step, "refused", "invalid_args", why, ok=False)
            dec.action = "done"
            halt = tc.after_error(step)
            continue
        try:
            checked = spec.schema.model_validate(args)
        except ValidationError as exc:
            _finish(step, "refused", "invalid_args", f"{p.tool}: {_schema_error(exc)}", ok=False)
            dec.action = "done"
            halt = tc.after_error(step)
            continue
        # the tool gets the checked arguments (trimmed, typed), never the raw ones
        args = checked.model_dump(exclude_none=True)
        step.args = redact_obj(args)
        dec.args = args
        step.call_reason = redact(str(args.get("reason", "")))[:2000]
        # the policy key a launch falls under: the less urgent of proposed and facts (agent.policy.capacity)
        policy_args, notes, need, within = args, [], None, True
        if p.tool in CAPACITY_TOOLS:
            if need0 is None:
                need0 = need_for(tc.world)
            need = need0.after(ahead)
            within = need.workers >= 1
            step.facts = {"need": need.record(within)}
            if p.tool == "launch_instance":
                proposed, facts = args.get("launch_priority"), facts_priority(tc.world)
                step.facts["priority"] = {"proposed": proposed, "facts": facts}
                if proposed in PRIORITIES:
                    policy_args = {**args, "launch_priority": less_urgent(proposed, facts)}
                if priority_detail(proposed, facts):
                    notes.append(priority_detail(proposed, facts))
            if not within:
                notes.append(beyond_detail(need))
        if is_forbidden(p.tool, policy_args, tc.world.policy):
            prio = policy_args.get("launch_priority")
            why = f" ({'; '.join(notes)})" if notes else ""
            _finish(step, "halted", "forbidden_tool", f"{p.tool} at priority {prio} is forbidden by policy{why}", ok=False)
            halt = Halt("forbidden_tool", f"{p.tool} ({prio}) is forbidden by policy")
            dec.action = "done"
            continue
        ident = tc.breakers.identical(p.tool, args, tc.turn_index)
        if ident is not None:
            _finish(step, "halted", ident.code, ident.detail, ok=False)
            halt = ident
            dec.action = "done"
            continue
        dec.key = idempotency_key(tc.run.number, tc.turn_index, pos, p.tool, args)
        step.idempotency_key = dec.key
        refusal = None
        if p.tool in CAPACITY_TOOLS:
            same = (p.tool, canonical_json(args))
            if not within and same in capacity_calls:
                refusal = Refusal("duplicate", f"the same {p.tool} is earlier in this batch and this one is {beyond_detail(need)}")
            capacity_calls.add(same)
            if run_launched is None:
                run_launched = launched_in_run(tc.run.pk)
        if refusal is not None:
            pass
        elif too_large:  # refused whole: only the checks before it in docs/contract.md's refusal order may speak first
            refusal = duplicate_refusal(p.tool, args, dec.key, batch_prior=passed) or Refusal(
                "batch_too_large", f"a parallel batch of {len(turn.calls)} calls; at most {MAX_BATCH_CALLS} per turn, nothing in it ran")
            passed.append((p.tool, args))
        else:
            refusal = guard_check(p.tool, args, dec.key, tc.world, batch_prior=passed, actor=tc.actor,
                                  observe_only=tc.observe_only, batch_launched=run_launched or frozenset())
        if refusal is not None:
            _finish(step, "refused", refusal.code, refusal.detail, ok=False)
            dec.action = "done"
            continue
        passed.append((p.tool, args))
        if p.tool in SCALE_DOWN_TOOLS and tc.actor == "agent":
            step.facts = {"retires_capacity": retires_capacity(tc.world, args)}
        if spec.side_effect:
            dec.forced = forced_approval(p.tool, args, tc.world, injected=run_injected(tc))
            auto = policy_for(p.tool, policy_args, tc.world.policy, tc.actor) != "approval"
            if not within and auto and not dec.forced:
                dec.forced = beyond_detail(need)  # beyond the need: never rented without an operator
            dec.note = ", ".join(notes)
            if dec.forced or not auto:
                dec.action = "park"  # park() saves the step
            elif p.tool in CAPACITY_TOOLS:
                ahead += 1  # it runs: the next launch or resume counts it as starting
        # a call that runs is saved once, with its outcome, by execute()
    return decisions, halt


def retires_capacity(world, args: dict) -> bool:
    """Whether a stop or destroy of ``args["instance_id"]`` retires capacity (the instance is live
    or starting: ``agent.policy.capacity.capacity``); what the scale-down budget counts."""
    inst = world.instance(str(args.get("instance_id", "")))
    return inst is not None and capacity(world).holds(inst)


def launched_in_run(run_id: int) -> set[str]:
    """Instance ids this run launched or resumed (executed calls): they are not "pending" for its
    later launches (``launch_pending``); the need counts them instead (``agent.policy.capacity``)."""
    ids = set()
    for tool, args, obs in Step.objects.filter(run_id=run_id, tool__in=["launch_instance", "resume_instance"],
                                               outcome__in=["executed", "approved_executed"]).values_list("tool", "args", "observation"):
        if tool == "resume_instance":
            if isinstance(args, dict) and args.get("instance_id"):
                ids.add(str(args["instance_id"]))
            continue
        try:
            ids.add(json.loads(obs.split("\n", 1)[1])["instance_id"])
        except (IndexError, ValueError, KeyError, TypeError):
            continue
    return ids


def process_turn(tc, turn) -> TurnResult:
    """Score, park and execute the calls of one turn. Returns halt/parked/cancelled."""
    decisions, halt = score_turn(tc, turn)
    result = TurnResult(steps=[d.step for d in decisions])
    if halt is not None:
        for d in decisions:
            if not d.step.outcome:
                _finish(d.step, "refused", "aborted_before_dispatch", f"the run halted ({halt.code}) before this call started", ok=False)
        result.halt = halt
        return result
    for d in decisions:
        if d.action == "park":
            park(tc, d)
            result.parked = True

    # several diagnoses in one turn are collected in parallel first (docs/operations.md, Diagnosis); each call's step
    # then records its own verdict as usual
    prefetch(tc.world, [d.args.get("instance_id") for d in decisions if d.action == "run" and d.step.tool == "diagnose_instance"])
    for i, d in enumerate(decisions):
        if d.action != "run":
            continue
        # for real before a side effect and after another call of this batch ran; a read-only call
        # right after a recent check does not pay a round trip (agent.runtime.runs.CANCEL_CHECK_S)
        if tc.cancel_requested(must_check=TOOLS[d.step.tool].side_effect or i > 0):
            for rest in decisions[i:]:
                if rest.action == "run":
                    _finish(rest.step, "refused", "aborted_before_dispatch", "the run was cancelled before this call started", ok=False)
            result.cancelled = True
            return result
        execute(tc, d.step, TOOLS[d.step.tool], d.args, d.key)
        if d.step.outcome == "error":
            halt = tc.after_error(d.step)
            if halt is None and tc.breakers.failures[d.step.tool] >= tc.limits.three_strikes and TOOLS[d.step.tool].fallback:
                run_fallback(tc, d)
            if halt is not None:
                for rest in decisions[i + 1:]:
                    if rest.action == "run" and not rest.step.outcome:
                        _finish(rest.step, "refused", "aborted_before_dispatch", f"the run halted ({halt.code}) before this call started", ok=False)
                result.halt = halt
                return result
    return result


def run_fallback(tc, d: Decision) -> None:
    """Run the failed tool's declared fallback in its place (three strikes: docs/contract.md ``three_strikes``)."""
    spec = TOOLS[TOOLS[d.step.tool].fallback]
    step = tc.new_step(kind="call", turn=tc.turn_index, position=d.step.position, batch=d.step.batch, tool=spec.name,
                       args=d.args, raw_arguments=d.step.raw_arguments)
    step.detail = f"fallback after {tc.breakers.failures[d.step.tool]} failures of {d.step.tool}"
    execute(tc, step, spec, d.args, "")
    tc.breakers.record_call(step)


def run_injected(tc) -> bool:
    """Whether this run raised ``prompt_injection`` (in its observe phase or in a tool's output):
    every later side effect of the run parks for an operator (docs/contract.md, Forced approval)."""
    if tc.world.injection:
        return True
    return Alert.objects.filter(kind="prompt_injection", key__startswith=f"prompt_injection:{tc.run.number}:").exists()


def situation(world, args: dict | None) -> dict:
    """The facts an approval card shows "then" and "now": demand (state, queued, workers live and
    expected) and the target instance's status (``None`` when the call names none)."""
    d = world.demand
    target = None
    ident = (args or {}).get("instance_id")
    if ident:
        inst = world.instance(str(ident))
        target = {"id": ident, "status": "absent" if inst is None else ("gone" if inst.killed_at else inst.status)}
    return {"at": clock.now().isoformat(), "demand": d.state if d else "unknown",
            "queued": d.queued if d else None, "workers_live": d.workers_live if d else None,
            "workers_expected": d.workers_expected if d else None,
            "instances": sum(1 for i in world.instances if i.killed_at is None), "target": target}


def park(tc, d: Decision) -> Approval:
    """Write the Approval row for a call that needs an operator; the step's outcome is ``parked``."""
    now = clock.now()
    if d.step.pk is None:  # a scored call is saved before its approval points at it
        d.step.save(force_insert=True)
    approval = Approval.objects.create(
        run=tc.run,
        step=d.step,
        tool=d.step.tool,
        args=redact_obj(d.args),
        reason=d.step.call_reason,
        idempotency_key=d.key,
        created_at=now,
        expires_at=now + timedelta(minutes=tc.limits.approval_expiry_min),
        situation={**situation(tc.world, d.args), **({"forced": d.forced} if d.forced else {}),
                   **{k: v for k, v in (d.step.facts or {}).items() if k in ("need", "priority")}},
    )
    why = (f"; {d.note}" if d.note else "") + (f"; forced: {d.forced}" if d.forced and d.forced not in d.note else "")
    _finish(d.step, "parked", "approval_required",
            f"waiting for an operator (approval {approval.pk}, expires in {tc.limits.approval_expiry_min:g} min){why}",
            observation=f"parked: {d.step.tool} waits for operator approval {approval.pk}", ok=None)
    emit("approvals-changed")
    return approval


def execute(tc, step: Step, spec, args: dict, key: str, *, outcome: str = "executed") -> Step:
    """Run one tool body with its deadline, retries and idempotency claim; fill ``step``.

    ``outcome`` is the success outcome (``approved_executed`` for an approved call). A
    side-effect call first claims its key (``agent.policy.claims.open_claim``: one INSERT, with its intent
    audit row); a taken key is refused ``duplicate``, an instance with an open claim ``in_flight``,
    and nothing runs. Side effects are retried only on errors known not to have taken effect; a
    request whose answer was lost ends ``error``/``outcome_unknown`` after the runtime looked the
    effect up and adopted what exists (``agent.policy.claims.resolve_unknown``) — never re-sent.
    """
    limit = tc.limits.observation_max_chars
    claimed = bool(spec.side_effect and key)
    if claimed:
        # the trace names the call before it is claimed: a worker that dies mid-call leaves a step
        # the claim's settlement can find (agent.policy.claims) and an operator can read
        step.idempotency_key = key
        # what the call is dispatched on, for the invariant checks (agent.policy.invariants)
        step.facts = {**(step.facts or {}), "at_call": _call_facts(tc, spec.name, args)}
        if step.pk is None:
            step.save(force_insert=True)
        else:
            step.save(update_fields=["idempotency_key", "args", "call_reason", "facts"])
    timeout = spec.timeout_s or tc.limits.tool_timeout_s
    started = clock.now()
    t0 = clock.monotonic()

    def act(claim):
        ctx = ToolContext(run=tc.run, actor=tc.actor, world=tc.world, deadline=t0 + timeout, step=step,
                          label=claim.label if claim is not None else "")
        payload = with_retries(lambda: spec.body(ctx, args), attempts=tc.limits.retry_attempts, side_effect=spec.side_effect)
        elapsed = clock.monotonic() - t0
        if elapsed > timeout and not spec.side_effect:
            raise ToolError(f"{spec.name} ran {elapsed:.1f}s, past its {timeout:g}s timeout", kind="transient", code="timeout")
        return payload

    # the one claim -> act -> settle path, shared with an operator's instance action (agent.policy.claims)
    res = run_claimed(act, key=key if claimed else "", tool=spec.name, args=args,
                      instance_ref=str(args.get(spec.instance_arg or "", "")), actor=tc.actor,
                      reason=str(args.get("reason", "")), done=lambda payload: ok_observation(payload, limit))
    if res.status == "refused":
        return _finish(step, "refused", res.code, res.detail, ok=False)
    if res.status == "unknown":
        return _outcome_unknown(tc, step, res, t0)
    if res.status == "unrecorded":
        # it happened: never reported as a failure (docs/safety.md); an unclosed claim is settled next cycle
        return _finish(step, outcome, "", str(res.error), observation=ok_observation({"done": True, "note": str(res.error)}, limit),
                       ok=True, duration_ms=(clock.monotonic() - t0) * 1000)
    if res.status == "failed":
        exc = res.error
        if isinstance(exc, (ProviderError, ToolError)):
            return _failed(tc, step, exc, t0)
        log.error("tool %s crashed", spec.name, exc_info=exc)
        return _finish(step, "error", "", f"permanent error ({type(exc).__name__}): {exc}",
                       observation=error_observation(f"permanent error ({type(exc).__name__})", str(exc), limit),
                       ok=False, error_kind="permanent", duration_ms=(clock.monotonic() - t0) * 1000)
    payload, obs = res.value, res.result
    _finish(step, outcome, "", "", observation=obs, ok=True, duration_ms=(clock.monotonic() - t0) * 1000)
    hits = scan_for_injection(json.dumps(payload, default=str))
    if hits:
        tc.world.injection.append(f"{spec.name} output: {hits[0][:120]}")
        if Alert.objects.filter(kind="prompt_injection", raised_at__gte=started).exclude(state="resolved").exists():
            emit("runs-changed")  # the entry point (sync, diagnosis) already raised it for this text
            return step
        raise_alert("prompt_injection", f"instruction-like text in {spec.name} output (run {tc.run.number}): {hits[0][:120]}",
                    severity="P1", key=f"prompt_injection:{tc.run.number}:{spec.name}")
    emit("runs-changed")
    return step


def _call_facts(tc, tool: str, args: dict) -> dict:
    """``agent.policy.invariants.call_facts`` for this call; a record that cannot be made says why and
    never stops the call."""
    try:
        return call_facts(tc.world, tool, args, tc.actor)
    except Exception as exc:  # noqa: BLE001 — a record, never a reason for the call to fail
        log.warning("could not record the facts of %s: %s", tool, exc)
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def _failed(tc, step: Step, exc, t0: float) -> Step:
    """A tool failed with a known outcome: nothing took effect (its claim is closed ``failed``)."""
    code = "tool_timeout" if exc.code == "timeout" else (exc.code or exc.kind)
    return _finish(step, "error", code if code == "tool_timeout" else "", f"{exc.kind} error ({exc.code or 'error'}): {exc}",
                   observation=error_observation(f"{exc.kind} error ({exc.code or 'error'})", str(exc), tc.limits.observation_max_chars),
                   ok=False, error_kind=exc.kind, duration_ms=(clock.monotonic() - t0) * 1000)


def _outcome_unknown(tc, step: Step, res: Claimed, t0: float) -> Step:
    """The request was sent and its answer lost: it was looked up and what exists adopted, never
    re-sent (``agent.policy.claims.run_claimed``; docs/contract.md ``outcome_unknown``; docs/safety.md invariant 10)."""
    inst, note, exc = res.instance, res.detail, res.error
    if inst is not None and inst.killed_at is None:
        tc.world.set_instances([*[i for i in tc.world.instances if i.pk != inst.pk], inst])
    detail = f"{step.tool}: {exc.code or exc.kind} after the request was sent ({exc}); its outcome is unknown, so it was not re-sent; {note}"
    return _finish(step, "error", "outcome_unknown", detail,
                   observation=error_observation("outcome_unknown", detail, tc.limits.observation_max_chars),
                   ok=False, error_kind=exc.kind, duration_ms=(clock.monotonic() - t0) * 1000)


def dispatch_approved(tc, approval: Approval) -> Step:
    """Run an approved call: guards again at dispatch, then execute once (``approved_executed``).

    Refused now (diagnosis went stale, demand came back): nothing executes, the step's outcome
    is ``refused`` with the code and the approval becomes ``void`` (docs/contract.md, The cycle, step 4).
    """
    step = approval.step
    args = dict(approval.args)
    spec = TOOLS[approval.tool]
    claim = SideEffect.objects.filter(key=approval.idempotency_key).exclude(code="stale_claim").first()
    if claim is not None:
        # the call was dispatched before (a redelivered task after a worker died): never run it
        # again, and never void it as a duplicate of a call that may not have run
        return _already_dispatched(approval, claim)
    siblings = set(Approval.objects.filter(run_id=step.run_id, step__turn=step.turn).values_list("idempotency_key", flat=True))
    refusal = dispatch_priority_refusal(tc.world, approval.tool, args)
    if refusal is None:
        # no_longer_needed only for a call that was within the need when it was parked (one parked
        # before the need was recorded counts as within); beyond it, the operator decided on those facts
        parked_within = bool(((approval.situation or {}).get("need") or {}).get("within", True))
        refusal = guard_check(approval.tool, args, approval.idempotency_key, tc.world, actor=tc.actor,
                              batch_launched=launched_in_run(step.run_id), batch_keys=siblings, at_dispatch=True,
                              observe_only=tc.observe_only, parked_within=parked_within)
    if refusal is not None:
        _finish(step, "refused", refusal.code, f"approved, but refused at dispatch: {refusal.detail}", ok=False)
        detail = f"{refusal.code}: {refusal.detail}"
        again = _diagnose_and_ask_again(tc, approval) if refusal.code == "diagnosis_required" else None
        if again is not None:
            detail += f"; diagnosed again and asked again as approval {again.pk}"
        Approval.objects.filter(pk=approval.pk).update(status="void", outcome_detail=detail[:2000])
        _tell_refused(approval, detail)
        emit("approvals-changed")
        return step
    execute(tc, step, spec, args, approval.idempotency_key, outcome="approved_executed")
    if step.outcome == "refused" and step.reason_code == "in_flight":
        # another effect on the instance is open: not void — the operator's decision stands
        Approval.objects.filter(pk=approval.pk).update(status="void", outcome_detail=f"in_flight: {step.detail}")
        emit("approvals-changed")
        return step
    Approval.objects.filter(pk=approval.pk).update(
        status="executed" if step.outcome == "approved_executed" else "failed",
        outcome_detail=step.detail or "executed",
    )
    emit("approvals-changed")
    return step


def _tell_refused(approval: Approval, detail: str) -> None:
    """An approved call the guards refused at dispatch: the operator is told by an alert naming
    the approval, the call and the refusal code (the card shows the same as its outcome)."""
    target = (approval.args or {}).get("instance_id") or ""
    who = approval.decided_by.username if approval.decided_by_id else "an operator"
    raise_alert("approval_refused", f"approval {approval.pk} ({approval.tool} {target}), approved by {who}, was refused "
                f"at dispatch and did not run: {detail}", severity="P2", key=f"approval_refused:{approval.pk}")


def _diagnose_and_ask_again(tc, approval: Approval) -> Approval | None:
    """An approved stop or destroy refused ``diagnosis_required`` at dispatch (its diagnosis went
    stale while it waited): diagnose the instance now and park the same call again for the
    operator, with the fresh diagnosis in its reason and a new key. Returns the new approval, or
    ``None`` when the call is still refused after the diagnosis (its step says why)."""
    step = approval.step
    args = dict(approval.args)
    ident = args.get("instance_id")
    diag = tc.new_step(kind="call", actor=tc.actor, tool="diagnose_instance", turn=step.turn, position=step.position,
                       args={"instance_id": ident}, raw_arguments="",
                       call_reason=f"approval {approval.pk} was refused diagnosis_required at dispatch")
    execute(tc, diag, TOOLS["diagnose_instance"], {"instance_id": ident}, "")
    fresh = "failed" if diag.outcome != "executed" else "done"
    try:
        payload = json.loads(diag.observation.split("\n", 1)[1])
        fresh = f"{payload.get('health')} ({payload.get('cause') or 'no cause'})"
    except (IndexError, ValueError, AttributeError, TypeError):
        pass
    key = idempotency_key(tc.run.number, 30_000 + approval.pk, step.position, approval.tool, args)
    again = tc.new_step(kind="call", actor=step.actor, tool=approval.tool, args=args, turn=step.turn,
                        position=step.position, raw_arguments=step.raw_arguments,
                        call_reason=redact(f"{step.call_reason} — asked again: approval {approval.pk} was approved "
                                           f"after its diagnosis went stale; fresh diagnosis: {fresh}")[:2000])
    again.idempotency_key = key
    refusal = guard_check(approval.tool, args, key, tc.world, actor=tc.actor, at_dispatch=True,
                          observe_only=tc.observe_only)
    if refusal is not None:
        _finish(again, "refused", refusal.code, f"asked again after a fresh diagnosis, but refused: {refusal.detail}", ok=False)
        return None
    forced = forced_approval(approval.tool, args, tc.world, injected=run_injected(tc))
    return park(tc, Decision(step=again, proposal=None, args=args, key=key, action="park", forced=forced))


def dispatch_priority_refusal(world, tool: str, args: dict) -> Refusal | None:
    """At dispatch of an approved launch the facts priority is derived again; the call is refused
    (``forbidden_tool``, the run is not halted) only when the key it now falls under — the less
    urgent of proposed and facts — is ``forbidden``. Otherwise the operator's approval stands."""
    if tool != "launch_instance" or args.get("launch_priority") not in PRIORITIES:
        return None
    proposed, facts = args["launch_priority"], facts_priority(world)
    key = less_urgent(proposed, facts)
    if is_forbidden(tool, {**args, "launch_priority": key}, world.policy):
        return Refusal("forbidden_tool", f"launch_instance:{key} is forbidden by policy (proposed {proposed}, facts {facts})")
    return None


def _already_dispatched(approval: Approval, claim: SideEffect) -> Step:
    """An approved call whose claim exists: report what the claim says, run nothing.

    Open: it is running elsewhere, or its worker died (``agent.policy.claims.settle_claims`` settles it:
    adopted, or back to ``waiting``). Done or failed: the approval takes that outcome.
    """
    step = approval.step
    if claim.status == "claimed":
        return step
    status = "executed" if claim.status == "done" else "failed"
    Approval.objects.filter(pk=approval.pk, status="approved").update(status=status, outcome_detail=claim.result[:2000])
    if step.outcome in ("", "parked"):
        ok = claim.status == "done"
        _finish(step, "approved_executed" if ok else "error", "" if ok else claim.code,
                f"already dispatched (claim {claim.pk}): {claim.result}", observation="", ok=ok)
    emit("approvals-changed")
    return step
