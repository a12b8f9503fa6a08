"""A stand-in rented cloud (an external service, so a test double is allowed) and its fixtures.

``RentedProvider`` keeps its instances in memory: ``fail`` makes ``list_instances`` raise, ids
in ``sticky`` stay listed after a destroy (an unconfirmed destroy). The ``cloud`` fixture installs
it on a virtual clock starting at :data:`START`.
"""

from datetime import UTC, datetime, timedelta

import pytest

from fleet.clock import VirtualClock, clock, use_clock
from fleet.models import Instance
from fleet.providers import set_override
from fleet.providers.base import Provider, ProviderError, ProviderInstance

START = datetime(2026, 6, 9, 16, 50, tzinfo=UTC)


class RentedProvider(Provider):
    """In-memory cloud; ``calls`` counts list requests, ``destroyed`` the destroy requests."""

    def __init__(self, name: str = "rented"):
        self.name = name
        self.listed: dict[str, ProviderInstance] = {}
        self.destroyed: list[str] = []
        self.sticky: set[str] = set()
        self.fail: ProviderError | None = None
        self.calls = 0

    def list_instances(self) -> list[ProviderInstance]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return list(self.listed.values())

    def destroy(self, external_id: str) -> None:
        if external_id not in self.listed:
            raise ProviderError(f"no_such_instance {external_id}", code="not_found")
        self.destroyed.append(external_id)
        if external_id not in self.sticky:
            del self.listed[external_id]

    def add(self, ext: str, status: str, *, age_min: float, status_age_min: float | None = None,
            listed: bool = True, dph: float = 0.5) -> Instance:
        """An instance we own a row for, created ``age_min`` ago, in ``status`` for ``status_age_min``."""
        now = clock.now()
        if listed:
            self.listed[ext] = ProviderInstance(ext, status, gpu_name="RTX 4090", dph=dph, worker_name=ext,
                                                started_at=now - timedelta(minutes=age_min))
        return Instance.objects.create(
            provider=self.name, external_id=ext, status=status, gpu_name="RTX 4090", dph=dph, worker_name=ext,
            created_at=now - timedelta(minutes=age_min), started_at=now - timedelta(minutes=age_min),
            status_since=now - timedelta(minutes=age_min if status_age_min is None else status_age_min),
        )


@pytest.fixture
def vclock():
    with use_clock(VirtualClock(START)) as vc:
        yield vc


@pytest.fixture
def cloud(vclock, settings):
    settings.WARDEN = {**settings.WARDEN, "PROVIDER": "rented", "DEMAND_SOURCE": "local", "STARTUP_GRACE_S": 60,
                       "HEARTBEAT_S": 5}
    provider = RentedProvider()
    set_override(provider)
    try:
        yield provider
    finally:
        set_override(None)
