"""The agent's tools: their bodies, bound to the specs of ``agent.policy.tool_specs`` (names, argument
schemas, side-effect flags, timeouts), which this module re-exports.

Names and argument shapes are a contract (docs/contract.md, Tools). A tool body
returns a JSON-shaped payload; the runtime (``agent.runtime.pipeline``) turns it into the observation —
the planner never authors a tool result. A body raises :class:`ToolError` (or
``fleet.providers.ProviderError``) on failure; any other exception is caught at the pipeline's
boundary and becomes an error observation.
"""

import inspect
from dataclasses import dataclass, replace

from agent.actions.instances import do_instance_action, do_launch_instance
from agent.memory.store import MemoryInputError
from agent.memory.store import recall as find
from agent.memory.store import remember as store
from agent.models import Notification
from agent.notify.notifications import alert_routes
from agent.policy.tool_specs import (  # noqa: F401 — re-exported: the registry and the argument models
    OFFER_FILTERS,
    PUBLIC_TOOLS,
    TOOLS,
    EscalateArgs,
    InstanceActionArgs,
    InstanceArgs,
    LaunchArgs,
    ListInstancesArgs,
    NoArgs,
    RecallArgs,
    RememberArgs,
    SearchOffersArgs,
    Tool,
    _Args,
    canonical_args,
    canonical_json,
)
from agent.runtime.diagnosis import diagnose_instance as run_diagnosis
from fleet.alerts import raise_alert
from fleet.clock import clock
from fleet.models import Instance
from fleet.providers import get_provider
from fleet.sync import sync_instances


class ToolError(Exception):
    """A tool failed. ``kind``: transient | permanent | semantic (an error
    class: a transient one may pass on retry, a permanent or semantic one — bad input — will not)."""

    def __init__(self, message: str, *, kind: str = "permanent", code: str = ""):
        super().__init__(message)
        self.kind = kind
        self.code = code


@dataclass
class ToolContext:
    """What a tool body may use: the run, the actor, the world snapshot and its deadline.

    ``deadline`` is a ``clock.monotonic()`` value; long tools check :meth:`remaining`.
    ``world`` is the :class:`agent.runtime.observe.World` of the cycle (fleet, demand, diagnoses).
    ``label`` is the provider label a launch carries (``agent.policy.claims.launch_label`` of its key).
    """

    run: object
    actor: str
    world: object
    deadline: float
    step: object = None
    label: str = ""

    def remaining(self) -> float:
        return self.deadline - clock.monotonic()


# --------------------------------------------------------------------------------------------
# bodies


def _instance(instance_id: str) -> Instance:
    inst = Instance.objects.filter(external_id=instance_id).order_by("killed_at").first()
    if inst is None:
        raise ToolError(f"no instance {instance_id!r}; call list_instances for the ids", kind="permanent", code="not_found")
    return inst


def _instance_view(inst: Instance, world) -> dict:
    worker = world.worker_for(inst) if world is not None else None
    return {
        "id": inst.external_id,
        "provider": inst.provider,
        "status": inst.status,
        "intended_status": inst.intended_status,
        "gpu_name": inst.gpu_name,
        "dph": inst.dph,
        "age_min": round((clock.now() - inst.created_at).total_seconds() / 60, 1),
        "killed": inst.killed_at is not None,
        "worker": None
        if worker is None
        else {"live": worker.live, "unschedulable": worker.unschedulable, "owned_tasks": worker.owned_tasks},
    }


def list_instances(ctx: ToolContext, args: dict) -> dict:
    instances = sync_instances()
    ctx.world.set_instances(instances)
    rows = [_instance_view(i, ctx.world) for i in instances]
    if args.get("status"):
        rows = [r for r in rows if r["status"] == args["status"]]
    return {"instances": rows, "count": len(rows)}


def list_instances_fallback(ctx: ToolContext, args: dict) -> dict:
    """Fallback of ``list_instances``: the last synced rows, marked stale (never "zero")."""
    rows = [_instance_view(i, ctx.world) for i in ctx.world.instances]
    return {"instances": rows, "count": len(rows), "stale": True, "note": "provider unreachable; last known fleet"}


def get_demand(ctx: ToolContext, args: dict) -> dict:
    reading = ctx.world.refresh_demand()
    return ctx.world.demand_view(reading)


def search_offers(ctx: ToolContext, args: dict) -> dict:
    provider = get_provider()
    extra = {k: args[k] for k in OFFER_FILTERS if args.get(k) is not None}
    takes = inspect.signature(provider.search_offers).parameters
    refused = sorted(k for k in extra if k not in takes)
    if refused:
        raise ToolError(f"the {provider.name} provider does not filter offers by {', '.join(refused)}; "
                        "use gpu_name and max_dph", kind="permanent", code="invalid_args")
    offers = provider.search_offers(
        gpu_name=args.get("gpu_name") or "", max_dph=args.get("max_dph"), limit=args.get("limit") or 10, **extra
    )
    return {"offers": offers, "count": len(offers)}


#: characters of each collected output a diagnose_instance observation keeps (half head, half tail)
EVIDENCE_CHARS_PER_COMMAND = 600


def _compact(entry):
    if not isinstance(entry, dict) or not isinstance(entry.get("out"), str) or len(entry["out"]) <= EVIDENCE_CHARS_PER_COMMAND:
        return entry
    half = EVIDENCE_CHARS_PER_COMMAND // 2
    return {**entry, "out": f"{entry['out'][:half]}\n…\n{entry['out'][-half:]}"}


def diagnose_instance(ctx: ToolContext, args: dict) -> dict:
    """The verdict (``fleet.diagnostics.Verdict``: health, class, cause, the lines that support it
    as ``findings``, confidence), who judged it and from what source, then what was collected
    (``evidence``: each command's exit code and output, cut to :data:`EVIDENCE_CHARS_PER_COMMAND`
    head and tail; the full outputs are on the instance page). What machines print is untrusted
    data: it reaches the model only inside the observation block."""
    inst = _instance(args["instance_id"])
    diag = (getattr(ctx.world, "prefetched", None) or {}).pop(inst.pk, None)  # collected with its turn (agent.runtime.diagnosis.prefetch)
    if diag is None:
        diag = run_diagnosis(inst, worker=ctx.world.worker_for(inst), timeout_s=max(1.0, ctx.remaining()))
    ctx.world.add_diagnosis(diag)
    return {
        "instance_id": inst.external_id,
        "health": diag.health,
        "class": diag.fault_class or None,
        "cause": diag.cause,
        "findings": diag.findings,
        "confidence": diag.confidence,
        "judge": diag.judge,
        "source": diag.source,
        "evidence": {cmd: _compact(e) for cmd, e in diag.evidence.items() if cmd != "injection"},
        # instruction-like text found in what the machine printed: the pipeline's scan sees it here
        # too, so the run parks its later side effects (docs/contract.md, Forced approval)
        **({"injection": diag.evidence["injection"]} if diag.evidence.get("injection") else {}),
    }


def launch_instance(ctx: ToolContext, args: dict) -> dict:
    inst = do_launch_instance(
        gpu_name=args.get("gpu_name") or "", offer_id=args.get("offer_id") or "", actor=ctx.actor, reason=args.get("reason", ""),
        label=ctx.label,
    )
    ctx.world.set_instances([*ctx.world.instances, inst])
    return {"instance_id": inst.external_id, "status": inst.status, "gpu_name": inst.gpu_name, "dph": inst.dph}


def _lifecycle(action: str):
    def body(ctx: ToolContext, args: dict) -> dict:
        inst = _instance(args["instance_id"])
        do_instance_action(inst, action, actor=ctx.actor, reason=args.get("reason", ""))
        inst.refresh_from_db()
        ctx.world.replace(inst)  # later checks of this cycle see what the action did
        return {"instance_id": inst.external_id, "status": inst.status, "killed": inst.killed_at is not None}

    body.__name__ = f"{action}_instance"
    return body


def remember(ctx: ToolContext, args: dict) -> dict:
    """Store or change a fact (``agent.memory.store.remember``; redacted). Bad input is a semantic error."""
    try:
        fact, created = store(args["category"], args["key"], args["value"], importance=args.get("importance"), source="agent")
    except MemoryInputError as exc:
        raise ToolError(str(exc), kind="semantic", code="invalid_args") from exc
    return {"stored": True, "updated": not created, "category": fact.category, "key": fact.key}


def recall(ctx: ToolContext, args: dict) -> dict:
    """The best facts for the query (``agent.memory.store.recall``: full-text rank × decayed score)."""
    return {"facts": [{k: f[k] for k in ("category", "key", "value", "score")}
                      for f in find(args.get("query") or "", category=args.get("category"), limit=20)]}


def escalate_human(ctx: ToolContext, args: dict) -> dict:
    """Raise an ``escalation`` alert of ``severity``. It always shows on the Alerts page; P0 and P1
    also notify the operators who asked for escalations (``agent.notify.notifications.alert_routes``,
    docs/notifications.md). Returns ``{"alert_id", "severity", "routed_to": ["alerts", "notifications"?]}`` and,
    when routed to the notifications, ``notifications_queued``: how many messages (operators ×
    channels) were queued — 0 says nobody asked to be told."""
    alert = raise_alert("escalation", args["message"], severity=args["severity"], key=f"escalation:{ctx.run.number}:{args['message'][:80]}")
    out = {"alert_id": alert.pk, "severity": alert.severity, "routed_to": alert_routes(alert.severity)}
    if "notifications" in out["routed_to"]:
        out["notifications_queued"] = Notification.objects.filter(dedupe_key__startswith=f"alert:{alert.pk}:").count()
    return out


_BODIES = {
    "list_instances": list_instances,
    "list_instances_fallback": list_instances_fallback,
    "get_demand": get_demand,
    "search_offers": search_offers,
    "diagnose_instance": diagnose_instance,
    "launch_instance": launch_instance,
    "stop_instance": _lifecycle("stop"),
    "resume_instance": _lifecycle("resume"),
    "reboot_instance": _lifecycle("reboot"),
    "destroy_instance": _lifecycle("destroy"),
    "remember": remember,
    "recall": recall,
    "escalate_human": escalate_human,
}
# the implementations go into the one registry (agent.policy.tool_specs.TOOLS), in place
for _name, _body in _BODIES.items():
    TOOLS[_name] = replace(TOOLS[_name], body=_body)
