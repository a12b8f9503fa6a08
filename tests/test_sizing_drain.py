"""The need weighs how long the waiting work takes to drain against the loading time: no machine is
asked for that would come up after the queue it was rented for is empty (docs/money.md "The need")."""

import pytest

from agent.policy.capacity import need_for
from agent.policy.table import effective_limits, effective_policy
from agent.rehearse.sim import run_day
from agent.runtime.observe import observe
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

TARGET = {"target_proofs_hr": 540, "max_instances": 6}


def _need(fleet, **demand):
    base = {"state": "ok", "running": 0, "workers_expected": len(fleet), "idle_min": None, "proof_s": 20.0}
    live = sum(1 for e in fleet if e["worker"]["live"])
    with scenario_world(fleet, {**base, "workers_live": live, **demand}, objectives=TARGET):
        return need_for(observe(effective_limits(), effective_policy()))


def test_five_tasks_that_one_worker_drains_before_a_launch_loads_ask_for_one_worker():
    need = _need([], queued=5, loading_s=300)
    assert need.desired == 1  # 5 × 20 s = 100 s of work, less than one 300 s loading period


def test_the_target_still_binds_a_queue_that_takes_longer_than_a_loading_time():
    need = _need([], queued=200, loading_s=300)
    assert need.desired == 3  # 540/hr at 20 s; draining 200 × 20 s within 300 s would take 14


def test_a_middle_queue_asks_for_the_workers_that_drain_it_within_the_loading_time():
    need = _need([entry("v-1")], queued=20, loading_s=300)
    assert need.desired == 2 and need.workers == 1  # 20 × 20 s = 400 s: two workers beat one loading


def test_without_a_loading_time_the_target_sizes_alone():
    need = _need([], queued=5)
    assert need.desired == 3


def test_rehearsed_five_tasks_rent_one_machine_and_none_comes_up_idle():
    day = {"name": "five tasks", "seed": 1, "horizon_h": 0.25,
           "market": {"offers": [{"gpu_name": "RTX 4090", "dph": 0.45}], "loading": {"median_s": 300, "p95_s": 300}},
           "work": {"queued_at_start": 5, "proof_s": {"RTX 4090": {"median_s": 20}}},
           "objectives": {"target_proofs_hr": 540, "max_instances": 5}}
    res = run_day(day)
    s = res["summary"]
    assert res["unsafe"] == []
    assert s["launches"] == 1 and s["late_launches"] == 0 and s["proofs_delivered"] == 5
