"""Every operator input has a length cap, checked before any work: a too-long value is a 400 (form
error or JSON) naming the field and its cap, and nothing happens (no run, no audit row, no state
change). A 404 for a huge path logs a capped line."""

import json
import logging

import pytest

from agent.models import Approval, Run, SessionState
from console.forms import CAPS
from fleet.alerts import raise_alert
from fleet.models import AuditLog
from fleet.secrets import LOG_CAP, RedactingFilter
from tests.console_support import IDLE, park_stops
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    with scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider:
        run, _ = park_stops("v-1")
        yield run, provider


def _nothing_happened(before_audit: int, before_runs: int) -> None:
    assert AuditLog.objects.count() == before_audit
    assert Run.objects.count() == before_runs
    state = SessionState.get()
    assert state.observe_only is False and state.epoch == 1


def _form_posts(approval_pk: int, alert_pk: int) -> list[tuple[str, dict, str]]:
    long = {k: "x" * (cap + 1) for k, cap in CAPS.items()}
    return [
        ("/actions/message/", {"text": long["message"]}, f"message is too long: at most {CAPS['message']:,} characters"),
        ("/actions/target/", {"target": "1" * (CAPS["target"] + 1)}, f"target proofs/hr is too long: at most {CAPS['target']} characters"),
        ("/actions/target/", {"target": "5", "reason": long["reason"]}, f"reason is too long: at most {CAPS['reason']} characters"),
        ("/actions/observe-only/", {"on": "1", "reason": long["reason"]}, "reason is too long"),
        ("/actions/reset/", {"reason": long["reason"]}, "reason is too long"),
        (f"/approvals/{approval_pk}/decide/", {"decision": "reject", "comment": long["comment"]},
         f"comment is too long: at most {CAPS['comment']:,} characters"),
        (f"/approvals/{approval_pk}/decide/", {"decision": "approve", "comment": long["comment"]}, "comment is too long"),
        (f"/alerts/{alert_pk}/ack/", {"comment": long["comment"]}, "comment is too long"),
        ("/instances/v-2/act/", {"action": "cordon", "reason": long["reason"]}, "reason is too long"),
        ("/instances/v-2/act/", {"action": "reboot", "reason": "x", "override_reason": long["override_reason"]},
         f"override_reason is too long: at most {CAPS['override_reason']} characters"),
        ("/settings/", {"reason": long["reason"], "limits__max_dph": "1"}, "reason is too long"),
        ("/settings/", {"reason": "why", "limits__max_dph": "1" * (CAPS["setting"] + 1)},
         f"max_dph is too long: at most {CAPS['setting']} characters"),
    ]


def test_too_long_form_inputs_are_refused_by_name_and_nothing_happens(client, alice, world):
    run, provider = world
    approval = Approval.objects.get(run=run)
    alert = raise_alert("workers_dead", "1 dead")
    before_audit, before_runs = AuditLog.objects.count(), Run.objects.count()
    client.force_login(alice)
    for url, data, error in _form_posts(approval.pk, alert.pk):
        resp = client.post(url, data)
        assert resp.status_code == 400, (url, resp.status_code)
        assert error in resp.content.decode(), (url, error)
    _nothing_happened(before_audit, before_runs)
    assert Approval.objects.get(pk=approval.pk).status == "waiting"
    assert not provider.calls or "reboot_instance" not in [c for c, _ in provider.calls]


def test_too_long_json_api_inputs_are_refused_with_json(client, alice, world):
    before_audit, before_runs = AuditLog.objects.count(), Run.objects.count()
    client.force_login(alice)
    url = "/api/instances/v-2/cordon/"
    for field in ("reason", "override_reason", "request_key"):
        body = {"reason": "wedged", field: "y" * (CAPS[field] + 1)}
        resp = client.post(url, json.dumps(body), content_type="application/json")
        assert resp.status_code == 400, field
        assert resp.json() == {"ok": False, "code": "too_long",
                               "detail": f"{field} is too long: at most {CAPS[field]} characters (this one has {CAPS[field] + 1})"}
    resp = client.post(url, json.dumps({"reason": "z" * 20_000}), content_type="application/json")
    assert resp.status_code == 413 and resp.json()["code"] == "too_large"
    resp = client.post(url, "[" * 1000 + "]" * 1000, content_type="application/json")
    assert resp.status_code == 400 and resp.json()["code"] == "invalid"
    _nothing_happened(before_audit, before_runs)


def test_too_long_get_filters_are_a_clear_400(client, alice):
    client.force_login(alice)
    resp = client.get("/actions/", {"actor": "a" * (CAPS["filter"] + 1)})
    assert resp.status_code == 400 and b"actor filter is too long: at most 200 characters" in resp.content
    for last in ["1" * 24, "0", "-3", "１０", "ten"]:
        resp = client.get("/traces/", {"last": last})
        assert resp.status_code == 400 and b"last must be a whole number of runs from 1 to 100,000" in resp.content, last
    assert client.get("/traces/", {"last": "10"}).status_code == 200


def test_a_404_for_a_huge_path_logs_a_capped_line(client, caplog):
    caplog.handler.addFilter(RedactingFilter())
    path = "/" + "a" * 15_000 + "password=hunter2hunter2"
    with caplog.at_level(logging.WARNING, logger="django.request"):
        assert client.get(path).status_code == 404
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    message = record.getMessage()
    assert len(message) < LOG_CAP + 100 and "cut to 2000" in message and "hunter2" not in message
    assert client.get("/healthz").status_code in (200, 503)


def test_inputs_at_their_cap_are_accepted(client, alice, world):
    client.force_login(alice)
    alert = raise_alert("workers_dead", "1 dead")
    resp = client.post(f"/alerts/{alert.pk}/ack/", {"comment": "r" * CAPS["comment"]})
    assert resp.status_code == 302
    alert.refresh_from_db()
    assert alert.state == "acknowledged" and len(alert.ack_comment) == CAPS["comment"]
    resp = client.post("/actions/target/", {"target": "5", "reason": "r" * CAPS["reason"]})
    assert resp.status_code == 302 and SessionState.get().target_proofs_hr == 5


def test_a_too_long_next_url_is_ignored_for_the_default_page(client, alice):
    client.force_login(alice)
    resp = client.post("/actions/observe-only/", {"next": "/fleet/"})
    assert resp.status_code == 302 and resp["Location"] == "/fleet/"
    resp = client.post("/actions/observe-only/", {"next": "/fleet/?q=" + "a" * CAPS["next"]})
    assert resp.status_code == 302 and resp["Location"] == "/"
