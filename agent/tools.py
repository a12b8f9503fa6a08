"""The agent's tools: names, argument schemas, side-effect flags, timeouts and bodies.

Names and argument shapes are a contract (``../shared/SCENARIOS.md`` "Tools"). A tool body
returns a JSON-shaped payload; the runtime (``agent.pipeline``) turns it into the observation —
the planner never authors a tool result. A body raises :class:`ToolError` (or
``fleet.providers.ProviderError``) on failure; any other exception is caught at the pipeline's
boundary and becomes an error observation.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet.clock import clock
from fleet.models import Instance


class ToolError(Exception):
    """A tool failed. ``kind``: transient | permanent | semantic (seed 000's three classes)."""

    def __init__(self, message: str, *, kind: str = "permanent", code: str = ""):
        super().__init__(message)
        self.kind = kind
        self.code = code


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, strict=True)


class ListInstancesArgs(_Args):
    status: str | None = None


class NoArgs(_Args):
    pass


class SearchOffersArgs(_Args):
    gpu_name: str | None = None
    max_dph: float | None = Field(default=None, ge=0)
    limit: int | None = Field(default=None, ge=1, le=100)


class InstanceArgs(_Args):
    instance_id: str = Field(min_length=1, max_length=64)


class InstanceActionArgs(InstanceArgs):
    reason: str = Field(min_length=1, max_length=2000)


class LaunchArgs(_Args):
    gpu_name: str | None = None
    offer_id: str | None = None
    # any string passes the schema; the guard refuses a missing/invalid one (priority_required)
    launch_priority: str | None = None
    reason: str = Field(min_length=1, max_length=2000)


class RememberArgs(_Args):
    category: str = Field(min_length=1, max_length=40)
    key: str = Field(min_length=1, max_length=200)
    value: str = Field(min_length=1, max_length=4000)
    importance: float | None = Field(default=None, ge=0, le=1)


class RecallArgs(_Args):
    query: str = Field(max_length=200)
    category: str | None = None


class EscalateArgs(_Args):
    severity: Literal["P0", "P1", "P2", "P3"]
    message: str = Field(min_length=1, max_length=4000)


@dataclass
class ToolContext:
    """What a tool body may use: the run, the actor, the world snapshot and its deadline.

    ``deadline`` is a ``clock.monotonic()`` value; long tools check :meth:`remaining`.
    ``world`` is the :class:`agent.observe.World` of the cycle (fleet, demand, diagnoses).
    ``label`` is the provider label a launch carries (``agent.claims.launch_label`` of its key).
    """

    run: object
    actor: str
    world: object
    deadline: float
    step: object = None
    label: str = ""

    def remaining(self) -> float:
        return self.deadline - clock.monotonic()


@dataclass
class Tool:
    """One tool: ``side_effect`` tools get an idempotency key, guards, and policy checks.

    ``instance_arg`` names the argument holding an instance id (for in-flight and guards).
    ``fallback`` names a tool run in place of this one after three failures (three_strikes).
    """

    name: str
    schema: type[_Args]
    body: Callable[[ToolContext, dict], object]
    side_effect: bool = False
    timeout_s: float | None = None
    instance_arg: str | None = None
    fallback: str | None = None
    changes_world: bool = False
    extra: dict = field(default_factory=dict)


def canonical_args(args: dict | None) -> dict | None:
    """The call's canonical arguments: ``reason`` removed, nulls dropped (key order is ignored by
    :func:`canonical_json`). ``None`` stays ``None`` (unparsable)."""
    if args is None:
        return None
    return {k: v for k, v in args.items() if k != "reason" and v is not None}


def canonical_json(args: dict | None) -> str:
    """Stable JSON of the canonical arguments (sorted keys), for comparing calls."""
    return json.dumps(canonical_args(args), sort_keys=True, separators=(",", ":"), default=str)


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
    from fleet.sync import sync_instances

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
    from fleet.providers import get_provider

    offers = get_provider().search_offers(
        gpu_name=args.get("gpu_name") or "", max_dph=args.get("max_dph"), limit=args.get("limit") or 10
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
    from agent.diagnosis import diagnose_instance as run_diagnosis

    inst = _instance(args["instance_id"])
    diag = (getattr(ctx.world, "prefetched", None) or {}).pop(inst.pk, None)  # collected with its turn (agent.diagnosis.prefetch)
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
        # too, so the run parks its later side effects (SCENARIOS.md "forced approval")
        **({"injection": diag.evidence["injection"]} if diag.evidence.get("injection") else {}),
    }


def launch_instance(ctx: ToolContext, args: dict) -> dict:
    from agent.actions import do_launch_instance

    inst = do_launch_instance(
        gpu_name=args.get("gpu_name") or "", offer_id=args.get("offer_id") or "", actor=ctx.actor, reason=args.get("reason", ""),
        label=ctx.label,
    )
    ctx.world.set_instances([*ctx.world.instances, inst])
    return {"instance_id": inst.external_id, "status": inst.status, "gpu_name": inst.gpu_name, "dph": inst.dph}


def _lifecycle(action: str):
    def body(ctx: ToolContext, args: dict) -> dict:
        from agent.actions import do_instance_action

        inst = _instance(args["instance_id"])
        do_instance_action(inst, action, actor=ctx.actor, reason=args.get("reason", ""))
        inst.refresh_from_db()
        ctx.world.replace(inst)  # later checks of this cycle see what the action did
        return {"instance_id": inst.external_id, "status": inst.status, "killed": inst.killed_at is not None}

    body.__name__ = f"{action}_instance"
    return body


def remember(ctx: ToolContext, args: dict) -> dict:
    """Store or change a fact (``agent.memory.remember``; redacted). Bad input is a semantic error."""
    from agent.memory import MemoryInputError
    from agent.memory import remember as store

    try:
        fact, created = store(args["category"], args["key"], args["value"], importance=args.get("importance"), source="agent")
    except MemoryInputError as exc:
        raise ToolError(str(exc), kind="semantic", code="invalid_args") from exc
    return {"stored": True, "updated": not created, "category": fact.category, "key": fact.key}


def recall(ctx: ToolContext, args: dict) -> dict:
    """The best facts for the query (``agent.memory.recall``: full-text rank × decayed score)."""
    from agent.memory import recall as find

    return {"facts": [{k: f[k] for k in ("category", "key", "value", "score")}
                      for f in find(args.get("query") or "", category=args.get("category"), limit=20)]}


def escalate_human(ctx: ToolContext, args: dict) -> dict:
    from fleet.alerts import raise_alert

    alert = raise_alert("escalation", args["message"], severity=args["severity"], key=f"escalation:{ctx.run.number}:{args['message'][:80]}")
    return {"alert_id": alert.pk, "severity": alert.severity}


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in [
        Tool("list_instances", ListInstancesArgs, list_instances, fallback="list_instances_fallback"),
        Tool("list_instances_fallback", ListInstancesArgs, list_instances_fallback, extra={"internal": True}),
        Tool("get_demand", NoArgs, get_demand),
        Tool("search_offers", SearchOffersArgs, search_offers),
        Tool("diagnose_instance", InstanceArgs, diagnose_instance, instance_arg="instance_id", timeout_s=60, changes_world=True),
        Tool("launch_instance", LaunchArgs, launch_instance, side_effect=True, timeout_s=120),
        Tool("stop_instance", InstanceActionArgs, _lifecycle("stop"), side_effect=True, instance_arg="instance_id", timeout_s=60),
        Tool("resume_instance", InstanceActionArgs, _lifecycle("resume"), side_effect=True, instance_arg="instance_id", timeout_s=60),
        Tool("reboot_instance", InstanceActionArgs, _lifecycle("reboot"), side_effect=True, instance_arg="instance_id", timeout_s=60),
        Tool("destroy_instance", InstanceActionArgs, _lifecycle("destroy"), side_effect=True, instance_arg="instance_id", timeout_s=60),
        Tool("remember", RememberArgs, remember),
        Tool("recall", RecallArgs, recall),
        Tool("escalate_human", EscalateArgs, escalate_human),
    ]
}

#: tools a planner may call (internal fallbacks are not)
PUBLIC_TOOLS = sorted(name for name, t in TOOLS.items() if not t.extra.get("internal"))

