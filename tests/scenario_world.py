"""Test helper: install a scenario provider and demand source (stand-ins for vast.ai and Curio).

They are the replay's real parts (fleet/providers/scenario.py, fleet/demand/scenario.py); tests
use them to drive the real loop without the network.
"""

import contextlib
from datetime import timedelta

from agent.models import SessionState
from fleet import demand as demand_mod
from fleet import providers
from fleet.clock import clock
from fleet.demand.scenario import ScenarioDemandSource
from fleet.models import Instance
from fleet.providers.scenario import ScenarioProvider


def entry(iid: str, *, status: str = "running", live: bool = True, owned: int = 0, dph: float = 0.45, ssh=None) -> dict:
    """One fleet entry in the scenario file's shape."""
    return {"id": iid, "actual_status": status, "intended_status": "running", "gpu_name": "RTX 4090", "dph": dph,
            "worker": {"live": live, "unschedulable": False, "owned_tasks": owned},
            "ssh": ssh or {"reachable": True, "commands": {"nvidia-smi -L": {"rc": 0, "out": "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-1)"}}}}


@contextlib.contextmanager
def scenario_world(fleet: list[dict], demand: dict, *, policy: dict | None = None, age_min: float = 300, objectives=None,
                   provider_name: str = "scenario"):
    """Rows for ``fleet``, the scenario provider/demand installed, policy overrides set."""
    now = clock.now()
    for e in fleet:
        Instance.objects.create(provider=provider_name, external_id=e["id"], status=e["actual_status"], gpu_name=e["gpu_name"],
                                dph=e["dph"], worker_name=e["id"], created_at=now - timedelta(minutes=age_min),
                                started_at=now - timedelta(minutes=age_min), status_since=now - timedelta(minutes=age_min))
    state = SessionState.get()
    state.overrides = {"policy": policy or {}}
    # the scale-down budget (one retirement per 15 min at 50% of two workers) is opted out of here:
    # these worlds test other rules with several stops; the budget's own tests set it (test_money.py)
    state.objectives = {"retire_budget_pct": 100, **(objectives or {})}
    if "target_proofs_hr" in state.objectives:  # the target lives on the anchor, as in replay
        state.target_proofs_hr = state.objectives["target_proofs_hr"]
    state.save()
    provider = ScenarioProvider(fleet=fleet, name=provider_name)
    providers.set_override(provider)
    demand_mod.set_override(ScenarioDemandSource(demand, fleet))
    try:
        yield provider
    finally:
        providers.set_override(None)
        demand_mod.set_override(None)
