"""$ per proof per GPU model (fleet.proof_cost) from the proofs Curio's task history credits to each
node, on a Curio-shaped test database: node address → machine name → our instance → its GPU model."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Instance
from fleet.proof_cost import proof_costs
from tests.curio_support import CURIO_DB, curio  # noqa: F401 (fixture)

pytestmark = CURIO_DB


def proved(curio, host: str, seconds: float, *, ended_s_ago: float = 600, result: bool = True) -> None:  # noqa: F811
    curio.sql(
        "INSERT INTO harmony_task_history (task_id, name, posted, work_start, work_end, result, err, "
        "completed_by_host_and_port) VALUES (1, 'PoRep', now() - make_interval(secs => %s), "
        "now() - make_interval(secs => %s), now() - make_interval(secs => %s), %s, '', %s)",
        [ended_s_ago + seconds + 5, ended_s_ago + seconds, ended_s_ago, result, host],
    )


def instance(ext: str, gpu: str, dph: float, **kw) -> Instance:
    now = timezone.now()
    return Instance.objects.create(provider="rented", external_id=ext, worker_name=ext, gpu_name=gpu, dph=dph,
                                   status="running", status_since=now, created_at=now - timedelta(hours=2), **kw)


def test_each_gpu_model_costs_its_rate_times_its_median_proof_time(curio):  # noqa: F811
    insts = [instance("v-1", "RTX 4090", 0.6), instance("v-2", "A100", 1.8),
             instance("v-3", "RTX 4090", 0.4, killed_at=timezone.now())]  # it proved before it was destroyed
    curio.machine("v-1", host="10.0.0.1:1")
    curio.machine("v-2", host="10.0.0.2:1")
    curio.machine("v-3", host="10.0.0.3:1")
    curio.machine("someone-else", host="10.0.0.9:1")
    for s in (30, 40, 50):
        proved(curio, "10.0.0.1:1", s)
    proved(curio, "10.0.0.3:1", 45)
    proved(curio, "10.0.0.2:1", 20)
    proved(curio, "10.0.0.2:1", 20)
    proved(curio, "10.0.0.2:1", 5, result=False)           # a failed attempt is no proof
    proved(curio, "10.0.0.2:1", 900, ended_s_ago=30 * 3600)  # outside the 24 h window
    proved(curio, "10.0.0.9:1", 60)                        # a worker that is not ours

    costs, error = proof_costs(insts)

    assert error == ""
    assert [(c.gpu_name, c.proofs, c.proof_s, c.dph) for c in costs] == [
        ("RTX 4090", 4, 42.5, 0.5), ("A100", 2, 20.0, 1.8), ("", 1, 60.0, None)]
    assert costs[0].usd_per_proof == pytest.approx(0.5 * 42.5 / 3600)
    assert costs[1].usd_per_proof == pytest.approx(0.01)
    assert costs[2].usd_per_proof is None


def test_nothing_measured_is_said_not_zero(curio):  # noqa: F811
    from fleet import demand
    from fleet.demand.scenario import ScenarioDemandSource

    assert proof_costs([]) == ([], "")
    demand.set_override(ScenarioDemandSource({"state": "ok", "queued": 0}, []))  # a source without task history
    try:
        costs, error = proof_costs([])
    finally:
        demand.set_override(None)
    assert costs == [] and error == "the demand source in use (ScenarioDemandSource) has no task history"
