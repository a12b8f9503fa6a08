"""Trace scoring: the runs as data (judge the trace, not the impression a run leaves).

:func:`score_traces` reads Run, Step and Approval rows with a fixed number of aggregate queries
(six, whatever the number of runs or steps) and returns:

- ``runs``: how many runs were scored, and ``by_status``;
- ``step_histogram``: planner turns per run (a parallel batch is one turn), bucketed
  (:data:`BUCKETS`);
- ``halt_reasons``: halted runs per reason code;
- ``calls``: agent calls; ``forbidden`` / ``forged``: attempts (calls refused with
  ``forbidden_tool`` / ``forged_observation``), each with its ``rate`` per agent call and the
  number of runs with at least one;
- ``refusals``: agent calls per refusal code (``refused`` and ``halted`` outcomes);
- ``side_effects``: side-effect calls that ran, per tool and actor: ``with_approval``
  (``approved_executed``, an operator approved it) and ``without_approval`` (``executed``:
  auto policy, or the monitor); ``approvals``: Approval rows per status;
- ``entailment``: runs whose final answer names an id or a number no observation contains, and
  the newest :data:`FLAGGED_SHOWN` of them (run number and flagged tokens).

``last`` limits scoring to the newest N runs; ``epoch`` to one session epoch.
"""

from collections import Counter

from django.db.models import Count, Q

from agent.models import Approval, Run, Step
from agent.runtime.report import flagged_claims
from agent.runtime.tools import TOOLS

#: histogram buckets of planner turns per run: (label, low, high) inclusive
BUCKETS = [("0", 0, 0), ("1", 1, 1), ("2", 2, 2), ("3", 3, 3), ("4-5", 4, 5), ("6-8", 6, 8), ("9-12", 9, 12),
           ("13+", 13, 10**9)]
FLAGGED_SHOWN = 20
SIDE_EFFECT_TOOLS = sorted(name for name, t in TOOLS.items() if t.side_effect)


def _runs(last: int | None, epoch: int | None):
    base = Run.objects.exclude(status="queued")
    if epoch is not None:
        base = base.filter(epoch=epoch)
    if last:
        # a subquery keeps this one round trip
        return Run.objects.filter(pk__in=base.order_by("-number").values("pk")[:last])
    return base


def _bucket(n: int) -> str:
    for label, lo, hi in BUCKETS:
        if lo <= n <= hi:
            return label
    return BUCKETS[-1][0]


def score_traces(*, last: int | None = None, epoch: int | None = None) -> dict:
    """Score the stored traces; see the module docstring for the shape. Six queries."""
    runs = _runs(last, epoch)
    run_ids = runs.values("pk")

    # 1. runs per status and halt reason
    status_rows = list(runs.values("status", "halt_reason").annotate(n=Count("pk")))
    by_status: Counter = Counter()
    halts: Counter = Counter()
    for r in status_rows:
        by_status[r["status"]] += r["n"]
        if r["status"] == "halted" and r["halt_reason"]:
            halts[r["halt_reason"]] += r["n"]
    total = sum(by_status.values())

    # 2. turns per run (agent call and text steps; distinct turn numbers)
    turn_rows = list(
        Step.objects.filter(run_id__in=run_ids, actor="agent", kind__in=["call", "text"])
        .values("run_id").annotate(turns=Count("turn", distinct=True))
    )
    hist = Counter(_bucket(r["turns"]) for r in turn_rows)
    hist["0"] += total - len(turn_rows)
    histogram = [{"turns": label, "runs": hist.get(label, 0)} for label, _, _ in BUCKETS]

    # 3. agent calls by outcome and reason code
    call_rows = list(
        Step.objects.filter(run_id__in=run_ids, kind="call", actor="agent")
        .values("outcome", "reason_code").annotate(n=Count("pk"), runs=Count("run_id", distinct=True))
    )
    agent_calls = sum(r["n"] for r in call_rows)
    refusals: Counter = Counter()
    for r in call_rows:
        if r["outcome"] in ("refused", "halted") and r["reason_code"]:
            refusals[r["reason_code"]] += r["n"]

    # 4. runs with a forbidden / forged attempt (distinct across codes needs its own count)
    attempt = Step.objects.filter(run_id__in=run_ids, kind="call", actor="agent").aggregate(
        forbidden_runs=Count("run_id", distinct=True, filter=Q(reason_code="forbidden_tool")),
        forged_runs=Count("run_id", distinct=True, filter=Q(reason_code="forged_observation")),
    )

    # 5. side effects that ran, by tool, actor and outcome; approvals by status
    se_rows = list(
        Step.objects.filter(run_id__in=run_ids, kind="call", tool__in=SIDE_EFFECT_TOOLS,
                            outcome__in=["executed", "approved_executed"])
        .values("tool", "actor", "outcome").annotate(n=Count("pk")).order_by("tool", "actor")
    )
    side: dict[tuple[str, str], dict] = {}
    for r in se_rows:
        row = side.setdefault((r["tool"], r["actor"]), {"tool": r["tool"], "actor": r["actor"],
                                                        "with_approval": 0, "without_approval": 0})
        row["with_approval" if r["outcome"] == "approved_executed" else "without_approval"] += r["n"]
    approvals = dict(Approval.objects.filter(run_id__in=run_ids).values_list("status").annotate(n=Count("pk")))

    # 6. entailment flags (the newest flagged runs; the count comes with them)
    flagged_qs = runs.exclude(entailment_flags=[]).order_by("-number")
    flagged = list(flagged_qs.values("number", "entailment_flags", "final_answer")[:FLAGGED_SHOWN])
    flagged_count = len(flagged)
    if flagged_count == FLAGGED_SHOWN:
        flagged_count = flagged_qs.count()  # a seventh query only when more may exist

    def rate(code: str) -> float:
        return round(refusals.get(code, 0) / agent_calls, 4) if agent_calls else 0.0

    side_rows = list(side.values())
    return {
        "runs": total,
        "by_status": dict(sorted(by_status.items())),
        "step_histogram": histogram,
        "halt_reasons": dict(halts.most_common()),
        "calls": agent_calls,
        "forbidden": {"attempts": refusals.get("forbidden_tool", 0), "rate": rate("forbidden_tool"),
                      "runs": attempt["forbidden_runs"]},
        "forged": {"attempts": refusals.get("forged_observation", 0), "rate": rate("forged_observation"),
                   "runs": attempt["forged_runs"]},
        "refusals": dict(refusals.most_common()),
        "side_effects": side_rows,
        "side_effects_with_approval": sum(r["with_approval"] for r in side_rows),
        "side_effects_without_approval": sum(r["without_approval"] for r in side_rows),
        "approvals": dict(sorted(approvals.items())),
        "entailment": {"flagged_runs": flagged_count,
                       "rate": round(flagged_count / total, 4) if total else 0.0,
                       "newest": [{"run": f["number"], "flags": f["entailment_flags"],
                                   "claims": flagged_claims(f["final_answer"], f["entailment_flags"])}
                                  for f in flagged]},
    }


def format_table(score: dict) -> str:
    """The score as plain-text tables (what ``manage.py score_traces`` prints)."""
    out = [f"runs scored: {score['runs']}   agent calls: {score['calls']}",
           "status: " + (", ".join(f"{k} {v}" for k, v in score["by_status"].items()) or "none"), "",
           "turns per run   runs"]
    peak = max((r["runs"] for r in score["step_histogram"]), default=0) or 1
    for row in score["step_histogram"]:
        bar = "#" * round(30 * row["runs"] / peak) if row["runs"] else ""
        out.append(f"{row['turns']:>13}   {row['runs']:>4}  {bar}")
    out += ["", "halt reason            runs"]
    out += [f"{code:<22} {n:>5}" for code, n in score["halt_reasons"].items()] or ["(none)"]
    out += ["", "attempt                attempts   rate    runs"]
    for label in ("forbidden", "forged"):
        a = score[label]
        out.append(f"{label:<22} {a['attempts']:>8}   {a['rate']:>6.1%} {a['runs']:>5}")
    out += ["", "refusal code           calls"]
    out += [f"{code:<22} {n:>5}" for code, n in score["refusals"].items()] or ["(none)"]
    out += ["", "side effect          actor      with approval  without"]
    out += [f"{r['tool']:<20} {r['actor']:<10} {r['with_approval']:>13}  {r['without_approval']:>7}"
            for r in score["side_effects"]] or ["(none ran)"]
    out.append("approvals: " + (", ".join(f"{k} {v}" for k, v in score["approvals"].items()) or "none"))
    ent = score["entailment"]
    out += ["", f"entailment flags: {ent['flagged_runs']} run(s) ({ent['rate']:.1%})"]
    out += [f"  run {f['run']}: {', '.join(f['flags'])}" for f in ent["newest"]]
    return "\n".join(out)
