"""Demand sources: ``read_demand(instances)`` reads the configured one (WARDEN_DEMAND_SOURCE)."""

from django.conf import settings

from fleet.clock import clock
from fleet.demand.base import DemandError, DemandReading, WorkerView  # noqa: F401
from fleet.demand.curio import HarmonyDemandSource
from fleet.demand.http import HTTPDemandSource

_override = None


def get_source(name: str | None = None):
    """The demand source object (has ``read(instances) -> DemandReading``)."""
    if _override is not None and name is None:
        return _override
    name = name or settings.WARDEN["DEMAND_SOURCE"]
    if name in ("local", "curio"):
        return HarmonyDemandSource(kind=name)
    if name == "http":
        return HTTPDemandSource()
    raise DemandError(f"unknown demand source {name!r}; set WARDEN_DEMAND_SOURCE to local, curio or http")


def set_override(source) -> None:
    """Route ``get_source()`` to ``source`` (scenario replay); ``None`` restores."""
    global _override
    _override = source


def read_demand(instances) -> DemandReading:
    """Read demand for our non-killed ``instances``; any failure is ``state="unknown"``. The
    reading's ``source`` names the source that was read."""
    source = settings.WARDEN["DEMAND_SOURCE"] if _override is None else getattr(_override, "kind", "scenario")
    try:
        reading = get_source().read(instances)
    except DemandError as exc:  # our own one-line message says what is wrong
        reading = DemandReading.unknown(str(exc), taken_at=clock.now())
    except Exception as exc:  # noqa: BLE001 — an unreadable source is 'unknown', never zero
        reading = DemandReading.unknown(f"{type(exc).__name__}: {exc}", taken_at=clock.now())
    reading.source = reading.source or source
    if reading.taken_at is None:
        reading.taken_at = clock.now()
    return reading
