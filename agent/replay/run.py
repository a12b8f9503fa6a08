"""Running a scenario: the planner a file asks for, the operator's answers to parked approvals, the timeline's moments, each through the real observe cycle."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings

from agent.model.model_client import ModelConfig
from agent.model.model_standin import StandIn
from agent.models import Approval, Run, SessionState, Step
from agent.planners.llm import LlmPlanner
from agent.planners.rules import RulesPlanner
from agent.planners.script import ScriptPlanner
from agent.replay.file_format import (
    Moment,
    Scenario,
    ScenarioFileError,
)
from agent.replay.report import args_agree, build_report, match_expect
from agent.replay.world import OPERATOR_USERNAME, isolated, set_objectives, setup_world
from agent.runtime.approvals import DecisionError, do_decide
from agent.runtime.loop import _settle_expired, expire_approvals, resume_run, run_cycle
from agent.runtime.tools import canonical_json


def make_planner(sc: Scenario, raw: dict, *, cycle: int = 0):
    """The planner the file names for ``cycle``: ``ScriptPlanner`` (the file's steps verbatim in
    cycle 0, nothing later), ``RulesPlanner()``, or for ``llm`` an ``LlmPlanner`` against a
    stand-in server playing ``model_responses`` in cycle 0 (nothing later)."""
    if sc.planner == "script":
        return ScriptPlanner(raw["steps"] if cycle == 0 else [])
    if sc.planner == "rules":
        return RulesPlanner()
    if cycle > 0:  # like `script`: the recorded responses belong to cycle 0 (and its resumes)
        return ScriptPlanner([])
    return llm_planner(sc.model_responses or [])


#: seconds the `llm` planner waits for the stand-in in replay (a `{"timeout": true}` entry)
REPLAY_MODEL_TIMEOUT_S = 1.0


def llm_planner(responses: list):
    """An ``LlmPlanner`` pointed at a fresh :class:`agent.model.model_standin.StandIn` playing
    ``responses`` — the console's code path, the HTTP wire format included. The stand-in is the
    planner's ``standin`` attribute; :func:`run_scenario` stops it."""
    standin = StandIn(responses).start()
    m = settings.MODEL
    planner = LlmPlanner(ModelConfig(base_url=standin.base_url, model="standin", timeout_s=REPLAY_MODEL_TIMEOUT_S,
                                     max_tokens=m["MAX_TOKENS"], temperature=m["TEMPERATURE"],
                                     price_in=m["PRICE_IN"], price_out=m["PRICE_OUT"]))
    planner.standin = standin
    return planner


def _turn_index(runs) -> dict[tuple[int, int], int]:
    """(run id, turn) of each agent planner turn -> index into the file's ``steps`` (in order)."""
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
            if d.args and not args_agree(d.args, approval.args or step.args):
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
        return Run.objects.filter(number__gte=self.first)

    def mark(self, cycle: int) -> None:
        last = Step.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        self.cycle_marks.append((last, cycle))

    def heartbeat(self, cycle: int) -> None:
        """One observe cycle (observe, monitor, planner), then the top-level operator's answers."""
        planner = self.planner_for(cycle)
        run = run_cycle("replay", planner=planner)
        if run is None:
            raise RuntimeError("run_cycle returned None: the run lock is held in a fresh database")
        self.cycles += 1
        self.planners[run.pk] = planner
        self.last_run = run
        if cycle == 0:
            self.cycle0_run = run
        self.answer_top_level()

    def planner_for(self, cycle: int):
        """The planner of ``cycle``: the file's own (script, rules or recorded model responses)."""
        return make_planner(self.sc, self.raw, cycle=cycle)

    def answer_top_level(self) -> None:
        """Answer approvals parked in this cycle as the file's top-level ``operator`` says, resume."""
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
        for run in runs:
            run.refresh_from_db()
            planner = self.planners.get(run.pk) or make_planner(self.sc, self.raw, cycle=1)
            self.last_run = resume_run(run, planner=planner) or run

    def moment(self, n: int, m: Moment) -> None:
        """Timeline moment ``n`` (cycle ``n + 1``): clock, demand, fleet, objectives, decisions, cycle."""
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
        resume: dict[int, object] = {}
        for k, d in enumerate(m.operator.decisions):
            where = f"{self.path or self.sc.name}: timeline[{n}].operator.decisions[{k}]"
            ever = [a for a in Approval.objects.filter(run__in=self.runs(), tool=d.tool).select_related("run", "step")
                    .order_by("created_at", "id") if not d.args or args_agree(d.args, a.args)]
            if not ever:
                raise ScenarioFileError(f"{where}: names {d.tool}, which was never parked")
            waiting = [a for a in ever if a.status == "waiting"]
            if len({canonical_json({k2: v for k2, v in (a.args or {}).items() if k2 != "reason"}) for a in waiting}) > 1:
                raise ScenarioFileError(
                    f"{where}: {len(waiting)} {d.tool} calls with different arguments wait; add args keys to say which"
                )
            # none waiting: it was decided, voided or expired before this moment
            self.decide_each(waiting, d, resume)
        self.resume(resume.values())
        self.answer_top_level()

    def decide_each(self, approvals, d, resume: dict) -> None:
        """Answer each of ``approvals`` with decision ``d`` (a timeline moment's, as the replay
        operator); the runs of those decided are added to ``resume`` (run pk → run). An approval
        that can no longer be decided (``DecisionError``: expired or voided meanwhile) is skipped."""
        for a in approvals:
            self.seen.add(a.pk)
            try:
                do_decide(a, d.decision, f"user:{OPERATOR_USERNAME}", d.comment or f"replay operator: {d.decision}")
            except DecisionError:
                continue
            resume[a.run_id] = a.run

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
