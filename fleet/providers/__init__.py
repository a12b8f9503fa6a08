"""Provider registry: ``get_provider()`` returns the configured provider (WARDEN_PROVIDER), with
the owned SSH hosts of WARDEN_SSH_HOSTS_FILE alongside it when that is set (``fleet.providers.ssh``)."""

from django.conf import settings

from fleet.providers import ssh
from fleet.providers.base import Provider, ProviderError, ProviderInstance  # noqa: F401
from fleet.providers.local import LocalProvider
from fleet.providers.vastai import VastProvider

_override: Provider | None = None


def get_provider(name: str | None = None) -> Provider:
    """The provider named ``name`` (default: settings WARDEN["PROVIDER"], or the replay override).

    Without ``name``, and with owned hosts configured (WARDEN_SSH_HOSTS_FILE), the fleet is the
    configured provider and the owned hosts together (``fleet.providers.ssh.WithOwnedHosts``).
    Raises ``ProviderError`` (permanent) for an unknown name.
    """
    if _override is not None:  # replay and tests: one stand-in answers for every provider name
        return _override

    if name is None and ssh.hosts_file() and settings.WARDEN["PROVIDER"] != "ssh":
        return ssh.WithOwnedHosts(get_provider(settings.WARDEN["PROVIDER"]), ssh.SSHProvider())
    name = name or settings.WARDEN["PROVIDER"]
    if name == "ssh":
        return ssh.SSHProvider()
    if name == "local":
        return LocalProvider()
    if name == "vastai":
        return VastProvider()
    raise ProviderError(f"unknown provider {name!r}; set WARDEN_PROVIDER to local, vastai or ssh", kind="permanent", code="config")


def set_override(provider: Provider | None) -> None:
    """Route every ``get_provider()`` to ``provider`` (scenario replay); ``None`` restores."""
    global _override
    _override = provider
