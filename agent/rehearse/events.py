"""Trigger events on the virtual clock: the store ``agent.runtime.triggers`` uses during a rehearsal.

Production keeps trigger state in Redis (a Lua script per event) and starts runs with Celery;
a rehearsal runs in one process on virtual time, so :class:`VirtualTriggers` keeps the same
state in memory and, instead of queueing a Celery task, records when a run is due. The answers
are the Lua script's: the first event of a priority opens its window and starts a run at once
(-1); a later one in the window schedules one follow-up at the window's end (its delay in ms);
more coalesce into that follow-up (-2). ``drain`` takes every waiting event and clears the
follow-up flags, as the script does (the windows stay).
"""

from __future__ import annotations

import heapq

from fleet.clock import clock


class VirtualTriggers:
    """Trigger state for ``agent.runtime.triggers.set_store``; ``due`` holds the times runs are due."""

    def __init__(self):
        self.events: list[dict] = []
        self.window_until: dict[str, float] = {}
        self.follow_until: dict[str, float] = {}
        self.last: dict[str, bytes] = {}
        self.due: list[float] = []
        self.fired = 0

    def _now(self) -> float:
        return clock.monotonic()

    def fire(self, event: dict, window_ms: int) -> int:
        self.fired += 1
        now = self._now()
        p = event["priority"]
        self.events.append(event)
        if self.window_until.get(p, -1.0) <= now:
            self.window_until[p] = now + window_ms / 1000
            heapq.heappush(self.due, now)
            return -1
        ttl = max(0.0, self.window_until[p] - now)
        if self.follow_until.get(p, -1.0) <= now:
            self.follow_until[p] = now + ttl + 60
            heapq.heappush(self.due, now + ttl)
            return int(ttl * 1000)
        return -2

    def note(self, key: str, value: str) -> bytes | None:
        """Remember ``value`` under ``key``; the previous one as Redis answers it (bytes, or None)."""
        prev = self.last.get(key)
        self.last[key] = value.encode()
        return prev

    def drain(self) -> list[dict]:
        taken, self.events = self.events, []
        self.follow_until.clear()
        return taken

    def put_back(self, events: list[dict]) -> None:
        self.events = list(events) + self.events

    def pending(self) -> int:
        return len(self.events)

    def reset(self) -> None:
        self.__init__()

    def next_due(self) -> float | None:
        """The monotonic time of the next run an event asked for (None: none)."""
        return self.due[0] if self.due else None

    def pop_due(self) -> float:
        return heapq.heappop(self.due)
