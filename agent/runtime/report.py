"""The honest final report, written by the runtime from the trace — never by the planner.

Never a plausible-looking made-up result: what was done (calls that
succeeded), what was refused and why, what is still waiting or failed, why the run stopped, and
the fleet's state. :func:`entailment_flags` marks instance ids and numbers in the planner's final
answer that appear in no observation of the run (the final answer must follow from observations the
runtime actually returned).
"""

import json
import re

from agent.chat.chat_answer import FALLBACK_NOTE, model_words
from agent.chat.verdicts import without_verdicts
from agent.models import Run
from fleet.models import Instance

# bounded repeats: a scan of the model's answer is linear (tests/test_regex_fuzz.py)
_ID = re.compile(r"\b[a-z]{1,40}-\d{1,20}\b")
_NUM = re.compile(r"(?<![\w.])\d{1,30}(?:\.\d{1,30})?(?![\w.])")


def _call(s) -> str:
    ident = (s.args or {}).get("instance_id")
    return f"{s.tool}({ident})" if ident else s.tool


def final_report(run: Run) -> str:
    """Plain-text report of ``run`` built from its steps (one query)."""
    steps = list(run.steps.filter(kind="call").order_by("seq"))
    done = [s for s in steps if s.outcome in ("executed", "approved_executed")]
    refused = [s for s in steps if s.outcome in ("refused", "halted")]
    errors = [s for s in steps if s.outcome == "error"]
    parked = [s for s in steps if s.outcome == "parked"]
    rejected = [s for s in steps if s.outcome in ("rejected", "expired")]
    lines = [f"Run {run.number} ({run.trigger}) — {run.status}" + (f": halted by {run.halt_reason}" if run.halt_reason else "")]
    seen = _observed(run)
    if seen.get("provider_error"):
        lines.append(f"Fleet read FAILED: {seen['provider_error']}; the fleet listed below is the last known state, not a fresh read.")
    demand = seen.get("demand") or {}
    if demand and demand.get("state") != "ok":
        lines.append(f"Demand was {demand.get('state')}: {demand.get('error') or 'no fresh read'} (counts unknown, not zero).")
    if run.halt_detail:
        lines.append(f"Why it stopped: {run.halt_detail}")

    lines.extend(run.steps.filter(kind="message", actor="system", text__startswith=FALLBACK_NOTE).values_list("text", flat=True))
    lines.append("Done: " + (", ".join(_call(s) + (" (approved)" if s.outcome == "approved_executed" else "") for s in done) or "nothing"))
    if refused:
        lines.append("Refused: " + "; ".join(f"{_call(s)} — {s.reason_code}: {s.detail}" for s in refused))
    if errors:
        lines.append("Failed: " + "; ".join(f"{_call(s)} — {s.detail}" for s in errors))
    if rejected:
        lines.append("Not approved: " + "; ".join(f"{_call(s)} — {s.outcome}: {s.detail}" for s in rejected))
    if parked:
        lines.append("Waiting for an operator: " + ", ".join(_call(s) for s in parked))
    if run.planner != "monitor" and (run.status in ("halted", "failed", "cancelled") or (run.status == "done" and run.verdict_action is None)):
        lines.append("Remains: the planner did not finish; the next cycle re-observes and decides again.")

    live = list(Instance.objects.filter(killed_at__isnull=True).order_by("id").values_list("external_id", "status"))
    lines.append("Fleet now: " + fleet_summary(live))
    return "\n".join(lines)


#: up to this many instances the report names each one; above, it counts them by status
NAME_EACH_UP_TO = 10
#: above NAME_EACH_UP_TO, a status with at most this many instances still names them (the odd ones out)
NAME_STATUS_UP_TO = 5


def fleet_summary(live: list[tuple[str, str]]) -> str:
    """``[(external_id, status)]`` as one readable line.

    Up to ``NAME_EACH_UP_TO`` instances: ``"v-1 running, v-2 exited"``. Above: counts by status,
    most first, naming the instances of a status only when it has at most ``NAME_STATUS_UP_TO``
    (``"1000 instances: 997 running; 3 exited (v-4, v-9, v-12)"``), so a large fleet reads in one
    line and what is unusual is still named.
    """
    if not live:
        return "no instances"
    if len(live) <= NAME_EACH_UP_TO:
        return ", ".join(f"{i} {st}" for i, st in live)
    by_status: dict[str, list[str]] = {}
    for ident, status in live:
        by_status.setdefault(status, []).append(ident)
    parts = []
    for status, ids in sorted(by_status.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        names = f" ({', '.join(ids)})" if len(ids) <= NAME_STATUS_UP_TO else ""
        parts.append(f"{len(ids)} {status}{names}")
    return f"{len(live)} instances: " + "; ".join(parts)


def _observed(run: Run) -> dict:
    """The runtime's observation of the cycle (its ``observe`` step), parsed; ``{}`` when absent."""
    text = run.steps.filter(kind="observe").order_by("seq").values_list("observation", flat=True).first()
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


#: planners whose proposals the runtime computes itself (their numbers are not the model's claims)
RUNTIME_PLANNERS = {"rules", "monitor"}


def runtime_text(run: Run) -> str:
    """What the runtime itself wrote in ``run``'s call steps, as one text: every refusal's or
    outcome's ``detail`` (guards, claims) and, for a deterministic planner (:data:`RUNTIME_PLANNERS`),
    its proposals' arguments and reasons ("want 4 workers", "past the 1 min dwell"). A model
    planner's arguments are its own claims, never evidence for them. One query."""
    own = run.planner in RUNTIME_PLANNERS
    parts = []
    for args, why, detail in run.steps.filter(kind="call").values_list("args", "call_reason", "detail"):
        parts.append(detail or "")
        if own:
            parts += [json.dumps(args, default=str) if args is not None else "", why or ""]
    return " ".join(p for p in parts if p)


def flagged_claims(answer: str, flags: list[str]) -> list[dict]:
    """Each flag with the sentence of ``answer`` that makes the claim: ``[{"flag", "claim"}]``
    (``claim`` at most 240 characters; empty for a flag about the verdict, which no sentence holds)."""
    text = without_verdicts(answer or "", sep=" ", strip=True).replace("\n", ". ")
    sentences = [x.strip() for x in text.split(". ") if x.strip()]
    out = []
    for flag in flags:
        claim = next((x for x in sentences if flag in x), "") if " " not in flag else ""
        out.append({"flag": flag, "claim": claim[:240]})
    return out


def entailment_flags(run: Run) -> list[str]:
    """Ids and numbers in ``run.final_answer`` that no observation of the run contains, nor any
    text the runtime itself computed in it (:func:`runtime_text`). The model's words only: the
    runtime's own note on refused and parked calls is not a claim to check."""

    answer = without_verdicts(model_words(run.final_answer))
    if not answer:
        return []
    corpus = " ".join(run.steps.exclude(observation="").values_list("observation", flat=True))
    corpus += " " + " ".join(run.steps.filter(kind="message").values_list("text", flat=True))
    corpus += " " + runtime_text(run)
    flags = []
    for token in set(_ID.findall(answer)) | set(_NUM.findall(_ID.sub(" ", answer))):
        if not re.search(rf"(?<![\w.-]){re.escape(token)}(?![\w-]|\.\d)", corpus):
            flags.append(token)
    if run.verdict_action and not run.steps.filter(
        kind="call", outcome__in=["executed", "approved_executed"],
        tool__in=["launch_instance", "stop_instance", "destroy_instance", "reboot_instance", "resume_instance"],
    ).exists():
        flags.append("verdict says action, but no side effect ran")
    return sorted(flags)
