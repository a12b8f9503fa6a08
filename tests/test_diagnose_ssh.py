"""diagnose_instance over a real OpenSSH server: healthy, the GPU faults of tests/gpu_outputs.py, missing commands,
SSH refused (falls back to the provider's data), and the client always closed.

The sshd is Debian's (``tests.sshd``) on a loopback port; the "rented" provider below stands in
for an external cloud: it lists one instance whose ssh host/port point at that sshd.
"""

import threading
import time

import paramiko
import pytest
from django.conf import settings
from django.utils import timezone

from fleet.diagnostics import PROCESSES, diagnose
from fleet.models import Diagnosis, Instance
from fleet.providers import set_override
from fleet.providers.base import Provider, ProviderInstance
from fleet.ssh import IDLE_REUSE_S, POOL
from tests import sshd as sshd_support
from tests.sshd import DRIVER_NOT_LOADED, GPU_LOST, HEALTHY_L, NVML_UNKNOWN_IN_CONTAINER, free_port

sshd = sshd_support.sshd
DB = pytest.mark.django_db(databases=["default", "harmony"])
pytestmark = DB


class RentedProvider(Provider):
    """A stand-in cloud: the instances it was given, with their ssh endpoints."""

    name = "rented"

    def __init__(self, instances: list[ProviderInstance]):
        self.instances = instances

    def list_instances(self) -> list[ProviderInstance]:
        return list(self.instances)


def live_transports() -> list[paramiko.Transport]:
    return [t for t in threading.enumerate() if isinstance(t, paramiko.Transport) and t.is_alive()]


def wait_no_transports(timeout: float = 5.0) -> list:
    deadline = time.monotonic() + timeout
    while live_transports() and time.monotonic() < deadline:
        time.sleep(0.05)
    return live_transports()


@pytest.fixture
def rented(sshd, monkeypatch):
    """An instance of the rented provider reachable through the test sshd (as its key's user)."""
    monkeypatch.setitem(settings.WARDEN, "SSH_USER", sshd.user)
    monkeypatch.setitem(settings.WARDEN, "SSH_KEY_FILE", str(sshd.key_file))
    now = timezone.now()
    inst = Instance.objects.create(
        provider="rented", external_id="r-1", status="running", status_since=now, created_at=now,
        gpu_name="H200", dph=2.5, ssh_host=sshd.host, ssh_port=sshd.port,
    )
    provider = RentedProvider([ProviderInstance("r-1", "running", ssh_host=sshd.host, ssh_port=sshd.port)])
    set_override(provider)
    try:
        yield inst
    finally:
        set_override(None)
        POOL.close_all()  # connections are kept for reuse (fleet.ssh.IDLE_REUSE_S); closed here
        assert wait_no_transports() == [], "a paramiko transport outlived the pool"


def test_a_healthy_gpu_is_diagnosed_healthy_over_ssh(rented, sshd):
    d = diagnose(rented)

    assert (d.health, d.fault_class, d.source) == ("healthy", "", "ssh")
    assert d.cause == "1 GPU(s) listed"
    assert d.evidence["nvidia-smi -L"] == {"rc": 0, "out": HEALTHY_L + "\n"}
    # the other commands really ran on the host
    assert d.evidence["uptime"]["rc"] == 0 and "load average" in d.evidence["uptime"]["out"]
    assert d.evidence[PROCESSES]["rc"] == 0 and "PID" in d.evidence[PROCESSES]["out"]
    assert d.evidence["provider"]["status"] == "running"
    assert Diagnosis.objects.get() == d
    assert "Accepted publickey" in sshd.log()


def test_a_lost_gpu_is_a_host_level_failure(rented, sshd):
    sshd.fake("nvidia-smi", GPU_LOST, rc=15)

    d = diagnose(rented)

    assert (d.health, d.fault_class, d.source) == ("failed", "host", "ssh")
    assert "GPU lost" in d.cause
    assert d.evidence["nvidia-smi -L"]["rc"] == 15 and "GPU is lost" in d.evidence["nvidia-smi -L"]["out"]


def test_nvml_unknown_error_inside_the_container_is_a_container_failure_not_hardware(rented, sshd):
    sshd.fake("nvidia-smi", NVML_UNKNOWN_IN_CONTAINER, rc=255, stderr=True)

    d = diagnose(rented)

    assert (d.health, d.fault_class) == ("failed", "container")
    assert "recreate the container" in d.cause


def test_driver_not_loaded_is_a_host_failure(rented, sshd):
    sshd.fake("nvidia-smi", DRIVER_NOT_LOADED, rc=9)

    d = diagnose(rented)

    assert (d.health, d.fault_class) == ("failed", "host")


def test_a_missing_nvidia_smi_is_missing_evidence_not_a_failure(rented, sshd):
    sshd.remove("nvidia-smi")

    d = diagnose(rented)

    assert d.evidence["nvidia-smi -L"]["rc"] == 127
    out = d.evidence["nvidia-smi -L"]["out"]
    assert "not found" in out or "No such file" in out  # the shell's words, or timeout(1)'s
    assert d.health != "failed"
    assert d.source == "ssh"
    assert "missing evidence" in d.cause and "nvidia-smi -L" in d.cause


def test_ssh_refused_falls_back_to_the_providers_data(rented, sshd):
    rented.ssh_port = free_port()  # nothing listens there
    rented.save()
    t0 = time.monotonic()

    d = diagnose(rented)

    assert d.source == "provider"
    assert (d.health, d.fault_class) == ("degraded", "network")
    assert d.evidence["ssh"]["rc"] == 255 and d.evidence["ssh"]["kind"] == "refused"
    assert "connection refused" in d.evidence["ssh"]["out"]
    assert d.evidence["provider"] == {"status": "running", "status_msg": "", "exit_code": None}
    assert "nvidia-smi -L" not in d.evidence
    assert time.monotonic() - t0 < 5  # one retry after 1 s, no more


def test_ssh_refused_on_an_exited_instance_rests_on_the_provider_status(rented):
    rented.ssh_port = free_port()
    rented.status = "exited"
    rented.exit_code = 1
    rented.save()

    d = diagnose(rented)

    assert (d.source, d.health, d.fault_class) == ("provider", "failed", "container")
    assert d.cause == "provider reports exited"


def test_a_key_the_host_does_not_accept_is_unreachable_and_closes_the_transport(rented, sshd, tmp_path, monkeypatch):
    other = tmp_path / "other_key"
    paramiko.RSAKey.generate(2048).write_private_key_file(str(other))
    monkeypatch.setitem(settings.WARDEN, "SSH_KEY_FILE", str(other))

    d = diagnose(rented)

    assert d.source == "provider"
    assert "authentication failed" in d.evidence["ssh"]["out"] and d.evidence["ssh"]["kind"] == "auth"
    assert wait_no_transports() == []  # a failed handshake keeps nothing


def test_one_connection_per_host_is_reused_and_closed_when_idle(rented, sshd):
    before = sshd.session_count()
    diagnose(rented)
    diagnose(rented)

    assert sshd.log().count("Accepted publickey") == 1  # the second diagnosis reused the connection
    assert len(live_transports()) == 1 and len(POOL) == 1
    POOL.idle_s = 0.0  # past the reuse window (IDLE_REUSE_S = 120 s in service)
    try:
        assert POOL.reap() == 1
    finally:
        POOL.idle_s = IDLE_REUSE_S
    assert wait_no_transports() == []
    deadline = time.monotonic() + 5
    while sshd.session_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sshd.session_count() == before  # the server saw the connection end


def test_a_hung_nvidia_smi_times_out_and_the_rest_still_runs(rented, sshd):
    sshd.fake("nvidia-smi", HEALTHY_L, sleep_s=5)

    d = diagnose(rented, timeout_s=1)

    assert d.evidence["nvidia-smi -L"]["rc"] == 124
    assert (d.health, d.fault_class) == ("degraded", "host")
    assert d.evidence["uptime"]["rc"] == 0
    assert len(POOL) == 1  # the connection outlives one command's timeout and stays for reuse


def test_a_session_that_drops_mid_step_is_a_network_verdict_and_the_client_is_still_closed(rented, sshd):
    # nvidia-smi kills the sshd process serving this connection: the session drops mid-step
    sshd.script("nvidia-smi", """
pid=$$
while [ "$pid" -gt 1 ]; do
  comm=$(cat /proc/$pid/comm)
  case "$comm" in sshd*) kill -9 "$pid"; exit 0;; esac
  pid=$(awk '{print $4}' /proc/$pid/stat)
done
exit 3""")

    d = diagnose(rented)

    assert d.source == "ssh"
    assert d.evidence["nvidia-smi -L"].get("ssh_error")
    assert "uptime" not in d.evidence  # nothing more is tried on a dropped session
    assert (d.health, d.fault_class) == ("degraded", "network")
    assert len(POOL) == 0 and wait_no_transports() == []  # a broken connection is not pooled
    assert sshd.proc.poll() is None  # only that connection's process died, not the server


def test_diagnose_instance_through_the_cycle_stores_a_diagnosis_and_an_observation(rented, sshd, settings):
    from agent.planners.script import ScriptPlanner
    from agent.runtime.loop import run_cycle

    sshd.fake("nvidia-smi", GPU_LOST, rc=15)
    settings.WARDEN = {**settings.WARDEN, "PROVIDER": "rented"}
    planner = ScriptPlanner([{"tool": "diagnose_instance", "args": {"instance_id": "r-1"}},
                             {"text": 'done <verdict>{"action": false, "state_changed": false}</verdict>'}])

    run = run_cycle("test", planner=planner)

    step = run.steps.get(kind="call", tool="diagnose_instance")
    assert (step.outcome, step.ok) == ("executed", True)
    assert '"health": "failed"' in step.observation and '"class": "host"' in step.observation
    assert '"source": "ssh"' in step.observation
    d = Diagnosis.objects.get(instance=rented)
    assert (d.health, d.fault_class) == ("failed", "host")


def test_no_evidence_at_all_is_not_a_healthy_verdict():
    from fleet.diagnostics import COMMANDS, judge

    nothing = {cmd: {"rc": 127, "out": "command not found"} for cmd in COMMANDS}
    health, cls, cause = judge(nothing, status="running", worker=None)
    assert health == "degraded" and cause.startswith("no evidence")
    # one command answering is evidence enough for the rules judge
    some = {**nothing, "uptime": {"rc": 0, "out": " 10:00:00 up 3 days"}}
    assert judge(some, status="running", worker=None)[0] == "healthy"
