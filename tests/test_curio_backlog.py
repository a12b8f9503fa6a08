"""Work waiting in Curio's pipeline tables is demand: reported apart from the queue, sized for,
and it blocks scale-down (docs/replay.md version 2 ``backlog``).

Curio adds an UpdateProve or PoRep queue row only on a live node that runs that task, so with no
GPU worker alive ``harmony_task`` reads empty while sectors wait (the scale-to-zero trap).
"""

from agent.planners.rules import RulesPlanner
from agent.policy.guards import check
from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import World, read_and_record_demand
from fleet.demand import read_demand
from fleet.models import DemandSample
from tests.curio_support import CURIO_DB, curio, instance, instances  # noqa: F401 (fixture)

pytestmark = CURIO_DB


def world() -> World:
    insts = instances()
    return World(insts, read_and_record_demand(insts), effective_limits(), effective_policy())


def test_an_encoded_snap_sector_with_no_prove_task_is_backlog_not_queue(curio):  # noqa: F811
    curio.snap_sector(1, after_encode=True, after_prove=False, task_id_prove=None)

    r = read_demand([])

    assert r.state == "ok", r.error
    assert (r.queued, r.backlog, r.running) == (0, 1, 0)


def test_only_sectors_waiting_for_a_proof_count(curio):  # noqa: F811
    curio.snap_sector(1)                              # waits for UpdateProve
    curio.snap_sector(2, after_encode=False)          # still encoding
    curio.snap_sector(3, task_id_prove=77)            # its UpdateProve is queued: counted in the queue
    curio.snap_sector(4, after_prove=True)            # proved
    curio.sdr_sector(10)                              # precommit landed, seed known: waits for PoRep
    curio.sdr_sector(11, seed_epoch=None)             # precommit not landed
    curio.sdr_sector(12, task_id_porep=78)            # its PoRep is queued
    curio.sdr_sector(13, after_porep=True)            # proved
    curio.sdr_sector(14, failed=True)                 # failed
    curio.sdr_sector(15, precommitted=False)          # precommit message not yet successful
    curio.task("UpdateProve", age_s=5)
    curio.task("PoRep", age_s=5)

    r = read_demand([])

    assert (r.queued, r.backlog) == (2, 2)


def test_backlog_counts_only_the_proving_task_names_warden_serves(curio, settings):  # noqa: F811
    curio.snap_sector(1)
    curio.sdr_sector(10)
    settings.WARDEN = {**settings.WARDEN, "TASK_NAMES": ["UpdateProve"]}

    assert read_demand([]).backlog == 1


def test_a_stop_is_refused_while_work_waits_in_the_backlog(curio):  # noqa: F811
    curio.snap_sector(1)
    curio.machine("vast-101", age_s=10)  # its worker is live and owns nothing
    instance("vast-101")
    w = world()

    refusal = check("stop_instance", {"instance_id": "vast-101", "reason": "idle"}, "key-1", w)

    assert (w.demand.queued, w.demand.backlog) == (0, 1)
    assert refusal is not None and refusal.code == "demand_guard"
    assert "1 in the backlog" in refusal.detail


def test_the_backlog_launches_a_worker_when_none_is_alive(curio):  # noqa: F811
    curio.snap_sector(1)
    curio.snap_sector(2)

    turn = RulesPlanner().first_turn(world())

    launches = [p for p in turn.calls if p.tool == "launch_instance"]
    assert len(launches) >= 1 and launches[0].args["launch_priority"] == "P0"
    assert "+2 in the backlog" in launches[0].args["reason"]


def test_the_observation_and_the_sample_carry_queue_and_backlog_apart(curio):  # noqa: F811
    curio.snap_sector(1)
    curio.task("PoRep")

    w = world()
    view = World.demand_view(w.demand)
    sample = DemandSample.objects.latest("taken_at")

    assert (view["queued"], view["backlog"]) == (1, 1)
    assert (sample.queued, sample.backlog) == (1, 1)
    assert sample.idle_since is None


def test_the_queue_is_not_idle_while_the_backlog_is_not_empty(curio):  # noqa: F811
    curio.snap_sector(1)

    w = world()

    assert (w.demand.queued, w.demand.running, w.demand.backlog) == (0, 0, 1)
    assert w.demand.idle_since is None
    assert DemandSample.objects.latest("taken_at").idle_since is None


def test_a_cycle_with_only_backlog_launches_and_reports_it(curio):  # noqa: F811
    from agent.runtime.loop import run_cycle
    from fleet import demand as demand_mod
    from tests.scenario_world import scenario_world

    curio.snap_sector(1)
    with scenario_world([], {"state": "unknown"}) as provider:
        demand_mod.set_override(None)  # the demand is the Curio database's, not the scenario's
        provider.offers = [{"id": "o-1", "gpu_name": "RTX 4090", "dph": 0.42, "machine_id": 5512}]
        run = run_cycle("heartbeat", planner=RulesPlanner())

    launches = [s for s in run.steps.filter(kind="call", tool="launch_instance")]
    assert [s.outcome for s in launches] == ["executed"]  # P0: no worker is live
    assert "launch_instance" in [c for c, _ in provider.calls]
    answer = run.steps.filter(kind="text").order_by("-seq").values_list("text", flat=True).first()
    assert "queued 0, backlog 1" in answer
    observed = run.steps.get(kind="observe").observation
    assert '"backlog": 1' in observed and '"queued": 0' in observed
