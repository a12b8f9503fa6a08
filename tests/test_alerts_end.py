"""Alerts end: each kind's episode is resolved when its condition clears, stamped with the time
and the reason, and the operators its raise notified are told it ended.

Real parts: PostgreSQL, the scenario provider and demand source (the replay's stand-ins for
vast.ai and Curio), the observe phase as the loop runs it.
"""

import pytest
from django.contrib.auth.models import User

from agent.actions.notifications import do_save_notification_settings
from agent.models import Notification, Run
from agent.policy.table import effective_limits, effective_policy
from agent.runtime.observe import lifecycle_alerts, observe
from fleet.alerts import ENDS, raise_alert, resolve
from fleet.clock import clock
from fleet.models import Alert, Instance
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])

BUSY = {"state": "ok", "active": True, "queued": 3, "running": 2, "workers_expected": 2, "workers_live": 2, "idle_min": None}


def _cycle():
    lifecycle_alerts(observe(effective_limits(), effective_policy()))


def test_an_instance_exited_alert_ends_when_its_instance_is_destroyed():
    with scenario_world([entry("v-1"), entry("v-2")], BUSY):
        gone = Instance.objects.get(external_id="v-1")
        raise_alert("instance_exited", "v-1 died", key="instance_exited:v-1", instance=gone, severity="P1")
        raise_alert("stuck_provisioning", "v-1 stuck", key="stuck_provisioning:v-1", instance=gone, severity="P1")
        Instance.objects.filter(pk=gone.pk).update(killed_at=clock.now(), killed_by="monitor", kill_reason="terminal: exited")
        _cycle()
    for key in ("instance_exited:v-1", "stuck_provisioning:v-1"):
        a = Alert.objects.get(key=key)
        assert a.state == "resolved" and a.resolved_at is not None, key
        assert a.resolved_reason.startswith("v-1 destroyed at ") and "by monitor: terminal: exited" in a.resolved_reason


def test_near_miss_an_instance_still_dead_and_listed_keeps_its_alert():
    dead = entry("v-1", status="exited", live=False)
    with scenario_world([dead, entry("v-2")], BUSY):
        Instance.objects.filter(external_id="v-1").update(intended_status="running")
        raise_alert("instance_exited", "v-1 died", key="instance_exited:v-1", severity="P1")
        _cycle()
    a = Alert.objects.get(key="instance_exited:v-1")
    assert a.state == "firing" and a.resolved_reason == ""


def test_an_instance_exited_alert_ends_when_the_worker_is_live_again_with_that_reason():
    with scenario_world([entry("v-1")], BUSY):
        raise_alert("instance_exited", "v-1 died", key="instance_exited:v-1")
        _cycle()
    assert Alert.objects.get(key="instance_exited:v-1").resolved_reason == "v-1 runs with a live worker again"


def test_demand_unknown_and_a_runs_injection_end_with_their_reasons():
    with scenario_world([entry("v-1")], BUSY):
        raise_alert("demand_unknown", "demand is unknown: timeout", severity="P1")
        run = Run.objects.create(number=7, trigger="beat", planner="rules", status="done", started_at=clock.now())
        raise_alert("prompt_injection", "text in diagnose output (run 7)", key=f"prompt_injection:{run.number}:diagnose_instance")
        raise_alert("prompt_injection", "text in run 8", key="prompt_injection:8:diagnose_instance")  # run 8: not closed
        _cycle()
    assert Alert.objects.get(key="demand_unknown").resolved_reason.startswith("demand readable again (3 queued")
    assert Alert.objects.get(key="prompt_injection:7:diagnose_instance").resolved_reason == "run 7 that read the text closed (done)"
    assert Alert.objects.get(key="prompt_injection:8:diagnose_instance").state == "firing"


def test_every_kind_raised_in_the_code_says_what_ends_it():
    from agent.replay.file_format import ALERT_KINDS

    # planner_fallback and breaker_tripped are one-per-condition elsewhere; budget is never raised
    assert set(ALERT_KINDS) - set(ENDS) <= {"planner_fallback", "breaker_tripped", "budget"}


def test_the_end_of_a_notified_alert_is_notified_with_when_and_why(alice):
    do_save_notification_settings(alice, email="alice@example.test", webhook_ref="", kinds=["alert"], actor="user:alice")
    raise_alert("workers_dead", "0 of 3 workers live", severity="P1")
    raise_alert("provider_error", "vast.ai answered 500", severity="P2")  # not notified: its end is not either
    resolve("workers_dead", "no expected worker is dead any more (3 of 3 live)")
    resolve("provider_error", "the provider answers again")
    ended = Notification.objects.get(dedupe_key__startswith="alert_resolved:")
    assert ended.subject == "[resolved] [P1] workers_dead: no expected worker is dead any more (3 of 3 live)"
    assert ended.body.startswith("Resolved at ") and " UTC: no expected worker" in ended.body
    assert Notification.objects.filter(user=alice).count() == 2  # the raise and the end


def test_the_alerts_page_shows_when_and_why_an_alert_ended_and_what_ends_an_open_one(client):
    User.objects.create_user("viewer", password="x")
    client.login(username="viewer", password="x")
    raise_alert("instance_exited", "v-9 died", key="instance_exited:v-9", severity="P1")
    raise_alert("demand_unknown", "demand is unknown", severity="P1")
    resolve("demand_unknown", "demand readable again (0 queued, 1 workers live)")
    page = client.get("/alerts/?state=all").content.decode()
    assert "UTC: demand readable again (0 queued, 1 workers live)" in page
    assert "ends when the instance runs with a live worker again, or is stopped or destroyed" in page
