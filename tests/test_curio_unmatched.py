"""Worker rows that match no instance are reported as such, never folded into "dead"
(docs/curio.md, Workers: map by machine_name, never host_and_port)."""

from agent.runtime.observe import World
from fleet.demand import read_demand
from tests.curio_support import CURIO_DB, curio, instance, instances  # noqa: F401 (fixture)

pytestmark = CURIO_DB


def test_a_live_cordoned_row_without_a_name_counts_as_cordoned_not_dead(curio):  # noqa: F811
    curio.machine("", age_s=20, cordoned=True, host="172.17.0.2:12300")
    instance("vast-102")  # its worker started without CURIO_NODE_NAME

    r = read_demand(instances())

    assert (r.workers_expected, r.workers_live, r.workers_cordoned, r.workers_dead) == (1, 0, 1, 0)
    assert [(u["host_and_port"], u["name"], u["live"], u["cordoned"]) for u in r.unmatched] == [
        ("172.17.0.2:12300", "", True, True)
    ]


def test_a_live_row_without_a_name_keeps_a_rowless_instance_out_of_dead_and_counts_live(curio):  # noqa: F811
    curio.machine("", age_s=20, host="172.17.0.3:12300")
    instance("vast-103")

    r = read_demand(instances())

    # an unnamed live node proves our queue: a live worker (and capacity), matched to no instance
    assert (r.workers_live, r.workers_unmatched_live, r.workers_cordoned, r.workers_dead) == (1, 1, 0, 0)
    assert not r.workers["vast-103"].live  # never the instance's own liveness: no action targets the row
    assert len(r.unmatched) == 1 and r.unmatched[0]["host_and_port"] == "172.17.0.3:12300"


def test_a_node_with_no_details_row_yet_is_unnamed(curio):  # noqa: F811
    curio.machine(None, age_s=5, host="172.17.0.4:12300")  # details are written after the engine starts
    instance("vast-104")

    r = read_demand(instances())

    assert r.workers_dead == 0 and [u["host_and_port"] for u in r.unmatched] == ["172.17.0.4:12300"]


def test_a_name_of_no_instance_is_reported_and_never_stands_in_for_one(curio):  # noqa: F811
    curio.machine("sealer-gpu-7", age_s=5, host="10.1.1.7:12300")
    instance("vast-105")  # no row at all: dead

    r = read_demand(instances())

    assert (r.workers_live, r.workers_dead) == (0, 1)
    assert [(u["name"], u["host_and_port"]) for u in r.unmatched] == [("sealer-gpu-7", "10.1.1.7:12300")]


def test_a_stale_row_without_a_name_does_not_hide_a_dead_instance(curio):  # noqa: F811
    curio.machine("", age_s=600, host="172.17.0.5:12300")
    instance("vast-106")

    r = read_demand(instances())

    assert r.workers_dead == 1 and r.unmatched[0]["live"] is False


def test_nodes_that_run_no_proving_task_are_not_workers(curio):  # noqa: F811
    curio.machine("", age_s=5, host="10.0.0.1:12300", tasks="SDR,TreeD,TreeRC,WdPost,WinPost", gpu=0)
    instance("vast-107")

    r = read_demand(instances())

    assert r.unmatched == [] and r.workers_dead == 1


def test_instances_map_by_machine_name_and_a_shared_host_and_port_is_flagged(curio):  # noqa: F811
    a = curio.machine("vast-201", age_s=5, host="127.0.0.1:12300")
    b = curio.machine("vast-202", age_s=400, host="127.0.0.1:12300")  # behind the same tunnel address
    curio.task("PoRep", owner=a)
    curio.task("PoRep", owner=b)
    instance("vast-201")
    instance("vast-202")

    r = read_demand(instances())

    assert r.workers["vast-201"].live and not r.workers["vast-202"].live
    assert (r.workers_live, r.workers_dead, r.running, r.queued) == (1, 1, 1, 1)
    assert r.unmatched == []
    assert r.shared_hosts == {"127.0.0.1:12300": [a, b]}


def test_the_observation_lists_unmatched_rows_with_their_host_and_port(curio):  # noqa: F811
    curio.machine("", age_s=20, cordoned=True, host="172.17.0.2:12300")
    instance("vast-102")

    view = World.demand_view(read_demand(instances()))

    assert view["workers_unmatched"] == 1
    assert view["unmatched"] == [
        {"host_and_port": "172.17.0.2:12300", "name": "", "live": True, "cordoned": True, "owned_tasks": 0}
    ]
    assert view["workers_dead"] == 0 and view["workers_cordoned"] == 1


def test_a_rowless_instance_may_own_the_tasks_of_a_live_unnamed_row_so_its_stop_needs_an_operator(curio):  # noqa: F811
    from agent.policy.lifecycle import forced_approval
    from agent.policy.table import effective_limits, effective_policy
    from agent.runtime.observe import read_and_record_demand

    unnamed = curio.machine("", age_s=20, host="172.17.0.2:12300")
    curio.task("PoRep", owner=unnamed)
    instance("vast-102")
    insts = instances()
    w = World(insts, read_and_record_demand(insts), effective_limits(), effective_policy())

    args = {"instance_id": "vast-102", "reason": "idle"}

    assert w.demand.workers["vast-102"].owned_tasks == 1 and not w.demand.workers["vast-102"].live
    # not a live worker's tasks (no owned_tasks refusal), but a dead worker's: forced approval
    assert "still owns 1 task" in forced_approval("stop_instance", args, w)
    assert "still owns" in forced_approval("destroy_instance", args, w)


def test_a_healthy_cluster_with_no_node_names_has_live_workers_and_no_emergency(curio):  # noqa: F811
    """Issue: with CURIO_NODE_NAME set on no node every node proves, yet workers_live read 0 and the
    "no live worker" rules (a P0 launch, starvation) fired. Unnamed live nodes are live workers and
    capacity; they match no instance and no action targets them."""
    from agent.planners.rules import RulesPlanner
    from agent.policy.table import effective_limits, effective_policy
    from agent.runtime.observe import read_and_record_demand
    from fleet.lifecycle import starving
    from fleet.models import Alert, Instance

    a = curio.machine("", age_s=20, host="10.0.0.1:12300")
    b = curio.machine("", age_s=40, host="10.0.0.2:12300")
    for owner in (a, b):
        curio.task("PoRep", owner=owner)
    for _ in range(6):
        curio.task("PoRep")
    instance("vast-301")
    instance("vast-302")
    pending = instance("vast-303", status="loading", started_s_ago=3 * 3600)  # a launch pending for 3 h
    insts = instances()
    w = World(insts, read_and_record_demand(insts), effective_limits(), effective_policy())

    d = w.demand
    assert (d.workers_live, d.workers_unmatched_live, d.workers_dead, d.running, d.queued) == (2, 2, 0, 2, 6)
    assert not starving(Instance.objects.get(pk=pending.pk), w)
    launches = [p for p in RulesPlanner().first_turn(w).calls if p.tool == "launch_instance"]
    assert all(p.args["launch_priority"] != "P0" for p in launches)
    assert not Alert.objects.filter(kind="workers_dead").exists()
    view = World.demand_view(d)
    assert view["workers_unmatched_live"] == 2 and view["workers_live"] == 2


def test_twin_with_no_node_alive_the_emergency_stands(curio):  # noqa: F811
    from agent.planners.rules import RulesPlanner
    from agent.policy.table import effective_limits, effective_policy
    from agent.runtime.observe import read_and_record_demand

    curio.machine("", age_s=900, host="10.0.0.1:12300")  # unnamed and silent: not live
    for _ in range(6):
        curio.task("PoRep")
    instance("vast-301")
    insts = instances()
    w = World(insts, read_and_record_demand(insts), effective_limits(), effective_policy())

    assert (w.demand.workers_live, w.demand.workers_unmatched_live, w.demand.workers_dead) == (0, 0, 1)
    launches = [p for p in RulesPlanner().first_turn(w).calls if p.tool == "launch_instance"]
    assert launches and launches[0].args["launch_priority"] == "P0"


def test_unnamed_live_workers_beyond_our_instances_are_capacity_and_end_the_emergency(curio):  # noqa: F811
    """Unnamed live nodes that no rowless instance of ours can be are still capacity: the need
    counts them and a launch is P1 (work waits, a worker is live), not P0. No instance at all here."""
    from agent.policy.capacity import capacity, facts_priority, need_for
    from agent.policy.table import effective_limits, effective_policy
    from agent.runtime.observe import read_and_record_demand

    for host in ("10.0.0.1:12300", "10.0.0.2:12300"):
        curio.machine("", age_s=20, host=host)
    for _ in range(6):
        curio.task("PoRep")
    w = World([], read_and_record_demand([]), effective_limits(), effective_policy())

    assert w.demand.workers_unmatched_live == 2
    cap = capacity(w)
    assert (cap.unmatched, cap.count, cap.instances) == (2, 2, [])
    assert facts_priority(w) == "P1"
    assert need_for(w).live == 2


def test_twin_with_the_unnamed_nodes_silent_they_are_no_capacity(curio):  # noqa: F811
    from agent.policy.capacity import capacity, facts_priority
    from agent.policy.table import effective_limits, effective_policy
    from agent.runtime.observe import read_and_record_demand

    for host in ("10.0.0.1:12300", "10.0.0.2:12300"):
        curio.machine("", age_s=900, host=host)
    for _ in range(6):
        curio.task("PoRep")
    w = World([], read_and_record_demand([]), effective_limits(), effective_policy())

    assert (capacity(w).unmatched, capacity(w).count) == (0, 0)
    assert facts_priority(w) == "P0"
