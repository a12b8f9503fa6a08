"""Shared set-up for the safety-rail tests (pipeline, breakers, reports, secrets, context, scoring).

A cycle runs for real — ``agent.runtime.loop.run_cycle`` with a ``ScriptPlanner`` — against the in-memory
``scenario`` provider and demand source (``fleet.providers.scenario``, ``fleet.demand.scenario``:
test doubles of a cloud provider and of Curio's database) on a :class:`~fleet.clock.VirtualClock`,
so backoff and timeouts advance virtual time without waiting.

``rails_world(...)`` yields a :class:`RailsWorld` with the provider, the demand source and the
clock. Instance rows are written like a replay file's ``fleet`` (created ``age_min`` ago). The
demand dicts state no worker counts: they come from ``fleet.demand.base.count_workers`` over those
rows and each entry's ``worker`` (the rule every demand source uses, the startup grace included).
``extra_tool(...)`` registers a test-only tool in ``agent.runtime.tools.TOOLS``/``PUBLIC_TOOLS`` for the
duration of a ``with`` block.
"""

import contextlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from agent.models import Run, SessionState
from agent.planners.script import ScriptPlanner
from fleet.clock import VirtualClock, use_clock
from fleet.models import Diagnosis, Instance

NOW = datetime(2026, 6, 9, 16, 50, tzinfo=UTC)

#: a calm fleet: one running instance whose worker is live, nothing queued, idle for an hour
CALM_DEMAND = {"state": "ok", "active": False, "queued": 0, "running": 0, "idle_min": 60}
BUSY_DEMAND = {"state": "ok", "active": True, "queued": 5, "running": 1, "idle_min": None}


def fleet_entry(ident="v-1", *, status="running", live=True, owned_tasks=0, ssh=None, dph=0.45, age_min=300):
    """One ``fleet[]`` entry in the scenario file's shape."""
    return {"id": ident, "provider": "scenario", "actual_status": status, "intended_status": "running",
            "status_msg": "", "gpu_name": "RTX 4090", "dph": dph, "age_min": age_min,
            "worker": {"live": live, "unschedulable": False, "owned_tasks": owned_tasks},
            "ssh": ssh if ssh is not None else {"reachable": True, "commands": {
                "nvidia-smi": {"rc": 0, "out": "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-1)"}}}}


@dataclass
class RailsWorld:
    provider: object
    demand: object
    clock: VirtualClock

    def provider_calls(self, call: str) -> int:
        """How many requests the provider received for ``call`` (retries included)."""
        return sum(1 for c, _ in self.provider.calls if c == call)

    def cycle(self, steps: list[dict], trigger: str = "test", message: str | None = None) -> Run:
        """Run one real observe cycle with a script planner playing ``steps``."""
        from agent.runtime.loop import run_cycle

        run = run_cycle(trigger, planner=ScriptPlanner(steps), message=message, actor="user:alice" if message else "system")
        assert run is not None, "the run lock was held"
        run.refresh_from_db()
        return run


@contextlib.contextmanager
def rails_world(fleet=None, demand=None, offers=None, faults=None, *, policy=None, limits=None, diagnosed=(),
                observe_only=False):
    """The scenario provider/demand source and a virtual clock at :data:`NOW` for a ``with`` block.

    ``diagnosed``: instance ids with a healthy diagnosis taken 1 minute ago. ``policy``/``limits``
    land in the session anchor's overrides, as the settings page or a replay file's policy would.
    """
    from fleet import demand as demand_mod
    from fleet import providers as providers_mod
    from fleet.demand.scenario import ScenarioDemandSource
    from fleet.providers.scenario import FaultBook, ScenarioProvider

    fleet = [fleet_entry()] if fleet is None else fleet
    clk = VirtualClock(NOW)
    with use_clock(clk):  # the provider's start times are on the virtual clock, as the rows' are
        provider = ScenarioProvider(fleet, offers or [], FaultBook(faults or []))
    source = ScenarioDemandSource(demand or CALM_DEMAND, fleet)
    providers_mod.set_override(provider)
    demand_mod.set_override(source)
    try:
        with use_clock(clk):
            state = SessionState.get()
            state.overrides = {"policy": dict(policy or {}), "limits": dict(limits or {})}
            state.observe_only = observe_only
            state.save()
            for f in fleet:
                created = NOW - timedelta(minutes=f.get("age_min", 300))
                inst, _ = Instance.objects.update_or_create(provider=provider.name, external_id=f["id"], defaults=dict(
                    label=f["id"], gpu_name=f["gpu_name"], status=f["actual_status"], intended_status="running",
                    status_since=created, dph=f["dph"], ssh_host=f["id"], ssh_port=22, worker_name=f["id"],
                    created_at=created, started_at=created, killed_at=None,
                ))
                if f["id"] in diagnosed:
                    Diagnosis.objects.create(instance=inst, taken_at=NOW - timedelta(minutes=1), health="healthy",
                                             fault_class="", cause="on record", source="ssh", evidence={})
            yield RailsWorld(provider, source, clk)
    finally:
        providers_mod.set_override(None)
        demand_mod.set_override(None)


@contextlib.contextmanager
def extra_tool(name: str, body, *, schema=None, timeout_s=None, side_effect=False, fallback=None):
    """Register a test tool ``name`` (auto policy) for the ``with`` block; removed afterwards."""
    from agent.policy.table import DEFAULT_POLICY
    from agent.runtime import tools

    spec = tools.Tool(name, schema or tools.NoArgs, body, timeout_s=timeout_s, side_effect=side_effect, fallback=fallback)
    tools.TOOLS[name] = spec
    tools.PUBLIC_TOOLS.append(name)
    DEFAULT_POLICY[name] = "auto"
    try:
        yield spec
    finally:
        tools.TOOLS.pop(name, None)
        if name in tools.PUBLIC_TOOLS:
            tools.PUBLIC_TOOLS.remove(name)
        DEFAULT_POLICY.pop(name, None)


def calls(run: Run) -> list:
    """The run's agent call steps in order."""
    return list(run.steps.filter(kind="call", actor="agent").order_by("seq"))


def verdict(action=False, changed=False) -> dict:
    """A final-answer text step."""
    return {"text": f'Done. <verdict>{{"action": {str(action).lower()}, "state_changed": {str(changed).lower()}}}</verdict>'}
