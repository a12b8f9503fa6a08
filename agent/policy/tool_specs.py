"""The tools' specs: names, argument schemas (pydantic), side-effect flags, timeouts, fallbacks,
and :func:`canonical_json` — everything about a tool but its implementation.

Names and argument shapes are a contract (docs/contract.md, Tools). This module sits
below ``agent.policy.guards``, ``agent.runtime.breakers``, ``agent.actions`` and ``agent.runtime.tools`` (which binds the
bodies): the guards read what a tool *is* without importing what it *does* (no
``actions → guards → tools → actions`` circle).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
    # vast.ai's offer filters (fleet.providers.vastai); a provider without them refuses them
    min_gpu_ram_gb: float | None = Field(default=None, ge=0)
    min_reliability: float | None = Field(default=None, ge=0, le=1)
    min_cuda: float | None = Field(default=None, ge=0)
    min_disk_gb: float | None = Field(default=None, ge=0)


#: the most calls one parallel batch may hold; a larger batch is refused whole before any call
#: runs (``batch_too_large``, docs/contract.md)
MAX_BATCH_CALLS = 16

#: search_offers filters only some providers take
OFFER_FILTERS = ("min_gpu_ram_gb", "min_reliability", "min_cuda", "min_disk_gb")


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
class Tool:
    """One tool: ``side_effect`` tools get an idempotency key, guards, and policy checks.

    ``instance_arg`` names the argument holding an instance id (for in-flight and guards).
    ``fallback`` names a tool run in place of this one after three failures (three_strikes).
    ``body`` (``(agent.runtime.tools.ToolContext, args) -> payload``) is ``None`` in this module's table;
    ``agent.runtime.tools`` binds the implementations when it is imported.
    """

    name: str
    schema: type[_Args]
    body: Callable[..., object] | None = None
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


#: the registry: every tool's spec; ``agent.runtime.tools`` binds each body in place (the same dict, so a
#: tool registered later — tests, benches — is seen by guards, breakers and the pipeline alike)
TOOLS: dict[str, Tool] = {
    t.name: t
    for t in [
        Tool("list_instances", ListInstancesArgs, fallback="list_instances_fallback"),
        Tool("list_instances_fallback", ListInstancesArgs, extra={"internal": True}),
        Tool("get_demand", NoArgs),
        Tool("search_offers", SearchOffersArgs),
        Tool("diagnose_instance", InstanceArgs, instance_arg="instance_id", timeout_s=60, changes_world=True),
        Tool("launch_instance", LaunchArgs, side_effect=True, timeout_s=120),
        Tool("stop_instance", InstanceActionArgs, side_effect=True, instance_arg="instance_id", timeout_s=60),
        Tool("resume_instance", InstanceActionArgs, side_effect=True, instance_arg="instance_id", timeout_s=60),
        Tool("reboot_instance", InstanceActionArgs, side_effect=True, instance_arg="instance_id", timeout_s=60),
        Tool("destroy_instance", InstanceActionArgs, side_effect=True, instance_arg="instance_id", timeout_s=60),
        Tool("remember", RememberArgs),
        Tool("recall", RecallArgs),
        Tool("escalate_human", EscalateArgs),
    ]
}

#: tools a planner may call (internal fallbacks are not)
PUBLIC_TOOLS = sorted(name for name, t in TOOLS.items() if not t.extra.get("internal"))


def truncate(text: str, limit: int) -> str:
    """Cut ``text`` to about ``limit`` characters, keeping head and tail, with a marker saying how much went."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    removed = len(text) - head - tail
    return f"{text[:head]}\n[… {removed} characters removed …]\n{text[-tail:]}"
