"""A destroyed instance's Curio row (cordoned while it drained, then stale) is history, not an
"unmatched" node with a CURIO_NODE_NAME hint (seen on the dashboard after a destroy)."""

from django.utils import timezone

from fleet.demand import read_demand
from fleet.models import Instance
from tests.curio_support import CURIO_DB, curio, instance, instances  # noqa: F401 (fixture)

pytestmark = CURIO_DB


def test_the_row_of_a_destroyed_cordoned_worker_is_not_unmatched(curio):  # noqa: F811
    curio.machine("local-7", age_s=600, cordoned=True, host="127.0.0.1:40007")
    gone = instance("local-7")
    Instance.objects.filter(pk=gone.pk).update(killed_at=timezone.now(), killed_by="user:alice", kill_reason="destroyed")
    instance("local-8")
    curio.machine("local-8", age_s=1, host="127.0.0.1:40008")

    r = read_demand(instances())

    assert r.unmatched == [] and (r.workers_live, r.workers_dead) == (1, 0)


def test_a_row_named_after_no_instance_of_ours_is_still_unmatched(curio):  # noqa: F811
    curio.machine("sealer-9", age_s=600, cordoned=True, host="10.0.0.9:12300")
    gone = instance("local-7")
    Instance.objects.filter(pk=gone.pk).update(killed_at=timezone.now())

    r = read_demand(instances())

    assert [u["name"] for u in r.unmatched] == ["sealer-9"]


def test_a_name_reused_by_a_live_instance_matches_that_instance(curio):  # noqa: F811
    now = timezone.now()
    Instance.objects.create(provider="local", external_id="local-70", worker_name="local-7", status="exited",
                            killed_at=now, created_at=now, status_since=now)
    instance("local-7")  # a live instance whose worker uses the destroyed one's name
    curio.machine("local-7", age_s=1, host="127.0.0.1:40007")

    r = read_demand(instances())

    assert r.unmatched == [] and r.workers_live == 1
