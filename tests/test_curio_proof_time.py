"""proofs_hr and the measured proof time from Curio's task history; the rules planner sizes the fleet
from the measured time when known, else from WARDEN_PROOF_SECONDS (docs/replay.md version 2 ``proof_s``)."""

import pytest

from agent.models import SessionState
from agent.planners.rules import RulesPlanner
from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import World, read_and_record_demand
from fleet.demand import read_demand
from fleet.demand.curio import PROOF_SAMPLE
from tests.curio_support import CURIO_DB, curio, instance, instances  # noqa: F401 (fixture)

pytestmark = CURIO_DB


def test_proof_s_is_the_median_of_recent_successful_proofs(curio):  # noqa: F811
    for seconds in (30, 40, 100):
        curio.history(seconds, ended_s_ago=600)
    curio.history(5, result=False)                         # failed attempts do not count
    curio.history(1, name="SDR")                           # not a proving task
    curio.history(1000, ended_s_ago=25 * 3600)             # outside the window
    curio.history(60, name="UpdateProve", ended_s_ago=2 * 3600)  # in the window, not in the last hour

    r = read_demand([])

    assert r.proof_s == 50.0  # the median of 30, 40, 60 and 100
    assert r.proofs_hr == 15.4  # 3 proofs in the 15-min window, the first begun 700 s ago: 3 * 3600 / 700


def test_proof_s_uses_only_the_newest_proofs(curio):  # noqa: F811
    for _ in range(PROOF_SAMPLE):
        curio.history(20, ended_s_ago=60)
    for _ in range(PROOF_SAMPLE):
        curio.history(90, ended_s_ago=7200)

    assert read_demand([]).proof_s == 20.0


def test_no_history_is_not_measured(curio):  # noqa: F811
    r = read_demand([])

    assert (r.proof_s, r.proofs_hr) == (None, 0.0)


def launches(target: float) -> int:
    SessionState.objects.update_or_create(pk=1, defaults={"target_proofs_hr": target})
    insts = instances()
    w = World(insts, read_and_record_demand(insts), effective_limits(), effective_policy())
    return sum(1 for p in RulesPlanner().first_turn(w).calls if p.tool == "launch_instance")


def test_the_rules_planner_sizes_from_the_measured_proof_time(curio, settings):  # noqa: F811
    settings.WARDEN = {**settings.WARDEN, "MAX_INSTANCES": 20, "PROOF_SECONDS": 20.0}
    for _ in range(200):  # more than a loading time of work, so the target sizes (docs/money.md "The need")
        curio.task("PoRep")
    for _ in range(3):
        curio.history(90, ended_s_ago=600)  # 90 s per proof: 40 proofs/hr per worker

    assert launches(target=360) == 9  # ceil(360 / 40), not 360 / (3600 / 20) = 2


def test_without_a_measurement_it_sizes_from_the_configured_proof_time(curio, settings):  # noqa: F811
    settings.WARDEN = {**settings.WARDEN, "MAX_INSTANCES": 20, "PROOF_SECONDS": 20.0}
    for _ in range(200):  # more than a loading time of work, so the target sizes (docs/money.md "The need")
        curio.task("PoRep")

    assert launches(target=360) == 2  # 3600 / 20 = 180 proofs/hr per worker


def test_the_demo_case_two_workers_proving_at_360_an_hour_ask_for_no_more(curio, settings):  # noqa: F811
    """A run once seen: 2 workers live, 20 s per proof each (360/hr together), proving for 3
    minutes. A trailing-hour count said 18/hr and asked for 4 workers; the measured rate says 360."""
    settings.WARDEN = {**settings.WARDEN, "MAX_INSTANCES": 20, "PROOF_SECONDS": 90.0}
    for name in ("local-1", "local-2"):
        instance(name)
        curio.machine(name, host=f"10.0.0.{name[-1]}:12300")
        for k in range(9):  # back to back, the first began 180 s ago
            curio.history(20, ended_s_ago=160 - 20 * k)
    for _ in range(30):
        curio.task("PoRep")

    r = read_demand(instances())
    assert (r.workers_live, r.proof_s) == (2, 20.0)
    assert r.proofs_hr == pytest.approx(360, rel=0.02)  # the read comes a moment after the inserts
    assert launches(target=360) == 0  # 2 live workers at 180/hr each meet the target
    assert launches(target=720) == 2


def test_proof_time_is_measured_per_worker_and_per_gpu_model(curio):  # noqa: F811
    for name, gpu in (("rig-a", "RTX 4090"), ("rig-b", "RTX 4090"), ("rig-c", "H200")):
        inst = instance(name)
        inst.gpu_name = gpu
        inst.save()
    curio.machine("rig-a", host="10.0.0.1:12300")
    curio.machine("rig-b", host="10.0.0.2:12300")
    curio.machine("rig-c", host="10.0.0.3:12300")
    curio.machine("", host="10.0.0.9:12300")           # no machine_name: not attributable
    curio.machine("twin-1", host="172.17.0.2:12300")   # two rows share a host_and_port (docs/curio.md):
    curio.machine("twin-2", host="172.17.0.2:12300")   # its proofs belong to neither
    for s in (30, 32, 34):
        curio.history(s, host="10.0.0.1:12300")
    curio.history(40, host="10.0.0.2:12300")
    for s in (10, 12):
        curio.history(s, host="10.0.0.3:12300")
    curio.history(99, host="10.0.0.9:12300")
    curio.history(99, host="172.17.0.2:12300")

    r = read_demand(instances())

    assert r.proof_s_by_worker == {"rig-a": 32.0, "rig-b": 40.0, "rig-c": 11.0}
    assert r.proof_s_by_gpu == {"H200": 11.0, "RTX 4090": 33.0}
    assert r.proof_s == 33.0  # the fleet median counts every proof
