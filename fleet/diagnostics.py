"""Diagnosing one instance: collect evidence (SSH, else the provider's data) and judge it.

Order (``../shared/reference/gpu-faults.md`` §4.4): reachable over SSH? then ``nvidia-smi -L``
classified per §4.1 (host-level vs container-level faults), the process list, uptime, disk and
memory. A command that answers rc 127 is missing evidence, not a failure. When SSH cannot
connect, the verdict falls back to the provider's status and Curio's heartbeat.

Verdict: ``health`` healthy | degraded | failed; ``fault_class`` host | container | app |
network. The rules judge is the default; a model judge (agent side) may replace it later.
"""

import re

from fleet.clock import clock
from fleet.models import Diagnosis, Instance

COMMANDS = [
    "nvidia-smi -L",
    "ps -eo pid,stat,etime,pcpu,comm --sort=-pcpu",
    "uptime",
    "df -h /",
    "free -m",
]
MAX_EVIDENCE_CHARS = 2000

# (pattern, health, class, cause) — first match wins; gpu-faults.md §4.1
_NVIDIA_RULES = [
    (re.compile(r"GPU is lost|fallen off the bus", re.I), "failed", "host", "GPU lost (NVML 15 / Xid 79): host-level fault"),
    (re.compile(r"Unable to determine the device handle", re.I), "failed", "host", "GPU device handle unavailable: hardware suspect"),
    (re.compile(r"couldn't communicate with the NVIDIA driver", re.I), "failed", "host", "NVIDIA driver not loaded"),
    (re.compile(r"Driver/library version mismatch", re.I), "failed", "host", "driver/library version mismatch: host needs reboot"),
    (re.compile(r"Failed to initialize NVML: Unknown Error", re.I), "failed", "container", "container lost GPU access: recreate the container"),
    (re.compile(r"No devices were found", re.I), "failed", "container", "no GPU visible (NVML 6)"),
]


class Unreachable(Exception):
    """The command runner could not connect (refused, timeout, auth)."""


class SSHRunner:
    """Runs commands over SSH with paramiko. ``key_ref``: a secret reference to a private key file.

    Used as a context manager so the client is closed when the step ends, also on error.
    """

    def __init__(self, host: str, port: int = 22, user: str = "root", key_filename: str | None = None, timeout_s: float = 10):
        self.host, self.port, self.user, self.key_filename, self.timeout_s = host, port, user, key_filename, timeout_s
        self.client = None

    def __enter__(self):
        import paramiko

        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        try:
            client.connect(
                self.host,
                port=self.port,
                username=self.user,
                key_filename=self.key_filename,
                timeout=self.timeout_s,
                banner_timeout=self.timeout_s,
                auth_timeout=self.timeout_s,
                allow_agent=False,
                look_for_keys=self.key_filename is None,
            )
        except (TimeoutError, OSError, paramiko.SSHException) as exc:
            client.close()
            raise Unreachable(f"ssh {self.host}:{self.port}: {exc}") from None
        self.client = client
        return self

    def run(self, command: str, timeout_s: float = 10) -> tuple[int, str]:
        """Run ``command``; returns (exit code, stdout+stderr truncated)."""
        try:
            _, stdout, stderr = self.client.exec_command(command, timeout=timeout_s)
            out = stdout.read().decode(errors="replace") + stderr.read().decode(errors="replace")
            return stdout.channel.recv_exit_status(), out[:MAX_EVIDENCE_CHARS]
        except (TimeoutError, OSError) as exc:
            return 124, f"timed out or failed: {exc}"

    def __exit__(self, *exc):
        if self.client is not None:
            self.client.close()
        return False


def collect(runner, timeout_s: float = 10) -> dict:
    """Run :data:`COMMANDS` through ``runner`` (a context manager with ``run``); evidence dict.

    Raises :class:`Unreachable` when the runner cannot connect.
    """
    evidence = {}
    with runner as r:
        for cmd in COMMANDS:
            rc, out = r.run(cmd, timeout_s=timeout_s)
            evidence[cmd] = {"rc": rc, "out": out[:MAX_EVIDENCE_CHARS]}
    return evidence


def judge(evidence: dict, *, status: str, worker=None, reachable: bool = True) -> tuple[str, str, str]:
    """Rules judge: (health, fault_class, cause) from evidence, provider status and worker view."""
    if status in ("unknown", "offline"):
        return "failed", "host", f"provider reports {status}: host lost contact"
    if status in ("exited", "error"):
        return "failed", "container", f"provider reports {status}"
    if not reachable:
        if worker is not None and worker.live:
            return "healthy", "", "SSH unreachable, but the worker's heartbeat is live"
        return "degraded", "network", "SSH unreachable and no live heartbeat"
    nv = evidence.get("nvidia-smi -L")
    if nv and nv.get("rc") != 127:
        text = nv.get("out", "")
        for pat, health, cls, cause in _NVIDIA_RULES:
            if pat.search(text):
                return health, cls, cause
        if nv.get("rc") != 0:
            return "degraded", "host", f"nvidia-smi -L exited {nv.get('rc')}"
    if worker is not None and not worker.live and status == "running":
        return "degraded", "app", "instance up, but the Curio worker's heartbeat is stale"
    gpus = len(re.findall(r"^GPU \d+:", (nv or {}).get("out", ""), re.M))
    return "healthy", "", f"{gpus} GPU(s) listed" if gpus else "no fault seen"


def diagnose(instance: Instance, *, worker=None, timeout_s: float = 30) -> Diagnosis:
    """Collect evidence for ``instance`` and store a :class:`Diagnosis`.

    Uses the provider's command runner (SSH for rented and owned hosts); when there is none, or
    it cannot connect, the verdict rests on the provider's status and the worker's heartbeat
    (``source="provider"``).
    """
    from fleet.providers import get_provider

    provider = get_provider(instance.provider)
    runner = provider.command_runner(instance)
    evidence, source, reachable = {}, "provider", True
    if runner is not None:
        try:
            evidence = collect(runner, timeout_s=min(10, timeout_s))
            source = "ssh"
        except Unreachable as exc:
            evidence = {"ssh": {"rc": 255, "out": str(exc)}}
            reachable = False
    evidence["provider"] = {"status": instance.status, "status_msg": instance.status_msg, "exit_code": instance.exit_code}
    if worker is not None:
        evidence["worker"] = {"live": worker.live, "unschedulable": worker.unschedulable, "owned_tasks": worker.owned_tasks}
    health, cls, cause = judge(evidence, status=instance.status, worker=worker, reachable=reachable)
    return Diagnosis.objects.create(
        instance=instance, taken_at=clock.now(), health=health, fault_class=cls, cause=cause, source=source, evidence=evidence
    )
