"""Starting work for the agent: an operator's chat message, a queued cycle, a rehearsal.

Each ``do_*`` writes its audit row and announces change topics after commit (``agent.actions``).
"""


from celery import current_app
from django.db import transaction

from agent.models import Rehearsal, Run, SessionState, Step
from fleet.audit import do_audit
from fleet.clock import clock
from fleet.events import emit
from fleet.secrets import redact


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


@transaction.atomic
def do_start_rehearsal(day: dict, name: str, actor: str, reason: str = "", change: dict | None = None,
                       baseline: dict | None = None, baseline_name: str = ""):
    """Store a rehearsal of ``day`` (a day file's JSON, docs/rehearse.md) as ``queued`` and enqueue its
    playing once this commits (``agent.tasks.rehearse``: a throwaway database, progress and outcome
    stored on the row). ``name`` says what is rehearsed ("yesterday under max_instances 4 → 6");
    ``change`` is the change under test (``{"policy": {...}, "limits": {...}}``), audited with it.
    With ``baseline`` (the same day under the current settings, named ``baseline_name``) an A/B
    pair is stored: the baseline row, then this one, linked both ways by ``compare_to``, and the one
    task plays both (``agent.rehearse.background.play_stored``). The days are checked first:
    ``agent.rehearse.day.DayFileError`` (one line) and nothing stored. Audited as
    ``start_rehearsal``; announces ``rehearsals-changed``. Returns the ``Rehearsal`` row of ``day``."""
    # inside: upward import, listed in pyproject.toml ignore_imports (layers contract)
    from agent.rehearse.day import parse_day

    parse_day(day, "the day to rehearse")
    if baseline is not None:
        parse_day(baseline, "the day under the current settings")
        other = Rehearsal.objects.create(name=redact(str(baseline_name or "rehearsal"))[:200], day=baseline,
                                         started_by=str(actor)[:150])
    row = Rehearsal.objects.create(name=redact(str(name or "rehearsal"))[:200], day=day, started_by=str(actor)[:150],
                                   compare_to=other if baseline is not None else None)
    if baseline is not None:
        other.compare_to = row
        other.save(update_fields=["compare_to"])
    do_audit(actor, "start_rehearsal", f"rehearsal:{row.pk}", reason, None,
             {"name": row.name, "change": change or {}, "compare_to": row.compare_to_id})
    emit("rehearsals-changed")
    # by name: agent.tasks (the top of agent) imports actions
    transaction.on_commit(lambda: current_app.tasks["agent.tasks.rehearse"].delay(row.pk))
    return row
