"""A stand-in rented cloud (an external service, so a test double is allowed) and its fixtures.

``RentedProvider`` keeps its instances in memory: ``fail`` makes ``list_instances`` raise, ids
in ``sticky`` stay listed after a destroy (an unconfirmed destroy). It launches (``r-1``, ``r-2``…,
carrying the label it was given), reboots, stops and resumes; ``requests`` records every
side-effect request that reached it, and :meth:`RentedProvider.fault` makes the next request to a
call fail — before it takes effect, or after (``after_effect``: the answer is lost, as with a
timeout or a connection reset on a real cloud). The ``cloud`` fixture installs it on a virtual
clock starting at :data:`START`.
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
        self.requests: list[tuple[str, str]] = []  # (call, instance id or label)
        self.faults: dict[str, list[tuple[ProviderError, bool]]] = {}
        self.launched = 0

    CODES = {"timeout": "transient", "connection_reset": "transient", "http_500": "transient", "http_429": "transient",
             "connection_refused": "transient", "html_body": "semantic", "http_410": "permanent"}

    def fault(self, call: str, code: str, *, after_effect: bool = False, times: int = 1) -> None:
        """The next ``times`` requests to ``call`` (launch, reboot, stop, resume, destroy) fail with ``code``."""
        for _ in range(times):
            err = ProviderError(f"rented: {call}: {code}", kind=self.CODES[code], code=code)
            self.faults.setdefault(call, []).append((err, after_effect))

    def _request(self, call: str, what: str):
        self.requests.append((call, what))
        queue = self.faults.get(call) or []
        if queue:
            err, after = queue.pop(0)
            if not after:
                raise err
            return err
        return None

    def sent(self, call: str) -> int:
        """How many ``call`` requests reached the cloud."""
        return [c for c, _ in self.requests].count(call)

    def list_instances(self) -> list[ProviderInstance]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return list(self.listed.values())

    def launch(self, *, gpu_name: str = "", offer_id: str = "", label: str = "") -> ProviderInstance:
        late = self._request("launch", label)
        self.launched += 1
        ext = f"r-{self.launched}"
        self.listed[ext] = ProviderInstance(ext, "loading", gpu_name=gpu_name or "RTX 4090", dph=0.5, label=label,
                                            worker_name=ext, started_at=clock.now())
        if late is not None:
            raise late
        return self.listed[ext]

    def _act(self, call: str, external_id: str, status: str) -> None:
        if external_id not in self.listed:
            raise ProviderError(f"no_such_instance {external_id}", code="not_found")
        late = self._request(call, external_id)
        pi = self.listed[external_id]
        pi.status = status
        pi.intended_status = "stopped" if call == "stop" else "running"
        if call in ("reboot", "resume"):
            pi.started_at = clock.now()
        if late is not None:
            raise late

    def reboot(self, external_id: str) -> None:
        self._act("reboot", external_id, "running")

    def stop(self, external_id: str) -> None:
        self._act("stop", external_id, "stopped")

    def resume(self, external_id: str) -> None:
        self._act("resume", external_id, "running")

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
