"""The observe cycle: the one entry point every trigger uses (beat, "observe now", chat, replay).

::

    lock (one run at a time, with expiry) → observe (fleet, demand, alerts) → monitor rules
    → planner turns, each through breakers → pipeline (allowlist, schema, guards, policy,
      approvals, execution) → until the planner answers, a breaker halts, a call parks, or a
      cap is hit → verdict → honest final report written from the trace

A parked run releases the lock; :func:`resume_run` continues it once its approvals are decided.
Every step is persisted as it happens.
"""

import json
import logging

from django.conf import settings

from agent.actions.runs import do_post_message
from agent.chat.chat_answer import with_rails_note
from agent.chat.chat_stream import ChatStream
from agent.chat.verdicts import has_verdict_block, parse_verdict
from agent.model.model_client import ModelConfig
from agent.models import Approval, Run, SessionState, Step
from agent.planners.llm import LlmPlanner
from agent.planners.rules import RulesPlanner
from agent.policy.table import effective_limits, effective_policy
from agent.runtime import triggers
from agent.runtime.approvals import undispatched
from agent.runtime.breakers import Halt
from agent.runtime.monitor_runner import run_monitor
from agent.runtime.observe import observe, void_gone_approvals
from agent.runtime.pipeline import dispatch_approved, process_turn
from agent.runtime.runs import (
    RunBusy,
    TurnContext,
    acquire_lock,
    bound_lock,
    claim_run,
    close_run,
    fail_run,
    lock_lost,
    release_lock,
    turn_context,
)
from fleet.alerts import raise_alert, resolve
from fleet.clock import clock
from fleet.events import emit
from fleet.secrets import redact

log = logging.getLogger(__name__)

#: how the keys of the ``breaker_tripped`` alerts begin (one per halt code)
BREAKER_KEY = "breaker:"


def default_planner(run: Run | None = None):
    """The configured planner: ``llm`` when a model is configured (WARDEN_MODEL_BASE_URL and
    WARDEN_MODEL), else the built-in ``rules`` policy. The one place the choice is made. For a
    ``chat`` run the model's answer streams to the console (``agent.chat.chat_stream``)."""
    config = ModelConfig.from_settings()
    if config is not None:
        if run is not None and run.trigger == "chat":
            return LlmPlanner(config, on_delta=ChatStream(run.number))
        return LlmPlanner(config)

    return RulesPlanner()


# --- entry points ----------------------------------------------------------------------------
def run_cycle(trigger: str, *, message: str | None = None, actor: str = "system", planner=None,
              events: str | None = None) -> Run | None:
    """Run one observe cycle. Returns the run, or ``None`` when another run holds the lock.

    A chat message waiting in a ``queued`` run is picked up here (oldest first); ``message``
    creates such a run first. ``events="take"`` (the Celery tasks) takes the waiting trigger events
    (``agent.runtime.triggers.drain``) once the lock is held and before the observe phase, and records them
    on the run (``trigger="event"`` names the run after the first of them); ``events="need"`` also
    runs nothing when there are none and no run is queued (an earlier run took them), returning
    ``None``. ``events=None`` (tests, replay) leaves them alone. Exceptions
    outside tools mark the run ``failed`` (with a report) and are re-raised after the lock is
    released.
    """
    if message:
        do_post_message(message, actor)
    token = acquire_lock()
    if token is None:
        log.info("observe cycle (%s) skipped: another run holds the lock", trigger)
        return None
    try:
        taken = triggers.drain() if events else []
        if events == "need" and not taken and not Run.objects.filter(status="queued").exists():
            return None
        for parked in expire_approvals():
            _settle_expired(parked)
        try:
            run = claim_run(trigger, planner, taken)
        except RunBusy:
            log.warning("observe cycle (%s) skipped: another run is still running", trigger)
            triggers.put_back(taken)
            return None
        state = SessionState.get()
        limits, policy = effective_limits(state), effective_policy(state)
        bound_lock(run.number, _lock_bound_s(limits))
        world = observe(limits, policy)
        if events:  # a live cycle (not a replay): this run saw the demand; later edges compare with it
            triggers.note_demand(world.demand, fire_events=False)
        tc = turn_context(run, world, limits, state)
        tc.new_step(kind="observe", actor="system", text="observation", observation=redact(_json(world.summary())))
        _run_monitor(tc)
        void_gone_approvals()  # what the monitor destroyed voids the approvals waiting on it
        _drive(tc, planner or default_planner(run))
        return run
    except BaseException as exc:  # KeyboardInterrupt and SystemExit too: never leave it "running"
        if "run" in locals():
            _fail_quietly(run, exc)
        raise
    finally:
        release_lock(token)


def _lock_bound_s(limits) -> float:
    """How long the run lock of a run under ``limits`` is renewed: its wall clock plus one tool
    timeout and one model request with its retries (three attempts of WARDEN_MODEL_TIMEOUT_S
    and their backoff): a call that started just before the wall clock may still finish."""
    model_s = 3 * float(settings.MODEL.get("TIMEOUT_S") or 60) + 3
    return float(limits.wall_clock_s) + float(limits.tool_timeout_s) + model_s


def _fail_quietly(run: Run, exc: BaseException) -> None:
    """:func:`fail_run`, never raising over ``exc``: when the write itself fails (the database
    connection broke under an interrupt), the next cycle fails the run
    (``agent.runtime.runs.fail_stuck_runs``)."""
    try:
        run.refresh_from_db(fields=["status"])
        if run.status in ("running", "queued"):
            fail_run(run, exc)
    except BaseException as again:  # noqa: BLE001 — the original exception is what propagates
        log.warning("run %s could not be marked failed (%s); the next cycle fails it", run.number, again)


def resume_run(run: Run, *, planner=None) -> Run:
    """Continue a parked run whose approvals were decided (or expired).

    Approved calls are checked by the guards again and executed once; rejected and expired ones
    become ``rejected``/``expired`` observations; then the planner continues. A run with an
    approval still waiting stays parked. Raises nothing when the run is not parked (returns it).
    """
    token = acquire_lock()
    if token is None:
        return run
    try:
        run.refresh_from_db()
        if run.status != "parked":
            return run
        state = SessionState.get()
        limits, policy = effective_limits(state), effective_policy(state)
        bound_lock(run.number, _lock_bound_s(limits))
        world = observe(limits, policy)
        run.refresh_from_db()  # the observe phase may have voided its last waiting approval (target_gone)
        if run.status != "parked":
            return run
        tc = turn_context(run, world, limits, state)

        # decisions can land while an approved call executes: take them until none is left, and
        # stay parked while any parked step is still undecided (its own resume task follows)
        seen: set[int] = set()
        while True:
            decided = [a for a in run.approvals.filter(step__outcome="parked").exclude(status="waiting")
                       .select_related("step").order_by("decided_at", "step__seq") if a.pk not in seen]
            if not decided:
                break
            for a in decided:  # in approval order: each dispatch counts those dispatched before it
                seen.add(a.pk)
                if a.status == "approved":
                    tc.actor = a.step.actor or "agent"
                    dispatch_approved(tc, a)
                    tc.actor = "agent"
                    tc.breakers.record_decision(a.step.seq, a.step.turn)
                    tc.breakers.record_call(a.step)
                elif a.status == "rejected":
                    _decided(a.step, "rejected", "rejected", f"rejected by {a.decided_by or 'an operator'}: {a.comment}")
                    tc.breakers.record_decision(a.step.seq, a.step.turn)
                elif a.status == "expired":
                    _decided(a.step, "expired", "expired", "the approval expired unanswered; nothing executed")
        # still waiting, or dispatched elsewhere and not finished (an open claim: agent.policy.claims settles it)
        if run.approvals.filter(step__outcome="parked").exists():
            return run
        if run.ended_at is not None:  # the planner had finished; only the monitor's calls waited
            run.status = "done"
            close_run(run)
            return run
        run.status = "running"
        run.save(update_fields=["status"])
        # the planner continues on this fresh observation: record it, so the run page shows what
        # the resumed turns saw and the entailment check finds the numbers its answer cites
        tc.new_step(kind="observe", actor="system", text="observation at resume",
                    observation=redact(_json(world.summary())))
        emit("runs-changed", "approvals-changed")
        tc.turn_index = tc.breakers.turns
        _drive(tc, planner or default_planner(run))
        return run
    except BaseException as exc:
        if undispatched(run).exists():
            # the operator's decision outlives this failure: the run stays parked and the sweep
            # (:func:`sweep_decided`) dispatches it again; never failed with an approved call unrun
            log.warning("resume of run %s failed before its approved calls ran (%s); it stays parked", run.number, exc)
            try:
                Run.objects.filter(pk=run.pk).update(status="parked")
            except BaseException:  # noqa: BLE001 — the sweep finds it parked or stuck either way
                pass
        else:
            _fail_quietly(run, exc)
        raise
    finally:
        release_lock(token)


def _decided(step: Step, outcome: str, code: str, detail: str) -> None:
    step.outcome, step.reason_code, step.detail = outcome, code, redact(detail)
    step.observation = f"ok: false — {code}: {redact(detail)}"
    step.ok = False
    step.save(update_fields=["outcome", "reason_code", "detail", "observation", "ok"])


def _json(obj) -> str:
    return json.dumps(obj, default=str, sort_keys=True)


def _run_monitor(tc: TurnContext) -> None:
    """The monitor's lifecycle rules, before the planner's turns (docs/contract.md, The cycle, step 2)."""
    run_monitor(tc)


def _drive(tc: TurnContext, planner) -> None:
    """Ask the planner for turns until it answers, halts, parks, or runs out."""
    run = tc.run
    run.planner = getattr(planner, "name", run.planner)  # the planner that plans it (saved at close)
    halt = None
    while True:
        halt = tc.breakers.before_turn(run)
        if halt is None and lock_lost():
            halt = Halt("lock_lost", lock_lost())
            break
        if halt is not None and halt.code == "max_steps" and planner.exhausted(tc):
            halt = None
            run.status = "done"
            break
        if halt is not None:
            break
        turn = planner.next_turn(tc)
        if turn is None:
            run.status = "done"
            break
        run.tokens_in += turn.tokens_in  # saved with the run when it closes
        run.tokens_out += turn.tokens_out
        run.budget_tokens += turn.budget_tokens()  # what token_budget counts (agent.runtime.breakers)
        tc.breakers.turns += 1
        if not turn.calls:
            tc.new_step(kind="text", turn=tc.turn_index, text=redact(turn.text)[:8000], outcome="text", tokens=turn.tokens_out)
            emit("runs-changed", "chat-changed")
            verdict = parse_verdict(turn.text)
            if verdict is not None:
                run.verdict_action, run.verdict_state_changed = verdict
                # a no-op run leaves the prompt, unless the rails refused something in it: the
                # refusals stay in front of the model, so it does not propose the same again
                run.included_in_prompt = any(verdict) or run.steps.filter(kind="call", outcome__in=["refused", "halted"]).exists()
                run.final_answer = redact(turn.text)[:8000]
                run.status = "done"
                break
            if has_verdict_block(turn.text):
                # a final answer whose verdict is malformed: recorded as unknown, never guessed;
                # the run stays in the prompt (it is not known to be a no-op)
                run.verdict_action = run.verdict_state_changed = None
                run.final_answer = redact(turn.text)[:8000]
                run.status = "done"
                break
            tc.breakers.record_text()
            halt = tc.breakers.after_text()
            if halt is not None:
                break
            tc.turn_index += 1
            continue
        result = process_turn(tc, turn)
        for s in result.steps:
            if s.outcome and s.outcome not in ("error",) and not (s.outcome == "refused" and s.reason_code == "invalid_args"):
                tc.breakers.record_call(s)
        if result.halt is not None:
            halt = result.halt
            break
        if result.cancelled and lock_lost():  # not an operator's cancel: the lock went (agent.runtime.runs.LockKeeper)
            halt = Halt("lock_lost", lock_lost())
            break
        if result.cancelled:
            run.status = "cancelled"
            break
        if result.parked:
            run.status = "parked"
            break
        tc.turn_index += 1
    if not run.final_answer and run.trigger == "chat" and hasattr(planner, "chat_answer"):
        # parked or halted before its final turn: the operator still gets an answer in words
        # (the verdict stays unknown; a resumed run's final turn replaces this answer)
        run.final_answer = redact(planner.chat_answer(tc))[:8000]
    if run.trigger == "chat" and planner.name == "llm" and getattr(planner, "fallback", None) is None:
        # what the rails refused or parked is said in the runtime's words, not left to the model's
        run.final_answer = with_rails_note(run.final_answer, tc.call_steps())[-8000:]
    if halt is not None:
        run.status = "halted"
        run.halt_reason, run.halt_detail = halt.code, redact(halt.detail)

        # one alert per condition (the halt code), its count growing while runs keep halting so
        raise_alert("breaker_tripped", f"run {run.number} halted: {halt.code} — {halt.detail}", severity="P2",
                    key=f"{BREAKER_KEY}{halt.code}", recurring=True)
    elif run.status == "done":
        resolve(BREAKER_KEY, prefix=True)  # a run finished clean: the halting has ended
    close_run(run)


def _settle_expired(run: Run) -> None:
    """Record ``expired`` on a parked run's expired calls; with nothing left waiting it ends ``done``.

    It is not planned further: the current cycle re-observes and decides afresh.
    """
    for a in run.approvals.filter(status="expired", step__outcome="parked").select_related("step"):
        _decided(a.step, "expired", "expired", "the approval expired unanswered; nothing executed")
    if undispatched(run).exists():
        return  # an approved call still waits for its dispatch: resume_run (or the sweep) runs it, then closes
    if not run.approvals.filter(status="waiting").exists():
        run.status = "done"
        close_run(run)


def expire_approvals() -> list[Run]:
    """Mark approvals past their expiry ``expired``; returns the parked runs that can now resume."""
    now = clock.now()
    expired = list(Approval.objects.filter(status="waiting", expires_at__lt=now).values_list("pk", "run_id"))
    if not expired:
        return []
    Approval.objects.filter(pk__in=[pk for pk, _ in expired], status="waiting").update(status="expired", decided_at=now)
    emit("approvals-changed")
    return list(Run.objects.filter(pk__in={rid for _, rid in expired}, status="parked"))
