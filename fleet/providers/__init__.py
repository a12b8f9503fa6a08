"""Provider registry: ``get_provider()`` returns the configured provider (WARDEN_PROVIDER)."""

from django.conf import settings

from fleet.providers.base import Provider, ProviderError, ProviderInstance  # noqa: F401

_override: Provider | None = None


def get_provider(name: str | None = None) -> Provider:
    """The provider named ``name`` (default: settings WARDEN["PROVIDER"], or the replay override).

    Raises ``ProviderError`` (permanent) for an unknown name.
    """
    if _override is not None:  # replay and tests: one stand-in answers for every provider name
        return _override
    name = name or settings.WARDEN["PROVIDER"]
    if name == "local":
        from fleet.providers.local import LocalProvider

        return LocalProvider()
    if name == "vastai":
        from fleet.providers.vastai import VastProvider

        return VastProvider()
    raise ProviderError(f"unknown provider {name!r}; set WARDEN_PROVIDER=local", kind="permanent", code="config")


def set_override(provider: Provider | None) -> None:
    """Route every ``get_provider()`` to ``provider`` (scenario replay); ``None`` restores."""
    global _override
    _override = provider
