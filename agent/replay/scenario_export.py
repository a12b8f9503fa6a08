"""Export a run's situation as a replay file (docs/replay.md, version 2), to rehearse a policy change.

"Export as scenario" on a run page (docs/operations.md, Rehearsing a change with replay) writes what the run saw — the fleet and demand of
its observation, the objectives, limits and policy in force, recent side effects (for hold-off and
launch-pending), fresh diagnoses with their SSH evidence, the policy and limits then in force
(operator overrides changed since are taken back from the audit log) — and what was proposed: a ``rules`` run
replays the ``rules`` planner on that situation; any other run replays its recorded calls as a
``script``. Operator decisions on its approvals are kept, by tool and arguments. The operator
edits ``policy`` or ``objectives`` and runs ``python manage.py replay FILE`` to see what Warden
would do then; no ``expect`` is written (a rehearsal is read, not asserted).

Limits of the record, stated in ``about``: per-instance worker liveness is not stored with a
run, so it is derived from the run's own ``list_instances`` calls when it made one, else from the
demand's live count (the first N running instances live). Secrets never leave: every text is
redacted again. The result is checked with the file format's own :class:`~agent.replay.file_format.Scenario`
before it is offered; a run that cannot be exported raises :class:`ScenarioExportError`.
"""

import json
from datetime import timedelta

from pydantic import ValidationError

from agent.models import Run, SessionState
from agent.policy.limits import FROM_ENV
from agent.policy.table import PRIORITIES, effective_limits, effective_policy
from agent.replay.file_format import Scenario
from agent.runtime.tools import PUBLIC_TOOLS
from fleet.models import AuditLog, Diagnosis, Instance
from fleet.secrets import redact, redact_obj

#: side effects listed in ``history`` (docs/replay.md: past actions, for hold-off and launch-pending)
HISTORY_TOOLS = ("launch_instance", "stop_instance", "resume_instance", "reboot_instance", "destroy_instance")
HISTORY_WINDOW = timedelta(hours=24)
PROVIDERS = ("vastai", "ssh", "local", "scenario")
STATUSES = ("created", "loading", "scheduling", "running", "stopped", "exited", "error", "unknown", "offline",
            "rebooting", "frozen")

#: the limits an exported scenario carries as objectives: the target, the env-set ones and the
#: lifecycle numbers (the rest are the product's defaults, which the replay applies anyway)
EXPORTED_LIMITS = {"target_proofs_hr", *FROM_ENV, "offline_grace_min", "provisioning_limit_min", "claim_max_age_min",
                   "rejection_hold_min", "starve_min"}


class ScenarioExportError(ValueError):
    """The run cannot be exported; the message says why (no observation, or the file would not load)."""


def _minutes(delta: timedelta) -> float:
    return round(min(max(delta.total_seconds() / 60, 0.0), 1e6), 2)


def _observation(run: Run) -> tuple[dict, object]:
    step = run.steps.filter(kind="observe").order_by("seq").first()
    if step is None:
        raise ScenarioExportError(f"run {run.number} has no observation (it ended before observing); nothing to export")
    try:
        return json.loads(step.observation), step.created_at
    except ValueError:
        raise ScenarioExportError(f"run {run.number}'s observation is not JSON; it cannot be exported") from None


def _workers_seen(run: Run) -> dict:
    """Per-instance worker views from the run's own ``list_instances`` observations."""
    seen = {}
    for obs in run.steps.filter(kind="call", tool="list_instances", ok=True).values_list("observation", flat=True):
        try:
            rows = json.loads(obs).get("instances") or []
        except (ValueError, AttributeError):
            continue
        for r in rows:
            if isinstance(r, dict) and isinstance(r.get("worker"), dict):
                w = r["worker"]
                seen[r.get("id")] = {"live": bool(w.get("live")), "unschedulable": bool(w.get("unschedulable")),
                                     "owned_tasks": max(0, int(w.get("owned_tasks") or 0))}
    return seen


def _demand(view: dict) -> dict:
    out = {"state": view.get("state") if view.get("state") in ("ok", "unknown", "stale") else "unknown"}
    for key in ("queued", "running", "workers_expected", "workers_live", "backlog"):
        if isinstance(view.get(key), int) and view[key] >= 0:
            out[key] = view[key]
    if isinstance(view.get("active"), bool):
        out["active"] = view["active"]
    if isinstance(view.get("idle_min"), (int, float)) and view["idle_min"] >= 0:
        out["idle_min"] = float(view["idle_min"])
    if isinstance(view.get("proof_s"), (int, float)) and view["proof_s"] > 0:
        out["proof_s"] = float(view["proof_s"])
    return out


def _fleet(summary: dict, now, run: Run, demand: dict) -> list[dict]:
    rows = {i.external_id: i for i in Instance.objects.filter(external_id__in=[e.get("id") for e in summary.get("instances", [])])}
    seen = _workers_seen(run)
    live_left = demand.get("workers_live") if demand["state"] == "ok" else None
    fleet = []
    for e in summary.get("instances", []):
        iid, inst = e.get("id"), rows.get(e.get("id"))
        status = e.get("status") if e.get("status") in STATUSES else "unknown"
        entry = {"id": iid, "provider": inst.provider if inst and inst.provider in PROVIDERS else "scenario",
                 "actual_status": status, "gpu_name": str(e.get("gpu") or "")[:64], "dph": max(0.0, float(e.get("dph") or 0))}
        if inst is not None:
            if inst.intended_status in ("running", "stopped", "destroyed"):
                entry["intended_status"] = inst.intended_status
            entry["age_min"] = _minutes(now - inst.created_at)
            if inst.status_since <= now:
                entry["status_age_min"] = _minutes(now - inst.status_since)
            diag = (Diagnosis.objects.filter(instance=inst, taken_at__lte=now).order_by("-taken_at").first())
            if diag is not None:
                if diag.health == "healthy":
                    entry["diagnosed_min_ago"] = _minutes(now - diag.taken_at)
                commands = {str(cmd)[:200]: {"rc": int(v.get("rc") or 0), "out": redact(str(v.get("out") or ""))}
                            for cmd, v in (diag.evidence or {}).items()
                            if isinstance(v, dict) and isinstance(v.get("rc", 0), int)}
                if diag.source == "ssh" and commands:
                    entry["ssh"] = {"reachable": True, "commands": commands}
        if iid in seen:
            entry["worker"] = seen[iid]
        elif live_left is not None:
            live = status == "running" and live_left > 0
            live_left -= live
            entry["worker"] = {"live": live, "unschedulable": False, "owned_tasks": 0}
        fleet.append(entry)
    return fleet


def _history(now, fleet_ids: set) -> list[dict]:
    rows = AuditLog.objects.filter(verb__in=HISTORY_TOOLS, at__lte=now, at__gte=now - HISTORY_WINDOW,
                                   target__in=fleet_ids).order_by("at")
    return [{"min_ago": _minutes(now - r.at), "tool": r.verb, "instance": r.target} for r in rows]


def _policy(table: dict) -> dict:
    out = {}
    for key, value in table.items():
        tool, _, qual = key.partition(":")
        if (tool in PUBLIC_TOOLS and (not qual or qual == "monitor" or (tool == "launch_instance" and qual in PRIORITIES))
                and value in ("auto", "approval", "forbidden")):
            out[key] = value
    return out


def _args(step) -> dict:
    args = dict(step.args or {})
    if step.call_reason and "reason" not in args:
        args["reason"] = step.call_reason
    return redact_obj(args)


def _steps(run: Run) -> list[dict]:
    """The run's planner turns as script steps: a call, a parallel batch, or text."""
    turns: dict[int, list] = {}
    for s in run.steps.filter(kind__in=("call", "text"), actor="agent", turn__isnull=False).order_by("seq"):
        turns.setdefault(s.turn, []).append(s)
    steps = []
    for _, group in sorted(turns.items()):
        calls = [s for s in group if s.kind == "call"]
        if not calls:
            steps.append({"text": redact(group[-1].text or "")})
            continue
        specs = [{"tool": s.tool, "args": _args(s)} if s.args is not None else {"tool": s.tool, "raw_arguments": redact(s.raw_arguments)}
                 for s in calls]
        steps.append({"parallel": specs} if len(specs) > 1 or calls[0].batch else specs[0])
    return steps


def _decisions(run: Run) -> list[dict]:
    out = []
    for a in run.approvals.filter(status__in=("approved", "rejected", "executed", "failed", "void")).exclude(decided_at=None):
        decision = "reject" if a.status == "rejected" else "approve"
        args = {k: v for k, v in (a.args or {}).items() if k != "reason"}
        out.append({"tool": a.tool, "args": redact_obj(args), "decision": decision, "comment": redact(a.comment or "")[:2000]})
    return out


def _state_then(now) -> SessionState:
    """The anchor as it was at ``now``: operator overrides changed since are put back from the
    ``before`` of the first ``update_overrides`` audit row after ``now`` (unsaved copy)."""
    state = SessionState.get()
    later = AuditLog.objects.filter(verb="update_overrides", at__gt=now).order_by("at", "id").first()
    if later is not None and isinstance(later.before, dict):
        state.overrides = {**(state.overrides or {}), "policy": later.before.get("policy") or {},
                           "limits": later.before.get("limits") or {}}
    return state


def export_run(run: Run) -> dict:
    """The replay file (a JSON-shaped dict, version 2) for ``run``.

    Raises :class:`ScenarioExportError` when the run has no observation or the file would not pass
    the file format's checks (the message names the field)."""
    summary, observed_at = _observation(run)
    now = observed_at or run.started_at
    state = _state_then(now)
    limits = effective_limits(state).values
    objectives = {k: limits[k] for k in sorted(EXPORTED_LIMITS) if isinstance(limits.get(k), (int, float))}
    if isinstance(summary.get("target_proofs_hr"), (int, float)):
        objectives["target_proofs_hr"] = summary["target_proofs_hr"]
    demand = _demand(summary.get("demand") or {})
    fleet = _fleet(summary, now, run, demand)
    rules = run.planner == "rules"
    data = {
        "name": f"run-{run.number}",
        "about": redact(f"Exported from run {run.number} (trigger {run.trigger}, planner {run.planner or 'none'}, "
                        f"{run.status}{', halted: ' + run.halt_reason if run.halt_reason else ''}). Fleet and demand as "
                        "the run observed them; worker liveness from its list_instances calls, else from the demand's "
                        "live count. Edit policy or objectives and replay to rehearse a change."),
        "now": now.isoformat().replace("+00:00", "Z"),
        "objectives": objectives,
        "policy": _policy(effective_policy(state)),
        "fleet": fleet,
        "demand": demand,
        "history": _history(now, {e["id"] for e in fleet}),
        "planner": "rules" if rules else "script",
        "operator": {"default": "none", "decisions": _decisions(run)},
        "session": {"observe_only": bool(state.observe_only)},
    }
    if not rules:
        data["steps"] = _steps(run) or [{"text": "nothing to do"}]
    try:
        Scenario.model_validate(json.loads(json.dumps(data)))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ScenarioExportError(f"run {run.number} cannot be exported: {where}: {err['msg']}") from None
    return data
