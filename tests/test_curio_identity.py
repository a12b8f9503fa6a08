"""Two nodes behind one address become one Curio row (Curio's registration upserts by
host_and_port): Warden detects it, raises ``node_identity``, reads the instance without a row as of
unknown liveness (never dead) and parks every stop, reboot or destroy of either instance for an
operator, the monitor's included. Twin: a real dead node with a row of its own is still dead."""

from agent.policy.lifecycle import forced_approval
from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import World, read_and_record_demand
from fleet.models import Alert
from tests.curio_support import CURIO_DB, curio, instance, instances  # noqa: F401 (fixture)

pytestmark = CURIO_DB

BRIDGE = "172.17.0.2:12300"  # Docker's default bridge address, the same on separate rented hosts


def world() -> World:
    insts = instances()
    return World(insts, read_and_record_demand(insts), effective_limits(), effective_policy())


def collided(curio):  # noqa: F811
    """vast-105 registered first; vast-106 then started behind the same address and took its row."""
    instance("vast-105")
    instance("vast-106")
    row = curio.machine("vast-105", age_s=5, host=BRIDGE)
    first = world()
    curio.rename(row, "vast-106")
    curio.task("PoRep", owner=row)  # both nodes' tasks are owned by the one row
    curio.task("PoRep", owner=row)
    return row, first


def test_two_nodes_behind_one_address_are_flagged_and_the_rowless_one_is_not_dead(curio):  # noqa: F811
    row, first = collided(curio)
    assert first.demand.workers_dead == 1 and not first.demand.node_identity  # vast-106 not registered yet: dead

    w = world()

    d = w.demand
    assert d.workers_dead == 0, d
    assert {x["instance"] for x in d.node_identity} == {"vast-105", "vast-106"}
    assert all(x["machine_id"] == row for x in d.node_identity)
    view = d.workers["vast-105"]
    assert not view.live and "now carries vast-106" in view.identity and "unique listen address" in view.identity
    alert = Alert.objects.get(kind="node_identity")
    assert alert.state == "firing" and "vast-105" in alert.message
    assert not Alert.objects.filter(kind="workers_dead", state="firing").exists()


def test_stopping_rebooting_or_destroying_either_needs_an_operator(curio):  # noqa: F811
    collided(curio)
    w = world()

    for tool in ("stop_instance", "reboot_instance", "destroy_instance"):
        for inst in ("vast-105", "vast-106"):
            why = forced_approval(tool, {"instance_id": inst, "reason": "x"}, w)
            assert "identity is in doubt (node_identity)" in why, (tool, inst)


def test_the_monitor_parks_its_destroy_of_an_instance_in_doubt(curio):  # noqa: F811
    from agent.models import Approval
    from agent.planners.script import ScriptPlanner
    from agent.runtime.loop import run_cycle
    from fleet import demand as demand_mod
    from fleet.models import Instance
    from tests.scenario_world import entry, scenario_world

    row = curio.machine("vast-105", age_s=5, host=BRIDGE)
    fleet = [entry("vast-105", status="error", live=False), entry("vast-106")]
    with scenario_world(fleet, {"state": "unknown"}, policy={"destroy_instance:monitor": "auto"}):
        demand_mod.set_override(None)  # the demand is the Curio database's
        Instance.objects.filter(external_id__in=["vast-105", "vast-106"]).update(provider="scenario")
        read_and_record_demand(instances())  # the row seen as vast-105's
        curio.rename(row, "vast-106")
        run = run_cycle("heartbeat", planner=ScriptPlanner([]))

    [step] = list(run.steps.filter(kind="call", actor="monitor", tool="destroy_instance"))
    assert step.outcome == "parked", (step.outcome, step.reason_code, step.detail)
    approval = Approval.objects.get(step=step)
    assert "node_identity" in str(approval.situation.get("forced", ""))


def test_twin_a_dead_node_with_its_own_row_is_still_dead(curio):  # noqa: F811
    instance("vast-105")
    instance("vast-106")
    curio.machine("vast-105", age_s=900, host="10.0.0.5:12300")  # its own row, long silent
    curio.machine("vast-106", age_s=5, host="10.0.0.6:12300")
    world()
    w = world()

    assert (w.demand.workers_live, w.demand.workers_dead, w.demand.node_identity) == (1, 1, [])
    assert forced_approval("reboot_instance", {"instance_id": "vast-105", "reason": "dead"}, w) == ""
    assert Alert.objects.get(kind="workers_dead").state == "firing"


def test_twin_a_rowless_instance_with_no_row_changing_hands_is_dead(curio):  # noqa: F811
    instance("vast-105")
    instance("vast-106")
    curio.machine("vast-106", age_s=5, host="10.0.0.6:12300")
    world()
    w = world()

    assert (w.demand.workers_dead, w.demand.node_identity) == (1, [])
    assert not w.demand.workers["vast-105"].identity
