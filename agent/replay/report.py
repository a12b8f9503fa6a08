"""The replay report, built from the Run, Step, Approval and Alert rows a replay wrote, and its comparison with the file's ``expect``."""

from __future__ import annotations

import json

from agent.models import Approval, Step
from agent.replay.file_format import (
    CallExpect,
    ExpectSpec,
)
from fleet.models import Alert

OUTCOMES_EXECUTED = {"executed", "approved_executed"}


OUTCOMES_REFUSED = {"refused", "halted"}


OUTCOMES_DISPATCHED = {"executed", "approved_executed", "error"}


#: the approval status -> final outcome of a parked call whose step still says ``parked``
_APPROVAL_OUTCOME = {
    "waiting": ("parked", "approval_required"),
    "approved": ("parked", "approval_required"),
    "rejected": ("rejected", "rejected"),
    "expired": ("expired", "expired"),
    "executed": ("approved_executed", None),
}


def _final(step, approval) -> tuple[str, str | None]:
    outcome, reason = step.outcome or "", step.reason_code or None
    if approval is not None and outcome in ("", "parked", "approval_required"):
        if approval.status == "void":
            return "refused", reason if reason not in (None, "approval_required") else "void"
        outcome, code = _APPROVAL_OUTCOME.get(approval.status, ("parked", "approval_required"))
        return outcome, code if code else None
    return outcome, reason


def _cycle_of(pk: int, marks: list[tuple[int, int]]) -> int:
    for last, cycle in marks:
        if pk <= last:
            return cycle
    return marks[-1][1] if marks else 0


def build_report(runs, *, name: str = "", cycle_marks: list[tuple[int, int]] = (), last=None) -> dict:
    """The report of ``runs`` (a queryset or list of Run rows) from their rows, in the order the
    steps were written.

    Shape (docs/replay.md, The report): ``{"name", "ok", "steps": [...], "alerts", "halt", "verdict",
    "final_report", "mismatches"}``. One entry per call with its final outcome (a parked call's
    later dispatch under the same idempotency key is folded into its entry); a parallel batch is
    one entry with ``calls``; text turns are entries with outcome ``text``. Entries carry ``i``,
    ``cycle`` (from ``cycle_marks``: ``(last Step pk, cycle)`` pairs; 0 without them),
    ``actor``, ``tool``, ``args``, ``outcome``, ``reason``, ``detail``, and ``parked: true`` when
    the call was ever parked for an operator; a launch or resume also ``priority: {proposed,
    facts}`` (launches) and ``need: {workers, capacity}`` as the runtime scored it. ``final_report`` is ``last``'s (default: the last
    run's).
    """
    runs = list(runs)
    steps = list(Step.objects.filter(run__in=runs, kind__in=["call", "text"]).order_by("pk"))
    approvals = {a.step_id: a for a in Approval.objects.filter(run__in=runs)}
    entries: list[dict] = []
    by_key: dict[tuple, dict] = {}  # (run, idempotency key) of a parked call -> its report call
    batches: dict[tuple, dict] = {}
    for s in steps:
        if s.kind == "text":
            entries.append(
                {"i": len(entries), "cycle": _cycle_of(s.pk, cycle_marks), "actor": s.actor or "agent", "tool": None,
                 "args": None, "outcome": "text", "reason": None, "detail": s.detail or "", "text": s.text}
            )
            continue
        approval = approvals.get(s.pk)
        key = (s.run_id, s.idempotency_key)
        if s.idempotency_key and key in by_key and approval is None:
            # the dispatch of a call parked earlier: fold its final outcome into the parked entry
            call = by_key[key]
            outcome, reason = s.outcome, s.reason_code or None
            if outcome == "executed":
                outcome = "approved_executed"
            call.update(outcome=outcome, reason=reason, detail=s.detail or call["detail"])
            continue
        outcome, reason = _final(s, approval)
        call = {
            "i": 0,
            "cycle": _cycle_of(s.pk, cycle_marks),
            "actor": s.actor or "agent",
            "tool": s.tool or None,
            "args": s.args,
            "outcome": outcome,
            "reason": reason,
            "detail": s.detail or (approval.outcome_detail if approval is not None else "") or "",
            "_parked": approval is not None,
        }
        facts = s.facts or {}
        if facts.get("priority"):  # the runtime's facts a launch was scored on (agent.policy.capacity)
            call["priority"] = {"proposed": facts["priority"].get("proposed"), "facts": facts["priority"].get("facts")}
        if facts.get("need"):
            call["need"] = {"workers": facts["need"].get("workers"), "capacity": facts["need"].get("capacity")}
        if approval is not None and s.idempotency_key:
            by_key[key] = call
        if s.batch:
            bkey = (s.run_id, s.turn, s.actor)
            entry = batches.get(bkey)
            if entry is None:
                entry = {"i": len(entries), "cycle": call["cycle"], "actor": s.actor or "agent", "calls": []}
                batches[bkey] = entry
                entries.append(entry)
            call["i"] = len(entry["calls"])
            entry["calls"].append(call)
        else:
            call["i"] = len(entries)
            entries.append(call)
    alerts = list(dict.fromkeys(Alert.objects.order_by("raised_at", "id").values_list("kind", flat=True)))
    last = last if last is not None else (runs[-1] if runs else None)
    if last is not None:
        last.refresh_from_db()
    verdict = None
    for r in runs:
        if r.verdict_action is not None or r.verdict_state_changed is not None:
            verdict = {"action": r.verdict_action, "state_changed": r.verdict_state_changed}
    halt = None
    for r in runs:
        if r.halt_reason:
            halt = r.halt_reason
    return {
        "name": name,
        "ok": True,
        "steps": entries,
        "alerts": alerts,
        "halt": halt,
        "verdict": verdict,
        "final_report": last.final_report if last is not None else "",
        "mismatches": [],
    }


def public_report(report: dict) -> dict:
    """The report as printed by ``--json``: private keys dropped, ``"parked": true`` on every call
    that was ever parked for an operator."""

    def clean(e: dict) -> dict:
        out = {k: v for k, v in e.items() if not k.startswith("_")}
        if e.get("_parked"):
            out["parked"] = True
        if "calls" in out:
            out["calls"] = [clean(c) for c in out["calls"]]
        return out

    return {**report, "steps": [clean(e) for e in report["steps"]]}


def flat_calls(report: dict) -> list[dict]:
    """Every call entry of the report (batch members included), in order."""
    out = []
    for e in report["steps"]:
        if "calls" in e:
            out.extend(e["calls"])
        elif e.get("outcome") != "text":
            out.append(e)
    return out


def args_agree(want: dict, have: dict | None) -> bool:
    have = have or {}
    return all(k in have and have[k] == v for k, v in want.items())


def _fits(exp: CallExpect, call: dict) -> bool:
    if exp.tool is not None and call.get("tool") != exp.tool:
        return False
    if exp.reason is not None:
        accepted = exp.reason if isinstance(exp.reason, list) else [exp.reason]
        if call.get("reason") not in accepted:
            return False
    if exp.actor is not None and call.get("actor") != exp.actor:
        return False
    if exp.outcome is not None and call.get("outcome") != exp.outcome:
        return False
    if exp.args and not args_agree(exp.args, call.get("args")):
        return False
    return True


def _describe(exp: CallExpect) -> str:
    return json.dumps(exp.model_dump(exclude_none=True), sort_keys=True)


def _brief(call: dict) -> str:
    reason = f" ({call['reason']})" if call.get("reason") else ""
    return f"{call.get('tool')} {json.dumps(call.get('args'), sort_keys=True)} {call.get('outcome')}{reason}"


def _match_list(label: str, wanted: list[CallExpect], actual: list[dict]) -> list[str]:
    """Multiset match: each expectation takes a distinct call; per tool named, counts are exact."""
    problems = []
    if not wanted:
        if actual:
            problems.append(f"{label}: expected none, got {len(actual)}: " + "; ".join(_brief(c) for c in actual))
        return problems
    # maximum bipartite matching (expectations -> calls), small sizes
    owner: dict[int, int] = {}

    def augment(e: int, seen: set[int]) -> bool:
        for c, call in enumerate(actual):
            if c in seen or not _fits(wanted[e], call):
                continue
            seen.add(c)
            if c not in owner or augment(owner[c], seen):
                owner[c] = e
                return True
        return False

    for e in range(len(wanted)):
        augment(e, set())
    matched = set(owner.values())
    for e, exp in enumerate(wanted):
        if e not in matched:
            problems.append(f"{label}: no call matches {_describe(exp)}")
    for tool in dict.fromkeys(w.tool for w in wanted if w.tool is not None):
        want_n = sum(1 for w in wanted if w.tool == tool)
        got = [c for c in actual if c.get("tool") == tool]
        if len(got) != want_n:
            problems.append(
                f"{label}: expected {want_n} {tool}, got {len(got)}" + (": " + "; ".join(_brief(c) for c in got) if got else "")
            )
    return problems


def match_expect(report: dict, expect: ExpectSpec) -> list[str]:
    """The differences between ``report`` and ``expect`` (empty when every expectation holds)."""
    calls = flat_calls(report)
    problems: list[str] = []
    given = expect.model_fields_set
    if expect.executed is not None:
        problems += _match_list("executed", expect.executed, [c for c in calls if c["outcome"] in OUTCOMES_EXECUTED])
    if expect.refused is not None:
        problems += _match_list("refused", expect.refused, [c for c in calls if c["outcome"] in OUTCOMES_REFUSED])
    if expect.parked is not None:
        problems += _match_list("parked", expect.parked, [c for c in calls if c.get("_parked") or c.get("parked")])
    if expect.errored is not None:
        problems += _match_list("errored", expect.errored, [c for c in calls if c["outcome"] == "error"])
    for tool in expect.never_executed or []:
        bad = [c for c in calls if c.get("tool") == tool and c["outcome"] in OUTCOMES_DISPATCHED]
        if bad:
            problems.append(f"never_executed: {tool} was dispatched: " + "; ".join(_brief(c) for c in bad))
    if "halt" in given and report.get("halt") != expect.halt:
        problems.append(f"halt: expected {expect.halt!r}, got {report.get('halt')!r}")
    raised = report.get("alerts", [])
    listed = ", ".join(raised) or "none"
    for kind in expect.alerts or []:
        if kind not in raised:
            problems.append(f"alerts: {kind!r} was not raised (raised: {listed})")
    if expect.alerts_any is not None and not set(expect.alerts_any) & set(raised):
        problems.append(f"alerts_any: none of {', '.join(expect.alerts_any)} was raised (raised: {listed})")
    for kind in expect.no_alerts or []:
        if kind in raised:
            problems.append(f"no_alerts: {kind!r} was raised")
    final = (report.get("final_report") or "").lower()
    for text in expect.report_contains or []:
        if text.lower() not in final:
            problems.append(f"report_contains: {text!r} is not in the final report")
    for text in expect.report_lacks or []:
        if text.lower() in final:
            problems.append(f"report_lacks: {text!r} is in the final report")
    fleet = report.get("final_fleet") or {}
    for iid, status in (expect.final_fleet or {}).items():
        have = fleet.get(iid, "absent")
        if have != status:
            problems.append(f"final_fleet: {iid} is {have}, expected {status}")
    counts = report.get("provider_requests") or {}
    for op, n in (expect.provider_requests or {}).items():
        if counts.get(op, 0) != n:
            problems.append(f"provider_requests: {counts.get(op, 0)} {op} request(s), expected {n}")
    return problems


def format_report(report: dict) -> str:
    """The human-readable report: one line per call (batch members indented), then the summary."""
    lines = [f"scenario {report['name']}"]
    for e in report["steps"]:
        if "calls" in e:
            lines.append(f"  {e['i']:>2} {e['actor']:<7} parallel batch of {len(e['calls'])} (cycle {e.get('cycle', 0)})")
            for c in e["calls"]:
                lines.append("       " + _line(c))
        elif e.get("outcome") == "text":
            text = (e.get("text") or "").replace("\n", " ")
            lines.append(f"  {e['i']:>2} {e['actor']:<7} text: {text[:100]}")
        else:
            lines.append(f"  {e['i']:>2} " + _line(e))
    lines.append(f"alerts: {', '.join(report['alerts']) or 'none'}")
    if "cycles" in report:
        lines.append(f"cycles: {report['cycles']}")
    if report.get("final_fleet") is not None:
        lines.append("final fleet: " + (", ".join(f"{k} {v}" for k, v in report["final_fleet"].items()) or "empty"))
    if report.get("provider_requests"):
        lines.append("provider requests: " + ", ".join(f"{k} {v}" for k, v in report["provider_requests"].items() if v))
    lines.append(f"halt: {report['halt'] or 'none'}")
    v = report["verdict"]
    lines.append(f"verdict: {'none' if v is None else json.dumps(v)}")
    if report.get("final_report"):
        lines.append("final report: " + report["final_report"].strip().replace("\n", "\n  "))
    if report["mismatches"]:
        lines.append("MISMATCHES:")
        lines += [f"  - {m}" for m in report["mismatches"]]
    lines.append("OK" if report["ok"] else "FAILED")
    return "\n".join(lines)


def _line(c: dict) -> str:
    args = "null" if c.get("args") is None else json.dumps(c["args"], sort_keys=True)
    reason = f" [{c['reason']}]" if c.get("reason") else ""
    detail = f" — {c['detail']}" if c.get("detail") else ""
    cycle = f" (cycle {c['cycle']})" if c.get("cycle") else ""
    return f"{c['actor']:<7} {c.get('tool')} {args} -> {c['outcome']}{reason}{cycle}{detail}"
