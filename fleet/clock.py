"""The one clock every guard, freshness check, expiry, wall-clock budget and backoff reads.

docs/safety.md invariant 8: replay swaps in a :class:`VirtualClock` so a scenario runs on virtual
time (sleeps advance it without waiting). Code reads ``clock.now()`` / ``clock.sleep(s)`` /
``clock.monotonic()`` — never ``timezone.now()`` or ``time.sleep`` directly.
"""

import contextlib
import threading
import time
from datetime import datetime, timedelta

from django.utils import timezone


class RealClock:
    """Wall time (aware UTC datetimes); ``sleep`` really sleeps."""

    virtual = False

    def now(self) -> datetime:
        return timezone.now()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """Virtual time starting at ``start`` (aware datetime); ``sleep`` advances it instantly."""

    virtual = True

    def __init__(self, start: datetime):
        self._now = start
        self._mono = 0.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=max(0.0, seconds))
            self._mono += max(0.0, seconds)


_current = RealClock()


class _ClockProxy:
    """Module-level handle: ``from fleet.clock import clock``; delegates to the active clock."""

    def now(self) -> datetime:
        return _current.now()

    def monotonic(self) -> float:
        return _current.monotonic()

    def sleep(self, seconds: float) -> None:
        _current.sleep(seconds)

    @property
    def virtual(self) -> bool:
        return _current.virtual

    @property
    def active(self):
        return _current


clock = _ClockProxy()


@contextlib.contextmanager
def use_clock(new):
    """Make ``new`` the clock for the duration of the ``with`` block (replay, tests)."""
    global _current
    old, _current = _current, new
    try:
        yield new
    finally:
        _current = old
