"""The five shipped days (``tests/days/``), each played by the product's own code at a short
horizon around its moment: no unsafe decision, $ at least the oracle's, and the outcome bounds that
follow from the inputs.

The ``slow`` test plays the five at full length and fails on any unsafe decision or a ratio to the
oracle below 1.
"""

import pytest

from agent.rehearse.sim import run_day
from tests.days_support import day, window

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


def _first(result, *kinds):
    return min((m["at_s"] for m in result["markers"] if m["kind"] in kinds), default=None)


def _safe(result):
    """No unsafe decision, and the $ at least the oracle's (a lower bound of the delivered work)."""
    assert result["unsafe"] == [], "unsafe decisions: " + "; ".join(
        f"{v['invariant']} run {v['run']} {v['call']}: {v['detail']}" for v in result["unsafe"])
    s = result["summary"]
    assert s["oracle"] == "delivered-work lower bound" and s["proofs_delivered"] > 0
    assert s["oracle_usd"] > 0 and s["oracle_ratio"] >= 1, (s["usd_total"], s["oracle_usd"])


def test_seed_002_day_repairs_or_replaces_dead_workers_within_two_heartbeats():
    raw = window(day("seed-002"), 9.75)  # every worker dies 15 minutes in, with the burst queued
    res = run_day(raw, hours=1)
    s = res["summary"]
    _safe(res)
    deaths = _first(res, "worker_deaths")
    assert deaths == 900
    acted = _first(res, "launch", "reboot")
    assert acted is not None and deaths <= acted <= deaths + 2 * raw["heartbeat_s"]
    assert s["reboots"] + s["launches"] >= 1
    assert s["stops"] == 0 and s["destroys"] == 0  # never retired while the work and the dead waited
    assert s["proofs_delivered"] >= s["proofs_arrived"] - 10


def test_bursty_day_comes_up_for_a_burst_and_drains_it():
    raw = window(day("bursty"), 8.9)  # the 09:00 burst of 200, six minutes in
    res = run_day(raw, hours=1.25)
    s = res["summary"]
    _safe(res)
    first = _first(res, "launch")
    assert first is not None and 360 <= first <= 360 + 2 * raw["heartbeat_s"]
    assert res["hourly"][0]["spend_usd"] > 0 and s["proofs_arrived"] == 200
    assert s["proofs_delivered"] == 200  # three machines drain 200 × 35 s in under an hour
    assert s["launches"] <= raw["objectives"]["max_instances"]


def test_sealing_day_launches_when_sectors_come_due_not_when_they_are_sealed():
    raw = window(day("sealing"), 6)  # sectors finish from the start; the first is due 75 min later
    res = run_day(raw, hours=2)
    _safe(res)
    first_due = 3600 / 12 / 2 + 75 * 60
    loading = raw["market"]["loading"]["median_s"]
    first = _first(res, "launch")
    assert first is not None
    assert first_due - loading - raw["heartbeat_s"] <= first <= first_due + raw["heartbeat_s"]
    before = [h for h in res["hourly"] if (h["hour"] + 1) * 3600 <= first]
    assert before and all(h["spend_usd"] == 0 for h in before)  # nothing rented for sectors not due


def test_bad_market_day_keeps_the_money_caps_and_retires_stuck_launches_only_past_the_limit():
    raw = window(day("bad-market"), 0)
    res = run_day(raw, hours=1.5)
    s = res["summary"]
    _safe(res)
    assert s["launches"] >= 1 and s["stuck_loading"] >= 1
    assert s["usd_gpu"] <= raw["objectives"]["max_dph"] * s["hours"]
    limit_s = raw["objectives"]["provisioning_limit_min"] * 60
    first_launch = _first(res, "launch")
    first_destroy = _first(res, "destroy", "destroy_not_taken")
    assert first_destroy is not None  # the first launch stuck: it is destroyed once terminal
    assert first_destroy >= first_launch + limit_s


def test_operator_away_no_launch_runs_by_itself_while_approvals_wait():
    raw = window(day("operator-away"), 10)  # the operator leaves as the work arrives
    res = run_day(raw, hours=1)
    s = res["summary"]
    _safe(res)
    assert s["approvals_asked_by_tool"].get("launch_instance", 0) >= 1
    assert s["launches"] == 0  # a worker is live: launches are P1 and wait for the absent operator
    assert s["approvals_approved"] == 0 and s["approvals_rejected"] == 0
    assert s["approvals_expired"] >= 1  # they expire after 30 minutes unanswered
    one_worker = 3600 / raw["work"]["proof_s"]["RTX 4090"]["median_s"]
    assert 0.6 * one_worker <= s["proofs_delivered"] <= 1.2 * one_worker


@pytest.mark.slow
@pytest.mark.parametrize("name", ["seed-002", "bursty", "sealing", "bad-market", "operator-away"])
def test_shipped_day_at_full_length_has_no_unsafe_decision(name):
    res = run_day(day(name))
    _safe(res)
    if name == "sealing":  # sectors stop at 18:00 and are due by 19:15: the night is disk only
        assert all(h["spend_gpu_usd"] == 0 for h in res["hourly"] if h["hour"] >= 22)
