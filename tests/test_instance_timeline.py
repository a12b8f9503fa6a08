"""The per-instance timeline: launches, diagnoses, actions, the agent's calls, alerts
and proof rates on one page, newest first, narrowed by ``?kind=``; the same number of queries
however long the history."""

from datetime import timedelta

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from agent.actions.alerts import do_ack_alert
from fleet.alerts import raise_alert
from fleet.audit import do_audit
from fleet.clock import clock
from fleet.harmony import HarmonyMachine, HarmonyMachineDetails, HarmonyTaskHistory
from fleet.models import Instance
from tests.console_support import HX, IDLE, park_stops
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def _proofs(name: str, ok: int, failed: int, hours_ago: float):
    m = HarmonyMachine.objects.create(last_contact=clock.now(), host_and_port=f"{name}:12300")
    HarmonyMachineDetails.objects.create(machine=m, tasks="PoRep", machine_name=name)
    end = (clock.now() - timedelta(hours=hours_ago)).replace(minute=20)
    for n in range(ok + failed):
        HarmonyTaskHistory.objects.create(task_id=n, name="PoRep", posted=end, work_start=end, work_end=end,
                                          result=n < ok, err="" if n < ok else "gpu fault",
                                          completed_by_host_and_port=f"{name}:12300")
        HarmonyTaskHistory.objects.create(task_id=100 + n, name="PoRep", posted=end, work_start=end, work_end=end,
                                          result=True, completed_by_host_and_port="someone-else:1")


def test_the_timeline_shows_every_kind_newest_first(client, alice):
    with scenario_world([entry("v-1"), entry("v-2")], IDLE):
        do_audit("agent", "launch_instance", "v-1", "queue growing")
        run, _ = park_stops("v-1")  # a diagnosis, then a parked stop
        alert = raise_alert("instance_exited", "v-1's worker exited", severity="P1", key="exited:v-1",
                            instance=Instance.objects.get(external_id="v-1"))
        do_ack_alert(alert, "user:alice", "looking at the log")
        _proofs("v-1", ok=3, failed=1, hours_ago=2)
        client.force_login(alice)
        page = client.get("/instances/v-1/").content.decode()
        assert 'id="timeline"' in page and 'hx-get="/instances/v-1/timeline/"' in page
        html = client.get("/instances/v-1/timeline/", headers=HX).content.decode()
    for text in ("launch instance by agent", "diagnosis: healthy", f"stop_instance parked (approval_required) · run {run.number}",
                 "P1 instance_exited raised", "instance_exited acknowledged by user:alice", "looking at the log",
                 "3 proofs completed, 1 failed", "diagnose_instance executed"):
        assert text in html, text
    assert "v-2" not in html.replace("v-1", "")  # nothing of the other instance
    order = [html.index(t) for t in ("instance_exited acknowledged", "stop_instance parked", "3 proofs completed")]
    assert order == sorted(order)  # newest first: the ack, the run, the proofs of two hours ago


def test_kind_filters_and_own_page(client, alice):
    with scenario_world([entry("v-1")], IDLE):
        park_stops("v-1")
        _proofs("v-1", ok=2, failed=0, hours_ago=1)
        client.force_login(alice)
        only_rates = client.get("/instances/v-1/timeline/?kind=rate", headers=HX).content.decode()
        assert "2 proofs completed" in only_rates and "stop_instance" not in only_rates and "diagnosis:" not in only_rates
        full = client.get("/instances/v-1/timeline/").content.decode()
        assert "<h1>Timeline of v-1</h1>" in full and "2 proofs completed" in full
        assert client.get("/instances/nope/timeline/").status_code == 404


def test_the_query_count_does_not_grow_with_the_history(client, alice):
    with scenario_world([entry("v-1")], IDLE):
        client.force_login(alice)

        def count() -> int:
            with CaptureQueriesContext(connections["default"]) as d, CaptureQueriesContext(connections["harmony"]) as h:
                assert client.get("/instances/v-1/timeline/", headers=HX).status_code == 200
            return len(d) + len(h)

        park_stops("v-1")
        _proofs("v-1", ok=1, failed=0, hours_ago=1)
        before = count()
        inst = Instance.objects.get(external_id="v-1")
        for n in range(20):
            raise_alert("provider_error", f"error {n}", key=f"e{n}", instance=inst)
            do_audit("user:alice", "reboot_instance", "v-1", f"try {n}")
        _proofs("v-1", ok=5, failed=2, hours_ago=3)
        assert count() == before
