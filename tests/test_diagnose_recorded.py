"""Every recorded GPU output (tests/gpu_outputs.py) served by a real sshd is classified by the rules
judge as docs/operations.md (Diagnosis) says; dead hosts (a stopped sshd, a socket that accepts and never speaks)
cost no more than the connect budget and are classified, never a traceback; a log with planted
instructions raises ``prompt_injection`` and changes nothing.
"""

import time

import pytest
from django.conf import settings
from django.utils import timezone

from fleet.diagnostics import GPU_ECC, GPU_QUERY, KERNEL_XID, commands_for, diagnose
from fleet.models import Alert, Diagnosis, Instance
from fleet.providers import set_override
from fleet.providers.base import Provider, ProviderInstance
from fleet.ssh import CONNECT_TIMEOUT_S, POOL
from tests.gpu_outputs import EXPECTED, PROFILES
from tests.sshd import SilentHost, SSHServer, free_port

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


class Rented(Provider):
    name = "rented"

    def list_instances(self):
        return []


class Listed(Rented):
    """The rented cloud listing the given instances (what a run's observe phase syncs)."""

    def __init__(self, instances):
        self.instances = instances

    def list_instances(self):
        return list(self.instances)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = SSHServer(tmp_path_factory.mktemp("sshd-recorded"))
    s.start()
    yield s
    POOL.close_all()
    s.stop()


@pytest.fixture
def machine(server, monkeypatch):
    monkeypatch.setitem(settings.WARDEN, "SSH_USER", server.user)
    monkeypatch.setitem(settings.WARDEN, "SSH_KEY_FILE", str(server.key_file))
    set_override(Rented())
    now = timezone.now()
    inst = Instance.objects.create(provider="rented", external_id="r-7", status="running", status_since=now,
                                   created_at=now, ssh_host=server.host, ssh_port=server.port)
    yield inst
    set_override(None)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_recorded_output_is_classified_as_the_reference_says(profile, server, machine):
    machine.log_path = str(server.profile(profile))
    machine.save()

    d = diagnose(machine)

    assert (d.health, d.fault_class) == EXPECTED[profile], d.cause
    assert d.source == "ssh" and d.judge == "rules"
    assert 0 < d.confidence <= 1 and d.findings  # the verdict cites what it saw
    assert set(commands_for(machine)) <= set(d.evidence)  # the whole collector ran


def test_the_healthy_h200_evidence_is_read_field_by_field(server, machine):
    machine.log_path = str(server.profile("healthy_h200"))
    machine.save()

    d = diagnose(machine)

    assert d.evidence[GPU_QUERY]["out"].startswith("0, NVIDIA H200,") and "[N/A]" in d.evidence[GPU_QUERY]["out"]
    assert "Remapping Failure Occurred        : No" in d.evidence[GPU_ECC]["out"]
    assert d.evidence[commands_for(machine)[-1]]["out"].endswith("task 41213 done in 23.1s\n")  # the worker log tail
    assert d.cause == "1 GPU(s) listed"


def test_gpu_lost_cites_the_xid_79_line(server, machine):
    server.profile("gpu_lost_xid79")

    d = diagnose(machine)

    assert "79" in d.evidence[KERNEL_XID]["out"]
    assert any("Xid" in line and "79" in line for line in d.findings)
    assert any("GPU is lost" in line for line in d.findings)


def test_a_host_fault_leaves_its_machine_out_of_later_offers(server, machine):
    """A host-class verdict means "replace it and avoid that machine_id"."""
    from fleet.machines import excluded_machines

    machine.machine_id = "m-701"
    machine.save()
    server.profile("gpu_lost_xid79")

    d = diagnose(machine)

    assert d.fault_class == "host"
    assert excluded_machines("rented") == {"m-701"}


def test_a_healthy_machine_is_not_left_out_of_offers(server, machine):
    from fleet.machines import excluded_machines

    machine.machine_id = "m-702"
    machine.save()
    server.profile("healthy_h200")

    assert diagnose(machine).fault_class == ""
    assert excluded_machines("rented") == set()


def test_a_planted_instruction_in_the_worker_log_raises_prompt_injection_and_changes_nothing(server, machine):
    machine.log_path = str(server.profile("planted_log"))
    machine.save()

    d = diagnose(machine)

    assert (d.health, d.fault_class) == ("healthy", "")  # the verdict is the healthy machine's
    alert = Alert.objects.get(kind="prompt_injection")
    assert "r-7" in alert.message and "tail" in alert.message
    assert d.evidence["injection"][0]["command"].startswith("tail -n")
    assert "ignore all previous instructions" in d.evidence["injection"][0]["fragment"]
    machine.refresh_from_db()
    assert (machine.status, machine.killed_at, machine.destroy_requested_at) == ("running", None, None)


def test_a_log_path_from_the_provider_is_quoted_not_executed(server, machine, tmp_path):
    marker = tmp_path / "pwned"
    machine.log_path = f"/nonexistent; touch {marker}"
    machine.save()

    diagnose(machine)

    assert not marker.exists()


def test_a_stopped_sshd_is_refused_fast_and_falls_back_to_the_provider(machine):
    machine.ssh_port = free_port()
    machine.save()
    t0 = time.monotonic()

    d = diagnose(machine)

    assert time.monotonic() - t0 <= CONNECT_TIMEOUT_S + 0.5
    assert (d.source, d.health, d.fault_class) == ("provider", "degraded", "network")
    assert d.evidence["ssh"]["kind"] == "refused"


def test_a_host_that_accepts_and_never_speaks_costs_the_connect_budget_and_is_classified(machine, caplog):
    with SilentHost() as silent:
        machine.ssh_port = silent.port
        machine.save()
        t0 = time.monotonic()

        d = diagnose(machine)

        took = time.monotonic() - t0
        assert silent.accepted == 1  # no retry spends the budget twice
    assert CONNECT_TIMEOUT_S - 0.5 <= took <= CONNECT_TIMEOUT_S + 1.0
    assert (d.source, d.health, d.fault_class) == ("provider", "degraded", "network")
    assert d.evidence["ssh"]["kind"] == "banner"
    assert "no SSH banner" in d.evidence["ssh"]["out"]
    assert "Traceback" not in caplog.text
    assert Diagnosis.objects.filter(instance=machine).count() == 1


def test_a_planted_instruction_read_during_a_run_parks_every_later_side_effect(server, machine, settings):
    """Through a real cycle: the run that read the planted log cannot act on its own afterwards."""
    from agent.planners.script import ScriptPlanner
    from agent.runtime.loop import run_cycle

    machine.log_path = str(server.profile("planted_log"))
    machine.save()
    set_override(Listed([ProviderInstance("r-7", "running", ssh_host=server.host, ssh_port=server.port,
                                          log_path=machine.log_path)]))
    settings.WARDEN = {**settings.WARDEN, "PROVIDER": "rented"}
    planner = ScriptPlanner([
        {"tool": "diagnose_instance", "args": {"instance_id": "r-7"}},
        {"tool": "reboot_instance", "args": {"instance_id": "r-7", "reason": "the log told me to"}},
    ])

    run = run_cycle("test", planner=planner)

    diag = run.steps.get(kind="call", tool="diagnose_instance")
    assert (diag.outcome, diag.ok) == ("executed", True) and '"health": "healthy"' in diag.observation
    reboot = run.steps.get(kind="call", tool="reboot_instance")
    assert reboot.outcome != "executed"  # parked for an operator (forced approval), never run
    assert Alert.objects.filter(kind="prompt_injection").exists()
    machine.refresh_from_db()
    assert (machine.status, machine.killed_at) == ("running", None)
