"""The fleet's structural guards: code the model cannot talk past (docs/safety.md invariants 1–3).

:func:`check` returns the first refusal that applies to one call, in docs/contract.md's refusal order. The
whole order, with the stage that reports each code:

``forged_observation``, ``unknown_tool``, ``forbidden_tool``, ``invalid_args``, ``identical_args``
(pipeline) → ``duplicate`` → ``batch_too_large`` (pipeline, a whole batch) → ``target_gone``,
``already_running``, ``rejected_recently``, ``priority_required``, ``owned_host``, ``demand_guard``, ``owned_tasks``,
``hold_off``, ``disruption_budget``, ``launch_pending``, ``instance_cap``, ``budget_cap``, ``diagnosis_required``,
``in_flight``, ``no_longer_needed`` (at dispatch of a parked launch or resume),
``observe_only``, ``rate_limited`` (here) → policy (``approval_required``: pipeline, with
:func:`agent.policy.lifecycle.forced_approval`). Guards run when a call is proposed and again at
dispatch of an approved call (an approval granted on stale facts executes nothing).

Rules and their sources (what "terminal", "blind" and "starving" mean is ``fleet.lifecycle``):
- ``target_gone``: the instance is killed (destroyed or vanished from a successful list); a
  destroy re-sent after ``destroy_unconfirmed`` is not refused for it;
- ``already_running``: a resume of an instance the provider reports ``running`` at the check (the
  world is read from the provider right before): it would do nothing but restart "running since";
- ``rejected_recently``: an operator rejected the same tool on the same instance and it still
  stands (``rejection_hold_min``, or until demand changes state), for every planner;
- scale-down (stop/destroy of a non-terminal instance) is refused while demand is not ``ok``,
  tasks are queued or in the pipeline backlog (or the backlog could not be read), or an expected
  worker is dead (scale on waiting work, never on a flag: docs/contract.md ``demand_guard``);
  demand is re-read right before the check;
- a live worker that owns tasks is never stopped, destroyed or rebooted (its task would be lost
  with it: docs/curio.md, Workers); a dead one's owner parks for an operator (forced approval);
- only after the queue has been empty for the dwell and not within the hold-off after a launch
  (cluster-autoscaler's scale-down-unneeded-time and scale-down-delay-after-add);
- terminal instances are replaced, not scaled down: ``demand_guard`` and ``hold_off`` skip them;
- stop, and destroy of a non-terminal instance, need a fresh diagnosis (diagnose before you act: HTTP 428);
- an operator-owned SSH host is never destroyed by the agent or the monitor (dstack SSH fleets);
- no launch while an earlier launch is pending (SkyPilot) unless it is starving, within the
  instance (starving launches still count) and $/hr caps;
- ``disruption_budget``: the agent's stops and destroys of capacity (live or starting instances)
  within ``retire_window_min`` are at most ``max(1, floor(retire_budget_pct% of W))``
  (``agent.policy.capacity.retire_budget``): a misread signal cannot retire the fleet in one cycle
  (defence in depth, after every other scale-down guard passed). The monitor and an operator's
  own actions are outside it;
- ``no_longer_needed``: at dispatch, a launch or resume that was within the need when it was
  parked and is beyond it now (``agent.policy.capacity.need_for``, counting what was dispatched
  before it); one parked beyond the need is the operator's decision.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Max

from agent.models import Approval, SideEffect
from agent.policy.capacity import capacity, need_for, retire_budget
from agent.policy.claims import open_claims_block
from agent.policy.lifecycle import recent_rejection
from agent.policy.table import PRIORITIES
from agent.policy.tool_specs import TOOLS, canonical_json
from fleet.clock import clock
from fleet.lifecycle import eligibility, starving
from fleet.models import PENDING_STATUSES
from fleet.providers import ProviderError, get_provider

SCALE_DOWN_TOOLS = {"stop_instance", "destroy_instance"}


@dataclass
class Refusal:
    """A guard's ``code`` (a reason code of docs/contract.md) and a one-line ``detail`` for the operator."""

    code: str
    detail: str


def last_launch_at(world):
    """Time of the most recent launch we know of (agent side effects or instances created)."""
    se = SideEffect.objects.filter(tool="launch_instance", status="done").aggregate(t=Max("claimed_at"))["t"]
    created = max((i.created_at for i in world.instances), default=None)
    times = [t for t in (se, created) if t is not None]
    return max(times) if times else None


def demand_refusal(d) -> Refusal | None:
    """The ``demand_guard`` refusal of a scale-down on the demand reading ``d``, or ``None``:
    demand not ``ok``, a count missing (unknown is never zero), tasks queued or in the backlog, the
    backlog unreadable, or an expected worker dead. The first half of "idle enough to retire"
    (:func:`idle_refusal`), for the guards and the ``rules`` planner alike."""
    if d is None or d.state != "ok":
        state = d.state if d is not None else "unknown"
        return Refusal("demand_guard", f"demand is {state}: {(d.error if d else '') or 'no fresh read'}; "
                       "no scale-down without a good read")
    if None in (d.queued, d.running, d.workers_expected, d.workers_live, d.workers_dead):
        return Refusal("demand_guard", "the demand read is missing counts (queued, running or workers); unknown is never zero")
    if d.queued or d.backlog:
        waiting = f"{d.queued} tasks queued" + (f", {d.backlog} in the backlog" if d.backlog else "")
        return Refusal("demand_guard", f"{waiting}; {d.workers_expected} workers expected, {d.workers_live} live")
    if "backlog" in d.unreadable:
        return Refusal("demand_guard", f"the pipeline backlog is unknown ({d.unreadable['backlog']}); unknown is never zero")
    if d.workers_dead:
        return Refusal("demand_guard", f"{d.workers_dead} expected worker(s) dead; {d.workers_expected} expected, {d.workers_live} live")
    return None


def hold_refusal(world, d) -> Refusal | None:
    """The ``hold_off`` refusal of a scale-down, or ``None``: tasks are running, the queue has not
    been empty for the dwell (``dwell_min``), or a launch happened within the hold-off
    (``hold_off_min``). The second half of "idle enough to retire" (:func:`idle_refusal`).

    Running tasks are never idle, whatever ``idle_since`` says: a reading that claims an idle
    queue while it counts running tasks contradicts itself, and a contradiction holds a
    scale-down off (this is the ``rules`` planner's reading, which the guards share since the two
    copies disagreed)."""
    lim, now = world.limits, clock.now()
    if d.running or d.idle_since is None:
        return Refusal("hold_off", f"on hold: the queue is not idle ({d.running or 0} running); a scale-down "
                       f"waits until it has been empty for the dwell ({lim.dwell_min:g} min)")
    if now - d.idle_since < timedelta(minutes=lim.dwell_min):
        idle = (now - d.idle_since).total_seconds() / 60
        return Refusal("hold_off", f"on hold: the queue has been empty for {idle:.1f} min; a scale-down waits "
                       f"until it has been empty for the dwell ({lim.dwell_min:g} min)")
    last = last_launch_at(world)
    if last is not None and now - last < timedelta(minutes=lim.hold_off_min):
        ago = (now - last).total_seconds() / 60
        return Refusal("hold_off", f"on hold: the last launch was {ago:.1f} min ago; a scale-down waits "
                       f"out the hold-off after a launch ({lim.hold_off_min:g} min)")
    return None


def idle_refusal(world) -> Refusal | None:
    """Why the fleet is not idle enough to retire an instance (``demand_guard`` or ``hold_off``),
    or ``None`` when it is: the one rule the guards (per call, around ``owned_tasks``) and the
    ``rules`` planner (before proposing any retirement) both apply, on ``world.demand``."""
    return demand_refusal(world.demand) or hold_refusal(world, world.demand)


def _launch_price(args: dict) -> float:
    """$/hr of the launch ``args`` ask for: the named offer, else the cheapest matching offer."""
    provider = get_provider()
    try:
        offers = provider.search_offers(gpu_name=args.get("gpu_name") or "", limit=50)
    except ProviderError as exc:
        if exc.code == "unsupported":
            return 0.0
        raise
    if args.get("offer_id"):
        for o in offers:
            if str(o.get("id")) == str(args["offer_id"]):
                return float(o.get("dph") or 0)
        raise ProviderError(f"offer {args['offer_id']} is not among the provider's offers", kind="permanent", code="not_found")
    prices = [float(o.get("dph") or 0) for o in offers]
    return min(prices) if prices else 0.0


def duplicate(tool: str, args: dict, key: str, *, batch_prior: list[tuple[str, dict]] = (),
              batch_keys: set[str] = frozenset()) -> Refusal | None:
    """The ``duplicate`` refusal for a side effect, or ``None``: its idempotency key already ran,
    the same action is earlier in this batch, or it already waits for approval (arguments as in
    :func:`check`). The first guard of :func:`check`; the pipeline also asks it alone for a
    batch refused whole (``batch_too_large`` comes after ``duplicate`` in docs/contract.md's order)."""
    spec = TOOLS[tool]
    if not spec.side_effect:
        return None
    # a claim settled as stale_claim never ran: it does not hold its key (agent.policy.claims)
    if SideEffect.objects.filter(key=key).exclude(code="stale_claim").exists():
        return Refusal("duplicate", "this call already ran (same idempotency key)")
    canon = canonical_json(args)
    if spec.instance_arg and any(t == tool and canonical_json(a) == canon for t, a in batch_prior):
        return Refusal("duplicate", "the same action is already in this batch")
    for a in Approval.objects.filter(status="waiting", tool=tool).select_related("run"):
        if canonical_json(a.args) == canon and a.idempotency_key != key and a.idempotency_key not in batch_keys:
            what = f"{tool} of {args.get(spec.instance_arg)}" if spec.instance_arg else tool
            return Refusal("duplicate", f"{what} already waits for approval {a.pk} (parked by run #{a.run.number}); "
                           "decide that one in the Approvals inbox")
    return None


def check(tool: str, args: dict, key: str, world, *, batch_prior: list[tuple[str, dict]] = (), actor: str = "agent",
          override: set[str] = frozenset(), batch_launched: set[str] = frozenset(),
          batch_keys: set[str] = frozenset(), at_dispatch: bool = False, observe_only: bool = False,
          parked_within: bool = True) -> Refusal | None:
    """The first refusal for ``tool(args)``, or ``None`` when every guard passes.

    ``key`` is the runtime's idempotency key; ``batch_prior`` the (tool, args) of calls earlier
    in the same batch that passed; ``override`` the guard codes an operator overrode with a
    typed reason (only ``demand_guard`` and ``hold_off`` may be overridden); ``batch_launched``
    the instances launched by earlier calls of the same batch (they are not "pending" for it);
    ``batch_keys`` the keys of approvals parked by the same batch (identical launches of one batch
    are several workers wanted, not duplicates of each other); ``at_dispatch`` true when an
    approved call is about to run (``no_longer_needed`` applies then, and only when
    ``parked_within``: the call was within the need when it was parked); ``observe_only`` the
    session's switch (side effects are refused ``observe_only`` after every other guard but
    ``rate_limited``). A side effect naming an instance that exists nowhere (neither in the
    fleet nor in our records) is refused ``target_gone`` here, never parked; a read (diagnose)
    of one is left to the tool (it errors ``not_found``).
    """
    spec = TOOLS[tool]
    lim = world.limits
    now = clock.now()

    refusal = duplicate(tool, args, key, batch_prior=batch_prior, batch_keys=batch_keys)
    if refusal is not None:
        return refusal

    inst = None
    if spec.instance_arg:
        inst = world.instance(args.get(spec.instance_arg, ""))
    # target_gone, owned_host, owned_tasks and terminal: fleet.lifecycle.eligibility, the one rule
    elig = eligibility(inst, world, tool, actor=actor) if inst is not None else None

    # target_gone: killed (destroyed and confirmed by a re-list, or vanished from a successful list).
    # A destroy re-sent after destroy_unconfirmed targets a row that is not killed (still listed; a
    # confirmed destroy listed again is reopened by fleet.sync), so it is never refused for it.
    if spec.side_effect and elig is not None and elig.code == "target_gone":
        return Refusal(elig.code, elig.detail)
    if spec.side_effect and spec.instance_arg and inst is None:
        ident = str(args.get(spec.instance_arg, ""))[:80]
        return Refusal("target_gone", f"no instance {ident!r} exists (not in the fleet the provider lists, not in our records); "
                       "list_instances shows the ids")

    # already_running: the world was listed from the provider just before this check
    if tool == "resume_instance" and inst is not None and inst.status == "running":
        return Refusal("already_running", f"{inst.external_id} is already running (the provider's status at this check); "
                       "there is nothing to resume")

    # rejected_recently (binds every planner and the monitor; an operator's own action is a decision)
    if spec.side_effect and inst is not None and not actor.startswith("user:"):
        rejected = recent_rejection(tool, inst.external_id, world)
        if rejected is not None:
            return Refusal("rejected_recently", f"an operator rejected {tool} on {inst.external_id} "
                           f"(approval {rejected.pk}: {rejected.comment or 'no comment'}); it stands for "
                           f"{lim.rejection_hold_min:g} min or until demand changes state")

    # priority_required
    if tool == "launch_instance" and args.get("launch_priority") not in PRIORITIES:
        return Refusal("priority_required", "launch_instance needs launch_priority P0, P1, P2 or P3")

    # owned_host
    if elig is not None and elig.code == "owned_host":
        return Refusal(elig.code, elig.detail)

    # a replacement, not a scale-down (terminal, or a destroy already decided and re-sent)
    terminal = elig is not None and elig.terminal

    if tool in SCALE_DOWN_TOOLS and inst is not None and inst.killed_at is None:
        d = world.refresh_demand() if not terminal else world.demand
        # demand_guard
        if not terminal and "demand_guard" not in override:
            refusal = demand_refusal(d)
            if refusal is not None:
                return refusal
        # owned_tasks: a live worker's tasks (a dead one's owner parks for an operator: forced approval)
        if elig.code == "owned_tasks":
            return Refusal(elig.code, elig.detail)
        # hold_off
        if not terminal and "hold_off" not in override:
            refusal = hold_refusal(world, d)
            if refusal is not None:
                return refusal

    # disruption_budget: the agent's retirements of capacity within the sliding window
    if tool in SCALE_DOWN_TOOLS and inst is not None and inst.killed_at is None and actor == "agent":
        cap = capacity(world)
        if cap.holds(inst):
            # earlier stops and destroys of this batch retire one instance each (a stop then a
            # destroy of the same instance is one retirement; this instance's own is this call)
            prior = len({str(a.get("instance_id", "")) for t, a in batch_prior if t in SCALE_DOWN_TOOLS
                         and str(a.get("instance_id", "")) != inst.external_id
                         and (i := world.instance(str(a.get("instance_id", "")))) is not None and cap.holds(i)})
            budget = retire_budget(world, cap=cap, exclude_key=key, ahead=prior)
            if budget.left < 1:
                return Refusal("disruption_budget", f"the scale-down budget is spent: {budget.words()}; "
                               f"{inst.external_id} is capacity, so it is not retired now")

    # owned_tasks for a reboot: it would kill the tasks a live worker is proving (a dead worker's
    # tasks are stuck anyway — rebooting it is the repair)
    if tool == "reboot_instance" and elig is not None and elig.code == "owned_tasks":
        return Refusal(elig.code, elig.detail)

    prior_launches = sum(1 for t, _ in batch_prior if t == "launch_instance")
    if tool == "launch_instance":
        # launch_pending (calls of the same batch do not count; a starving launch stops counting)
        pending = [
            i for i in world.instances
            if i.status in PENDING_STATUSES and i.killed_at is None and i.external_id not in batch_launched
            and not starving(i, world)
        ]
        if pending:
            return Refusal("launch_pending", f"launch of {pending[0].external_id} still pending ({pending[0].status or 'provisioning'})")
        # an open launch claim (settled ones block nothing: agent.policy.claims.settle_claims)
        if open_claims_block(tool="launch_instance") is not None:
            return Refusal("launch_pending", "an earlier launch is still in flight")
        # instance_cap (starving launches and instances being destroyed still count; an owned host
        # whose worker is not running is idle capacity a launch may start, not an instance in use)
        count = sum(1 for i in world.instances if i.killed_at is None
                    and not (i.is_owned_host and i.status in ("stopped", "exited", "offline"))) + prior_launches
        if count + 1 > lim.max_instances:
            return Refusal("instance_cap", f"{count} instances; the cap is {lim.max_instances}")
        # budget_cap
        spend = sum(i.dph for i in world.instances if i.killed_at is None)
        try:
            spend += sum(_launch_price(a) for t, a in batch_prior if t == "launch_instance")
            price = _launch_price(args)
        except ProviderError as exc:
            return Refusal("budget_cap", f"cannot price the launch ({exc.code or exc.kind}: {exc}); not launching blind")
        if spend + price > lim.max_dph + 1e-9:
            return Refusal("budget_cap", f"${spend:.2f}/hr + ${price:.2f}/hr would exceed the ${lim.max_dph:.2f}/hr cap")

    # diagnosis_required
    if inst is not None and inst.killed_at is None and (
        tool == "stop_instance" or (tool == "destroy_instance" and not terminal)
    ):
        if world.fresh_diagnosis(inst) is None:
            return Refusal(
                "diagnosis_required",
                f"no diagnosis of {inst.external_id} in the last {lim.diagnosis_fresh_min:g} min; call diagnose_instance first (HTTP 428)",
            )

    # in_flight
    if spec.side_effect and inst is not None:
        claim = open_claims_block(instance_ref=inst.external_id)
        if claim is not None:
            return Refusal("in_flight", f"a side effect on {inst.external_id} is already in flight "
                           f"({claim.tool}, claim {claim.pk} by {claim.actor})")

    # no_longer_needed (a parked launch or resume, at dispatch: the rules planner's sizing again)
    if at_dispatch and parked_within and tool in ("launch_instance", "resume_instance"):
        need = need_for(world)
        if need.workers <= 0:
            d = world.demand
            return Refusal("no_longer_needed", f"no longer needed: it was within the need when parked; now demand {d.state}, "
                           f"{d.queued if d.queued is not None else 'unknown'} queued, {need.words()}")

    # observe_only
    if spec.side_effect and observe_only:
        return Refusal("observe_only", f"observe-only mode: would have run {tool}")

    # rate_limited
    if tool == "launch_instance":
        n, seconds = lim.launch_rate
        recent = SideEffect.objects.filter(
            tool="launch_instance", status="done", claimed_at__gte=now - timedelta(seconds=seconds)
        ).count()
        if recent + prior_launches >= n:
            return Refusal("rate_limited", f"{recent} launches in the last {seconds}s; the limit is {n}")

    return None
