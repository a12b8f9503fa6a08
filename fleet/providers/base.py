"""What every provider (local, scenario, later vastai and ssh) offers the fleet and the agent.

docs/safety.md invariant 7: an empty, malformed or failed read raises :class:`ProviderError`; it is
never read as "zero instances".
"""

from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.conf import settings

from fleet.ssh import InstanceHostKeys, SSHRunner


class ProviderError(Exception):
    """A provider call failed.

    ``kind``: ``transient`` (timeouts, connection errors, 429, 5xx: worth a retry),
    ``permanent`` (4xx, permission, not found) or ``semantic`` (it answered, but the answer is
    malformed or contradicts itself). ``code`` is a short machine name such as ``http_429``,
    ``timeout``, ``empty_body``, ``not_found``.
    """

    def __init__(self, message: str, *, kind: str = "permanent", code: str = ""):
        super().__init__(message)
        self.kind = kind
        self.code = code

    @property
    def not_sent(self) -> bool:
        """Known not to have taken effect (:data:`NOT_SENT_CODES`): safe to send again."""
        return self.code in NOT_SENT_CODES

    @property
    def outcome_unknown(self) -> bool:
        """For a side-effect request: it may have taken effect although it failed (a timeout, a
        reset, a 5xx or a garbled answer after it was sent; vast's create can fail and still
        carry ``new_contract``). Such a request is never re-sent blind (docs/safety.md invariant 10)."""
        return self.kind in ("transient", "semantic") and not self.not_sent


#: error codes of requests the provider refused before acting (HTTP 429, a refused connection, a
#: process that could not be spawned): the only side-effect failures that are retried
NOT_SENT_CODES = {"http_429", "connection_refused", "spawn"}


@dataclass
class ProviderInstance:
    """One instance as the provider reports it (vast ``actual_status`` vocabulary for ``status``)."""

    external_id: str
    status: str
    intended_status: str = "running"
    status_msg: str = ""
    gpu_name: str = ""
    dph: float = 0.0
    #: $/hr the disk costs alone (what a stopped instance still pays; vast: disk GB × storage price)
    storage_dph: float = 0.0
    label: str = ""
    ssh_host: str = ""
    ssh_port: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    log_path: str = ""
    worker_name: str = ""
    started_at: datetime | None = None
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["started_at"] = self.started_at.isoformat() if self.started_at else None
        return d


class Provider:
    """Base class. Subclasses set ``name`` and implement the calls they support.

    Every method raises :class:`ProviderError` on failure. ``launch`` returns the new instance and
    tags it with ``label`` (Warden derives it from the call's idempotency key);
    ``stop``/``destroy``/``resume``/``reboot`` take the provider's ``external_id``.
    """

    name = "base"

    def list_instances(self) -> list[ProviderInstance]:
        raise NotImplementedError

    def find_by_label(self, label: str) -> list[ProviderInstance]:
        """The instances carrying ``label`` (how a launch whose answer was lost is found again).

        Default: a full list filtered here; a provider with a server-side filter (vast v1
        ``select_filters={"label": {"eq": label}}``) overrides it. Raises :class:`ProviderError`.
        """
        return [pi for pi in self.list_instances() if label and pi.label == label]

    def launch(self, *, gpu_name: str = "", offer_id: str = "", label: str = "") -> ProviderInstance:
        raise ProviderError(f"{self.name}: launch is not supported", kind="permanent", code="unsupported")

    def stop(self, external_id: str) -> None:
        raise ProviderError(f"{self.name}: stop is not supported", kind="permanent", code="unsupported")

    def resume(self, external_id: str) -> None:
        raise ProviderError(f"{self.name}: resume is not supported", kind="permanent", code="unsupported")

    def reboot(self, external_id: str) -> None:
        raise ProviderError(f"{self.name}: reboot is not supported", kind="permanent", code="unsupported")

    def destroy(self, external_id: str) -> None:
        raise ProviderError(f"{self.name}: destroy is not supported", kind="permanent", code="unsupported")

    def set_cordon(self, external_id: str, on: bool) -> None:
        """Tell the provider the instance's worker is cordoned, where it can start it so (the local
        provider passes ``--cordoned``). Default: nothing; Warden re-applies the cordon after each
        reboot, resume and registration itself (``fleet.cordon``)."""

    def search_offers(self, *, gpu_name: str = "", max_dph: float | None = None, limit: int = 10) -> list[dict]:
        raise ProviderError(f"{self.name}: search_offers is not supported", kind="permanent", code="unsupported")

    def command_runner(self, instance):
        """A runner for diagnostics on ``instance`` (``fleet.diagnostics``), or ``None``.

        Default: SSH to ``instance.ssh_host:ssh_port`` as WARDEN_SSH_USER with the key file named
        by WARDEN_SSH_KEY_FILE (a reference, read at use), when the instance has an SSH host; the
        host key is kept on the instance on first contact and a changed one refused
        (``fleet.ssh.InstanceHostKeys``).
        """
        if not instance.ssh_host:
            return None

        return SSHRunner(
            instance.ssh_host,
            instance.ssh_port or 22,
            user=settings.WARDEN["SSH_USER"],
            key_filename=settings.WARDEN.get("SSH_KEY_FILE") or None,
            host_keys=InstanceHostKeys(instance) if instance.pk else None,  # trust on first use
        )
