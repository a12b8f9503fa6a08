"""Running the monitor's rules (``fleet.monitor``) through the agent's pipeline.

Its actions need no approval (its rules are its policy) but pass the same guards and
idempotency as any call; they are recorded as call steps with actor ``monitor`` (no planner
turn) and appear in the Actions tab through the audit log.
"""

from agent.guards import check as guard_check
from agent.pipeline import _finish, execute, idempotency_key
from agent.tools import TOOLS
from fleet.alerts import raise_alert
from fleet.monitor import decide


def run_monitor(tc) -> int:
    """Apply the monitor's rules inside the cycle ``tc``; returns how many actions it proposed."""
    actions = decide(tc.world.instances, provisioning_limit_min=tc.limits.provisioning_limit_min)
    for pos, act in enumerate(actions):
        if act.alert:
            raise_alert(act.alert[0], act.alert[1], severity="P1", key=f"{act.alert[0]}:{act.args['instance_id']}")
        step = tc.new_step(kind="call", actor="monitor", tool=act.tool, args=act.args, position=pos,
                           raw_arguments="", call_reason=act.args.get("reason", ""))
        key = idempotency_key(tc.run.number, 10_000, pos, act.tool, act.args)
        step.idempotency_key = key
        refusal = guard_check(act.tool, act.args, key, tc.world, actor="monitor")
        if refusal is not None:
            _finish(step, "refused", refusal.code, refusal.detail, ok=False)
            continue
        prev_actor, tc.actor = tc.actor, "monitor"
        try:
            execute(tc, step, TOOLS[act.tool], act.args, key)
        finally:
            tc.actor = prev_actor
    if actions:  # one query: what the monitor destroyed is gone from the cycle's view
        from fleet.models import Instance

        tc.world.set_instances(list(Instance.objects.filter(pk__in=[i.pk for i in tc.world.instances], killed_at__isnull=True)))
    return len(actions)


def monitor_tick() -> int | None:
    """The beat task's body: a cycle of the monitor alone, recorded as a run only when it acts.

    Returns the run number, or ``None`` when there was nothing to do or the lock was held.
    """
    from agent.loop import _claim_run, _close, _context, acquire_lock, release_lock
    from agent.models import SessionState
    from agent.observe import observe
    from agent.policy import effective_limits, effective_policy

    token = acquire_lock()
    if token is None:
        return None
    try:
        state = SessionState.get()
        limits, policy = effective_limits(state), effective_policy(state)
        world = observe(limits, policy)
        if not decide(world.instances, provisioning_limit_min=limits.provisioning_limit_min):
            return None
        run = _claim_run("monitor", None)
        run.planner = "monitor"
        tc = _context(run, world, limits, state)
        run_monitor(tc)
        run.status = "done"
        _close(run)
        return run.number
    finally:
        release_lock(token)
