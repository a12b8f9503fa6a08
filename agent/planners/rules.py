"""The ``rules`` planner: Warden's built-in, deterministic autoscaling policy (the default).

Policy (the autoscaler's rules of docs/contract.md and docs/money.md):
1. Scale on waiting work, never on a flag: with tasks queued or in Curio's pipeline backlog
   (backlog is demand, docs/replay.md), keep
   ``min(cap, queued + backlog, max(1, ceil(target / per-worker rate)))`` instances, the rate
   being ``3600 / proof_s`` (measured) or ``3600 / WARDEN_PROOF_SECONDS``; launch the missing
   ones — ``P0`` when no worker is live (an emergency), ``P1`` otherwise.
2. Replace, don't scale down, terminal instances (exited/error/unknown/offline, stuck
   provisioning, or diagnosed failed/host): destroy them; the replacement follows from rule 1.
3. Expected workers that are dead are diagnosed first, then acted on by the diagnosis' class
   (docs/operations.md, Diagnosis): ``host`` (failed, on the machine's own evidence) → replaced (destroyed; rule 1
   launches the replacement) and the machine remembered as bad; ``container`` or ``app`` →
   rebooted; ``network`` (SSH unreachable) → diagnosed again after ``network_recheck_min``, never
   destroyed or rebooted on one failure. With nothing live and work queued, escalated.
4. Retire idle workers only when demand is ``ok``, nothing is queued, in the backlog or running, no expected
   worker is dead, the queue has been empty for the dwell and no launch happened within the
   hold-off; diagnose each first, then stop those diagnosed healthy (they own no tasks). A stopped
   instance is resumed before a new one is rented when work comes back (rule 1). Under the same
   conditions an instance stopped longer than ``stopped_destroy_h`` (it still pays for its disk)
   is diagnosed, then proposed for destruction (``destroy_instance``: approval by default).
5. Never retire while demand is unknown or stale.
6. Never propose again what already waits for an operator's approval (:func:`not_waiting`).
It proposes; the guards, policy and approvals still decide (nothing here bypasses them).
"""

from dataclasses import dataclass, field
from datetime import timedelta

from agent.chat.chat_answer import state_answer
from agent.models import Approval
from agent.planners.base import Planner, Proposal, Turn
from agent.policy.capacity import SIZING_SLACK, draining, facts_priority, need_for, per_worker_rate  # noqa: F401 (re-exported)
from agent.policy.guards import idle_refusal
from agent.policy.lifecycle import recent_rejection
from agent.policy.table import is_forbidden
from agent.policy.tool_specs import MAX_BATCH_CALLS
from fleet.clock import clock
from fleet.lifecycle import eligibility, from_machine


@dataclass
class Sizing:
    """The ``rules`` planner's sizing on one world: ``desired`` workers, the ``active`` instances
    counted as capacity (live or starting: :func:`agent.policy.capacity.capacity`), the ``dead`` ones
    (running, worker dead: not capacity), the ``terminal`` ones to replace, stopped ones to
    ``resume`` and the number of ``launches`` still missing, at ``priority`` (the facts priority,
    :func:`agent.policy.capacity.facts_priority`). ``need`` is :func:`agent.policy.capacity.need_for`'s."""

    desired: int
    active: list
    terminal: list
    resume: list
    launches: int
    priority: str
    dead: list = field(default_factory=list)

    @property
    def need(self) -> int:
        return len(self.resume) + self.launches


def sizing(world) -> Sizing:
    """Rule 1 on ``world``, from the one count of capacity and need (:func:`agent.policy.capacity.need_for`:
    ``min(cap, work, max(1, ceil(target / per-worker rate)))`` workers minus those live or
    starting). Stopped instances we stopped are resumed before anything is rented; terminal ones
    (not owned hosts, not being destroyed) are listed for replacement. The pipeline counts
    launches and resumes with the same function, not a copy."""
    # destroyable (fleet.lifecycle.eligibility: not gone, not an owned host) and terminal; one
    # already being destroyed is the monitor's (destroy_unconfirmed)
    terminal = [
        i for i in world.instances
        if i.destroy_requested_at is None and (e := eligibility(i, world, "destroy_instance")).ok and e.terminal
    ]
    need = need_for(world)
    cap = need.capacity
    if not need.desired:
        return Sizing(0, cap.instances, terminal, [], 0, "P1", cap.dead)
    stopped = [
        i for i in world.instances
        if i.killed_at is None and i not in terminal and not i.is_owned_host and i.destroy_requested_at is None
        and (i.status == "stopped" or (i.status == "exited" and i.intended_status == "stopped"))
    ]
    resume = stopped[:need.workers]
    return Sizing(need.desired, cap.instances, terminal, resume, need.workers - len(resume), facts_priority(world), cap.dead)


def needs_diagnosis(inst, world) -> bool:
    """Whether ``inst`` should be diagnosed now: no fresh diagnosis, or a network-class one (SSH
    unreachable) older than ``network_recheck_min`` — diagnose again later, never act on one
    failed connection."""
    d = world.fresh_diagnosis(inst)
    if d is None:
        return True
    recheck = timedelta(minutes=world.limits.network_recheck_min)
    return d.fault_class == "network" and clock.now() - d.taken_at >= recheck


def bad_machine_fact(inst, diag) -> dict:
    """``remember`` arguments recording ``inst``'s machine as bad after a host-class diagnosis
    (through ``remember``: a machine with a hardware fault is destroyed and not rented again). Keyed by the
    provider's machine id when the instance has one, else by provider, SSH endpoint and id."""
    machine = getattr(inst, "machine_id", "") or ""
    where = f"machine {machine}" if machine else f"{inst.provider} {inst.external_id}" + (
        f" ({inst.ssh_host}:{inst.ssh_port})" if inst.ssh_host else "")
    return {
        "category": "machine_perf",
        "key": f"bad host {where}"[:200],
        "value": f"avoid {where} ({inst.gpu_name or 'gpu?'}): host-level fault diagnosed "
                 f"{diag.taken_at:%Y-%m-%d %H:%M} UTC: {diag.cause}"[:4000],
        "importance": 0.9,
    }


def allowed(calls: list[Proposal], world) -> list[Proposal]:
    """``calls`` without those the policy table forbids: the built-in planner never proposes a
    forbidden tool (that would halt the run with ``forbidden_tool`` and abort the launch batched
    with it, starving the queue while the operator only meant "not that")."""
    return [p for p in calls if not is_forbidden(p.tool, p.args, world.policy)]


def not_waiting(calls: list[Proposal]) -> list[Proposal]:
    """``calls`` without those that already wait for an operator: a call on an instance whose tool
    already waits for approval on it, and as many launches as launches already wait (they are
    capacity on its way once approved). Proposing them again is only refused ``duplicate`` or
    parks a second copy of the same question (noise in the inbox and the run). One query."""
    waiting = list(Approval.objects.filter(status="waiting").values_list("tool", "args"))
    on_instance = {(t, str(a["instance_id"])) for t, a in waiting if isinstance(a, dict) and a.get("instance_id")}
    launches = sum(1 for t, _ in waiting if t == "launch_instance")
    out = []
    for p in calls:
        ident = (p.args or {}).get("instance_id")
        if ident and (p.tool, str(ident)) in on_instance:
            continue
        if p.tool == "launch_instance" and launches:
            launches -= 1
            continue
        out.append(p)
    return out


def _verdict(action: bool, changed: bool) -> str:
    return f'<verdict>{{"action": {str(action).lower()}, "state_changed": {str(changed).lower()}}}</verdict>'


class RulesPlanner(Planner):
    """Deterministic policy; see the module docstring for the rules."""

    name = "rules"

    def per_worker_rate(self, demand) -> float:
        """Proofs/hr one worker delivers (:func:`per_worker_rate`)."""
        return per_worker_rate(demand)

    @staticmethod
    def _idle(world) -> bool:
        """Rule 4's conditions, the guards' own (:func:`agent.policy.guards.idle_refusal`): demand ok with
        every count known, nothing queued, in the backlog or running, no expected worker dead, the
        queue empty past the dwell and no launch within the hold-off."""
        return idle_refusal(world) is None

    def _long_stopped(self, world) -> list:
        """Instances stopped longer than ``stopped_destroy_h`` while the fleet is idle (:meth:`_idle`),
        not owned hosts, not being destroyed, with no destroy waiting for an operator and no
        rejection of one that still stands (``rejected_recently``)."""
        if not self._idle(world):
            return []

        limit = timedelta(hours=world.limits.stopped_destroy_h)
        waiting = {(a.args or {}).get("instance_id") for a in Approval.objects.filter(status="waiting", tool="destroy_instance")}
        return [
            i for i in world.instances
            if i.killed_at is None and not i.is_owned_host and i.destroy_requested_at is None and i.status == "stopped"
            and clock.now() - i.status_since > limit and i.external_id not in waiting
            and recent_rejection("destroy_instance", i.external_id, world) is None
        ]

    def _retire_candidates(self, world) -> list:
        if not self._idle(world):
            return []
        out = []
        for inst in world.instances:
            # fleet.lifecycle.eligibility: not gone, no live worker's tasks, not terminal (that is a
            # replacement), and nothing that would park it for an operator (a dead worker's tasks,
            # a worker whose identity is in doubt). An owned host is not retired: it costs no rent.
            e = eligibility(inst, world, "stop_instance")
            if inst.is_owned_host or not e.ok or e.park or e.terminal:
                continue
            if inst.status == "running":
                out.append(inst)
        return out

    def first_turn(self, world) -> Turn:
        d = world.demand
        calls: list[Proposal] = []
        size = sizing(world)
        for inst in size.terminal:
            why = eligibility(inst, world, "destroy_instance").why
            calls.append(Proposal("destroy_instance", {"instance_id": inst.external_id, "reason": f"terminal: {why}"}))
            diag = world.fresh_diagnosis(inst)
            if why.startswith("diagnosed failed (host)") and diag is not None:
                calls.append(Proposal("remember", bad_machine_fact(inst, diag)))
        backlog = f" (+{d.backlog} in the backlog)" if d.backlog else ""
        # an instance we stopped earlier is resumed before anything new is rented
        for inst in size.resume:
            calls.append(Proposal("resume_instance", {
                "instance_id": inst.external_id,
                "reason": f"{d.queued} queued{backlog}, {d.workers_live} live; resume before renting new",
            }))
        for _ in range(size.launches):
            calls.append(Proposal("launch_instance", {
                "launch_priority": size.priority,
                "reason": f"{d.queued} queued{backlog}, {d.workers_live} live; want {size.desired} workers for {world.limits.target_proofs_hr:g} proofs/hr",
            }))
        # repair before replace: dead expected workers get diagnosed (again, after a network verdict)
        for inst in size.dead:
            w = world.worker_for(inst)
            if inst.status == "running" and w is not None and not w.live and not w.unschedulable and needs_diagnosis(inst, world):
                calls.append(Proposal("diagnose_instance", {"instance_id": inst.external_id}))
        for inst in [*self._retire_candidates(world), *self._long_stopped(world)]:
            if world.fresh_diagnosis(inst) is None:
                calls.append(Proposal("diagnose_instance", {"instance_id": inst.external_id}))
        seen, unique = set(), []
        for p in not_waiting(allowed(calls, world)):
            k = (p.tool, str(sorted((p.args or {}).items())))
            if p.tool == "launch_instance" or k not in seen:  # several identical launches are wanted
                seen.add(k)
                unique.append(p)
        unique = _within_one_batch(unique)
        return Turn(calls=unique, batch=len(unique) > 1)

    def repair_turn(self, world, proposed: set[str], remembered: frozenset = frozenset()) -> Turn:
        """Repair before replace (Ray restarts a node on heartbeat loss; a stuck Curio is restarted before its machine is replaced):
        a running instance whose worker is dead and whose fresh diagnosis is not healthy is
        rebooted, or destroyed as a replacement when the fault is the host's. With no worker
        live and work queued, an operator is told (``escalate_human``)."""
        calls = []
        for inst in world.instances:
            w = world.worker_for(inst)
            diag = world.fresh_diagnosis(inst)
            if inst.status != "running" or w is None or w.live or w.unschedulable or diag is None:
                continue
            if diag.health == "healthy" or inst.external_id in proposed:
                continue
            if diag.fault_class == "network":
                continue  # one failed connection is no verdict: diagnosed again later (first_turn)
            if diag.health == "failed" and diag.fault_class == "host" and from_machine(diag):
                if not inst.is_owned_host:
                    calls.append(Proposal("destroy_instance", {"instance_id": inst.external_id, "reason": f"replace: {diag.cause}"}))
                fact = bad_machine_fact(inst, diag)
                if fact["key"] not in remembered:
                    calls.append(Proposal("remember", fact))
            else:
                calls.append(Proposal("reboot_instance", {
                    "instance_id": inst.external_id,
                    "reason": f"worker heartbeat dead; {diag.health} ({diag.fault_class or 'no class'}): {diag.cause}",
                }))
        calls = not_waiting(allowed(calls, world))
        d = world.demand
        repairs = [p for p in calls if "instance_id" in p.args]
        if repairs and d.state == "ok" and d.queued and not d.workers_live:
            # proposed, not done: each call still passes the guards and policy, and the outcome
            # is in the run's report (never say an action happened that was refused)
            what = ", ".join(f"{p.tool.removesuffix('_instance')} {p.args['instance_id']}" for p in repairs)
            calls.append(Proposal("escalate_human", {
                "severity": "P1",
                "message": f"every expected worker is dead with {d.queued} tasks queued; proposed repair ({what}), "
                           "subject to the guards and approval: see the run's report for what ran",
            }))
        return Turn(calls=calls, batch=len(calls) > 1)

    def retire_turn(self, world) -> Turn:
        calls = []
        for inst in self._retire_candidates(world):
            if recent_rejection("stop_instance", inst.external_id, world) is not None:
                continue  # an operator said no, and it still stands (rejected_recently)
            diag = world.fresh_diagnosis(inst)
            if diag is not None and diag.health == "healthy":
                calls.append(Proposal("stop_instance", {
                    "instance_id": inst.external_id,
                    "reason": f"idle: queue empty past the {world.limits.dwell_min:g} min dwell; diagnosed healthy",
                }))
        for inst in self._long_stopped(world):
            if world.fresh_diagnosis(inst) is not None:  # the reason stays the same cycle to cycle (duplicate)
                calls.append(Proposal("destroy_instance", {
                    "instance_id": inst.external_id,
                    "reason": f"idle: stopped since {inst.status_since:%Y-%m-%d %H:%M} UTC, past the "
                              f"{world.limits.stopped_destroy_h:g} h limit; it still pays "
                              f"${inst.storage_dph:.3f}/hr for its disk",
                }))
        calls = not_waiting(allowed(calls, world))
        return Turn(calls=calls, batch=len(calls) > 1)

    def next_turn(self, ctx) -> Turn | None:
        if ctx.world.provider_error:  # acting on a fleet we cannot see risks duplicates and wrong kills
            return self.final_turn(ctx)
        if ctx.turn_index == 0:
            turn = self.first_turn(ctx.world)
            if turn.calls:
                return turn
        steps = ctx.call_steps()
        if not any(s.tool in ("reboot_instance", "escalate_human") for s in steps):
            proposed = {(s.args or {}).get("instance_id") for s in steps if s.tool == "destroy_instance"}
            remembered = frozenset((s.args or {}).get("key") for s in steps if s.tool == "remember")
            turn = self.repair_turn(ctx.world, proposed, remembered)
            if turn.calls:
                return turn
        retire_proposed = any(
            s.tool in ("stop_instance", "destroy_instance") and s.call_reason.startswith("idle") for s in steps
        )
        if not retire_proposed:
            turn = self.retire_turn(ctx.world)
            if turn.calls:
                return turn
        return self.final_turn(ctx)

    def chat_answer(self, ctx) -> str:
        """The answer to a ``chat`` run that parks or halts before its final turn (no verdict):
        the observed state in words (:func:`agent.chat.chat_answer.state_answer`)."""
        return state_answer(ctx)

    def final_turn(self, ctx) -> Turn:
        """The run's answer with its verdict. A ``chat`` run gets the no-model answer from the
        observed state (:func:`agent.chat.chat_answer.state_answer`); other runs a one-line summary."""
        done = [s for s in ctx.call_steps() if s.outcome in ("executed", "approved_executed")]
        d = ctx.world.observed  # report the numbers the run's observation holds (entailment)
        side = [s for s in done if s.tool in ("launch_instance", "stop_instance", "destroy_instance", "reboot_instance", "resume_instance")]
        parts = [] if d.state == "ok" else [f"Demand is {d.state}: no scale-down until it reads ok."]
        if ctx.world.provider_error:
            parts.append(f"The fleet could not be read ({ctx.world.provider_error}); nothing was changed.")
        backlog = f", backlog {d.backlog}" if d.backlog else ""
        parts += [f"Demand {d.state}: queued {d.queued if d.queued is not None else 'unknown'}{backlog}, "
                 f"workers {d.workers_live if d.workers_live is not None else '?'}/{d.workers_expected if d.workers_expected is not None else '?'} live."]
        if side:
            parts.append("Did: " + ", ".join(f"{s.tool}({(s.args or {}).get('instance_id', '')})".replace("()", "") for s in side) + ".")
        else:
            parts.append("No fleet change needed." if not ctx.call_steps() else "No fleet change made.")
        if ctx.run.trigger == "chat":
            return Turn(text=state_answer(ctx) + "\n" + _verdict(bool(side), bool(side)))
        return Turn(text=" ".join(parts) + " " + _verdict(bool(side), bool(side)))


def _within_one_batch(calls: list[Proposal]) -> list[Proposal]:
    """At most :data:`agent.policy.tool_specs.MAX_BATCH_CALLS` calls, the launches cut first: a batch larger
    than that is refused whole (``batch_too_large``), so a need of 400 new workers proposed at once
    launched none. The launches left out are proposed again by the next cycle's sizing, which
    counts the ones this batch started."""
    if len(calls) <= MAX_BATCH_CALLS:
        return calls
    others = [p for p in calls if p.tool != "launch_instance"]
    room = max(0, MAX_BATCH_CALLS - len(others))
    kept, out = 0, []
    for p in calls:
        if p.tool == "launch_instance":
            if kept >= room:
                continue
            kept += 1
        out.append(p)
    return out[:MAX_BATCH_CALLS]
