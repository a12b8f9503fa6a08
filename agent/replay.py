"""Scenario replay: run one scenario file through the real observe cycle and report from its rows.

Format: ``docs/replay.md`` (checked by ``agent.scenario_file``, re-exported here).
:func:`run_scenario` sets up the world in the *current* database (the ``replay`` management
command points that at a throwaway SQLite file first; tests use pytest's test database), routes
``get_provider()`` and the demand source to the file's fleet and demand, swaps in a virtual clock
that starts at the file's ``now``, runs ``agent.loop.run_cycle`` (the entry point the Celery task
calls), answers parked approvals as the file's ``operator`` says and resumes, then plays each
``timeline`` moment (clock, demand, fleet, objectives, operator decisions dispatched at once, a
heartbeat cycle unless ``run`` is ``none``) — :class:`Replay`. The report is built from the Run,
Step, Approval and Alert rows those cycles wrote, plus the provider's final fleet and request
counts. :func:`match_expect` compares a report with the file's ``expect``.
"""

from __future__ import annotations

import contextlib
import json
from datetime import timedelta

from agent.scenario_file import (  # noqa: F401 — the file format is re-exported for callers of replay
    ALERT_KINDS,
    HALT_CODES,
    REASON_CODES,
    CallExpect,
    ExpectSpec,
    Moment,
    Scenario,
    ScenarioFileError,
    load_scenario,
)

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
OPERATOR_USERNAME = "replay-operator"


# ------------------------------------------------------------------------------------------------
# the world


def setup_world(sc: Scenario, provider) -> None:
    """Write the scenario's starting state into the current database, on the current (virtual) clock.

    Instance rows from ``fleet`` (not for ``known: false`` entries; ``created_at``/``status_since``
    from ``age_min``/``status_age_min``; ``worker_name`` and ``ssh_host`` = the instance id),
    healthy Diagnosis rows for ``diagnosed_min_ago``, SideEffect and AuditLog rows for ``history``
    (``state: claimed`` leaves the SideEffect ``claimed``; a done destroy or stop records the
    instance's destroy- or stop-requested time), the session anchor's objectives, policy
    overrides and observe-only switch. Also an operator user who answers approvals.
    """
    from django.contrib.auth.models import Group, User

    from agent.models import AuditLog, SessionState, SideEffect
    from fleet.clock import clock
    from fleet.models import Diagnosis, Instance

    now = clock.now()
    state = SessionState.get()
    set_objectives(state, sc.objectives)
    overrides = dict(state.overrides or {})
    overrides["policy"] = {**overrides.get("policy", {}), **file_policy(sc.policy)}
    state.overrides = overrides
    state.observe_only = sc.session.observe_only
    state.save()

    by_id = {}
    for f in sc.fleet:
        if not f.known:
            continue  # the provider lists it; our database has no row (a lost launch answer)
        created = now - timedelta(minutes=f.age_min)
        status_age = f.status_age_min if f.status_age_min is not None else f.age_min
        by_id[f.id] = Instance.objects.create(
            provider=f.provider or provider.name,
            external_id=f.id,
            label=f.id,
            gpu_name=f.gpu_name,
            status=f.actual_status,
            intended_status=f.intended_status,
            status_msg=f.status_msg,
            status_since=now - timedelta(minutes=status_age),
            dph=f.dph,
            ssh_host=f.id if f.ssh is not None else "",
            ssh_port=22 if f.ssh is not None else None,
            worker_name=f.id,
            created_at=created,
            started_at=created,
        )
        if f.diagnosed_min_ago is not None:
            Diagnosis.objects.create(
                instance=by_id[f.id],
                taken_at=now - timedelta(minutes=f.diagnosed_min_ago),
                health="healthy",
                fault_class="",
                cause="on record (scenario)",
                source="ssh",
                evidence={},
            )
    requested_field = {"destroy_instance": "destroy_requested_at", "stop_instance": "stop_requested_at"}
    instance_fields = {f.name for f in Instance._meta.get_fields()}
    for n, h in enumerate(sc.history):
        at = now - timedelta(minutes=h.min_ago)
        if h.tool == "launch_instance":
            gpu = next((f.gpu_name for f in sc.fleet if f.id == h.instance), "")
            args = {"gpu_name": gpu, "launch_priority": "P1", "reason": "scenario history"}
        else:
            args = {"instance_id": h.instance or "", "reason": "scenario history"}
        claimed = h.state == "claimed"
        SideEffect.objects.create(
            key=f"history:{n}",
            tool=h.tool,
            args=args,
            instance_ref=h.instance or "",
            status="claimed" if claimed else "done",
            result="" if claimed else "(scenario history)",
            actor="agent",
            claimed_at=at,
            finished_at=None if claimed else at,
        )
        AuditLog.objects.create(
            at=at, actor="agent", verb=h.tool, target=h.instance or "",
            reason="scenario history" + (" (claimed, never finished)" if claimed else ""), after=args,
        )
        field = requested_field.get(h.tool)
        if not claimed and field in instance_fields and h.instance in by_id:
            Instance.objects.filter(pk=by_id[h.instance].pk).update(**{field: at})
    user, _ = User.objects.get_or_create(username=OPERATOR_USERNAME)
    group, _ = Group.objects.get_or_create(name="operators")
    user.groups.add(group)


def file_policy(policy: dict) -> dict:
    """The file's ``policy`` as overrides: naming ``TOOL`` replaces the product's default for every
    priority key of that tool the file does not name (``launch_instance: approval`` also covers
    ``:P0``). ``TOOL:monitor`` keys are left alone: the monitor keeps its own default unless the
    file names that key (``forbidden`` on ``TOOL`` binds it anyway, in the pipeline)."""
    from agent.policy import DEFAULT_POLICY

    out = dict(policy)
    for key in DEFAULT_POLICY:
        tool, _, qual = key.partition(":")
        if qual and qual != "monitor" and tool in policy and key not in policy:
            out[key] = policy[tool]
    return out


def set_objectives(state, objectives: dict) -> None:
    """Set ``objectives`` on the session anchor as an operator would (``target_proofs_hr`` on the
    anchor, the rest merged into its objectives). The caller saves ``state``."""
    merged = dict(state.objectives or {})
    merged.update(objectives)
    state.objectives = merged
    if objectives.get("target_proofs_hr") is not None:
        state.target_proofs_hr = float(objectives["target_proofs_hr"])


def provider_name(sc: Scenario) -> str:
    """The name the scenario provider registers under: the fleet's one provider name, else ``scenario``.

    Instance rows carry it, so ``get_provider(instance.provider)`` reaches the scenario provider and
    an ``ssh`` fleet is an operator-owned one (``Instance.is_owned_host``).
    """
    names = {f.provider for f in sc.fleet}
    return names.pop() if len(names) == 1 else "scenario"


class World:
    """The replay's stand-ins for one file: ``provider`` (the scenario provider), ``demand``
    (the scenario demand source) and ``clock`` (the virtual clock)."""

    def __init__(self, provider, demand, clock):
        self.provider, self.demand, self.clock = provider, demand, clock

    def move_to(self, at) -> None:
        """Move the virtual clock forward to ``at`` (never back: sleeps may have passed it)."""
        ahead = (at - self.clock.now()).total_seconds()
        if ahead > 0:
            self.clock.advance(ahead)

    def change_fleet(self, entries) -> None:
        """Apply a moment's ``fleet`` changes at the provider and to Curio's view of the workers."""
        for e in entries:
            data = e.model_dump(exclude_none=True)
            self.provider.put(data)
            mine = next((f for f in self.demand.fleet if f["id"] == e.id), None)
            if mine is None:
                mine = {"id": e.id}
                self.demand.fleet.append(mine)
            if e.worker is not None:
                mine["worker"] = e.worker.model_dump()
            elif e.gone:
                mine.pop("worker", None)  # a machine the provider no longer has runs no worker


@contextlib.contextmanager
def isolated(sc: Scenario):
    """The replay's world for the ``with`` block: virtual clock at ``now``, scenario provider and
    demand source, no broadcasts (the ``changed`` signal's receivers are detached), no Celery
    broker, product-default policy (``WARDEN_UNATTENDED`` ignored). Yields the provider (its
    :class:`World` is its ``world`` attribute)."""
    from django.conf import settings

    from fleet import demand as demand_mod
    from fleet import providers as providers_mod
    from fleet.clock import VirtualClock, use_clock
    from fleet.demand.scenario import ScenarioDemandSource
    from fleet.events import changed
    from fleet.providers.scenario import FaultBook, ScenarioProvider

    vclock = VirtualClock(sc.now)
    saved_receivers = changed.receivers
    saved_unattended = settings.WARDEN.get("UNATTENDED")
    changed.receivers = []
    changed.sender_receivers_cache.clear()
    settings.WARDEN["UNATTENDED"] = False
    try:
        with use_clock(vclock):
            fleet = [f.model_dump() for f in sc.fleet]
            faults = FaultBook([f.model_dump() for f in sc.provider_faults])
            provider = ScenarioProvider(fleet, [o.model_dump() for o in sc.offers], faults, name=provider_name(sc))
            source = ScenarioDemandSource(sc.demand.model_dump(), fleet)
            provider.world = World(provider, source, vclock)
            providers_mod.set_override(provider)
            demand_mod.set_override(source)
            yield provider
    finally:
        providers_mod.set_override(None)
        demand_mod.set_override(None)
        settings.WARDEN["UNATTENDED"] = saved_unattended
        changed.receivers = saved_receivers
        changed.sender_receivers_cache.clear()


# ------------------------------------------------------------------------------------------------
# running


def make_planner(sc: Scenario, raw: dict, *, cycle: int = 0):
    """The planner the file names for ``cycle``: ``ScriptPlanner`` (the file's steps verbatim in
    cycle 0, nothing later), ``RulesPlanner()``, or for ``llm`` an ``LlmPlanner`` against a
    stand-in server playing ``model_responses`` in cycle 0 (nothing later)."""
    if sc.planner == "script":
        from agent.planners.script import ScriptPlanner

        return ScriptPlanner(raw["steps"] if cycle == 0 else [])
    if sc.planner == "rules":
        from agent.planners.rules import RulesPlanner

        return RulesPlanner()
    if cycle > 0:  # like `script`: the recorded responses belong to cycle 0 (and its resumes)
        from agent.planners.script import ScriptPlanner

        return ScriptPlanner([])
    return llm_planner(sc.model_responses or [])


#: seconds the `llm` planner waits for the stand-in in replay (a `{"timeout": true}` entry)
REPLAY_MODEL_TIMEOUT_S = 1.0


def llm_planner(responses: list):
    """An ``LlmPlanner`` pointed at a fresh :class:`agent.model_standin.StandIn` playing
    ``responses`` — the console's code path, the HTTP wire format included. The stand-in is the
    planner's ``standin`` attribute; :func:`run_scenario` stops it."""
    from django.conf import settings

    from agent.model_client import ModelConfig
    from agent.model_standin import StandIn
    from agent.planners.llm import LlmPlanner

    standin = StandIn(responses).start()
    m = settings.MODEL
    planner = LlmPlanner(ModelConfig(base_url=standin.base_url, model="standin", timeout_s=REPLAY_MODEL_TIMEOUT_S,
                                     max_tokens=m["MAX_TOKENS"], temperature=m["TEMPERATURE"],
                                     price_in=m["PRICE_IN"], price_out=m["PRICE_OUT"]))
    planner.standin = standin
    return planner


def _turn_index(runs) -> dict[tuple[int, int], int]:
    """(run id, turn) of each agent planner turn -> index into the file's ``steps`` (in order)."""
    from agent.models import Step

    turns = (
        Step.objects.filter(run__in=runs, actor="agent", kind__in=["call", "text"], turn__isnull=False)
        .order_by("run__number", "turn")
        .values_list("run_id", "turn")
        .distinct()
    )
    return {key: n for n, key in enumerate(dict.fromkeys(turns))}


def _decision_for(sc: Scenario, approval, turn_index: dict, used: set[int]) -> tuple[str, str]:
    step = approval.step
    idx = turn_index.get((step.run_id, step.turn))
    for n, d in enumerate(sc.operator.decisions):
        if d.step is not None:
            if step.actor != "agent" or idx != d.step or (d.call or 0) != step.position:
                continue
        else:
            if d.tool != approval.tool:
                continue
            if d.args and not _args_agree(d.args, approval.args or step.args):
                continue
        used.add(n)
        return d.decision, d.comment
    return sc.operator.default, ""


class Replay:
    """Drives one file: cycle 0, then each timeline moment; remembers which cycle wrote which step.

    ``cycle_marks`` is a list of ``(last Step pk, cycle)``: steps up to that pk were written in
    that cycle. ``runs`` maps a run's pk to the planner that drives it (resumes reuse it).
    """

    def __init__(self, sc: Scenario, raw: dict, provider, *, path: str = ""):
        from agent.models import Run

        self.sc, self.raw, self.provider, self.path = sc, raw, provider, path
        self.first = (Run.objects.order_by("-number").values_list("number", flat=True).first() or 0) + 1
        self.planners: dict[int, object] = {}
        self.cycle0_run = None
        self.last_run = None
        self.cycles = 0
        self.cycle_marks: list[tuple[int, int]] = []
        self.used: set[int] = set()  # top-level decisions that named a parked call
        self.seen: set[int] = set()  # approvals the top-level operator already answered (or left)

    def runs(self):
        from agent.models import Run

        return Run.objects.filter(number__gte=self.first)

    def mark(self, cycle: int) -> None:
        from agent.models import Step

        last = Step.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        self.cycle_marks.append((last, cycle))

    def heartbeat(self, cycle: int) -> None:
        """One observe cycle (observe, monitor, planner), then the top-level operator's answers."""
        from agent.loop import run_cycle

        planner = make_planner(self.sc, self.raw, cycle=cycle)
        run = run_cycle("replay", planner=planner)
        if run is None:
            raise RuntimeError("run_cycle returned None: the run lock is held in a fresh database")
        self.cycles += 1
        self.planners[run.pk] = planner
        self.last_run = run
        if cycle == 0:
            self.cycle0_run = run
        self.answer_top_level()

    def answer_top_level(self) -> None:
        """Answer approvals parked in this cycle as the file's top-level ``operator`` says, resume."""
        from agent.approvals import do_decide
        from agent.models import Approval

        for _ in range(100):
            waiting = [
                a for a in Approval.objects.filter(run__in=self.runs(), status="waiting").select_related("step")
                .order_by("created_at", "id") if a.pk not in self.seen
            ]
            cycle0 = [self.cycle0_run] if self.cycle0_run is not None else []
            turn_index = _turn_index(cycle0)
            decided: dict[int, object] = {}
            for a in waiting:
                self.seen.add(a.pk)
                decision, comment = _decision_for(self.sc, a, turn_index, self.used)
                if decision == "none":
                    continue
                do_decide(a, decision, f"user:{OPERATOR_USERNAME}", comment or f"replay operator: {decision}")
                decided[a.run_id] = a.run
            if not decided:
                return
            self.resume(decided.values())

    def resume(self, runs) -> None:
        from agent.loop import resume_run

        for run in runs:
            run.refresh_from_db()
            planner = self.planners.get(run.pk) or make_planner(self.sc, self.raw, cycle=1)
            self.last_run = resume_run(run, planner=planner) or run

    def moment(self, n: int, m: Moment) -> None:
        """Timeline moment ``n`` (cycle ``n + 1``): clock, demand, fleet, objectives, decisions, cycle."""
        from agent.loop import _settle_expired, expire_approvals
        from agent.models import SessionState

        world = self.provider.world
        world.move_to(self.sc.now + timedelta(minutes=m.at_min))
        if m.demand is not None:
            world.demand.demand = m.demand.model_dump()
        if m.fleet:
            world.change_fleet(m.fleet)
        if m.objectives:
            state = SessionState.get()
            set_objectives(state, m.objectives)
            state.save()
        if m.operator and m.operator.decisions:
            for parked in expire_approvals():  # what the next beat would settle first
                _settle_expired(parked)
            self.decide_at(n, m)
        if m.run == "heartbeat":
            self.heartbeat(n + 1)

    def decide_at(self, n: int, m: Moment) -> None:
        """The moment's operator decisions: each answers the approvals of its tool (and args) that
        wait now; approved calls are dispatched at once (guards re-checked) by resuming their runs.

        Raises :class:`ScenarioFileError` for a decision naming a call that was never parked, or
        one that fits several waiting calls with different arguments (give ``args`` keys).
        """
        from agent.approvals import DecisionError, do_decide
        from agent.models import Approval
        from agent.tools import canonical_json

        resume: dict[int, object] = {}
        for k, d in enumerate(m.operator.decisions):
            where = f"{self.path or self.sc.name}: timeline[{n}].operator.decisions[{k}]"
            ever = [a for a in Approval.objects.filter(run__in=self.runs(), tool=d.tool).select_related("run", "step")
                    .order_by("created_at", "id") if not d.args or _args_agree(d.args, a.args)]
            if not ever:
                raise ScenarioFileError(f"{where}: names {d.tool}, which was never parked")
            waiting = [a for a in ever if a.status == "waiting"]
            if len({canonical_json({k2: v for k2, v in (a.args or {}).items() if k2 != "reason"}) for a in waiting}) > 1:
                raise ScenarioFileError(
                    f"{where}: {len(waiting)} {d.tool} calls with different arguments wait; add args keys to say which"
                )
            for a in waiting:  # none waiting: it was decided, voided or expired before this moment
                self.seen.add(a.pk)
                try:
                    do_decide(a, d.decision, f"user:{OPERATOR_USERNAME}", d.comment or f"replay operator: {d.decision}")
                except DecisionError:
                    continue
                resume[a.run_id] = a.run
        self.resume(resume.values())
        self.answer_top_level()

    def unused_decisions(self) -> None:
        """Raise :class:`ScenarioFileError` for a top-level decision that named no parked call."""
        unused = [n for n in range(len(self.sc.operator.decisions)) if n not in self.used]
        if unused:
            d = self.sc.operator.decisions[unused[0]]
            named = f"step {d.step}" + (f" call {d.call}" if d.call is not None else "") if d.step is not None else f"tool {d.tool}"
            raise ScenarioFileError(
                f"{self.path or self.sc.name}: operator.decisions[{unused[0]}]: names {named}, which was never parked"
            )


def run_scenario(sc: Scenario, raw: dict, *, path: str = "") -> dict:
    """Set up the world, run cycle 0, answer approvals and resume, then play the ``timeline``;
    returns the report (with ``ok``).

    Uses the current database (call it on a throwaway one). Raises :class:`ScenarioFileError`
    when an operator decision names a call that was never parked.
    """
    with isolated(sc) as provider:
        setup_world(sc, provider)
        replay = Replay(sc, raw, provider, path=path)
        try:
            replay.heartbeat(0)
            replay.mark(0)
            for n, m in enumerate(sc.timeline):
                replay.moment(n, m)
                replay.mark(n + 1)
            replay.unused_decisions()
        finally:
            for planner in replay.planners.values():
                if getattr(planner, "standin", None) is not None:
                    planner.standin.stop()
        report = build_report(replay.runs().order_by("number"), name=sc.name, cycle_marks=replay.cycle_marks,
                              last=replay.last_run)
        report["final_fleet"] = provider.statuses()
        report["provider_requests"] = provider.request_counts()
        report["cycles"] = replay.cycles
    report["mismatches"] = match_expect(report, sc.expect) if sc.expect is not None else []
    report["ok"] = not report["mismatches"]
    return report


# ------------------------------------------------------------------------------------------------
# the report


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

    Shape (SCENARIOS.md "Report"): ``{"name", "ok", "steps": [...], "alerts", "halt", "verdict",
    "final_report", "mismatches"}``. One entry per call with its final outcome (a parked call's
    later dispatch under the same idempotency key is folded into its entry); a parallel batch is
    one entry with ``calls``; text turns are entries with outcome ``text``. Entries carry ``i``,
    ``cycle`` (from ``cycle_marks``: ``(last Step pk, cycle)`` pairs; 0 without them),
    ``actor``, ``tool``, ``args``, ``outcome``, ``reason``, ``detail``, and ``parked: true`` when
    the call was ever parked for an operator. ``final_report`` is ``last``'s (default: the last
    run's).
    """
    from agent.models import Approval, Step
    from fleet.models import Alert

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


# ------------------------------------------------------------------------------------------------
# matching expect


def _args_agree(want: dict, have: dict | None) -> bool:
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
    if exp.args and not _args_agree(exp.args, call.get("args")):
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


# ------------------------------------------------------------------------------------------------
# printing


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
