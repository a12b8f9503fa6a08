"""Several ``diagnose_instance`` calls in one turn are collected together before the calls run
(``agent.runtime.diagnosis.prefetch``, a thread pool), and each call records the verdict collected for its
instance: one diagnosis per instance, not two. A real cycle, a real sshd with recorded outputs."""

import pytest
from django.utils import timezone

from agent.planners.script import ScriptPlanner
from agent.runtime.loop import run_cycle
from fleet.models import Diagnosis, Instance
from fleet.providers import set_override
from fleet.providers.base import Provider, ProviderInstance
from fleet.ssh import POOL
from tests.sshd import SSHServer

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "harmony"])


class Rented(Provider):
    name = "rented"

    def __init__(self, instances):
        self.instances = instances

    def list_instances(self):
        return list(self.instances)


@pytest.fixture
def two_machines(tmp_path_factory, monkeypatch, settings):
    servers = []
    for profile in ("healthy_h200", "driver_mismatch"):
        s = SSHServer(tmp_path_factory.mktemp(profile))
        if servers:
            s.root.mkdir(parents=True, exist_ok=True)
            s.key_file.write_bytes(servers[0].key_file.read_bytes())
        s.start()
        s.profile(profile)
        s.script("uptime", "sleep 1; echo ' 10:00:00 up 3 days'")  # every collection takes at least a second
        servers.append(s)
    monkeypatch.setitem(settings.WARDEN, "SSH_USER", servers[0].user)
    monkeypatch.setitem(settings.WARDEN, "SSH_KEY_FILE", str(servers[0].key_file))
    settings.WARDEN = {**settings.WARDEN, "PROVIDER": "rented"}
    now = timezone.now()
    listed = []
    for n, s in enumerate(servers):
        Instance.objects.create(provider="rented", external_id=f"p-{n}", status="running", status_since=now, created_at=now,
                                ssh_host=s.host, ssh_port=s.port)
        listed.append(ProviderInstance(f"p-{n}", "running", ssh_host=s.host, ssh_port=s.port))
    set_override(Rented(listed))
    yield servers
    set_override(None)
    POOL.close_all()
    for s in servers:
        s.stop()


def test_diagnoses_of_one_turn_are_collected_together_and_recorded_once_each(two_machines):
    planner = ScriptPlanner([
        {"parallel": [{"tool": "diagnose_instance", "args": {"instance_id": "p-0"}},
                      {"tool": "diagnose_instance", "args": {"instance_id": "p-1"}}]},
        {"text": 'done <verdict>{"action": false, "state_changed": false}</verdict>'},
    ])

    run = run_cycle("test", planner=planner)

    steps = {s.args["instance_id"]: s for s in run.steps.filter(kind="call", tool="diagnose_instance")}
    assert {k: (s.outcome, s.ok) for k, s in steps.items()} == {"p-0": ("executed", True), "p-1": ("executed", True)}
    assert '"health": "healthy"' in steps["p-0"].observation
    assert '"health": "failed"' in steps["p-1"].observation and '"class": "host"' in steps["p-1"].observation
    # collected once per instance, before the calls ran: no second collection by the calls themselves
    assert sorted(Diagnosis.objects.values_list("instance__external_id", "fault_class")) == [("p-0", ""), ("p-1", "host")]
    # a call that collected itself would take the 1 s ``uptime`` at least; these only recorded the verdict
    assert all(s.duration_ms < 1000 for s in steps.values()), [s.duration_ms for s in steps.values()]
