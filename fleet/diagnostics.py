"""Diagnosing one instance: collect evidence (SSH, else the provider's data) and judge it.

Order (``../shared/reference/gpu-faults.md`` §4.4): reachable over SSH? then ``nvidia-smi -L``
classified per §4.1 (host-level vs container-level faults), the process list, uptime, disk and
memory. A command that answers rc 127 is missing evidence, not a failure. When SSH cannot
connect, the verdict falls back to the provider's status and Curio's heartbeat.

Verdict: ``health`` healthy | degraded | failed; ``fault_class`` host | container | app |
network. The rules judge is the default; a model judge (agent side) may replace it later.
"""

import json
import re
import time

from fleet.clock import clock
from fleet.models import Diagnosis, Instance
from fleet.secrets import redact, redact_obj

COMMANDS = [
    "nvidia-smi -L",
    "ps -eo pid,stat,etime,pcpu,comm --sort=-pcpu",
    "uptime",
    "df -h /",
    "free -m",
]
MAX_EVIDENCE_CHARS = 2000

#: one line of ``nvidia-smi -L``
_GPU_LINE = re.compile(r"^GPU \d{1,4}:", re.M)

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


def _read_until_exit(chan, timeout_s: float, keep: int = 4 * MAX_EVIDENCE_CHARS) -> tuple[str, int] | None:
    """Read a paramiko channel's stdout, then stderr, text until the command exits, for at most
    ``timeout_s`` seconds in all (paramiko's timeout bounds each read only: a command that writes
    forever, ``yes`` or ``journalctl -f``, would never time out and fill memory). Keeps the first
    ``keep`` bytes of each stream and drains the rest. Returns ``(text, exit code)`` (-1 when the
    channel closed without one), or None past the deadline (the channel is closed)."""
    deadline = time.monotonic() + timeout_s
    out, err = bytearray(), bytearray()
    while True:
        busy = False
        if chan.recv_ready():
            data, busy = chan.recv(32768), True
            out += data[: max(0, keep - len(out))]
        if chan.recv_stderr_ready():
            data, busy = chan.recv_stderr(32768), True
            err += data[: max(0, keep - len(err))]
        if not busy:
            if chan.exit_status_ready() or (chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready()):
                break
            if time.monotonic() > deadline:
                chan.close()
                return None
            time.sleep(0.01)
        elif time.monotonic() > deadline:
            chan.close()
            return None
    # the exit status arrives after the data on the channel: what is buffered now is all of it
    while chan.recv_ready():
        out += chan.recv(32768)[: max(0, keep - len(out))]
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(32768)[: max(0, keep - len(err))]
    rc = chan.recv_exit_status() if chan.exit_status_ready() else -1
    return out.decode(errors="replace") + err.decode(errors="replace"), rc


class SSHRunner:
    """Runs commands over SSH with paramiko (``key_filename``: a private key file, read at use).

    Used as a context manager so the client (and its transport thread) is closed when the step
    ends, also on error. Connecting is tried ``connect_attempts`` times with ``retry_backoff_s``
    (times the attempt number, on ``clock``) between tries; an authentication failure is not
    retried. Raises :class:`Unreachable` when it cannot connect.
    """

    def __init__(self, host: str, port: int = 22, user: str = "root", key_filename: str | None = None, timeout_s: float = 10,
                 connect_attempts: int = 2, retry_backoff_s: float = 1.0):
        self.host, self.port, self.user, self.key_filename, self.timeout_s = host, port, user, key_filename, timeout_s
        self.connect_attempts, self.retry_backoff_s = connect_attempts, retry_backoff_s
        self.client = None
        self.broken = False  # the session dropped during the step

    def __enter__(self):
        import paramiko

        pkey = None
        if self.key_filename:
            try:
                pkey = paramiko.PKey.from_path(self.key_filename)
            except (OSError, ValueError, paramiko.SSHException) as exc:
                raise Unreachable(f"ssh key {self.key_filename}: cannot load it: {exc}") from None
        attempts = max(1, self.connect_attempts)
        for attempt in range(1, attempts + 1):
            client = paramiko.SSHClient()
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
            try:
                client.connect(
                    self.host,
                    port=self.port,
                    username=self.user,
                    pkey=pkey,
                    timeout=self.timeout_s,
                    banner_timeout=self.timeout_s,
                    auth_timeout=self.timeout_s,
                    allow_agent=False,
                    look_for_keys=self.key_filename is None,
                )
            except paramiko.AuthenticationException as exc:
                client.close()  # permanent: no retry
                raise Unreachable(f"ssh {self.user}@{self.host}:{self.port}: authentication failed: {exc}") from None
            except (TimeoutError, OSError, EOFError, paramiko.SSHException) as exc:
                client.close()
                if attempt < attempts:
                    clock.sleep(self.retry_backoff_s * attempt)  # gpu-faults.md §4.4: retry before a verdict
                    continue
                raise Unreachable(f"ssh {self.host}:{self.port}: {exc or type(exc).__name__} (after {attempts} attempts)") from None
            self.client = client
            return self
        raise Unreachable(f"ssh {self.host}:{self.port}: not attempted")  # pragma: no cover — attempts >= 1

    def run(self, command: str, timeout_s: float = 10) -> tuple[int, str]:
        """Run ``command``; returns (exit code, stdout+stderr truncated).

        A command past ``timeout_s`` answers 124; a broken session (the connection dropped)
        answers 255 with the error text. Never raises for a command's failure.
        """
        import paramiko

        if self.client is None or self.client.get_transport() is None or not self.client.get_transport().is_active():
            self.broken = True
            return 255, "ssh session not active (the connection dropped)"
        try:
            _, stdout, stderr = self.client.exec_command(command, timeout=timeout_s)
            got = _read_until_exit(stdout.channel, timeout_s)
            if got is None:
                return 124, f"timed out after {timeout_s:g}s: the command was still running or still writing"
            out, rc = got
            if rc == -1:  # paramiko: the channel closed without an exit status (connection dropped)
                self.broken = True
                return 255, (out + "\nssh session dropped before the command's exit status arrived")[-MAX_EVIDENCE_CHARS:]
            return rc, out[:MAX_EVIDENCE_CHARS]
        except TimeoutError as exc:
            return 124, f"timed out after {timeout_s:g}s: {exc}"
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.broken = True
            return 255, f"ssh session failed: {exc or type(exc).__name__}"

    def __exit__(self, *exc):
        if self.client is not None:
            self.client.close()
        return False


def collect(runner, timeout_s: float = 10) -> dict:
    """Run :data:`COMMANDS` through ``runner`` (a context manager with ``run``); evidence dict.

    Each entry is ``{"rc": int, "out": str}``, plus ``"ssh_error": True`` when the session
    itself broke (the answer says nothing about the machine). Raises :class:`Unreachable` when
    the runner cannot connect. The runner is closed when this returns or raises.
    """
    evidence = {}
    with runner as r:
        for cmd in COMMANDS:
            rc, out = r.run(cmd, timeout_s=timeout_s)
            evidence[cmd] = {"rc": rc, "out": out[:MAX_EVIDENCE_CHARS]}
            if getattr(r, "broken", False):
                evidence[cmd]["ssh_error"] = True
    return evidence


def judge(evidence: dict, *, status: str, worker=None, reachable: bool = True) -> tuple[str, str, str]:
    """Rules judge: (health, fault_class, cause) from evidence, provider status and worker view.

    ``evidence`` maps each command to ``{"rc", "out"}``; ``status`` is the provider's status;
    ``worker`` a ``fleet.demand.WorkerView`` or None; ``reachable`` False when SSH failed.
    A command answering rc 127 (not found) is missing evidence: it is named in the cause and
    never turns the verdict into a failure.
    """
    if status in ("unknown", "offline"):
        return "failed", "host", f"provider reports {status}: host lost contact"
    if status in ("exited", "error"):
        return "failed", "container", f"provider reports {status}"
    if not reachable:
        if worker is not None and worker.live:
            return "healthy", "", "SSH unreachable, but the worker's heartbeat is live"
        return "degraded", "network", "SSH unreachable and no live heartbeat"
    nv = evidence.get("nvidia-smi -L")
    if nv and nv.get("ssh_error"):
        return "degraded", "network", "the SSH session dropped during the diagnosis; no GPU verdict"
    if nv and nv.get("rc") != 127:
        text = nv.get("out", "")
        for pat, health, cls, cause in _NVIDIA_RULES:
            if pat.search(text):
                return health, cls, cause
        if nv.get("rc") != 0:
            return "degraded", "host", f"nvidia-smi -L exited {nv.get('rc')}"
    if worker is not None and not worker.live and status == "running":
        return "degraded", "app", "instance up, but the Curio worker's heartbeat is stale"
    gpus = len(_GPU_LINE.findall((nv or {}).get("out", "")))
    cause = f"{gpus} GPU(s) listed" if gpus else "no fault seen"
    missing = [cmd for cmd, e in evidence.items() if isinstance(e, dict) and e.get("rc") == 127]
    if missing:
        cause += f"; missing evidence (rc 127, command not found): {', '.join(missing)}"
    if set(COMMANDS) <= set(missing) and worker is None:
        # nothing answered and no heartbeat seen: no evidence is not evidence of health
        return "degraded", "", "no evidence: every command was missing (rc 127) and no worker heartbeat is known"
    return "healthy", "", cause


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
    from agent.untrusted import scan_for_injection

    hits = scan_for_injection(json.dumps(evidence, default=str))
    if hits:  # what a machine prints is data: instruction-like text raises prompt_injection here
        from fleet.alerts import raise_alert

        raise_alert("prompt_injection", f"instruction-like text in the diagnose_instance evidence of {instance.external_id}: {hits[0][:120]}",
                    severity="P1", key=f"prompt_injection:diagnosis:{instance.external_id}")
    return Diagnosis.objects.create(
        instance=instance, taken_at=clock.now(), health=health, fault_class=cls, cause=redact(cause), source=source,
        evidence=redact_obj(evidence),  # what machines print is never stored with its secrets
    )
