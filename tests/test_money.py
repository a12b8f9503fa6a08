"""Money moves only on facts (docs/money.md): the runtime derives a launch's priority, counts every
launch and resume against one need, an operator's approval means what it says, and scale-down has
a budget. The inputs and their twins are replay files (``tests/scenarios/money-*.json``, run by
``test_replay_cases``); here the report's fields, the console, the chat path, the settings, and a
property over random fleets, demand, batches and later cycles (bulk approvals included), all
through the real cycle (``run_cycle`` / ``resume_run``) on the scenario provider."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.models import Approval, SessionState, Step
from agent.policy.capacity import need_for, retire_budget
from agent.policy.table import effective_limits, effective_policy
from agent.replay import flat_calls, load_scenario, run_scenario
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run
from agent.runtime.observe import observe
from console.views.approvals import beyond_the_need
from tests.rails_support import BUSY_DEMAND, fleet_entry, rails_world, verdict

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
HX = {"HX-Request": "true"}
OFFERS = [{"id": f"o-{k}", "gpu_name": g, "dph": 0.3, "machine_id": 7000 + k}
          for k, g in enumerate(["RTX 4090", "RTX 3090"] * 30, 1)]
ALL_AUTO = {"launch_instance": "auto", **{f"launch_instance:P{n}": "auto" for n in range(4)}}


def launch(prio="P1", gpu="RTX 4090", reason="one more"):
    return {"tool": "launch_instance", "args": {"gpu_name": gpu, "launch_priority": prio, "reason": reason}}


def _replay(name: str) -> dict:
    sc, raw = load_scenario(SCENARIOS / f"{name}.json")
    report = run_scenario(sc, raw, path=name)
    assert report["mismatches"] == [], json.dumps(report, indent=1, default=str)
    return report


@pytest.mark.django_db(transaction=True)
def test_the_report_names_both_priorities_and_the_need():
    [call] = [c for c in flat_calls(_replay("money-priority-from-facts")) if c["tool"] == "launch_instance"]
    assert "proposed P0, facts P1" in call["detail"] and "beyond the need" in call["detail"]
    assert call["priority"] == {"proposed": "P0", "facts": "P1"}
    assert call["need"] == {"workers": 1, "capacity": 1}


@pytest.mark.django_db(transaction=True)
def test_the_report_of_the_twin_names_the_emergency():
    [twin] = [c for c in flat_calls(_replay("money-priority-from-facts-near-miss")) if c["tool"] == "launch_instance"]
    assert twin["priority"] == {"proposed": "P0", "facts": "P0"} and twin["need"] == {"workers": 1, "capacity": 0}
    assert twin["outcome"] == "executed"


@pytest.mark.django_db
def test_an_approval_without_a_recorded_need_is_treated_as_within_it():
    """Approvals parked before the need was recorded (they were waiting when this landed): within
    the need at parking, so a drained queue refuses them ``no_longer_needed``; the same approval
    recorded beyond the need runs when approved (the operator decided on those facts)."""
    busy = dict(BUSY_DEMAND, queued=5)
    with rails_world([fleet_entry("v-1")], busy, offers=OFFERS) as w:
        runs = [w.cycle([launch("P1", gpu)]) for gpu in ("RTX 4090", "RTX 3090")]
        old, beyond = (Approval.objects.get(run=r) for r in runs)
        assert old.situation["need"]["within"] is True and beyond.situation["need"]["within"] is True
        old.situation = {k: v for k, v in old.situation.items() if k != "need"}
        old.save()
        beyond.situation = {**beyond.situation, "need": {**beyond.situation["need"], "within": False}}
        beyond.save()
        w.demand.demand = dict(busy, queued=0, running=0, idle_min=1)  # the queue drained
        for a in (old, beyond):
            do_decide(a, "approve", "user:alice", user=None)
            resume_run(a.run)
    old.step.refresh_from_db()
    beyond.step.refresh_from_db()
    assert (old.step.outcome, old.step.reason_code) == ("refused", "no_longer_needed")
    assert "it was within the need when parked" in old.step.detail
    assert beyond.step.outcome == "approved_executed"


@pytest.mark.django_db(databases=["default", "harmony"])
def test_the_chat_asks_for_one_more_worker_while_the_need_is_met(client, alice, broker_queue):
    """"launch one more worker" from an operator while two live workers meet the target: the launch
    parks beyond the need (even with P1 launches auto), its card says so before the buttons, a bulk
    approval leaves it out and says so, and it runs when approved on its own card."""
    client.force_login(alice)
    busy = dict(BUSY_DEMAND, queued=5, running=2)
    with rails_world([fleet_entry("v-1"), fleet_entry("v-2")], busy, offers=OFFERS, policy=ALL_AUTO) as w:
        run = w.cycle([launch("P1", reason="the operator asked for one more worker"), verdict(True, True)],
                      trigger="chat", message="launch one more worker")
        approval = Approval.objects.get(run=run)
        assert beyond_the_need(approval)
        assert approval.situation["forced"].startswith("beyond the need: the sizing asks for 2 workers, 2 are live or starting")
        card = client.get("/approvals/").content.decode()
        article = card[card.index(f'id="approval-{approval.pk}"'):]
        article = article[:article.index("</article>")]
        assert "Beyond the need:" in article and article.index("Beyond the need:") < article.index(">Approve<")
        assert "The sizing asks for 2 workers; 2 live, 0 starting." in article
        assert "Priority proposed P1, facts P1." in article
        assert 'class="bulk-pick"' not in article  # no bulk checkbox on such a card
        resp = client.post("/approvals/bulk/", {"decision": "approve", "ids": [str(approval.pk)]}, headers=HX)
        assert f"left out 1 beyond the need (approve each on its own card): approval {approval.pk}" in resp.content.decode()
        approval.refresh_from_db()
        assert approval.status == "waiting"
        resp = client.post(f"/approvals/{approval.pk}/decide/", {"decision": "approve"}, headers=HX)
        assert resp.status_code == 200, resp.content.decode()[:500]
        resume_run(approval.run)
    approval.step.refresh_from_db()
    assert approval.step.outcome == "approved_executed"
    assert w.provider_calls("launch_instance") == 1
    page = client.get(f"/runs/{run.number}/").content.decode()
    assert "The sizing asks for 2 workers; 2 live, 0 starting." in page


def test_the_scale_down_budget_objectives_are_checked():
    from agent.actions.settings import OverrideError, validate_overrides
    from agent.replay.file_format import check_objectives

    assert check_objectives({"retire_window_min": 30, "retire_budget_pct": 25})
    for bad in ({"retire_budget_pct": 0}, {"retire_budget_pct": 101}, {"retire_window_min": 0}, {"retire_budget_pct": "50"}):
        with pytest.raises(ValueError, match="retire_"):
            check_objectives(bad)
    with pytest.raises(OverrideError, match="more than 0"):
        validate_overrides({}, {"retire_budget_pct": 0})


STOP = {"tool": "stop_instance", "args": {"instance_id": "", "reason": "idle past the dwell"}}


def _stop(ident):
    return {**STOP, "args": {**STOP["args"], "instance_id": ident}}


@pytest.mark.django_db
def test_parked_stops_count_and_a_rejected_one_stops_counting(client, alice):
    """Four idle live workers: the budget is 2 of 2. Two stops parked use it (parked stops count at
    scoring); a third is refused ``disruption_budget`` with the budget's state in its detail; once
    one parked stop is rejected it stops counting and the next stop parks again. The dashboard
    says how many are left."""
    ids = ["v-1", "v-2", "v-3", "v-4"]
    idle = {"state": "ok", "active": False, "queued": 0, "running": 0, "idle_min": 60}
    client.force_login(alice)
    with rails_world([fleet_entry(i) for i in ids], idle, diagnosed=ids) as w:
        w.cycle([verdict()])
        assert "2 of 2 retirements left in this window" in client.get("/").content.decode()
        first = w.cycle([{"parallel": [_stop("v-1"), _stop("v-2"), _stop("v-3")]}])
        outcomes = [(s.outcome, s.reason_code) for s in first.steps.filter(kind="call").order_by("position")]
        assert outcomes == [("parked", "approval_required")] * 2 + [("refused", "disruption_budget")]
        refused = first.steps.get(kind="call", position=2)
        assert "0 of 2 retirements left in this window (15 min; 50% of 4 workers)" in refused.detail
        assert "0 of 2 retirements left in this window" in client.get("/").content.decode()
        do_decide(Approval.objects.get(step__position=0), "reject", "user:alice", "keep v-1", user=None)
        resume_run(first)
        again = w.cycle([_stop("v-4")])
        assert [(s.outcome, s.reason_code) for s in again.steps.filter(kind="call")] == [("parked", "approval_required")]


@pytest.mark.django_db
def test_the_monitor_and_an_operator_are_outside_the_budget():
    """The budget binds the agent: an operator's own stop through the console's action goes past
    a spent budget (their decision), and the budget never counts a call that is not the agent's."""
    from agent.actions.instances import do_instance_action
    from fleet.models import Instance

    ids = ["v-1", "v-2"]
    idle = {"state": "ok", "active": False, "queued": 0, "running": 0, "idle_min": 60}
    with rails_world([fleet_entry(i) for i in ids], idle, diagnosed=ids, policy={"stop_instance": "auto"}) as w:
        run = w.cycle([_stop("v-1"), _stop("v-2")])
        assert [(s.outcome, s.reason_code) for s in run.steps.filter(kind="call")] == [("executed", ""), ("refused", "disruption_budget")]
        do_instance_action(Instance.objects.get(external_id="v-2"), "stop", actor="user:alice", reason="my call")
        world = observe(effective_limits(), effective_policy())
        assert retire_budget(world).used == 1  # only the agent's executed stop
    assert Instance.objects.get(external_id="v-2").intended_status == "stopped"


# --- the property ------------------------------------------------------------------------------

calls_st = st.lists(st.tuples(st.sampled_from(["RTX 4090", "RTX 3090"]), st.sampled_from(["P0", "P1", "P2", "P3"]),
                              st.integers(0, 2)), min_size=1, max_size=6)
cycle_st = st.fixed_dictionaries({
    "queued": st.integers(0, 12),
    "live": st.lists(st.booleans(), min_size=3, max_size=3),
    "target": st.sampled_from([40, 180, 360, 720]),
    "calls": calls_st,
    "bulk": st.booleans(),
    "minutes": st.integers(0, 40),
})


@pytest.mark.django_db
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cycles=st.lists(cycle_st, min_size=1, max_size=3), initial=st.integers(0, 3))
def test_machines_rented_without_their_own_approval_never_exceed_the_need(cycles, initial):
    """Random fleets (0–3 rented instances, their workers live or dead), demand, targets and
    batches of launches (copies, and variations of ``gpu_name`` and priority meant to dodge
    ``duplicate``) over later cycles, with every priority's policy ``auto`` and bulk approvals of
    what waits: in each phase (a cycle, or a bulk approval), the machines rented without an
    operator's own approval of that call never exceed the need measured before it."""
    from django.db import transaction

    sid = transaction.savepoint()
    try:
        fleet = [fleet_entry(f"v-{k}") for k in range(initial)]
        with rails_world(fleet, dict(BUSY_DEMAND, queued=0), offers=list(OFFERS), policy=ALL_AUTO,
                         limits={"max_instances": 60, "max_dph": 1000, "launch_rate": [100, 600]}) as w:
            for c in cycles:
                w.clock.advance(c["minutes"] * 60)
                live = [e for e, up in zip(w.demand.fleet, c["live"], strict=False) if e["id"].startswith("v-") and up]
                for e, up in zip(w.demand.fleet, c["live"], strict=False):
                    if e["id"].startswith("v-"):
                        e["worker"]["live"] = up
                w.demand.demand = dict(BUSY_DEMAND, queued=c["queued"], running=min(1, len(live)),
                                       workers_expected=initial, workers_live=len(live))
                SessionState.objects.filter(pk=1).update(target_proofs_hr=c["target"])
                before = need_for(observe(effective_limits(), effective_policy())).workers
                batch = [launch(p, g, reason="more" * (1 + r)) for g, p, r in c["calls"]]
                run = w.cycle([{"parallel": batch}] if len(batch) > 1 else batch)
                auto = Step.objects.filter(run=run, tool="launch_instance", outcome="executed").count()
                assert auto <= before, (before, list(run.steps.values_list("tool", "outcome", "reason_code", "detail")))
                if c["bulk"]:
                    # the bulk approval's own rule: cards beyond the need are left out
                    waiting = [a for a in Approval.objects.filter(status="waiting") if not beyond_the_need(a)]
                    before = need_for(observe(effective_limits(), effective_policy())).workers
                    runs = {}
                    for a in waiting:
                        do_decide(a, "approve", "user:alice", user=None)
                        runs[a.run_id] = a.run
                    for r in runs.values():
                        resume_run(r)
                    bulk = Step.objects.filter(pk__in=[a.step_id for a in waiting], outcome="approved_executed").count()
                    assert bulk <= before, (before, bulk)
    finally:
        transaction.savepoint_rollback(sid)
