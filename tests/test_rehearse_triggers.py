"""Trigger events during a rehearsal: ``agent.runtime.triggers`` with the virtual store keeps the
production debounce (lead at once, one follow-up at the window's end, the rest coalesced) on the
virtual clock, and nothing reaches Redis."""

from datetime import UTC, datetime

import pytest

from agent.rehearse.events import VirtualTriggers
from agent.runtime import triggers
from fleet.clock import VirtualClock, use_clock


@pytest.fixture
def store():
    s = VirtualTriggers()
    triggers.set_store(s)
    try:
        with use_clock(VirtualClock(datetime(2026, 6, 9, tzinfo=UTC))) as clock:
            s.clock = clock
            yield s
    finally:
        triggers.set_store(None)


def test_a_burst_gives_a_lead_run_and_one_follow_up_at_the_window_end(store, settings):
    window = triggers.window_s("P1")
    edges = [triggers.fire("instance_state", f"i-{n}")["edge"] for n in range(4)]
    assert edges == ["lead", "follow", "coalesced", "coalesced"]
    assert store.next_due() == 0.0 and store.pending() == 4
    store.pop_due()
    assert store.next_due() == pytest.approx(window)
    assert [e["detail"] for e in triggers.drain()] == ["i-0", "i-1", "i-2", "i-3"]
    assert triggers.pending() == 0
    store.clock.advance(window)  # past the window: the next event leads again
    assert triggers.fire("instance_state", "i-4")["edge"] == "lead"


def test_priorities_have_their_own_windows(store):
    assert triggers.fire("instance_state", "a")["edge"] == "lead"
    assert triggers.fire("worker_died", "b")["edge"] == "lead"
    assert triggers.fire("worker_died", "c")["edge"] == "follow"


def test_demand_edges_are_noted_in_the_store_and_fire_once(store):
    from fleet.demand.base import DemandReading

    def reading(queued, live):
        return DemandReading(state="ok", queued=queued, workers_expected=2, workers_live=live, workers_dead=2 - live)

    assert triggers.note_demand(reading(0, 2)) == []
    assert triggers.note_demand(reading(5, 2)) == ["queue_nonempty"]
    assert triggers.note_demand(reading(5, 0)) == ["worker_died", "workers_all_dead"]
    assert triggers.note_demand(reading(5, 0)) == []
    assert store.fired == 3
