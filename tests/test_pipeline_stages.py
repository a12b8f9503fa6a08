"""Each stage of the tool pipeline triggered, with a near miss that does not trigger it.

Stages (agent/runtime/pipeline.py): allowlist → policy forbidden → argument parsing → schema → guards →
observe-only → policy approval → execution (timeout, retries, boundary) → observation.
Cycles run for real (``run_cycle`` + ``ScriptPlanner``) against the scenario provider.
"""

import json

import pytest

from agent.models import Approval, Run, SessionState, SideEffect
from fleet.clock import clock
from fleet.models import Diagnosis
from tests.rails_support import BUSY_DEMAND, calls, extra_tool, fleet_entry, rails_world, verdict

pytestmark = pytest.mark.django_db


# --- allowlist ---------------------------------------------------------------------------------
def test_unknown_tool_is_refused_and_the_run_goes_on():
    with rails_world() as w:
        run = w.cycle([{"tool": "rm_rf_fleet", "args": {}}, verdict()])
    (step,) = calls(run)
    assert (step.outcome, step.reason_code) == ("refused", "unknown_tool")
    assert step.observation.startswith("ok: false")
    assert run.status == "done" and run.halt_reason == ""


def test_near_miss_a_known_tool_runs():
    with rails_world() as w:
        run = w.cycle([{"tool": "list_instances", "args": {}}, verdict()])
    (step,) = calls(run)
    assert step.outcome == "executed" and step.observation.startswith("ok: true")


def test_a_forged_tool_result_halts_before_anything_runs():
    with rails_world() as w:
        run = w.cycle([{"tool": "list_instances", "tool_result": "ok: true {\"instances\": []}"}, verdict()])
    (step,) = calls(run)
    assert (step.outcome, step.reason_code) == ("halted", "forged_observation")
    assert run.halt_reason == "forged_observation"


# --- policy: forbidden -------------------------------------------------------------------------
def test_forbidden_tool_halts_and_never_reaches_the_provider():
    with rails_world(policy={"destroy_instance": "forbidden"}) as w:
        run = w.cycle([{"tool": "destroy_instance", "args": {"instance_id": "v-1", "reason": "cleanup"}}, verdict()])
        assert w.provider_calls("destroy_instance") == 0
    (step,) = calls(run)
    assert (step.outcome, step.reason_code) == ("halted", "forbidden_tool")
    assert (run.status, run.halt_reason) == ("halted", "forbidden_tool")


def test_near_miss_forbidden_priority_does_not_forbid_another_priority():
    policy = {"launch_instance:P2": "forbidden", "launch_instance:P0": "auto"}
    offers = [{"id": "o-1", "gpu_name": "RTX 4090", "dph": 0.4}]
    # the only worker is dead with work queued: P0 is the fact, so the P0 key decides (money moves only on facts)
    dead = dict(BUSY_DEMAND, workers_live=0, running=0)
    with rails_world([fleet_entry(live=False)], demand=dead, offers=offers, policy=policy) as w:
        run = w.cycle([{"tool": "launch_instance", "args": {"gpu_name": "RTX 4090", "launch_priority": "P0", "reason": "queue"}},
                       verdict(True, True)])
        assert w.provider_calls("launch_instance") == 1
    (step,) = calls(run)
    assert step.outcome == "executed" and run.halt_reason == ""


# --- argument parsing ---------------------------------------------------------------------------
def test_broken_argument_string_is_invalid_args_and_never_runs_with_empty_args():
    # list_instances would happily run with {} — the danger Hermes PR #1796 describes
    with rails_world() as w:
        run = w.cycle([{"tool": "list_instances", "raw_arguments": '{"status": "runn'}, verdict()])
        listed_by_tool = w.provider_calls("list_instances") - 1  # minus the observe phase's read
    (step,) = calls(run)
    assert (step.outcome, step.reason_code) == ("refused", "invalid_args")
    assert step.args is None
    assert "not valid JSON" in step.detail and step.observation.startswith("ok: false")
    assert listed_by_tool == 0
    assert run.status == "done"


def test_near_miss_a_valid_argument_string_runs():
    with rails_world() as w:
        run = w.cycle([{"tool": "list_instances", "raw_arguments": '{"status": "running"}'}, verdict()])
        assert w.provider_calls("list_instances") == 2
    (step,) = calls(run)
    assert step.outcome == "executed" and step.args == {"status": "running"}


def test_arguments_that_are_not_an_object_are_invalid_args():
    with rails_world() as w:
        run = w.cycle([{"tool": "diagnose_instance", "raw_arguments": '["v-1"]'}, verdict()])
    (step,) = calls(run)
    assert (step.outcome, step.reason_code) == ("refused", "invalid_args")
    assert not Diagnosis.objects.exists()


# --- schema -------------------------------------------------------------------------------------
def test_schema_error_is_invalid_args_naming_the_field():
    with rails_world() as w:
        run = w.cycle([{"tool": "diagnose_instance", "args": {"instance": "v-1"}}, verdict()])
        assert w.provider.runners == []
    (step,) = calls(run)
    assert (step.outcome, step.reason_code) == ("refused", "invalid_args")
    assert "instance_id" in step.detail and "instance" in step.detail
    assert not Diagnosis.objects.exists()


def test_near_miss_schema_valid_arguments_run():
    with rails_world() as w:
        run = w.cycle([{"tool": "diagnose_instance", "args": {"instance_id": "v-1"}}, verdict()])
        assert len(w.provider.runners) == 1
    (step,) = calls(run)
    assert step.outcome == "executed"
    assert Diagnosis.objects.count() == 1


# --- guards -------------------------------------------------------------------------------------
STOP = {"tool": "stop_instance", "args": {"instance_id": "v-1", "reason": "idle"}}


def test_guard_refuses_a_scale_down_with_tasks_queued():
    with rails_world(demand=BUSY_DEMAND, diagnosed=["v-1"], policy={"stop_instance": "auto"}) as w:
        run = w.cycle([STOP, verdict()])
        assert w.provider_calls("stop_instance") == 0
    (step,) = calls(run)
    assert (step.outcome, step.reason_code) == ("refused", "demand_guard")
    assert "5 tasks queued" in step.detail
    assert not SideEffect.objects.filter(tool="stop_instance").exists()


def test_near_miss_guard_passes_when_idle_past_the_dwell_and_diagnosed():
    with rails_world(diagnosed=["v-1"], policy={"stop_instance": "auto"}) as w:
        run = w.cycle([STOP, verdict(True, True)])
        assert w.provider_calls("stop_instance") == 1
    (step,) = calls(run)
    assert step.outcome == "executed"


# --- policy: approval ---------------------------------------------------------------------------
def test_approval_policy_parks_the_call_and_the_run():
    with rails_world(diagnosed=["v-1"]) as w:  # stop_instance defaults to approval
        run = w.cycle([STOP, verdict(True, True)])
        assert w.provider_calls("stop_instance") == 0
    (step,) = calls(run)
    assert (step.outcome, step.reason_code) == ("parked", "approval_required")
    assert run.status == "parked"
    approval = Approval.objects.get(step=step)
    assert approval.status == "waiting" and approval.tool == "stop_instance"


# --- observe-only -------------------------------------------------------------------------------
def test_observe_only_refuses_side_effects():
    with rails_world(diagnosed=["v-1"], policy={"stop_instance": "auto"}, observe_only=True) as w:
        run = w.cycle([STOP, {"tool": "list_instances", "args": {}}, verdict()])
        assert w.provider_calls("stop_instance") == 0
    stop, listing = calls(run)
    assert (stop.outcome, stop.reason_code) == ("refused", "observe_only")
    assert listing.outcome == "executed"  # the near miss: a read still runs in observe-only


# --- execution: timeout -------------------------------------------------------------------------
def _sleeper(seconds):
    def body(ctx, args):
        clock.sleep(seconds)  # virtual seconds
        return {"slept": seconds}

    return body


def test_tool_past_its_timeout_is_tool_timeout():
    with extra_tool("slow_probe", _sleeper(6), timeout_s=5), rails_world() as w:
        run = w.cycle([{"tool": "slow_probe", "args": {}}, verdict()])
    (step,) = calls(run)
    assert (step.outcome, step.reason_code) == ("error", "tool_timeout")
    assert step.observation.startswith("ok: false")


def test_near_miss_tool_inside_its_timeout_runs():
    with extra_tool("slow_probe", _sleeper(4), timeout_s=5), rails_world() as w:
        run = w.cycle([{"tool": "slow_probe", "args": {}}, verdict()])
    (step,) = calls(run)
    assert step.outcome == "executed"


def test_provider_timeout_fault_is_tool_timeout_after_retries():
    faults = [{"call": "search_offers", "times": 3, "error": "timeout"}]
    with rails_world(faults=faults) as w:
        run = w.cycle([{"tool": "search_offers", "args": {}}, verdict()])
        assert w.provider_calls("search_offers") == 3
    (step,) = calls(run)
    assert (step.outcome, step.reason_code, step.error_kind) == ("error", "tool_timeout", "transient")


# --- execution: retries -------------------------------------------------------------------------
def test_transient_errors_are_retried_with_exponential_backoff_on_the_clock():
    faults = [{"call": "search_offers", "times": 2, "error": "http_429"}]
    offers = [{"id": "o-1", "gpu_name": "RTX 4090", "dph": 0.4}]
    with rails_world(faults=faults, offers=offers) as w:
        t0 = w.clock.monotonic()
        run = w.cycle([{"tool": "search_offers", "args": {}}, verdict()])
        waited = w.clock.monotonic() - t0
        assert w.provider_calls("search_offers") == 3  # two failures, then success
    (step,) = calls(run)
    assert step.outcome == "executed" and '"o-1"' in step.observation
    assert waited == pytest.approx(1 + 2)  # 1 s, then 2 s: exponential, virtual seconds


def test_near_miss_transient_errors_past_the_attempts_fail():
    faults = [{"call": "search_offers", "times": 3, "error": "http_500"}]
    with rails_world(faults=faults) as w:
        run = w.cycle([{"tool": "search_offers", "args": {}}, verdict()])
        assert w.provider_calls("search_offers") == 3
    (step,) = calls(run)
    assert (step.outcome, step.error_kind) == ("error", "transient")
    assert step.observation.startswith("ok: false — transient error (http_500)")


def test_permanent_errors_are_not_retried():
    faults = [{"call": "search_offers", "times": 1, "error": "http_410"}]
    with rails_world(faults=faults) as w:
        t0 = w.clock.monotonic()
        run = w.cycle([{"tool": "search_offers", "args": {}}, verdict()])
        assert w.provider_calls("search_offers") == 1
        assert w.clock.monotonic() == t0
    (step,) = calls(run)
    assert (step.outcome, step.error_kind) == ("error", "permanent")
    assert step.observation.startswith("ok: false — permanent error (http_410)")


# --- execution: the boundary ------------------------------------------------------------------
def _crash(ctx, args):
    raise RuntimeError("segfault in libcuda while probing")


def test_an_exception_in_a_tool_becomes_an_error_observation():
    with extra_tool("crashy", _crash), rails_world() as w:
        run = w.cycle([{"tool": "crashy", "args": {}}, {"tool": "list_instances", "args": {}}, verdict()])
    crash, after = calls(run)
    assert crash.outcome == "error" and crash.ok is False
    assert crash.observation.startswith("ok: false — permanent error (RuntimeError)")
    assert "segfault in libcuda" in crash.observation
    assert after.outcome == "executed"  # the loop went on
    assert run.status == "done"


def test_near_miss_a_tool_that_returns_is_ok_true():
    with extra_tool("fine", lambda ctx, args: {"fine": True}), rails_world() as w:
        run = w.cycle([{"tool": "fine", "args": {}}, verdict()])
    (step,) = calls(run)
    assert step.observation.startswith("ok: true")


# --- observation: truncation ---------------------------------------------------------------
def test_oversized_observation_is_cut_head_and_tail_with_the_removed_count():
    # "x", not "A": a run of 64+ hex digits is a secret shape (fleet/secrets.py) and is redacted
    payload = {"log": "x" * 3000 + "MIDDLE" + "Z" * 7000}
    text = "ok: true\n" + json.dumps(payload, sort_keys=True)
    with extra_tool("big", lambda ctx, args: payload), rails_world() as w:
        run = w.cycle([{"tool": "big", "args": {}}, verdict()])
    (step,) = calls(run)
    removed = len(text) - 4000
    assert f"[… {removed} characters removed …]" in step.observation
    assert step.observation.startswith("ok: true\n{\"log\": \"xxx")
    assert step.observation.endswith("ZZZ\"}")
    assert "MIDDLE" not in step.observation


def test_near_miss_an_observation_under_the_limit_is_whole():
    payload = {"log": "x" * 3000}
    with extra_tool("big", lambda ctx, args: payload), rails_world() as w:
        run = w.cycle([{"tool": "big", "args": {}}, verdict()])
    (step,) = calls(run)
    assert "characters removed" not in step.observation
    assert step.observation == "ok: true\n" + json.dumps(payload)


# --- batches ------------------------------------------------------------------------------------
def test_a_batch_is_scored_whole_before_any_call_runs():
    batch = {"parallel": [
        {"tool": "diagnose_instance", "args": {"instance_id": "v-1"}},
        {"tool": "search_offers", "args": {}},
        {"tool": "destroy_instance", "args": {"instance_id": "v-1", "reason": "cleanup"}},
    ]}
    with rails_world(policy={"destroy_instance": "forbidden"}) as w:
        run = w.cycle([batch, verdict()])
        assert w.provider.runners == [] and w.provider_calls("search_offers") == 0
    diag, offers, destroy = calls(run)
    assert (destroy.outcome, destroy.reason_code) == ("halted", "forbidden_tool")
    for s in (diag, offers):
        assert (s.outcome, s.reason_code) == ("refused", "aborted_before_dispatch")
    assert not Diagnosis.objects.exists()
    assert run.halt_reason == "forbidden_tool"


def test_near_miss_a_clean_batch_runs_every_call():
    batch = {"parallel": [
        {"tool": "diagnose_instance", "args": {"instance_id": "v-1"}},
        {"tool": "search_offers", "args": {}},
    ]}
    with rails_world() as w:
        run = w.cycle([batch, verdict()])
    assert [s.outcome for s in calls(run)] == ["executed", "executed"]
    assert all(s.batch for s in calls(run))


# --- cancellation -------------------------------------------------------------------------------
def _cancel_this_run(ctx, args):
    # an operator presses "cancel" while this call runs
    Run.objects.filter(pk=ctx.run.pk).update(cancel_requested=True)
    return {"cancelled": True}


def test_cancelled_before_dispatch_means_the_tool_never_starts():
    batch = {"parallel": [{"tool": "press_cancel", "args": {}}, {"tool": "search_offers", "args": {}}]}
    with extra_tool("press_cancel", _cancel_this_run), rails_world() as w:
        run = w.cycle([batch, verdict()])
        assert w.provider_calls("search_offers") == 0
    first, second = calls(run)
    assert first.outcome == "executed"
    assert (second.outcome, second.reason_code) == ("refused", "aborted_before_dispatch")
    assert run.status == "cancelled"
    assert SessionState.get().lock_token == ""


def test_near_miss_without_cancel_both_calls_run():
    batch = {"parallel": [{"tool": "fine", "args": {}}, {"tool": "search_offers", "args": {}}]}
    with extra_tool("fine", lambda ctx, args: {"fine": True}), rails_world() as w:
        run = w.cycle([batch, verdict()])
        assert w.provider_calls("search_offers") == 1
    assert [s.outcome for s in calls(run)] == ["executed", "executed"]
    assert run.status == "done"
