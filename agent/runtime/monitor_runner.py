"""Running the monitor's rules (``fleet.monitor``) through the agent's pipeline, under policy.

The monitor is an actor like the agent (docs/contract.md, The cycle, step 2): its actions pass the policy
table (``TOOL:monitor`` keys; its own default ``auto``; ``forbidden`` on ``TOOL`` binds it — the
action is skipped as ``forbidden_tool`` and halts nothing), the same guards (observe-only
included), forced approvals (``agent.policy.lifecycle.forced_approval``) and idempotency as any call.
An action that needs approval parks as an Approval row whose step has actor ``monitor``; it is
dispatched like any approved call (``agent.runtime.loop.resume_run``). The run's lifecycle (lock, claim,
close) comes from ``agent.runtime.runs``, as the loop's does. They are recorded as call steps
with actor ``monitor`` (no planner turn) and appear in the Actions tab through the audit log.
"""

from agent.models import Approval, SessionState
from agent.policy.claims import our_launch_labels
from agent.policy.guards import check as guard_check
from agent.policy.lifecycle import forced_approval
from agent.policy.table import effective_limits, effective_policy, is_forbidden, policy_for
from agent.runtime import triggers
from agent.runtime.observe import observe
from agent.runtime.pipeline import Decision, _finish, execute, idempotency_key, park, run_injected
from agent.runtime.runs import RunBusy, acquire_lock, claim_run, close_run, release_lock, turn_context
from agent.runtime.tools import TOOLS
from fleet.alerts import raise_alert
from fleet.machines import remember_failure
from fleet.models import Instance
from fleet.monitor import decide


def monitor_actions(world) -> list:
    """``fleet.monitor.decide`` less the actions already waiting for an operator (not re-proposed)."""
    waiting = {(a.tool, (a.args or {}).get("instance_id")) for a in Approval.objects.filter(status="waiting")}
    return [a for a in decide(world, our_launch_labels) if (a.tool, a.args.get("instance_id")) not in waiting]


def run_monitor(tc) -> int:
    """Apply the monitor's rules inside the cycle ``tc``; returns how many actions it proposed."""
    actions = monitor_actions(tc.world)
    for pos, act in enumerate(actions):
        step = _act(tc, pos, act)
        if act.tool == "destroy_instance" and act.args["reason"].startswith("terminal") and step.outcome == "executed":
            _remember_machine(tc.world, act)
        if act.alert:  # says what became of the action: never "destroying" when it was refused
            what = {"executed": "done", "parked": "waits for an operator's approval"}.get(
                step.outcome, f"{step.outcome} ({step.reason_code or step.detail[:80]})")
            raise_alert(act.alert[0], f"{act.alert[1]}; the monitor's {act.tool}: {what}", severity="P1",
                        key=f"{act.alert[0]}:{act.args['instance_id']}")
    if actions:  # one query: what the monitor destroyed is gone from the cycle's view
        tc.world.set_instances(list(Instance.objects.filter(pk__in=[i.pk for i in tc.world.instances], killed_at__isnull=True)))
    return len(actions)


def _remember_machine(world, act) -> None:
    """A terminal instance's machine is left out of later offers (``fleet.machines``)."""
    inst = world.instance(act.args["instance_id"])
    if inst is not None:
        remember_failure(inst, act.args["reason"])


def _act(tc, pos: int, act):
    """One monitor action through policy, guards, forced approval and execution; returns its step."""
    step = tc.new_step(kind="call", actor="monitor", tool=act.tool, args=act.args, position=pos,
                       raw_arguments="", call_reason=act.args.get("reason", ""))
    key = idempotency_key(tc.run.number, 10_000, pos, act.tool, act.args)
    step.idempotency_key = key
    policy = policy_for(act.tool, act.args, tc.world.policy, "monitor")
    if is_forbidden(act.tool, act.args, tc.world.policy, "monitor"):  # skipped; a monitor action halts nothing
        return _finish(step, "refused", "forbidden_tool", f"{act.tool} is forbidden by policy; the monitor skips it", ok=False)
    refusal = guard_check(act.tool, act.args, key, tc.world, actor="monitor", observe_only=tc.observe_only)
    if refusal is not None:
        return _finish(step, "refused", refusal.code, refusal.detail, ok=False)
    forced = forced_approval(act.tool, act.args, tc.world, injected=run_injected(tc))
    if forced or policy == "approval":
        park(tc, Decision(step=step, proposal=None, args=act.args, key=key, action="park", forced=forced))
        return step
    prev_actor, tc.actor = tc.actor, "monitor"
    try:
        return execute(tc, step, TOOLS[act.tool], act.args, key)
    finally:
        tc.actor = prev_actor


def monitor_tick() -> int | None:
    """The beat task's body: a cycle of the monitor alone, recorded as a run only when it acts.

    Returns the run number, or ``None`` when there was nothing to do or the lock was held.
    """
    token = acquire_lock(sees_events=False)  # what its observe finds starts a planner run after it
    if token is None:
        return None
    try:
        state = SessionState.get()
        limits, policy = effective_limits(state), effective_policy(state)
        world = observe(limits, policy)
        triggers.note_demand(world.demand)
        if not monitor_actions(world):
            return None
        try:
            run = claim_run("monitor", None)
        except RunBusy:  # another run is still running: the next tick acts
            return None
        run.planner = "monitor"
        tc = turn_context(run, world, limits, state)
        run_monitor(tc)
        run.status = "done"  # close_run parks it while one of its calls waits for an operator
        close_run(run)
        return run.number
    finally:
        release_lock(token)
