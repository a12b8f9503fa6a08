"""Event triggers (docs/agent.md, Triggers): events start runs on the leading edge, bursts coalesce
into one follow-up per priority, one run at a time (the run lock, and the one-running-run
constraint as its second net), every event accounted for by exactly one run, and the run page
names the trigger and the events coalesced into it. With real Celery workers and Redis."""

import threading
from collections import Counter

import pytest

from agent.models import Run
from agent.runtime import triggers
from agent.runtime.loop import run_cycle
from agent.runtime.runs import RunBusy, claim_run
from fleet.clock import clock
from tests import fleet_support
from tests.console_support import broker_idle, tasks_done
from tests.fleet_support import FLEET_DB, wait_for
from tests.test_approval_restart import Worker, worker_env  # noqa: F401

pytestmark = FLEET_DB
local_fleet = fleet_support.local_fleet
BURST_KINDS = ["worker_died", "instance_state", "queue_nonempty", "alert", "target"]


@pytest.fixture
def short_windows(settings):
    """Triggers on, with windows short enough for a test (P0 0.5 s, P1 1 s); Redis state cleared."""
    settings.WARDEN = {**settings.WARDEN, "EVENT_TRIGGERS": True, "TRIGGER_WINDOWS_S": {"P0": 0.5, "P1": 1.0}}
    triggers.reset()
    yield
    triggers.reset()


def _event_ids(runs) -> list[str]:
    return [e["id"] for r in runs for e in r.trigger_events]


@pytest.mark.slow
def test_fifty_concurrent_triggers_run_one_at_a_time_and_each_is_accounted_for(
        worker_env, tmp_path, short_windows, settings, client, alice):  # noqa: F811
    env = {**worker_env, "WARDEN_RUN_LOCK_TTL_S": "600"}
    # The burst is fired before the workers start and inside windows longer than it lasts, so no
    # run drains the events mid-burst and no window ends mid-burst (on a loaded machine 50 threads
    # can take longer than the 0.5 s P0 window): exactly one lead and at most one follow-up per
    # priority is then the rule, not a race.
    settings.WARDEN = {**settings.WARDEN, "TRIGGER_WINDOWS_S": {"P0": 5.0, "P1": 5.0}}
    workers = []
    try:
        barrier = threading.Barrier(50)
        fired: list[dict] = []

        def one(i: int) -> None:
            barrier.wait()
            fired.append(triggers.fire(BURST_KINDS[i % len(BURST_KINDS)], f"burst event {i}"))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(fired) == 50 and None not in fired
        ids = {e["id"] for e in fired}
        edges = Counter((e["priority"], e["edge"]) for e in fired)
        assert edges[("P0", "lead")] == 1 and edges[("P1", "lead")] == 1  # the leading edge, once per priority
        assert edges[("P0", "follow")] <= 1 and edges[("P1", "follow")] <= 1  # one follow-up each, at most
        workers = [Worker(env, tmp_path / f"celery-{i}.log", f"trigger{i}").start() for i in range(2)]

        def settled() -> bool:
            return set(_event_ids(Run.objects.all())) == ids and not Run.objects.filter(status="running").exists()

        log = "\n".join(w.text() for w in workers)
        wait_for(settled, timeout=90, what=f"every event to be taken by a finished run; worker logs:\n{log}")
        # every cycle the burst scheduled (a lead and at most one follow-up per priority) has run to
        # its end: a follow-up that finds nothing must have started no run, which is checked below
        scheduled = sum(n for (_, edge), n in edges.items() if edge in ("lead", "follow"))
        wait_for(lambda: broker_idle() and sum(len(tasks_done(w.text(), "agent.tasks.triggered_cycle"))
                                               for w in workers) >= scheduled,
                 timeout=60, what=f"the {scheduled} scheduled triggered cycles to finish")
    finally:
        for w in workers:
            w.kill()
    runs = list(Run.objects.order_by("started_at"))
    got = _event_ids(runs)
    assert len(got) == 50 and set(got) == ids  # every trigger accounted for, none twice
    assert triggers.pending() == 0
    assert 1 <= len(runs) <= 4, [(r.number, r.trigger, len(r.trigger_events)) for r in runs]  # ≤ 2 per priority
    assert all(r.status == "done" for r in runs), [(r.number, r.status, r.halt_detail) for r in runs]
    for before, after in zip(runs, runs[1:], strict=False):
        assert before.ended_at <= after.started_at, f"runs {before.number} and {after.number} overlap"
    first = runs[0]
    assert first.trigger == first.trigger_events[0]["kind"]  # named after the event that started it

    client.force_login(alice)
    html = client.get(f"/runs/{first.number}/").content.decode()
    assert 'id="trigger-events"' in html and f"<code>{first.trigger}</code>" in html
    assert all(e["detail"] in html for e in first.trigger_events)


def test_a_run_takes_the_waiting_events_and_the_page_names_them(short_windows, broker_queue, client, alice):
    a = triggers.fire("worker_died", "i-1 running → exited")
    b = triggers.fire("alert", "P1 instance_exited: i-1")
    assert a["edge"] == "lead" and b["edge"] == "lead"  # different priorities: each its own window
    c = triggers.fire("target", "target 100 → 200 proofs/hr by user:alice")
    assert c["edge"] == "follow" and 0 < c["delay_s"] <= 1.0
    assert triggers.fire("instance_state", "i-2 loading → running")["edge"] == "coalesced"
    run = run_cycle("event", events="take")
    assert run.trigger == "worker_died"
    assert [e["kind"] for e in run.trigger_events] == ["worker_died", "alert", "target", "instance_state"]
    assert triggers.pending() == 0
    assert run_cycle("event", events="need") is None  # the follow-up finds its events taken: no run
    assert Run.objects.count() == 1

    client.force_login(alice)
    html = client.get(f"/runs/{run.number}/").content.decode()
    assert "3 more events coalesced into this run" in html
    for detail in ("i-1 running → exited", "target 100 → 200 proofs/hr by user:alice", "i-2 loading → running"):
        assert detail in html


def test_a_second_running_run_is_refused_by_the_database_and_a_stuck_one_does_not_hold_the_events(short_windows, broker_queue):
    stuck = Run.objects.create(number=90, trigger="heartbeat", planner="rules", status="running", started_at=clock.now())
    with pytest.raises(RunBusy):  # the constraint is the lock's second net
        claim_run("event", None, [])
    triggers.fire("worker_died", "i-7 running → exited")
    # the lock was free, so no live process owns run 90: the next cycle fails it and takes the events
    run = run_cycle("event", events="need")
    stuck.refresh_from_db()
    assert stuck.status == "failed" and "let go of the run lock" in stuck.halt_detail
    assert run is not None and run.trigger == "worker_died" and triggers.pending() == 0


def test_events_a_run_raises_itself_are_not_triggers(short_windows, broker_queue):
    from agent.runtime.runs import acquire_lock, release_lock

    token = acquire_lock()
    try:
        assert triggers.fire("alert", "raised by the run's own breaker") is None
    finally:
        release_lock(token)
    assert triggers.pending() == 0
    assert triggers.fire("alert", "raised outside a run")["edge"] == "lead"


@pytest.mark.slow
def test_killing_a_demo_worker_starts_a_run_without_a_heartbeat(local_fleet, worker_env, tmp_path,  # noqa: F811
                                                                 short_windows):
    from fleet.demo import kill_one_worker
    from fleet.sync import sync_instances

    local = local_fleet
    launched = local.launch(label="victim")
    wait_for(lambda: any(i.external_id == launched.external_id and i.status == "running"
                         for i in sync_instances(local)), timeout=30, what="the demo worker running")
    worker = Worker({**worker_env, "WARDEN_RUN_LOCK_TTL_S": "600"}, tmp_path / "celery.log", "trigger").start()
    try:
        triggers.reset()
        Run.objects.all().delete()
        killed = kill_one_worker()
        assert killed is not None and killed.external_id == launched.external_id
        run = wait_for(lambda: Run.objects.filter(trigger="worker_died").first(), timeout=30,
                       what=f"a run started by the worker's death; worker log:\n{worker.text()}")
        assert any(launched.external_id in e["detail"] for e in run.trigger_events)
        wait_for(lambda: Run.objects.get(pk=run.pk).status != "running", timeout=30, what="the run to end")
    finally:
        worker.kill()


def test_demand_edges_fire_once_each(short_windows, broker_queue):
    from fleet.demand.base import DemandReading

    def reading(queued, live, dead, expected=2):
        return DemandReading(state="ok", queued=queued, workers_live=live, workers_dead=dead, workers_expected=expected)

    assert triggers.note_demand(reading(0, 2, 0)) == []  # the first reading only sets the baseline
    assert triggers.note_demand(reading(4, 2, 0)) == ["queue_nonempty"]
    assert triggers.note_demand(reading(6, 2, 0)) == []  # still non-empty: no new edge
    assert triggers.note_demand(DemandReading.unknown("harmony unreachable")) == []  # unknown is no edge
    assert triggers.note_demand(reading(6, 0, 2)) == ["worker_died", "workers_all_dead"]
    assert triggers.note_demand(reading(6, 0, 2)) == []
    assert triggers.note_demand(reading(0, 2, 0), fire_events=False) == []  # a planner run saw it itself
    assert triggers.note_demand(reading(3, 2, 0)) == ["queue_nonempty"]
    assert [e["kind"] for e in triggers.drain()] == ["queue_nonempty", "worker_died", "workers_all_dead",
                                                     "queue_nonempty"]
