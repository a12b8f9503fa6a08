"""One instance's history on one line of time: launches, diagnoses, actions, alerts and rates.

The per-resource events tab operators expect (like dstack's Events tab).
Sources, each read once (the query count does not grow with the history):

- ``launch`` and ``action``: audit rows whose target is the instance (operators, the agent and
  the monitor all write them through ``agent.actions``);
- ``agent``: the agent's calls naming the instance (``args.instance_id``) with their outcome and
  reason code, refused and parked ones included — what it tried, not only what ran;
- ``diagnosis``: each verdict with its class and cause;
- ``decision``: an operator's approval or rejection of a parked call, at the time it was made;
- ``alert``: raised, acknowledged (with the comment), silenced and resolved;
- ``rate``: counts of proofs credited to the instance in each clock hour, when they completed
  (``ProofCredit``, kept after it stops or is destroyed), and its worker's failed attempts from
  Curio's ``harmony_task_history`` while it lives; labelled as counts ("3 proofs completed"), not
  rates. When Curio's database cannot be read, one ``rate`` event says so.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db import DatabaseError

from agent.models import Step
from fleet.clock import clock
from fleet.demand.curio import HarmonyDemandSource, node_clock_offsets
from fleet.harmony import HarmonyMachineDetails, HarmonyTaskHistory
from fleet.models import Alert, AuditLog, Diagnosis, Instance, ProofCredit
from fleet.proof_cost import credit_new_proofs

KINDS = ("launch", "diagnosis", "action", "agent", "decision", "alert", "rate")
RATE_WINDOW = timedelta(hours=48)
MAX_EVENTS = 300


@dataclass
class Event:
    """One entry: ``at`` (aware datetime), ``kind`` (one of :data:`KINDS`), a one-line ``title``, an
    optional ``detail``, an optional ``link`` (a console path) and a ``tone`` (ok | warn | bad | "")."""

    at: object
    kind: str
    title: str
    detail: str = ""
    link: str = ""
    tone: str = ""


def _audit(inst: Instance, limit: int) -> list[Event]:
    out = []
    for row in AuditLog.objects.filter(target=inst.external_id).order_by("-at", "-id")[:limit]:
        launch = row.verb == "launch_instance"
        refused = row.verb.endswith("_refused")
        detail = row.reason
        if refused and isinstance(row.after, dict):
            detail = f"{row.after.get('code', '')}: {row.after.get('detail', '')}".strip(": ")
        out.append(Event(row.at, "launch" if launch else "action", f"{row.verb.replace('_', ' ')} by {row.actor}",
                         detail, "", "bad" if refused else ("ok" if launch else "")))
    return out


def _agent_calls(inst: Instance, limit: int) -> list[Event]:
    """The agent's calls on ``inst``. A call that parked is three moments, each at its own time: it
    parked (the step's time), an operator decided (the approval's ``decided_at``, with who and the
    comment), and what became of it (stamped at the decision: it ran after it, not when parked)."""
    out = []
    calls = (Step.objects.filter(kind="call", args__instance_id=inst.external_id)
             .select_related("run", "approval", "approval__decided_by").order_by("-created_at", "-id")[:limit])
    for s in calls:
        tone = {"executed": "ok", "approved_executed": "ok", "refused": "bad", "error": "bad", "halted": "bad",
                "rejected": "bad", "parked": "warn", "expired": "warn"}.get(s.outcome, "")
        what = s.outcome + (f" ({s.reason_code})" if s.reason_code else "")
        link = f"/runs/{s.run.number}/"
        a = getattr(s, "approval", None)
        if a is None or a.decided_at is None:
            out.append(Event(s.created_at, "agent", f"{s.tool} {what} · run {s.run.number}", s.detail or s.call_reason,
                             link, tone))
            continue
        out.append(Event(s.created_at, "agent", f"{s.tool} parked for an operator · run {s.run.number}",
                         s.call_reason or a.reason, link, "warn"))
        who = a.decided_by.get_username() if a.decided_by else "nobody"
        verb = {"rejected": "rejected", "expired": "let expire", "void": "voided"}.get(a.status, "approved")
        out.append(Event(a.decided_at, "decision", f"{who} {verb} {s.tool}" if a.decided_by else f"{s.tool} {a.status}",
                         a.comment, "/approvals/", "bad" if verb == "rejected" else "ok"))
        if s.outcome != "parked":
            out.append(Event(a.decided_at, "agent", f"{s.tool} {what} · run {s.run.number}", s.detail or a.outcome_detail,
                             link, tone))
    return out


def _diagnoses(inst: Instance, limit: int) -> list[Event]:
    return [Event(d.taken_at, "diagnosis", f"diagnosis: {d.health}" + (f" ({d.fault_class})" if d.fault_class else "")
                  + f" via {d.source}", d.cause, "", {"healthy": "ok", "degraded": "warn", "failed": "bad"}.get(d.health, ""))
            for d in Diagnosis.objects.filter(instance=inst).order_by("-taken_at")[:limit]]


def _alerts(inst: Instance, limit: int) -> list[Event]:
    out = []
    for a in Alert.objects.filter(instance=inst).order_by("-raised_at")[:limit]:
        out.append(Event(a.raised_at, "alert", f"{a.severity} {a.kind} raised", a.message, "/alerts/?state=all", "bad"))
        if a.acknowledged_by:
            out.append(Event(a.raised_at, "alert", f"{a.kind} acknowledged by {a.acknowledged_by}", a.ack_comment,
                             "/alerts/?state=all", "warn"))
        if a.silenced_until:
            out.append(Event(a.raised_at, "alert", f"{a.kind} silenced until {a.silenced_until:%Y-%m-%d %H:%M} UTC "
                             f"by {a.silenced_by}", a.silence_comment, "/alerts/?state=all", "warn"))
        if a.resolved_at:
            out.append(Event(a.resolved_at, "alert", f"{a.kind} resolved", getattr(a, "resolved_reason", ""),
                             "/alerts/?state=all", "ok"))
    return out


def _rates(inst: Instance, now) -> list[Event]:
    """Proofs per hour credited to ``inst`` (``fleet.models.ProofCredit``, kept after it stops or
    is destroyed), hours on the database's clock (``seen_at``), plus the failed attempts of its
    worker's address in Curio's ``harmony_task_history`` while its rows are there."""
    name = inst.worker_name or inst.external_id
    since = max(inst.created_at, now - RATE_WINDOW)
    events = []
    try:
        credit_new_proofs(HarmonyDemandSource(), [inst])  # what completed since the last observe
    except DatabaseError as exc:
        events.append(Event(now, "rate", "new proofs unavailable", f"Curio's database could not be read: {type(exc).__name__}",
                            "", "warn"))
    offsets = node_clock_offsets()
    hours: dict = {}
    for seen, end, hp in ProofCredit.objects.filter(instance=inst, seen_at__gte=since).values_list(
            "seen_at", "work_end", "host_and_port"):
        # the hour it ended: the node's end time on the database's clock (its offset removed), else when seen
        at = end - timedelta(seconds=offsets.get(hp, 0.0)) if end is not None else seen
        hour = min(at, seen).replace(minute=0, second=0, microsecond=0)
        good, bad = hours.get(hour, (0, 0))
        hours[hour] = (good + 1, bad)
    if inst.killed_at is None:
        try:
            hosts = list(HarmonyMachineDetails.objects.filter(machine_name=name)
                         .values_list("machine__host_and_port", flat=True).distinct())
            failed = list(HarmonyTaskHistory.objects.filter(completed_by_host_and_port__in=hosts, work_end__gte=since,
                                                            result=False).values_list("work_end", flat=True)) if hosts else []
        except DatabaseError as exc:
            failed = []
            events.append(Event(now, "rate", "failed proofs unavailable",
                                f"Curio's database could not be read: {type(exc).__name__}", "", "warn"))
        for end in failed:
            hour = end.replace(minute=0, second=0, microsecond=0)
            good, bad = hours.get(hour, (0, 0))
            hours[hour] = (good, bad + 1)
    # a count per clock hour, labelled as a count (a rate would need the hour to be whole)
    return events + [
        Event(min(hour + timedelta(hours=1), now), "rate", f"{good} proof{'s' if good != 1 else ''} completed"
              + (f", {bad} failed" if bad else ""),
              f"{hour:%H:%M}–{hour + timedelta(hours=1):%H:%M} UTC, worker {name}", "", "bad" if bad and not good else "")
        for hour, (good, bad) in sorted(hours.items())]


def instance_timeline(inst: Instance, kinds: tuple[str, ...] = KINDS, limit: int = MAX_EVENTS) -> list[Event]:
    """``inst``'s events of ``kinds``, newest first, at most ``limit`` (each source is capped at
    ``limit`` too, so the newest events of every kind are in). ``created`` is added when no launch
    row exists (an instance adopted from the provider, or launched before the audit log)."""
    now = clock.now()
    events: list[Event] = []
    if "launch" in kinds or "action" in kinds:
        events += [e for e in _audit(inst, limit) if e.kind in kinds]
    if "agent" in kinds or "decision" in kinds:
        events += [e for e in _agent_calls(inst, limit) if e.kind in kinds]
    if "diagnosis" in kinds:
        events += _diagnoses(inst, limit)
    if "alert" in kinds:
        events += _alerts(inst, limit)
    if "rate" in kinds:
        events += _rates(inst, now)
    if "launch" in kinds and not any(e.kind == "launch" for e in events):
        events.append(Event(inst.created_at, "launch", f"created at {inst.provider}", inst.gpu_name, "", "ok"))
    if inst.killed_at and "action" in kinds:
        events.append(Event(inst.killed_at, "action", f"destroyed by {inst.killed_by or 'unknown'}", inst.kill_reason,
                            "", "bad"))
    events.sort(key=lambda e: e.at, reverse=True)
    return events[:limit]
