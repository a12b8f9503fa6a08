"""Worker counting, the one rule every demand source uses (``fleet.demand.base.count_workers``):
expected, live, cordoned, dead and starting, with the startup grace. The ``http`` and ``scenario``
sources are read here through their real ``read``; the ``curio`` source's own cases are
tests/test_demand_reader.py."""

from datetime import timedelta
from types import SimpleNamespace

import pytest

from fleet.clock import clock
from fleet.demand.base import WorkerView, count_workers
from fleet.demand.scenario import ScenarioDemandSource


def inst(name, *, status="running", started_s_ago=600, killed=False):
    """An instance as the sources see it (the fields ``count_workers`` reads)."""
    now = clock.now()
    return SimpleNamespace(external_id=name, worker_name="", status=status, killed_at=now if killed else None,
                           started_at=now - timedelta(seconds=started_s_ago), status_since=now)


def test_each_count_has_its_meaning(settings):
    settings.WARDEN = {**settings.WARDEN, "STARTUP_GRACE_S": 60}
    views = {"a": WorkerView("a", live=True), "b": WorkerView("b", live=True, unschedulable=True),
             "c": WorkerView("c", live=False), "young-live": WorkerView("young-live", live=True)}
    fleet = [inst("a"), inst("b"), inst("c"), inst("norow"), inst("young", started_s_ago=10),
             inst("young-live", started_s_ago=10), inst("off", status="stopped"), inst("gone", killed=True)]

    c = count_workers(fleet, views)

    # young-live heartbeats inside its grace: live whatever the grace; young is only starting
    assert (c.expected, c.live, c.cordoned, c.dead, c.starting) == (5, 2, 1, 2, 1)
    assert c.rowless == ["norow"] and views["norow"].live is False  # a row-less worker is shown dead


def test_the_grace_is_the_setting(settings):
    settings.WARDEN = {**settings.WARDEN, "STARTUP_GRACE_S": 0}
    c = count_workers([inst("young", started_s_ago=10)], {})
    assert (c.expected, c.dead, c.starting) == (1, 1, 0)


@pytest.mark.django_db
def test_the_scenario_source_counts_its_fleet_with_the_grace(settings):
    """A scenario that states no counts is counted by the real rule, the grace included."""
    settings.WARDEN = {**settings.WARDEN, "STARTUP_GRACE_S": 60}
    fleet = [{"id": "a", "worker": {"live": True}}, {"id": "b", "worker": {"live": False}}, {"id": "new"}]
    r = ScenarioDemandSource({"state": "ok", "queued": 0}, fleet).read(
        [inst("a"), inst("b"), inst("new", started_s_ago=5)])
    assert (r.workers_expected, r.workers_live, r.workers_dead, r.workers_starting) == (2, 1, 1, 1)

    stated = ScenarioDemandSource({"state": "ok", "queued": 0, "workers_expected": 3, "workers_live": 1}, fleet).read(
        [inst("a"), inst("b")])
    assert (stated.workers_expected, stated.workers_live, stated.workers_dead) == (3, 1, 2)  # as the file states
