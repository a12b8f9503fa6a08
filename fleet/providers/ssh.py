"""The ``ssh`` provider: machines the operator owns, reached over SSH (docs/operations.md, Owned SSH hosts).

Hosts come from a TOML file named by ``WARDEN_SSH_HOSTS_FILE`` (read at every use, so an edit
takes effect on the next cycle)::

    [defaults]                      # any host field; each [[hosts]] entry may override it
    user = "curio"
    key_file = "/etc/warden/ssh/id_ed25519"   # a reference: the key is read at use, never stored
    start = "systemctl --user start curio"
    stop = "systemctl --user stop curio"
    check = "systemctl --user is-active --quiet curio"   # exit 0 = the worker runs

    [[hosts]]
    name = "rig-1"                  # the instance id in Warden
    host = "10.0.0.11"
    port = 22
    gpu_name = "RTX 4090"

Each host is one instance (``external_id`` = ``name``; its Curio ``machine_name`` is
``worker_name``, default ``name``). ``list_instances`` runs ``check`` on every host, in
parallel: exit 0 is ``running``, any other exit ``stopped`` (the worker is not running: the
host is free), and a host SSH cannot reach is ``offline`` with the error in ``status_msg`` —
listed, never dropped, so it is never marked vanished. ``launch`` runs ``start`` on the first
free host (reachable, worker not running, in file order, matching ``gpu_name``/``offer_id``
when given) with ``CURIO_NODE_NAME`` and ``WARDEN_LABEL`` exported; ``stop`` runs ``stop``;
``resume`` runs ``start``; ``reboot`` restarts the worker (``stop`` then ``start``), not the
machine. ``destroy`` is refused (``owned_host``): an owned host is never destroyed.

What Warden wants of each host (``intended_status``: running after a launch or resume, stopped
after a stop; stopped for a host never launched), with the label of the launch (written before
the start is sent, so a launch whose answer was lost is found by ``find_by_label``), is kept in
``VAR_DIR/ssh_hosts/<name>``: a
worker found not running while it is wanted is ``exited`` (an ``instance_exited`` alert), one
not wanted is ``stopped`` (the host is free).

With another provider configured (``WARDEN_PROVIDER``, e.g. ``vastai``) and a hosts file, the
fleet is both (:class:`WithOwnedHosts`): owned hosts first, the rented provider when none is free.
"""

import shlex
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleet.lifecycle import eligibility
from fleet.models import Instance
from fleet.providers.base import Provider, ProviderError, ProviderInstance
from fleet.ssh import InstanceHostKeys, SSHRunner, Unreachable

#: the setting naming the hosts file
HOSTS_FILE_ENV = "WARDEN_SSH_HOSTS_FILE"
#: seconds to connect and for each command (``check`` and ``stop``); ``start`` gets ``start_timeout_s``
DEFAULT_TIMEOUT_S = 10.0
#: most hosts checked at once by ``list_instances``
PARALLEL = 8


class HostConfig(BaseModel):
    """One owned host as configured (see the module docstring). ``key_file`` is a path (a
    reference; None: WARDEN_SSH_KEY_FILE, else paramiko's default keys). ``dph`` is what the
    operator wants the host to count for in $/hr (default 0: already paid for)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(22, ge=1, le=65535)
    user: str = Field(min_length=1, max_length=64)
    key_file: str | None = None
    start: str = Field(min_length=1)
    stop: str = Field(min_length=1)
    check: str = Field(min_length=1)
    gpu_name: str = ""
    dph: float = Field(0.0, ge=0)
    worker_name: str = ""
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0, le=300)
    start_timeout_s: float = Field(60.0, gt=0, le=900)

    @property
    def curio_name(self) -> str:
        """The Curio ``machine_name`` this host's worker registers under (``CURIO_NODE_NAME``)."""
        return self.worker_name or self.name


def hosts_file() -> str:
    """The configured hosts file path, or "" when owned hosts are not configured."""
    return (settings.WARDEN.get("SSH_HOSTS_FILE") or "").strip()


def load_hosts(path: str | None = None) -> list[HostConfig]:
    """The hosts of the TOML file at ``path`` (default: ``WARDEN_SSH_HOSTS_FILE``), defaults applied.

    Raises ``ProviderError`` (permanent, code ``config``) naming the file, the host entry and the
    field when the file is missing, unreadable, not TOML, or an entry is invalid; a name used
    twice, a name that is only digits (a rented instance's id looks so) and two hosts whose workers
    would register under one Curio machine name (their liveness could not be told apart) are errors too.
    """
    path = path if path is not None else hosts_file()
    if not path:
        raise ProviderError(f"owned hosts are not configured: set {HOSTS_FILE_ENV} to a TOML hosts file",
                            kind="permanent", code="config")
    try:
        raw = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ProviderError(f"{HOSTS_FILE_ENV}={path}: cannot read it ({exc.strerror or exc})", code="config") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProviderError(f"{HOSTS_FILE_ENV}={path}: not valid TOML ({exc})", code="config") from None
    unknown = set(raw) - {"defaults", "hosts"}
    if unknown:
        raise ProviderError(f"{path}: unknown section(s) {', '.join(sorted(unknown))}; use [defaults] and [[hosts]]",
                            code="config")
    defaults = raw.get("defaults") or {}
    entries = raw.get("hosts") or []
    if not isinstance(defaults, dict) or not isinstance(entries, list):
        raise ProviderError(f"{path}: [defaults] must be a table and [[hosts]] an array of tables", code="config")
    hosts, seen, curio_names = [], set(), {}
    for i, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise ProviderError(f"{path}: host #{i} is not a table", code="config")
        try:
            h = HostConfig(**{**defaults, **entry})
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(x) for x in err["loc"]) or "?"
            who = entry.get("name") or f"#{i}"
            raise ProviderError(f"{path}: host {who}: {field}: {err['msg']}", code="config") from None
        if h.name in seen:
            raise ProviderError(f"{path}: host name {h.name!r} is used twice; names must be unique", code="config")
        if h.name.isdigit():
            # vast.ai instance ids are numbers: per-instance calls go to the owner of the id (WithOwnedHosts)
            raise ProviderError(f"{path}: host name {h.name!r} is a number, like a rented instance's id; give it a "
                                f"name with a letter (rig-{h.name})", code="config")
        if h.curio_name in curio_names:
            raise ProviderError(f"{path}: host {h.name}: Curio machine name {h.curio_name!r} is also host "
                                f"{curio_names[h.curio_name]}'s; each host's worker needs its own (set worker_name)",
                                code="config")
        seen.add(h.name)
        curio_names[h.curio_name] = h.name
        hosts.append(h)
    return hosts


def _with_env(host: HostConfig, command: str, label: str = "") -> str:
    """``command`` with the worker's name (and the launch's label) exported before it."""
    env = f"export CURIO_NODE_NAME={shlex.quote(host.curio_name)}"
    if label:
        env += f" WARDEN_LABEL={shlex.quote(label)}"
    return f"{env}; {command}"


def _intended_path(name: str) -> Path:
    return Path(settings.VAR_DIR) / "ssh_hosts" / name


def _intended(name: str) -> tuple[str, str]:
    """What Warden last asked of host ``name`` and the label of that launch: (``running`` or
    ``stopped``, label). Never asked: (``stopped``, "")."""
    try:
        status, _, label = _intended_path(name).read_text().partition("\n")
    except OSError:
        return "stopped", ""
    return ("running" if status.strip() == "running" else "stopped"), label.strip()


def _set_intended(name: str, status: str, label: str = "") -> None:
    path = _intended_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{status}\n{label}")
    tmp.replace(path)


class SSHProvider(Provider):
    """Owned hosts over SSH (module docstring). Every call raises ``ProviderError``: ``config``
    for a bad hosts file, ``not_found`` for an unknown host, ``connection_refused`` (transient, not
    sent) when the host cannot be reached, ``ssh_dropped`` (transient, outcome unknown) when the session drops, ``command_failed`` when ``start``/``stop`` exits non-zero,
    ``no_free_host`` when every host is busy or unreachable, ``owned_host`` for a destroy."""

    name = "ssh"

    def __init__(self, path: str | None = None):
        self.path = path

    # -- configuration ------------------------------------------------------------------------
    def hosts(self) -> list[HostConfig]:
        """The configured hosts (read now)."""
        return load_hosts(self.path)

    def host(self, external_id: str) -> HostConfig:
        """The configured host named ``external_id``; raises ``ProviderError`` ``not_found``."""
        for h in self.hosts():
            if h.name == external_id:
                return h
        raise ProviderError(f"{external_id} is not an owned host in {self.path or hosts_file()}", code="not_found")

    def runner(self, h: HostConfig) -> SSHRunner:
        """An :class:`SSHRunner` for ``h`` (one connect attempt: the next cycle is the retry)."""
        key = h.key_file or settings.WARDEN.get("SSH_KEY_FILE") or None
        return SSHRunner(h.host, h.port, user=h.user, key_filename=key, timeout_s=h.timeout_s, connect_attempts=1)

    def _run(self, h: HostConfig, *commands: tuple[str, float]) -> list[tuple[int, str]]:
        """Run each ``(command, timeout_s)`` on ``h`` in one session; raises ``ProviderError``
        ``connection_refused`` when it cannot connect (nothing was sent), ``ssh_dropped`` when the
        session drops (a command may have run)."""
        out = []
        try:
            with self.runner(h) as r:
                for cmd, timeout in commands:
                    rc, text = r.run(cmd, timeout_s=timeout)
                    if r.broken:
                        raise ProviderError(f"{h.name}: the SSH session dropped: {text[-200:]}", kind="transient",
                                            code="ssh_dropped")
                    out.append((rc, text))
        except Unreachable as exc:
            # nothing was sent: like a refused connection, safe to send again (ProviderError.not_sent)
            raise ProviderError(f"{h.name} unreachable: {exc}", kind="transient", code="connection_refused") from None
        return out

    # -- reads --------------------------------------------------------------------------------
    def _probe(self, h: HostConfig) -> ProviderInstance:
        pi = ProviderInstance(h.name, "offline", gpu_name=h.gpu_name, dph=h.dph, ssh_host=h.host, ssh_port=h.port,
                              worker_name=h.curio_name, extra={"provider": self.name})
        try:
            ((rc, text),) = self._run(h, (_with_env(h, h.check), h.timeout_s))
        except ProviderError as exc:
            pi.status, pi.status_msg = "offline", f"unreachable over SSH: {exc}"[:500]
            return pi
        pi.intended_status, pi.label = _intended(h.name)
        if rc == 0:
            pi.status = "running"
        else:
            pi.status = "exited" if pi.intended_status == "running" else "stopped"
            pi.status_msg = f"worker not running (check exited {rc}{': ' + text.strip()[-200:] if text.strip() else ''})"
        return pi

    def list_instances(self) -> list[ProviderInstance]:
        """Every configured host, checked now (module docstring). Raises ``ProviderError`` only
        for a bad hosts file: an unreachable host is listed ``offline``, never left out."""
        hosts = self.hosts()
        if not hosts:
            return []
        with ThreadPoolExecutor(max_workers=min(PARALLEL, len(hosts))) as pool:
            return list(pool.map(self._probe, hosts))

    def free_hosts(self, *, gpu_name: str = "", offer_id: str = "") -> list[ProviderInstance]:
        """Hosts a launch may use now: reachable, worker not running, matching ``gpu_name`` (and
        named ``offer_id`` when given), in file order."""
        return [
            pi for pi in self.list_instances()
            if pi.status in ("stopped", "exited") and (not gpu_name or pi.gpu_name == gpu_name)
            and (not offer_id or pi.external_id == str(offer_id))
        ]

    def search_offers(self, *, gpu_name: str = "", max_dph: float | None = None, limit: int = 10) -> list[dict]:
        """Free owned hosts as offers: ``{"id": name, "gpu_name", "dph", "owned": True}``."""
        return [
            {"id": pi.external_id, "gpu_name": pi.gpu_name, "dph": pi.dph, "owned": True}
            for pi in self.free_hosts(gpu_name=gpu_name) if max_dph is None or pi.dph <= max_dph
        ][:limit]

    # -- effects ------------------------------------------------------------------------------
    def _start(self, h: HostConfig, label: str = "") -> ProviderInstance:
        # recorded before the command is sent: a start whose answer is lost is found by its label
        before = _intended(h.name)
        _set_intended(h.name, "running", label)
        try:
            (rc, text), (check_rc, _) = self._run(h, (_with_env(h, h.start, label), h.start_timeout_s),
                                                  (_with_env(h, h.check), h.timeout_s))
        except ProviderError as exc:
            if exc.not_sent:  # could not connect: nothing was sent
                _set_intended(h.name, *before)
            raise
        if rc != 0:
            _set_intended(h.name, *before)
            raise ProviderError(f"{h.name}: start exited {rc}: {text.strip()[-300:]}", kind="permanent",
                                code="command_failed")
        return ProviderInstance(h.name, "running" if check_rc == 0 else "loading", gpu_name=h.gpu_name, dph=h.dph,
                                label=label, ssh_host=h.host, ssh_port=h.port, worker_name=h.curio_name,
                                extra={"provider": self.name})

    def launch(self, *, gpu_name: str = "", offer_id: str = "", label: str = "") -> ProviderInstance:
        """Start the worker on the first free host; raises ``ProviderError`` ``no_free_host``
        when none is (every host busy, unreachable or not matching)."""
        free = self.free_hosts(gpu_name=gpu_name, offer_id=offer_id)
        if not free:
            want = " ".join(x for x in (f"gpu {gpu_name}" if gpu_name else "", f"host {offer_id}" if offer_id else "") if x)
            raise ProviderError(f"no free owned host{' for ' + want if want else ''}: every host's worker runs or the "
                                "host is unreachable", kind="permanent", code="no_free_host")
        return self._start(self.host(free[0].external_id), label)

    def resume(self, external_id: str) -> None:
        """Run the host's ``start`` command."""
        self._start(self.host(external_id))

    def stop(self, external_id: str) -> None:
        """Run the host's ``stop`` command (the machine stays up and ours)."""
        h = self.host(external_id)
        ((rc, text),) = self._run(h, (_with_env(h, h.stop), h.timeout_s))
        if rc != 0:
            raise ProviderError(f"{h.name}: stop exited {rc}: {text.strip()[-300:]}", code="command_failed")
        _set_intended(h.name, "stopped", _intended(h.name)[1])

    def reboot(self, external_id: str) -> None:
        """Restart the worker (``stop``, then ``start``); the machine is not rebooted."""
        h = self.host(external_id)
        (rc, text), (rc2, text2) = self._run(h, (_with_env(h, h.stop), h.timeout_s),
                                             (_with_env(h, h.start), h.start_timeout_s))
        if rc2 != 0:
            raise ProviderError(f"{h.name}: restart: start exited {rc2}: {text2.strip()[-300:]}", code="command_failed")

    def destroy(self, external_id: str) -> None:
        """Refused, always: every host here is operator-owned, and an owned host is never destroyed
        (``fleet.lifecycle.eligibility``, docs/contract.md guard ``owned_host``)."""
        elig = eligibility(Instance(provider="ssh", external_id=external_id), None, "destroy_instance", actor="the ssh provider")
        raise ProviderError(f"{elig.detail}; stop its worker, or remove it from {HOSTS_FILE_ENV} to retire it",
                            kind="permanent", code=elig.code)

    def command_runner(self, instance):
        """SSH to the configured host with its own user and key (diagnostics); ``None`` when the
        host is no longer configured."""
        try:
            h = self.host(instance.external_id)
        except ProviderError:
            return super().command_runner(instance)
        key = h.key_file or settings.WARDEN.get("SSH_KEY_FILE") or None
        return SSHRunner(h.host, h.port, user=h.user, key_filename=key, timeout_s=h.timeout_s,
                         host_keys=InstanceHostKeys(instance) if instance.pk else None)  # trust on first use


class WithOwnedHosts(Provider):
    """The fleet of a rented provider (``primary``) plus owned hosts (``owned``), as one provider.

    Lists both (each owned instance carries ``extra["provider"] = "ssh"``, so its row is an
    ``ssh`` row); a launch goes to a free owned host first (already paid for), to the primary when
    none is free; offers list free owned hosts first; per-instance calls go to the provider that
    owns the id. ``name`` is the primary's (rows it launches are its rows)."""

    def __init__(self, primary: Provider, owned: SSHProvider):
        self.primary, self.owned = primary, owned
        self.name = primary.name
        self.names = {*getattr(primary, "names", {primary.name}), owned.name}

    def list_instances(self) -> list[ProviderInstance]:
        return self.primary.list_instances() + self.owned.list_instances()

    def find_by_label(self, label: str) -> list[ProviderInstance]:
        return self.primary.find_by_label(label) + self.owned.find_by_label(label)

    def search_offers(self, *, gpu_name: str = "", max_dph: float | None = None, limit: int = 10) -> list[dict]:
        offers = self.owned.search_offers(gpu_name=gpu_name, max_dph=max_dph, limit=limit)
        try:
            offers += self.primary.search_offers(gpu_name=gpu_name, max_dph=max_dph, limit=limit)
        except ProviderError as exc:
            if exc.code != "unsupported" or not offers:
                raise
        return offers[:limit]

    def launch(self, *, gpu_name: str = "", offer_id: str = "", label: str = "") -> ProviderInstance:
        owned_ids = {h.name for h in self.owned.hosts()}
        if not offer_id or str(offer_id) in owned_ids:
            try:
                return self.owned.launch(gpu_name=gpu_name, offer_id=offer_id, label=label)
            except ProviderError as exc:
                if exc.code != "no_free_host" or offer_id:
                    raise
        return self.primary.launch(gpu_name=gpu_name, offer_id=offer_id, label=label)

    def show(self, external_id: str) -> ProviderInstance:
        """The primary's view of one instance (what confirms a rented instance gone before it is
        marked vanished: ``fleet.sync``); an owned host, or a primary without ``show``, answers
        ProviderError ``not_found`` when its list omits it (its list is its truth)."""
        p = self._for(external_id)
        if p is not self.owned and hasattr(p, "show"):
            try:
                return p.show(external_id)
            except ProviderError as exc:
                if exc.code != "invalid_id":  # not the primary's id: a host gone from the hosts file
                    raise
        raise ProviderError(f"{external_id} is not listed by {p.name}", kind="permanent", code="not_found")

    def _for(self, external_id: str) -> Provider:
        return self.owned if external_id in {h.name for h in self.owned.hosts()} else self.primary

    def stop(self, external_id: str) -> None:
        self._for(external_id).stop(external_id)

    def resume(self, external_id: str) -> None:
        self._for(external_id).resume(external_id)

    def reboot(self, external_id: str) -> None:
        self._for(external_id).reboot(external_id)

    def destroy(self, external_id: str) -> None:
        self._for(external_id).destroy(external_id)

    def set_cordon(self, external_id: str, on: bool) -> None:
        self._for(external_id).set_cordon(external_id, on)

    def command_runner(self, instance):
        return self._for(instance.external_id).command_runner(instance)

