"""Proofs are credited to the machine that made them when they complete, and the credit stays
when the machine stops or is destroyed: the Performance tab's $ per proof by GPU model, its
per-instance proofs and an instance's timeline read the credits. Windows are on the database's
clock: a node whose clock is 3 minutes off does not move proofs/hr."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.runtime.observe import read_and_record_demand
from fleet.demand import read_demand
from fleet.demand.curio import node_clock_offsets
from fleet.models import CurioRead, Instance, ProofCredit
from fleet.proof_cost import proof_costs
from tests.curio_support import CURIO_DB, curio, instance, instances  # noqa: F401 (fixture)

pytestmark = CURIO_DB


def four_workers(curio):  # noqa: F811
    """local-1…4 (local-cpu) with their rows; each made some proofs; one credited observe."""
    rows = {}
    for k in range(1, 5):
        inst = instance(f"local-{k}")
        inst.gpu_name, inst.dph = "local-cpu", 0.10 * k
        inst.save()
        rows[k] = curio.machine(f"local-{k}", age_s=5, host=f"127.0.0.1:{12300 + k}")
        for _ in range(k + 2):  # 3 + 4 + 5 + 6 = 18 proofs
            curio.history(20, ended_s_ago=120, host=f"127.0.0.1:{12300 + k}")
    read_and_record_demand(instances())
    return rows


def test_each_proof_is_credited_once_to_the_instance_that_made_it(curio):  # noqa: F811
    four_workers(curio)
    read_and_record_demand(instances())  # a second observe credits nothing twice

    by = {i.external_id: i.proof_credits.count() for i in Instance.objects.all()}
    assert by == {"local-1": 3, "local-2": 4, "local-3": 5, "local-4": 6}
    assert ProofCredit.objects.count() == 18 and not ProofCredit.objects.filter(instance__isnull=True).exists()
    c = ProofCredit.objects.filter(instance__external_id="local-2").first()
    assert (c.gpu_name, c.dph, c.seconds, c.host_and_port) == ("local-cpu", pytest.approx(0.2), pytest.approx(20.0),
                                                             "127.0.0.1:12302")


def test_a_stopped_and_a_destroyed_worker_keep_their_proofs(curio, client):  # noqa: F811
    from django.contrib.auth.models import User

    rows = four_workers(curio)
    now = timezone.now()
    Instance.objects.filter(external_id="local-3").update(status="stopped", status_since=now)
    Instance.objects.filter(external_id="local-4").update(killed_at=now, killed_by="agent", kill_reason="idle")
    curio.sql("DELETE FROM harmony_machines WHERE id IN (%s, %s)", [rows[3], rows[4]])  # Curio prunes their rows
    curio.machine("", age_s=5, host="127.0.0.1:12303")  # and another node took local-3's address

    costs, error = proof_costs(list(Instance.objects.all()))

    assert error == ""
    assert [(c.gpu_name, c.proofs) for c in costs] == [("local-cpu", 18)]  # never "not ours"
    assert costs[0].dph == pytest.approx(0.25)  # the median $/hr of the four, as they were when proving

    client.force_login(User.objects.create_user("op", password="x" * 12, is_staff=True))
    page = client.get("/performance/?hours=6").content.decode()
    row = page[page.index('id="perf-local-4"'):]
    assert '<td class="proofs"' in row and ">6</td>" in row[:row.index("</tr>")]
    assert 'id="proofs-not-ours"' not in page
    timeline = client.get("/instances/local-4/timeline/?kind=rate", headers={"HX-Request": "true"}).content.decode()
    assert "6 proofs completed" in timeline and "Nothing recorded" not in timeline


def test_near_miss_proofs_of_a_node_that_is_not_ours_are_said_so(curio):  # noqa: F811
    instance("local-1")
    curio.machine("local-1", age_s=5, host="127.0.0.1:12301")
    curio.machine("sealer-7", age_s=5, host="10.9.9.9:12300")
    curio.history(20, host="127.0.0.1:12301")
    curio.history(30, host="10.9.9.9:12300")
    read_and_record_demand(instances())

    assert ProofCredit.objects.filter(instance__isnull=True).values_list("worker_name", flat=True).get() == "sealer-7"
    costs, _ = proof_costs(instances())
    assert sorted((c.gpu_name, c.proofs) for c in costs) == [("", 1), ("unknown GPU", 1)]


def test_a_node_three_minutes_behind_does_not_move_proofs_per_hour(curio):  # noqa: F811
    """20 proofs/hr by one node whose clock is 180 s slow read 16 with windows on its clock."""
    host = "10.0.0.1:12300"
    instance("rig-a")
    curio.machine("rig-a", age_s=5, host=host)
    (db_now,), = curio.sql("SELECT now()")
    # earlier reads (every 60 s of the last hour, on the database's clock) credited its proofs: each
    # ended between two reads, its work_end 180 s behind the truth
    reads = [db_now - timedelta(seconds=3600 - 60 * j) for j in range(45)]
    CurioRead.objects.bulk_create([CurioRead(at=t) for t in reads])
    for k, j in enumerate(range(0, 44, 3)):
        true_end = reads[j] + timedelta(seconds=1 if k % 2 else 59)
        ProofCredit.objects.create(history_id=10_000 + k, task_id=k, name="PoRep", host_and_port=host, seconds=170,
                                   work_end=true_end - timedelta(seconds=180), seen_at=reads[j + 1],
                                   seen_after=reads[j])
    assert node_clock_offsets()[host] == pytest.approx(-179, abs=1)
    # the last 15 minutes: one proof every 3 minutes (20/hr), written on the node's slow clock
    for true_ago in (60, 240, 420, 600, 780):
        curio.history(170, ended_s_ago=true_ago + 180, host=host)

    r = read_demand(instances())

    assert r.proofs_hr == pytest.approx(20, abs=0.2)


def test_twin_a_node_on_time_reads_the_same_with_no_estimate(curio):  # noqa: F811
    host = "10.0.0.2:12300"
    instance("rig-b")
    curio.machine("rig-b", age_s=5, host=host)
    for true_ago in (60, 240, 420, 600, 780):
        curio.history(170, ended_s_ago=true_ago, host=host)

    r = read_demand(instances())

    assert node_clock_offsets() == {}
    assert r.proofs_hr == pytest.approx(20, abs=0.2)


def test_a_proof_committed_after_a_newer_one_is_still_credited(curio):  # noqa: F811
    """History ids are taken at insert; two nodes' transactions may commit out of id order."""
    instance("rig-a")
    curio.machine("rig-a", age_s=5, host="10.0.0.1:12300")
    (late,), = curio.sql("SELECT nextval(pg_get_serial_sequence('harmony_task_history', 'id'))")
    curio.history(20, host="10.0.0.1:12300")  # id late + 1, committed first
    read_and_record_demand(instances())
    curio.sql("INSERT INTO harmony_task_history (id, task_id, name, posted, work_start, work_end, result, err, "
              "completed_by_host_and_port) VALUES (%s, 9, 'PoRep', now(), now() - interval '30 s', now(), true, '', "
              "'10.0.0.1:12300')", [late])
    read_and_record_demand(instances())

    assert sorted(ProofCredit.objects.values_list("history_id", flat=True)) == [late, late + 1]
