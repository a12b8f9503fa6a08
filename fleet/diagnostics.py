# Over 500 lines on purpose: collecting evidence and judging it share one fault taxonomy (docs/operations.md, Diagnosis).
"""Diagnosing instances: collect evidence (SSH, else the provider's data) and judge it.

Order (docs/operations.md, Diagnosis): reachable over SSH? then ``nvidia-smi -L`` classified into
host-level vs container-level faults, the ``--query-gpu`` CSV and ``nvidia-smi -q -d
ECC,ROW_REMAPPER`` (ECC counts and row remapping, after NVIDIA's docs), kernel Xid lines where visible, the process
list, uptime, disk, memory, the worker's log tail and a ``journalctl`` tail (:func:`commands_for`).
A command that answers rc 127 is missing evidence, not a failure. When SSH cannot connect, the
verdict falls back to the provider's status and Curio's heartbeat; the connection failure is
classified (``fleet.ssh.KINDS``), never a traceback.

Every collected text is redacted (``fleet.secrets.redact``) and scanned for instruction-like text
(``fleet.untrusted.scan_for_injection``) before it is stored or shown: a hit raises a
``prompt_injection`` alert and is recorded under ``evidence["injection"]``; it changes nothing in
the verdict (the rules never read the logs for faults).

Verdict (:class:`Verdict`): ``health`` healthy | degraded | failed; ``fault_class`` host |
container | app | network | none; ``cause``; ``evidence`` (the lines that support it);
``confidence`` 0..1. The rules judge (:func:`judge_rules`) is the default; a model judge (agent
side, ``agent.judge``) may be passed to :func:`diagnose` and its answer is validated against the
same schema.
"""

import json
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from django.conf import settings
from django.db import connection
from pydantic import BaseModel, Field, field_validator

from fleet.alerts import raise_alert, resolve
from fleet.clock import clock
from fleet.machines import remember_failure
from fleet.models import Alert, Diagnosis, Instance
from fleet.providers import get_provider
from fleet.secrets import redact, redact_obj
from fleet.ssh import Unreachable
from fleet.untrusted import scan_for_injection

#: the ``--query-gpu`` fields read (``nvidia-smi --help-query-gpu``; driver 580 reports the throttle reasons
#: under the header ``clocks_event_reasons.active`` but still accepts this name)
QUERY_FIELDS = (
    "index", "name", "uuid", "pci.bus_id", "driver_version", "temperature.gpu", "utilization.gpu", "memory.used",
    "memory.total", "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.volatile.total",
    "retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure", "clocks_throttle_reasons.active",
    "power.draw",
)
GPU_LIST = "nvidia-smi -L"
GPU_QUERY = f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits"
GPU_ECC = "nvidia-smi -q -d ECC,ROW_REMAPPER"
PROCESSES = "ps -eo pid,stat,etime,pcpu,pmem,comm --sort=-pcpu | head -n 30"
#: kernel Xid lines, where the kernel log is visible (on vast usually not, inside a container):
#: rc 3 with the reason when it is not
KERNEL_XID = ("if out=$(dmesg 2>&1); then printf '%s\\n' \"$out\" | grep -i 'xid' | tail -n 20; "
              "else printf 'kernel log not visible: %s\\n' \"$out\" | head -n 1; exit 3; fi")
JOURNAL = "journalctl -n 50 --no-pager -o short-iso"
#: the fixed part of the collector; :func:`commands_for` adds the worker's log tail
COMMANDS = [GPU_LIST, GPU_QUERY, GPU_ECC, KERNEL_XID, PROCESSES, "uptime", "df -h /", "free -m", JOURNAL]
#: the worker's log read when the instance names none (WARDEN_WORKER_LOG overrides)
DEFAULT_WORKER_LOG = "/var/log/curio/curio.log"
WORKER_LOG_LINES = 80
#: per-command seconds (each command; the connection has its own budget, fleet.ssh)
COMMAND_TIMEOUT_S = 10.0
#: instances diagnosed at once in one process (:func:`diagnose_many`)
MAX_PARALLEL = 16

#: one line of ``nvidia-smi -L``
_GPU_LINE = re.compile(r"^GPU \d{1,4}:", re.M)
#: a kernel Xid report: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.``
_XID = re.compile(r"NVRM: Xid \([^)\n]{0,64}\): (\d{1,3})")

# (pattern, health, class, cause) — first match wins; a lost or unusable GPU is the host's fault
_NVIDIA_RULES = [
    (re.compile(r"GPU is lost|fallen off the bus", re.I), "failed", "host", "GPU lost (NVML 15 / Xid 79): host-level fault"),
    (re.compile(r"Unable to determine the device handle", re.I), "failed", "host", "GPU device handle unavailable: hardware suspect"),
    (re.compile(r"couldn't communicate with the NVIDIA driver", re.I), "failed", "host", "NVIDIA driver not loaded"),
    (re.compile(r"Driver/library version mismatch", re.I), "failed", "host", "driver/library version mismatch: host needs reboot"),
    (re.compile(r"Failed to initialize NVML: Unknown Error", re.I), "failed", "container", "container lost GPU access: recreate the container"),
    (re.compile(r"No devices were found", re.I), "failed", "container", "no GPU visible (NVML 6)"),
]
#: nvidia-smi exit codes (NVML's return codes) when the text names no known fault
_NVIDIA_EXIT = {
    4: ("degraded", "container", "nvidia-smi has no permission (NVML 4): the container's device access"),
    6: ("failed", "container", "no GPU visible (NVML 6)"),
    9: ("failed", "host", "NVIDIA driver not loaded (NVML 9)"),
    12: ("failed", "container", "NVML library not found (NVML 12): the container's driver mounts"),
    14: ("degraded", "host", "GPU infoROM corrupted (NVML 14)"),
    15: ("failed", "host", "GPU lost (NVML 15): host-level fault"),
    16: ("failed", "host", "GPU reset required (NVML 16)"),
    17: ("failed", "container", "GPU access blocked by the OS or cgroups (NVML 17)"),
    18: ("failed", "host", "driver/library version mismatch (NVML 18): host needs reboot"),
}
#: Xid -> (health, class, meaning), after NVIDIA's Xid catalogue. 79/48/64/95 are host faults
_XID_RULES = {
    79: ("failed", "host", "GPU has fallen off the bus"),
    48: ("failed", "host", "double-bit ECC error"),
    64: ("failed", "host", "row remapping failed"),
    95: ("failed", "host", "uncontained uncorrectable ECC error"),
    94: ("degraded", "host", "contained uncorrectable ECC error"),
    74: ("degraded", "host", "NVLink error"),
    119: ("degraded", "host", "GSP RPC timeout"),
    120: ("degraded", "host", "GSP error"),
    13: ("degraded", "app", "graphics engine exception (usually the application)"),
    31: ("degraded", "app", "GPU memory page fault (the application)"),
    43: ("degraded", "app", "GPU stopped processing after an application error"),
}
#: throttle reason bits that mean the hardware slowed the GPU (NVML clocks event reasons)
_HW_SLOWDOWN = {0x8: "hardware slowdown", 0x40: "hardware thermal slowdown", 0x80: "hardware power brake"}
HEALTH = ("healthy", "degraded", "failed")
FAULT_CLASSES = ("host", "container", "app", "network", "none")
_RANK = {"healthy": 0, "degraded": 1, "failed": 2}


class Verdict(BaseModel):
    """A judge's verdict (docs/operations.md, Diagnosis): ``health``, ``fault_class`` (``class`` in JSON), ``cause``
    (one sentence), ``evidence`` (the observed lines that support it, at most 12), ``confidence``
    (0..1). A model's answer is parsed with :meth:`model_validate` (``class`` accepted as alias);
    anything outside the schema raises ``pydantic.ValidationError``."""

    model_config = {"populate_by_name": True, "extra": "forbid"}

    health: Literal["healthy", "degraded", "failed"]
    fault_class: Literal["host", "container", "app", "network", "none"] = Field(alias="class")
    cause: str = Field(min_length=1, max_length=500)
    evidence: list[str] = Field(default_factory=list, max_length=12)
    confidence: float = Field(ge=0.0, le=1.0)

    @field_validator("evidence")
    @classmethod
    def _short_lines(cls, v: list[str]) -> list[str]:
        return [str(line)[:300] for line in v]

    def as_dict(self) -> dict:
        """The verdict as the tool and the pages show it (``class`` key)."""
        return self.model_dump(by_alias=True)


def commands_for(instance=None) -> list[str]:
    """The collector's commands for ``instance``: :data:`COMMANDS` plus the tail of its worker's
    log (``instance.log_path``, else WARDEN_WORKER_LOG, else :data:`DEFAULT_WORKER_LOG`; the path
    is shell-quoted: it is provider data)."""
    path = (getattr(instance, "log_path", "") or settings.WARDEN.get("WORKER_LOG") or DEFAULT_WORKER_LOG)
    return [*COMMANDS, f"tail -n {WORKER_LOG_LINES} {shlex.quote(path)}"]


def _scan(text: str) -> list[str]:
    return scan_for_injection(text)


def collect(runner, timeout_s: float = COMMAND_TIMEOUT_S, commands: list[str] | None = None) -> dict:
    """Run ``commands`` (default :func:`commands_for` with no instance) through ``runner`` (a context
    manager with ``run``); evidence dict keyed by command.

    Each entry is ``{"rc": int, "out": str}`` with ``out`` redacted, plus ``"ssh_error": True``
    when the session itself broke (the answer says nothing about the machine; later commands are
    not tried) and ``"injection": [fragment, ...]`` when the text holds instruction-like text.
    Raises :class:`~fleet.ssh.Unreachable` when the runner cannot connect.
    """
    evidence = {}
    commands = commands or commands_for()
    keep = ["tail" if cmd.startswith(("tail ", "journalctl")) else "head" for cmd in commands]
    with runner as r:
        if hasattr(r, "run_many"):  # SSH: one session for the whole collector (fleet.ssh.SSHRunner.run_many)
            answers = r.run_many(commands, timeout_s=timeout_s, keep=keep)
        else:
            answers = []
            for cmd, k in zip(commands, keep, strict=True):
                answers.append(r.run(cmd, timeout_s=timeout_s, keep=k))
                if getattr(r, "broken", False):
                    break
        broken = getattr(r, "broken", False)
        for n, (cmd, (rc, out)) in enumerate(zip(commands, answers, strict=False)):
            entry = {"rc": rc, "out": redact(out)}
            hits = _scan(entry["out"])
            if hits:
                entry["injection"] = hits[:3]
            if broken and n == len(answers) - 1:  # the session dropped here: later commands never ran
                entry["ssh_error"] = True
            evidence[cmd] = entry
    return evidence


# --- parsers ---------------------------------------------------------------------------------
def _value(raw: str):
    v = raw.strip()
    if v in ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", ""):
        return None
    if v in ("Yes", "No"):
        return v == "Yes"
    try:
        return int(v, 16) if v.lower().startswith("0x") else int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


def parse_query_gpu(text: str) -> tuple[list[dict], list[str]]:
    """Rows of the ``--query-gpu`` CSV (``noheader,nounits``) as dicts keyed by
    :data:`QUERY_FIELDS`: ``[N/A]``/``[Not Supported]`` read as ``None``, ``Yes``/``No`` as bools,
    ``0x…`` as ints, numbers as numbers. Returns ``(rows, bad_lines)``: a line with another number
    of fields is returned in ``bad_lines``, never guessed."""
    rows, bad = [], []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(QUERY_FIELDS):
            bad.append(line[:200])
            continue
        rows.append({f: _value(p) for f, p in zip(QUERY_FIELDS, parts, strict=True)})
    return rows, bad


def parse_ecc(text: str) -> list[dict]:
    """Per GPU of ``nvidia-smi -q -d ECC,ROW_REMAPPER``: ``{"gpu", "dram_uncorrectable",
    "sram_uncorrectable", "remap_pending", "remap_failure"}`` (``None`` when absent or ``N/A``).
    Volatile and aggregate counts are both read; the larger is kept. ``Pending`` is read only in
    the ``Remapped Rows`` block (the ECC mode block has one too)."""
    gpus: list[dict] = []
    cur, block = None, ""
    for line in (text or "").splitlines():
        stripped = line.strip()
        if line.startswith("GPU "):
            cur = {"gpu": stripped[4:], "dram_uncorrectable": None, "sram_uncorrectable": None,
                   "remap_pending": None, "remap_failure": None}
            gpus.append(cur)
            continue
        if cur is None or not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if ":" not in stripped:
            if indent <= 4:
                block = stripped
            continue
        key, _, raw = stripped.partition(":")
        key, val = key.strip(), _value(raw)
        if key == "DRAM Uncorrectable" and isinstance(val, int):
            cur["dram_uncorrectable"] = max(cur["dram_uncorrectable"] or 0, val)
        elif key.startswith("SRAM Uncorrectable") and isinstance(val, int):
            cur["sram_uncorrectable"] = max(cur["sram_uncorrectable"] or 0, val)
        elif block == "Remapped Rows" and key == "Pending" and isinstance(val, bool):
            cur["remap_pending"] = val
        elif block == "Remapped Rows" and key == "Remapping Failure Occurred" and isinstance(val, bool):
            cur["remap_failure"] = val
    return gpus


def parse_xids(text: str) -> list[int]:
    """The Xid codes in kernel log lines (``NVRM: Xid (PCI:…): 79, …``), in order, without repeats."""
    seen: list[int] = []
    for m in _XID.finditer(text or ""):
        code = int(m.group(1))
        if code not in seen:
            seen.append(code)
    return seen


# --- the rules judge -------------------------------------------------------------------------
def _out(evidence: dict, cmd: str) -> dict | None:
    e = evidence.get(cmd)
    if isinstance(e, dict) and not e.get("ssh_error") and e.get("rc") not in (None, 127):
        return e
    return None


def _first_line(text: str, needle: str = "") -> str:
    for line in (text or "").splitlines():
        if line.strip() and (not needle or needle.lower() in line.lower()):
            return line.strip()[:300]
    return (text or "").strip()[:300]


def judge(evidence: dict, *, status: str, worker=None, reachable: bool = True) -> tuple[str, str, str]:
    """``(health, fault_class, cause)`` of :func:`judge_rules` (``fault_class`` empty for ``none``)."""
    v = judge_rules(evidence, status=status, worker=worker, reachable=reachable)
    return v.health, "" if v.fault_class == "none" else v.fault_class, v.cause


def judge_rules(evidence: dict, *, status: str, worker=None, reachable: bool = True) -> Verdict:
    """Rules judge (docs/operations.md, Diagnosis; NVIDIA's Xid catalogue): a :class:`Verdict` from evidence,
    the provider's status and the worker's view.

    ``evidence`` maps each command to ``{"rc", "out"}`` (:func:`collect`); ``status`` is the
    provider's status; ``worker`` a ``WorkerView`` or None; ``reachable`` False when SSH failed.
    The worst finding wins: GPU lost, Xid 79/48/64/95, a failed row remap and a driver/library
    mismatch are host faults; NVML "Unknown Error" inside the container while no host fault shows
    (no Xid 79, no lost GPU) is the container's; a stale heartbeat on a healthy GPU is the app's.
    A command answering rc 127 (not found) is missing evidence: it is named in the cause and never
    turns the verdict into a failure. What the logs say is never read as a fault (it is untrusted).
    """
    def v(health, cls, cause, lines, conf):
        return Verdict(health=health, fault_class=cls, cause=cause, evidence=lines, confidence=conf)

    ssh = evidence.get("ssh") or {}
    if not reachable and ssh.get("kind") == "host_key":
        # trust on first use (fleet.ssh.InstanceHostKeys): another key than the one kept is never
        # talked to, whatever the provider or a heartbeat says — the machine was not diagnosed
        return v("degraded", "network", "SSH host key changed: the machine was not diagnosed (refused before "
                 "logging in); check it, and clear its kept host key if it was rebuilt",
                 [f"ssh: host_key: {ssh.get('out', '')}"[:300], f"provider status {status}"], 0.4)
    if status in ("unknown", "offline"):
        return v("failed", "host", f"provider reports {status}: host lost contact", [f"provider status {status}"], 0.6)
    if status in ("exited", "error"):
        return v("failed", "container", f"provider reports {status}", [f"provider status {status}"], 0.6)
    if not reachable:
        ssh = evidence.get("ssh") or {}
        line = f"ssh: {ssh.get('kind', 'unreachable')}: {ssh.get('out', '')}"[:300]
        if worker is not None and worker.live:
            return v("healthy", "none", "SSH unreachable, but the worker's heartbeat is live", [line, "worker heartbeat live"], 0.6)
        return v("degraded", "network", "SSH unreachable and no live heartbeat: diagnose again before acting", [line], 0.5)
    nv = evidence.get(GPU_LIST)
    if nv and nv.get("ssh_error"):
        return v("degraded", "network", "the SSH session dropped during the diagnosis; no GPU verdict",
                 [f"{GPU_LIST}: {nv.get('out', '')[:200]}"], 0.5)

    findings: list[tuple[str, str, str, str, float]] = []  # (health, class, cause, line, confidence)
    xid_e = _out(evidence, KERNEL_XID)
    xids = parse_xids(xid_e["out"]) if xid_e and xid_e.get("rc") == 0 else []
    for code in xids:
        if code in _XID_RULES:
            h, c, meaning = _XID_RULES[code]
            findings.append((h, c, f"Xid {code}: {meaning}", _first_line(xid_e["out"], f": {code},"), 0.9))
    nv_e = _out(evidence, GPU_LIST)
    if nv_e:
        text = nv_e.get("out", "")
        for pat, health, cls, cause in _NVIDIA_RULES:
            if pat.search(text):
                if cls == "container" and any(_XID_RULES.get(x, ("", ""))[1] == "host" for x in xids):
                    cls, cause = "host", cause.split(":")[0] + " with a host Xid in the kernel log: host-level fault"
                findings.append((health, cls, cause, f"{GPU_LIST} rc {nv_e['rc']}: {_first_line(text)}", 0.9))
                break
        else:
            if nv_e.get("rc") in _NVIDIA_EXIT:
                h, c, cause = _NVIDIA_EXIT[nv_e["rc"]]
                findings.append((h, c, cause, f"{GPU_LIST} rc {nv_e['rc']}: {_first_line(text)}", 0.7))
            elif nv_e.get("rc") == 124:
                findings.append(("degraded", "host", "nvidia-smi hung past its timeout", f"{GPU_LIST}: {_first_line(text)}", 0.6))
            elif nv_e.get("rc") != 0:
                findings.append(("degraded", "host", f"nvidia-smi -L exited {nv_e.get('rc')}", f"{GPU_LIST}: {_first_line(text)}", 0.5))
    q = _out(evidence, GPU_QUERY)
    if q and q.get("rc") == 0:
        rows, _ = parse_query_gpu(q["out"])
        for r in rows:
            gpu = f"GPU {r['index']}"
            if r["remapped_rows.failure"] is True:
                findings.append(("failed", "host", f"{gpu}: row remapping failed", f"{gpu} remapped_rows.failure Yes", 0.9))
            elif r["remapped_rows.pending"] is True:
                findings.append(("degraded", "host", f"{gpu}: row remap pending (a reset fixes it)", f"{gpu} remapped_rows.pending Yes", 0.8))
            unc = r["ecc.errors.uncorrected.volatile.total"]
            if isinstance(unc, int) and unc > 0:
                findings.append(("degraded", "host", f"{gpu}: {unc} uncorrectable ECC error(s) since boot",
                                 f"{gpu} ecc.errors.uncorrected.volatile.total {unc}", 0.8))
            reasons = r["clocks_throttle_reasons.active"]
            if isinstance(reasons, int):
                slow = [name for bit, name in _HW_SLOWDOWN.items() if reasons & bit]
                if slow:
                    findings.append(("degraded", "host", f"{gpu}: {', '.join(slow)}",
                                     f"{gpu} clocks_throttle_reasons.active {reasons:#x}", 0.6))
    ecc = _out(evidence, GPU_ECC)
    if ecc and ecc.get("rc") == 0:
        for g in parse_ecc(ecc["out"]):
            if g["remap_failure"]:
                findings.append(("failed", "host", f"GPU {g['gpu']}: row remapping failed", "Remapping Failure Occurred: Yes", 0.9))
            elif g["remap_pending"]:
                findings.append(("degraded", "host", f"GPU {g['gpu']}: row remap pending (a reset fixes it)", "Remapped Rows Pending: Yes", 0.8))
            if (g["sram_uncorrectable"] or 0) > 4:  # NVIDIA: aggregate SRAM uncorrectable > 4 => RMA
                findings.append(("failed", "host", f"GPU {g['gpu']}: {g['sram_uncorrectable']} SRAM uncorrectable errors (RMA)",
                                 f"SRAM Uncorrectable {g['sram_uncorrectable']}", 0.85))
            elif (g["dram_uncorrectable"] or 0) > 0:
                findings.append(("degraded", "host", f"GPU {g['gpu']}: {g['dram_uncorrectable']} DRAM uncorrectable error(s)",
                                 f"DRAM Uncorrectable {g['dram_uncorrectable']}", 0.8))
    if findings:
        worst = max(findings, key=lambda f: (_RANK[f[0]], f[1] == "host", f[4]))
        lines = [worst[3]] + [f[3] for f in findings if f is not worst]
        return v(worst[0], worst[1], worst[2], lines, worst[4])

    if worker is not None and not worker.live and status == "running":
        return v("degraded", "app", "instance up and its GPU answers, but the Curio worker's heartbeat is stale",
                 ["worker heartbeat stale", *(f"{GPU_LIST}: {_first_line(nv_e['out'])}" for _ in [0] if nv_e)], 0.7)
    gpus = len(_GPU_LINE.findall((nv or {}).get("out", "")))
    cause = f"{gpus} GPU(s) listed" if gpus else "no fault seen"
    missing = [cmd for cmd, e in evidence.items() if isinstance(e, dict) and e.get("rc") == 127]
    if missing:
        cause += f"; missing evidence (rc 127, command not found): {', '.join(_short(c) for c in missing)}"
    lines = [f"{GPU_LIST}: {_first_line(nv_e['out'])}"] if nv_e else []
    if not any(_out(evidence, c) for c in evidence if c not in ("provider", "worker", "ssh", "injection")) and worker is None:
        # nothing answered and no heartbeat seen: no evidence is not evidence of health
        return v("degraded", "none", "no evidence: every command was missing (rc 127) and no worker heartbeat is known",
                 lines, 0.3)
    return v("healthy", "none", cause, lines, 0.8 if gpus else 0.5)


def _short(cmd: str) -> str:
    return cmd if len(cmd) <= 40 else cmd.split(" ", 1)[0] + " …"


# --- diagnose --------------------------------------------------------------------------------
def gather(instance: Instance, *, timeout_s: float = COMMAND_TIMEOUT_S) -> tuple[dict, str, bool]:
    """Collect evidence for ``instance``: ``(evidence, source, reachable)``; ``source`` is ``ssh``
    when the machine answered, ``provider`` otherwise (no runner, or :class:`Unreachable`, whose
    kind lands in ``evidence["ssh"]["kind"]``). Never raises for a machine's failure."""
    runner = get_provider(instance.provider).command_runner(instance)
    evidence, source, reachable = {}, "provider", True
    if runner is not None:
        try:
            evidence = collect(runner, timeout_s=min(COMMAND_TIMEOUT_S, timeout_s), commands=commands_for(instance))
            source = "ssh"
        except Unreachable as exc:
            evidence = {"ssh": {"rc": 255, "out": redact(str(exc)), "kind": getattr(exc, "kind", "network")}}
            reachable = False
    evidence["provider"] = {"status": instance.status, "status_msg": redact(instance.status_msg or ""),
                            "exit_code": instance.exit_code}
    return evidence, source, reachable


def diagnose(instance: Instance, *, worker=None, timeout_s: float = 30, judge_fn=None) -> Diagnosis:
    """Collect evidence for ``instance`` (:func:`gather`), judge it and store a :class:`Diagnosis`.

    ``judge_fn(evidence, instance=, worker=, rules=)`` — a model judge from the agent side — may
    return a :class:`Verdict` to use instead of the rules' (``judge="model"``), or ``None`` to keep
    the rules' verdict. Instruction-like text in any collected text raises one ``prompt_injection``
    alert and changes nothing else.
    """
    evidence, source, reachable = gather(instance, timeout_s=timeout_s)
    if worker is not None:
        evidence["worker"] = {"live": worker.live, "unschedulable": worker.unschedulable, "owned_tasks": worker.owned_tasks}
    verdict = judge_rules(evidence, status=instance.status, worker=worker, reachable=reachable)
    judged_by = "rules"
    if judge_fn is not None:
        other = judge_fn(evidence, instance=instance, worker=worker, rules=verdict)
        if other is not None:
            verdict, judged_by = other, "model"
    hits = [(cmd, e["injection"][0]) for cmd, e in evidence.items() if isinstance(e, dict) and e.get("injection")]
    hits += [("provider", h) for h in _scan(json.dumps(evidence["provider"]))]
    if hits:  # what a machine prints is data: instruction-like text raises prompt_injection here
        cmd, fragment = hits[0]
        evidence["injection"] = [{"command": c, "fragment": f[:120]} for c, f in hits]
        raise_alert("prompt_injection", f"instruction-like text in the diagnose_instance evidence of {instance.external_id} "
                    f"({_short(cmd)}): {fragment[:120]}", severity="P1", key=f"prompt_injection:diagnosis:{instance.external_id}")
    if verdict.fault_class == "host":  # a host fault: replace it and avoid that machine in later offers
        remember_failure(instance, f"host fault diagnosed: {redact(verdict.cause)}")
    return Diagnosis.objects.create(
        instance=instance, taken_at=clock.now(), health=verdict.health,
        fault_class="" if verdict.fault_class == "none" else verdict.fault_class, cause=redact(verdict.cause),
        source=source, evidence=redact_obj(evidence),  # what machines print is never stored with its secrets
        findings=[redact(line) for line in verdict.evidence], confidence=verdict.confidence, judge=judged_by,
    )


def diagnose_many(instances: list[Instance], *, workers: dict | None = None, max_parallel: int = MAX_PARALLEL,
                  timeout_s: float = 30, judge_fn=None) -> list[Diagnosis]:
    """Diagnose ``instances`` in parallel (a thread pool of at most ``max_parallel``), in their
    order. ``workers`` maps instance pk to its ``WorkerView``. A dead host costs its own thread
    the connect budget (``fleet.ssh.CONNECT_TIMEOUT_S``), not the others. Each thread closes its
    database connection when done."""
    def one(inst):
        try:
            return diagnose(inst, worker=(workers or {}).get(inst.pk), timeout_s=timeout_s, judge_fn=judge_fn)
        finally:
            connection.close()

    if not instances:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(instances))), thread_name_prefix="diagnose") as pool:
        return list(pool.map(one, instances))


def unreachable_alerts(instances, worker_for=None) -> list:
    """Alert on every owned host SSH cannot reach (status ``offline``), once per episode, with a
    diagnosis taken when the episode starts (:func:`diagnose`: its SSH attempt and
    the worker's heartbeat); resolved when the host answers again. The host is never removed.

    ``instances``: the cycle's ``Instance`` rows; ``worker_for(inst)``: its Curio ``WorkerView``
    or None. Alert kind ``provider_error`` (docs/contract.md), key ``provider_error:ssh:<name>``.
    Returns the alerts raised now.
    """
    owned = [i for i in instances if i.is_owned_host and i.killed_at is None]
    if not owned:
        return []
    open_keys = set(Alert.objects.filter(kind="provider_error", key__startswith="provider_error:ssh:")
                    .exclude(state="resolved").values_list("key", flat=True))
    raised = []
    for inst in owned:
        key = f"provider_error:ssh:{inst.external_id}"
        if inst.status != "offline":
            if key in open_keys:
                resolve(key, f"owned host {inst.external_id} answers again (now {inst.status})")
            continue
        if key in open_keys:
            continue
        d = diagnose(inst, worker=worker_for(inst) if worker_for else None)
        raised.append(raise_alert(
            "provider_error",
            f"owned host {inst.external_id} ({inst.ssh_host}:{inst.ssh_port}) is unreachable: {inst.status_msg}. "
            f"It stays in the fleet (an owned host is never removed). Diagnosis: {d.health}"
            f"{'/' + d.fault_class if d.fault_class else ''}: {d.cause}",
            severity="P1", key=key, instance=inst,
        ))
    return raised
