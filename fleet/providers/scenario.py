"""The ``scenario`` provider and SSH command runner: a fleet held in memory, taken from a replay file.

Scenario replay (``python manage.py replay FILE.json``, docs/replay.md) routes every
``get_provider()`` to a :class:`ScenarioProvider` built from the file's ``fleet``, ``offers`` and
``provider_faults``. Its calls change only its in-memory state; nothing outside the process is
touched. Faults make the next ``times`` requests to one call fail, from any caller (the observe
phase, the monitor and retries included), exactly like a real provider would. A fault may let
its first ``skip`` requests pass, and with ``after_effect`` the request takes effect at the
provider before it fails (a create that timed out but rented the machine):

=============  ==========================  ===================
error          ProviderError ``kind``      raised as
=============  ==========================  ===================
``http_429``   transient                   code ``http_429``
``http_500``   transient                   code ``http_500``
``timeout``    transient                   code ``timeout``, after the virtual clock advanced by
                                           :attr:`ScenarioProvider.timeout_s`
``http_410``   permanent                   code ``http_410``
``empty_body`` semantic                    code ``empty_body``
``html_body``  semantic                    code ``html_body``
=============  ==========================  ===================

``ssh_refused`` / ``ssh_timeout`` (call ``ssh``) apply to :class:`ScenarioCommandRunner`, the
SSH side of diagnosis (``Provider.command_runner``): connecting raises
``fleet.ssh.Unreachable`` instead of answering.
"""

from __future__ import annotations

import copy
import itertools
from datetime import timedelta

from fleet.clock import clock
from fleet.providers.base import Provider, ProviderError, ProviderInstance
from fleet.ssh import Unreachable

#: provider call names a fault may name; the short forms are aliases of the tool-style names
PROVIDER_CALLS = {
    "list_instances": "list_instances",
    "search_offers": "search_offers",
    "launch_instance": "launch_instance",
    "launch": "launch_instance",
    "stop_instance": "stop_instance",
    "stop": "stop_instance",
    "resume_instance": "resume_instance",
    "resume": "resume_instance",
    "reboot_instance": "reboot_instance",
    "reboot": "reboot_instance",
    "destroy_instance": "destroy_instance",
    "destroy": "destroy_instance",
}
#: call names an SSH fault may name (``ssh`` = every command the SSH runner is asked to run)
SSH_CALLS = {"ssh": "ssh", "diagnose_instance": "ssh"}
PROVIDER_ERRORS = {
    "http_429": ("transient", "HTTP 429 Too Many Requests"),
    "http_500": ("transient", "HTTP 500 Internal Server Error"),
    "timeout": ("transient", "request timed out"),
    "http_410": ("permanent", "HTTP 410 Gone"),
    "empty_body": ("semantic", "the provider answered with an empty body"),
    "html_body": ("semantic", "the provider answered with an HTML page instead of JSON"),
}
SSH_ERRORS = {"ssh_refused", "ssh_timeout"}


def normalize_call(call: str, error: str) -> str:
    """The canonical call name a fault applies to; raises ``ValueError`` for a bad pair."""
    if error in SSH_ERRORS:
        if call not in SSH_CALLS:
            raise ValueError(f"{error} applies to SSH; name the call 'ssh' (got {call!r})")
        return "ssh"
    if error not in PROVIDER_ERRORS:
        raise ValueError(f"unknown error {error!r}; use one of {sorted([*PROVIDER_ERRORS, *SSH_ERRORS])}")
    if call not in PROVIDER_CALLS:
        raise ValueError(f"unknown provider call {call!r}; use one of {sorted(set(PROVIDER_CALLS.values()))}")
    return PROVIDER_CALLS[call]


#: provider call -> the operation name the report counts (``provider_requests``)
OPERATIONS = {
    "list_instances": "list",
    "search_offers": "search",
    "launch_instance": "launch",
    "stop_instance": "stop",
    "resume_instance": "resume",
    "reboot_instance": "reboot",
    "destroy_instance": "destroy",
}
#: calls that change something at the provider (the only ones ``after_effect`` can apply to)
EFFECT_CALLS = {"launch_instance", "stop_instance", "resume_instance", "reboot_instance", "destroy_instance"}


class FaultBook:
    """The file's ``provider_faults``: per call, fault entries used up in order.

    ``faults`` is a list of dicts ``{"call": str, "times": int, "error": str, "skip"?: int,
    "after_effect"?: bool}``. Every request to a call first counts down the ``skip`` of each of
    that call's entries (an entry still skipping lets the request pass); then the first entry
    with ``times`` left fires. Shared by the provider and the SSH runner so one file drives
    both. ``fired`` records every fault that fired as ``(call, error)``, for tests and the report.
    """

    def __init__(self, faults: list[dict] | None = None):
        self._queues: dict[str, list[dict]] = {}
        self.fired: list[tuple[str, str]] = []
        for f in faults or []:
            call = normalize_call(f["call"], f["error"])
            if f.get("after_effect") and call not in EFFECT_CALLS:
                raise ValueError(f"after_effect applies to a call that changes something ({', '.join(sorted(EFFECT_CALLS))}), not {f['call']!r}")
            self._queues.setdefault(call, []).append(
                {"error": f["error"], "times": int(f.get("times", 1)), "skip": int(f.get("skip") or 0),
                 "after_effect": bool(f.get("after_effect"))}
            )

    def take_fault(self, call: str) -> dict | None:
        """The fault the next request to ``call`` meets (``{"error", "after_effect"}``), or None."""
        ready = None
        for entry in self._queues.get(call, []):
            if entry["skip"] > 0:
                entry["skip"] -= 1  # this request is one of the entry's first ``skip``: it passes this entry
            elif ready is None and entry["times"] > 0:
                ready = entry
        if ready is None:
            return None
        ready["times"] -= 1
        self.fired.append((call, ready["error"]))
        return {"error": ready["error"], "after_effect": ready["after_effect"]}

    def take(self, call: str) -> str | None:
        """The error the next request to ``call`` fails with (one use consumed), or None."""
        fault = self.take_fault(call)
        return fault["error"] if fault else None


class ScenarioProvider(Provider):
    """A provider whose fleet and offers live in memory, built from a scenario file.

    ``fleet``: the file's ``fleet`` entries as dicts (``id``, ``actual_status``,
    ``intended_status``, ``status_msg``, ``gpu_name``, ``dph``, ``age_min``...; an entry with
    ``listed: false`` is not at the provider). ``offers``: dicts with ``id``, ``gpu_name``,
    ``dph`` (and optionally ``machine_id``). ``faults``: a :class:`FaultBook` or the file's
    ``provider_faults`` list. ``calls`` records every request as ``(call, args)``, faulted ones
    included; :meth:`request_counts` counts them per operation. Launched instances are named
    ``s-1``, ``s-2``..., carry the launch's ``label`` and start ``loading``.
    """

    name = "scenario"
    #: virtual seconds a ``timeout`` fault takes before it fails
    timeout_s = 30.0

    def __init__(self, fleet=None, offers=None, faults=None, *, name: str = "scenario"):
        self.name = name
        self.faults = faults if isinstance(faults, FaultBook) else FaultBook(faults)
        self.instances: dict[str, dict] = {}
        self.ssh: dict[str, dict] = {}
        self.runners: list[ScenarioCommandRunner] = []
        for entry in fleet or []:
            if entry.get("listed", True) is False:
                continue
            self.put(entry)
        self.offers: list[dict] = [copy.deepcopy(o) for o in offers or []]
        self.calls: list[tuple[str, dict]] = []
        self._ids = itertools.count(1)

    # --- the file's changes (timeline) --------------------------------------------------------
    def put(self, entry: dict) -> None:
        """Add or change one instance at the provider from a fleet entry (only the keys it gives).

        ``"gone": true`` removes it from the provider's list. A new instance started ``age_min``
        minutes ago on the virtual clock (0 when not given).
        """
        iid = str(entry["id"])
        if entry.get("gone"):
            self.instances.pop(iid, None)
            self.ssh.pop(iid, None)
            return
        inst = self.instances.get(iid)
        if inst is None:
            age = entry.get("age_min")
            inst = self.instances[iid] = {
                "status": "running", "intended_status": "running", "status_msg": "", "gpu_name": "", "dph": 0.0,
                "started_at": None if age is None else clock.now() - timedelta(minutes=float(age)),
                "provider": self.name, "label": iid,
            }
        for key, field in (("actual_status", "status"), ("intended_status", "intended_status"),
                           ("status_msg", "status_msg"), ("gpu_name", "gpu_name"), ("provider", "provider")):
            if entry.get(key) is not None:
                inst[field] = entry[key]
        if entry.get("dph") is not None:
            inst["dph"] = float(entry["dph"])
        if entry.get("ssh") is not None:
            self.ssh[iid] = entry["ssh"]

    def request_counts(self) -> dict[str, int]:
        """Requests received per operation (``list``, ``search``, ``launch``, ``stop``, ``resume``,
        ``reboot``, ``destroy``), faulted ones included; every operation is present (0 when none)."""
        counts = dict.fromkeys(OPERATIONS.values(), 0)
        for call, _ in self.calls:
            op = OPERATIONS.get(call, call)  # a call added later is counted under its own name
            counts[op] = counts.get(op, 0) + 1
        return counts

    def statuses(self) -> dict[str, str]:
        """``{instance id: provider status}`` of every instance the provider lists now."""
        return {iid: inst["status"] for iid, inst in self.instances.items()}

    # --- faults -----------------------------------------------------------------------------
    def _request(self, call: str, **args) -> dict | None:
        """Record the request; raise its fault now, or return an ``after_effect`` fault to raise
        (with :meth:`_fail`) once the effect is applied."""
        self.calls.append((call, args))
        fault = self.faults.take_fault(call)
        if fault is None:
            return None
        if fault["after_effect"]:
            return fault
        self._fail(call, fault)
        return None

    def _fail(self, call: str, fault: dict | None) -> None:
        if fault is None:
            return
        error = fault["error"]
        kind, text = PROVIDER_ERRORS[error]
        if error == "timeout":
            clock.sleep(self.timeout_s)
        after = " (after it took effect)" if fault["after_effect"] else ""
        raise ProviderError(f"scenario provider: {call}: {text}{after}", kind=kind, code=error)

    def _get(self, external_id: str) -> dict:
        inst = self.instances.get(str(external_id))
        if inst is None:
            raise ProviderError(f"scenario provider: no instance {external_id!r}", kind="permanent", code="not_found")
        return inst

    def _view(self, external_id: str, inst: dict) -> ProviderInstance:
        return ProviderInstance(
            external_id=external_id,
            status=inst["status"],
            intended_status=inst["intended_status"],
            status_msg=inst["status_msg"],
            gpu_name=inst["gpu_name"],
            dph=inst["dph"],
            label=inst.get("label") or external_id,
            ssh_host=external_id,
            ssh_port=22,
            worker_name=external_id,
            started_at=inst["started_at"],
            extra={"provider": inst.get("provider", self.name)},
        )

    @property
    def names(self) -> set[str]:
        """Every provider name this stand-in answers for (a file may mix vastai and ssh entries)."""
        return {self.name} | {i.get("provider", self.name) for i in self.instances.values()}

    # --- the provider interface -------------------------------------------------------------
    def command_runner(self, instance):
        """The SSH runner for ``instance`` answering from its ``ssh`` block (None when it has none)."""
        ext = str(getattr(instance, "external_id", instance))
        if ext not in self.ssh:
            return None
        runner = ScenarioCommandRunner(ext, self.ssh[ext], self.faults)
        self.runners.append(runner)
        return runner

    def list_instances(self) -> list[ProviderInstance]:
        """Every instance not destroyed, as the file (and earlier calls) left it."""
        self._request("list_instances")
        return [self._view(i, inst) for i, inst in self.instances.items()]

    def search_offers(self, *, gpu_name: str = "", max_dph: float | None = None, limit: int = 10) -> list[dict]:
        """The file's offers matching ``gpu_name`` (exact, case-insensitive) and ``max_dph``, cheapest first."""
        self._fail("search_offers", self._request("search_offers", gpu_name=gpu_name, max_dph=max_dph, limit=limit))
        found = [
            copy.deepcopy(o)
            for o in self.offers
            if (not gpu_name or str(o.get("gpu_name", "")).lower() == gpu_name.lower())
            and (max_dph is None or float(o.get("dph", 0)) <= max_dph)
        ]
        found.sort(key=lambda o: float(o.get("dph", 0)))
        return found[: max(0, int(limit))] if limit is not None else found

    def launch(self, *, gpu_name: str = "", offer_id: str = "", label: str = "") -> ProviderInstance:
        """Rent an offer (by ``offer_id``, else the cheapest of ``gpu_name``); the offer is used up.

        Raises ProviderError ``not_found`` when no offer fits.
        """
        fault = self._request("launch_instance", gpu_name=gpu_name, offer_id=offer_id, label=label)
        offer = None
        if offer_id:
            offer = next((o for o in self.offers if str(o.get("id")) == str(offer_id)), None)
        else:
            fits = [o for o in self.offers if not gpu_name or str(o.get("gpu_name", "")).lower() == gpu_name.lower()]
            offer = min(fits, key=lambda o: float(o.get("dph", 0)), default=None)
        if offer is None:
            raise ProviderError(
                f"scenario provider: no offer for offer_id={offer_id!r} gpu_name={gpu_name!r}",
                kind="permanent",
                code="not_found",
            )
        self.offers.remove(offer)
        external_id = f"s-{next(self._ids)}"
        while external_id in self.instances:
            external_id = f"s-{next(self._ids)}"
        self.instances[external_id] = {
            "status": "loading",
            "intended_status": "running",
            "status_msg": "",
            "gpu_name": offer.get("gpu_name", gpu_name),
            "dph": float(offer.get("dph", 0.0)),
            "started_at": clock.now(),
            "provider": self.name,
            "label": label or external_id,
        }
        self._fail("launch_instance", fault)
        return self._view(external_id, self.instances[external_id])

    def stop(self, external_id: str) -> None:
        """Stop an instance: status and intended status become ``stopped``."""
        fault = self._request("stop_instance", external_id=external_id)
        inst = self._get(external_id)
        inst["status"] = inst["intended_status"] = "stopped"
        self._fail("stop_instance", fault)

    def resume(self, external_id: str) -> None:
        """Resume a stopped instance: ``running`` again."""
        fault = self._request("resume_instance", external_id=external_id)
        inst = self._get(external_id)
        inst["status"] = inst["intended_status"] = "running"
        self._fail("resume_instance", fault)

    def reboot(self, external_id: str) -> None:
        """Reboot an instance (in the scenario it comes back ``running`` at once)."""
        fault = self._request("reboot_instance", external_id=external_id)
        inst = self._get(external_id)
        inst["status"] = "running"
        self._fail("reboot_instance", fault)

    def destroy(self, external_id: str) -> None:
        """Destroy an instance: it disappears from later lists."""
        fault = self._request("destroy_instance", external_id=external_id)
        self._get(external_id)
        del self.instances[str(external_id)]
        self._fail("destroy_instance", fault)


class ScenarioCommandRunner:
    """Answers diagnosis commands for one instance from its ``fleet[].ssh`` block.

    Same shape as ``fleet.ssh.SSHRunner``: a context manager (connecting raises
    ``fleet.ssh.Unreachable``) whose ``run(command, timeout_s)`` returns ``(rc, output)``.
    A key of ``ssh.commands`` matches a command that starts with it; the longest key wins. A
    command no key matches answers rc 127 "command not found" (missing evidence, not a failure).
    ``reachable: false`` refuses the connection; an ``ssh_refused`` fault refuses it, an
    ``ssh_timeout`` fault times out after the virtual clock advanced by ``timeout_s``. Every
    connection attempt uses up one fault.
    """

    def __init__(self, host: str, ssh: dict, faults: FaultBook, timeout_s: float = 10.0):
        self.host, self.ssh, self.faults, self.timeout_s = host, ssh or {}, faults, timeout_s
        self.commands_run: list[str] = []
        self.broken = False  # never: a scenario session does not drop mid-step

    def __enter__(self):
        error = self.faults.take("ssh")
        if error == "ssh_timeout":
            clock.sleep(self.timeout_s)
            raise Unreachable(f"ssh {self.host}:22: timed out after {self.timeout_s:g}s")
        if error == "ssh_refused" or not self.ssh.get("reachable", True):
            raise Unreachable(f"ssh {self.host}:22: [Errno 111] Connection refused")
        return self

    def run(self, command: str, timeout_s: float = 10, keep: str = "head") -> tuple[int, str]:
        """The file's answer to ``command``: ``(rc, out)``; rc 127 when no key matches."""
        self.commands_run.append(command)
        commands = self.ssh.get("commands") or {}
        keys = [k for k in commands if command.startswith(k)]
        if not keys:
            return 127, f"bash: {command.split(' ', 1)[0]}: command not found"
        answer = commands[max(keys, key=len)]
        return int(answer.get("rc", 0)), str(answer.get("out", ""))

    def __exit__(self, *exc):
        return False
