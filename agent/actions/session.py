"""The session anchor's writes: the target, observe-only, a reset (``agent.models.SessionState``).

Each ``do_*`` writes its audit row and announces change topics after commit (``agent.actions``).
"""


from django.db import transaction

from agent.memory.store import flush_buffer
from agent.models import SessionState
from agent.policy.limits import MAX_TARGET_PROOFS_HR
from fleet.audit import do_audit
from fleet.events import emit, trigger
from fleet.numbers import NumberError, parse_number


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
def do_reset_session(actor: str, reason: str = "") -> SessionState:
    """Clear the conversation: a new epoch, so earlier runs and chat leave the model's context and
    the chat (they stay on the Runs pages), and the short-term buffer is flushed (important
    messages promoted to long-term memory, ``agent.memory.store.flush_buffer``).

    The anchor keeps the run-id sequence, the objectives, the target, the overrides and the fleet
    snapshot; long-term memory stays (run ids must not restart after a reset: docs/agent.md). The
    console asks first, server-side (``console.views.settings.reset_session``: a confirmation step
    that says what is kept and cleared, and works without JavaScript).
    """
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
