"""The oracle a rehearsal's $ is scored against: the delivered-work lower bound
(``agent.rehearse.metrics.work_lower_bound``), computed by hand for two tiny days; the ratio it gives
on the shipped days is checked in ``tests/test_rehearse_days.py``.

Real parts: the day file's own schema, and for the played day the product's cycle on PostgreSQL.
"""

import pytest

from agent.rehearse.day import parse_day
from agent.rehearse.metrics import ORACLE, work_lower_bound
from agent.rehearse.sim import run_day
from agent.rehearse.world import Task


def _day(**market):
    return parse_day({
        "name": "tiny", "market": {"offers": [{"gpu_name": "RTX 4090", "dph": 0.36, "count": 1}], **market},
        "work": {"proof_s": {"RTX 4090": {"median_s": 60}, "RTX 3090": {"median_s": 120}}},
    })


def test_proofs_at_the_cheapest_per_proof_price_and_loading_for_machines_beyond_the_start():
    """Offers: RTX 4090 at $0.36/hr (60 s a proof), cut to $0.30 at 02:00; RTX 3090 at $0.24/hr
    (120 s a proof). $ × s per proof: 4090 0.30 × 60 = 18, 3090 0.24 × 120 = 28.8, so ``rate`` = 18.

    Tasks: 90 proofs on a 4090 of 60 s each, all proved in hour 0 (busy 5,400 s: 2 machines); one on
    a 3090 of 120 s done at 4,000 s; one not done and one done past the 7,200 s horizon (neither
    counts). Proofs: (90 × 60 × 18 / 60 + 120 × 18 / 120) / 3600 = 91 × 18 / 3600 = $0.455.

    Loading: 2 machines needed, 1 running at the start, so 1 loading; the day's launches loaded in
    900 s and 300 s, shorter than the 600 s median once: 300 s at the lowest $/hr of any machine,
    $0.24: 0.24 × 300 / 3600 = $0.02. Oracle: $0.475.
    """
    day = _day(offers=[{"gpu_name": "RTX 4090", "dph": 0.36}, {"gpu_name": "RTX 3090", "dph": 0.24}],
               price_changes=[{"at_h": 2, "gpu_name": "RTX 4090", "dph": 0.30}], loading={"median_s": 600, "p95_s": 600})
    tasks = [Task(id=k, type="PoRep", arrived=0, done=100 + 35 * k, took=60, gpu="RTX 4090") for k in range(90)]
    tasks += [Task(id=90, type="PoRep", arrived=3000, done=4000, took=120, gpu="RTX 3090"),
              Task(id=91, type="PoRep", arrived=3000),
              Task(id=92, type="PoRep", arrived=3000, done=7300, took=60, gpu="RTX 4090")]
    bound = work_lower_bound(day, tasks, horizon=7200, running_at_start=1, loading_periods=[900, 300])
    assert bound["proof_usd"] == pytest.approx(0.455)
    assert (bound["machines_needed"], bound["loadings"]) == (2, 1)
    assert bound["loading_usd"] == pytest.approx(0.02)
    assert bound["usd"] == pytest.approx(0.475)

    # a median shorter than every loading prices the median; a resume counts as one of them
    day.market.loading.median_s = 200
    assert work_lower_bound(day, tasks, horizon=7200, running_at_start=1, loading_periods=[900, 300])["loading_usd"] \
        == pytest.approx(0.24 * 200 / 3600)
    assert work_lower_bound(day, tasks, horizon=7200, running_at_start=1, resumes=1)["loading_usd"] \
        == pytest.approx(0.24 * min(200, day.market.resume_s) / 3600)
    # enough machines running at the start: no loading at all
    assert work_lower_bound(day, tasks, horizon=7200, running_at_start=2, loading_periods=[300])["loading_usd"] == 0


def test_undelivered_work_is_not_priced():
    """Everything arrived, nothing delivered: the bound is $0 (and the ratio not measured), where
    pricing arrivals gave a bound above what a short horizon spent."""
    day = _day()
    assert work_lower_bound(day, [Task(id=0, type="PoRep", arrived=0)], horizon=3600)["usd"] == 0


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_played_tiny_day_costs_its_hand_computed_oracle_or_more():
    """One RTX 4090 running at the start at $0.36/hr, the market's only machine (no launch can be
    made), ten tasks queued at the start at exactly 60 s a proof, half an hour.

    The worker proves the ten one after another in the first 600 s. Proofs: 10 × 60 s at $0.36/hr =
    $0.06. The busiest hour kept 600 s busy: 1 machine, running at the start: no loading. Oracle
    $0.06; the machine was rented at least the 600 s it proved, so the ratio is at least 1.
    """
    res = run_day({"name": "tiny", "horizon_h": 0.5, "seed": 1,
                   "market": {"offers": [{"gpu_name": "RTX 4090", "dph": 0.36, "count": 1}],
                              "fleet": [{"gpu_name": "RTX 4090", "count": 1}]},
                   "work": {"queued_at_start": 10, "proof_s": {"RTX 4090": {"median_s": 60}}},
                   "objectives": {"target_proofs_hr": 60, "max_instances": 1, "max_dph": 1.0}})
    s = res["summary"]
    assert s["proofs_delivered"] == 10 and s["launches"] == 0
    assert s["oracle"] == ORACLE == "delivered-work lower bound"
    assert s["oracle_usd"] == pytest.approx(0.06)
    assert s["usd_gpu"] >= 0.06 and s["oracle_ratio"] >= 1
