"""Alerts of the observe phase — workers_dead, demand_unknown, provider_error — are raised once per
episode and resolved when the condition clears; the escalate_human tool raises an escalation.

The demand is read by the real HarmonyDemandSource from the test HarmonyDB; the "rented"
provider stands in for an external cloud.
"""

from datetime import timedelta

import pytest
from django.db import connections
from django.db.models.functions import Now

from agent.models import Approval
from agent.planners.script import ScriptPlanner
from agent.policy.table import effective_limits, effective_policy
from agent.runtime.loop import run_cycle
from agent.runtime.observe import observe
from fleet.clock import clock
from fleet.harmony import HarmonyMachine, HarmonyMachineDetails
from fleet.models import Alert, Instance
from fleet.providers.base import ProviderError, ProviderInstance
from tests import rented_cloud
from tests.fleet_support import clear_harmony

vclock, cloud = rented_cloud.vclock, rented_cloud.cloud

DB = pytest.mark.django_db(databases=["default", "harmony"])


def add_running(cloud, ext: str) -> Instance:
    """A running instance started an hour ago (past the startup grace): its worker is expected."""
    now = clock.now()
    cloud.listed[ext] = ProviderInstance(ext, "running", worker_name=ext, started_at=now - timedelta(hours=1))
    return Instance.objects.create(provider="rented", external_id=ext, status="running", worker_name=ext,
                                   created_at=now - timedelta(hours=1), started_at=now - timedelta(hours=1),
                                   status_since=now - timedelta(hours=1))


def heartbeat(name: str) -> HarmonyMachine:
    """The worker ``name`` reports in to HarmonyDB now (the database's clock, which liveness is measured on)."""
    m = HarmonyMachine.objects.create(last_contact=Now(), host_and_port=f"{name}:12300")
    HarmonyMachineDetails.objects.create(machine=m, machine_name=name)
    return m


def observe_once():
    return observe(effective_limits(), effective_policy())


def alerts(kind):
    return list(Alert.objects.filter(kind=kind).order_by("raised_at", "pk"))


@DB
def test_workers_dead_is_raised_once_per_episode_and_resolved_when_the_worker_is_back(cloud, vclock):
    add_running(cloud, "v-1")

    world = observe_once()
    observe_once()

    assert world.demand.workers_dead == 1
    [a] = alerts("workers_dead")
    assert (a.state, a.severity) == ("firing", "P0")  # no worker live at all
    assert "1 of 1 expected workers dead" in a.message

    m = heartbeat("v-1")
    vclock.advance(1)
    observe_once()
    a.refresh_from_db()
    assert (a.state, a.resolved_at) == ("resolved", clock.now())

    # a new episode makes a new alert
    vclock.advance(60)
    HarmonyMachine.objects.filter(pk=m.pk).update(last_contact=Now() - timedelta(seconds=60))  # stale: > 3 × 5 s
    observe_once()
    observe_once()
    assert [x.state for x in alerts("workers_dead")] == ["resolved", "firing"]
    assert m.pk


@DB
def test_an_acknowledged_alert_is_not_raised_again_in_the_same_episode(cloud):
    add_running(cloud, "v-1")
    observe_once()
    Alert.objects.filter(kind="workers_dead").update(state="acknowledged", acknowledged_by="alice")

    observe_once()

    assert [a.state for a in alerts("workers_dead")] == ["acknowledged"]


@DB
def test_provider_error_is_raised_once_per_episode_and_resolved_when_the_list_works(cloud, vclock):
    add_running(cloud, "v-1")
    heartbeat("v-1")
    cloud.fail = ProviderError("HTTP 500 from the API", kind="transient", code="http_500")

    world = observe_once()
    observe_once()

    assert cloud.calls == 6  # three attempts per observe (retries with backoff on the virtual clock)
    assert world.provider_error == "http_500: HTTP 500 from the API"
    assert [i.external_id for i in world.instances] == ["v-1"]  # the last known fleet, not "zero"
    [a] = alerts("provider_error")
    assert a.state == "firing" and "http_500" in a.message

    cloud.fail = None
    world = observe_once()
    a.refresh_from_db()
    assert a.state == "resolved" and world.provider_error == ""

    cloud.fail = ProviderError("timed out", kind="transient", code="timeout")
    observe_once()
    assert [x.state for x in alerts("provider_error")] == ["resolved", "firing"]


@DB
def test_alerts_are_raised_in_the_observe_phase_of_a_cycle(cloud):
    add_running(cloud, "v-1")
    cloud.fail = ProviderError("HTTP 429", kind="transient", code="http_429")
    done = ScriptPlanner([{"text": 'ok <verdict>{"action": false, "state_changed": false}</verdict>'}])

    run_cycle("test", planner=done)
    run_cycle("test", planner=ScriptPlanner([{"text": 'ok <verdict>{"action": false, "state_changed": false}</verdict>'}]))

    assert len(alerts("provider_error")) == 1
    assert len(alerts("workers_dead")) == 1


@pytest.mark.django_db(transaction=True, databases=["default", "harmony"])
def test_demand_unknown_is_raised_once_per_episode_and_resolved_when_harmony_reads_again(cloud):
    """A real read failure: Curio's harmony_task table is missing for a while."""
    clear_harmony()
    add_running(cloud, "v-1")
    heartbeat("v-1")
    harmony = connections["harmony"]
    with harmony.cursor() as cur:
        cur.execute("ALTER TABLE harmony_task RENAME TO harmony_task_away")
    try:
        w1 = observe_once()
        w2 = observe_once()
    finally:
        with harmony.cursor() as cur:
            cur.execute("ALTER TABLE harmony_task_away RENAME TO harmony_task")

    assert (w1.demand.state, w1.demand.queued, w1.demand.workers_dead) == ("unknown", None, None)
    assert w2.demand.state == "unknown"
    [a] = alerts("demand_unknown")
    assert a.state == "firing" and "harmony" in a.message.lower()
    assert alerts("workers_dead") == []  # unknown is not "dead"

    w3 = observe_once()
    assert w3.demand.state == "ok"
    a.refresh_from_db()
    assert a.state == "resolved"
    clear_harmony()


@DB
def test_escalate_human_raises_an_escalation_alert_with_severity_and_message(cloud):
    heartbeat("v-1")
    add_running(cloud, "v-1")
    msg = "v-1 lost its GPU twice in an hour; the host may need an RMA"

    run = run_cycle("test", planner=ScriptPlanner([
        {"tool": "escalate_human", "args": {"severity": "P1", "message": msg}},
        {"text": 'escalated <verdict>{"action": true, "state_changed": false}</verdict>'},
    ]))

    step = run.steps.get(kind="call", tool="escalate_human")
    assert (step.outcome, step.ok) == ("executed", True)
    [a] = alerts("escalation")
    assert (a.severity, a.message, a.state) == ("P1", msg, "firing")
    assert f'"alert_id": {a.pk}' in step.observation
    assert not Approval.objects.exists()  # escalation needs no approval


@DB
def test_escalate_human_validates_its_severity(cloud):
    heartbeat("v-1")
    add_running(cloud, "v-1")

    run = run_cycle("test", planner=ScriptPlanner([
        {"tool": "escalate_human", "args": {"severity": "urgent", "message": "help"}},
        {"text": 'done <verdict>{"action": false, "state_changed": false}</verdict>'},
    ]))

    step = run.steps.get(kind="call", tool="escalate_human")
    assert (step.outcome, step.reason_code) == ("refused", "invalid_args")
    assert alerts("escalation") == []
