"""The vast API key is used by reference only: the settings page names the reference, and even a
proxy that echoes the Authorization header into its error page leaves no key in the alert, the
run's steps, the model's context, the pages or the logs."""

import json
import logging

import pytest
from django.urls import reverse

from agent.memory.context import build_context
from agent.models import Step
from agent.planners.script import ScriptPlanner
from agent.runtime.loop import run_cycle
from fleet.models import Alert, AuditLog
from tests import vast_support
from tests.fleet_support import clear_harmony
from tests.vast_support import KEY, KEY_ENV

vast = vast_support.vast
pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def test_the_settings_page_names_the_key_reference_never_the_key(client, alice, vast):
    client.force_login(alice)
    page = client.get(reverse("settings")).content.decode()
    assert f"env:{KEY_ENV}" in page and "resolves" in page
    assert "warden/curio-worker:test" in page and "num_gpus=1" in page
    assert KEY not in page


def test_an_error_page_echoing_the_key_leaves_it_nowhere(client, alice, vast, settings, caplog):
    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "local", "TASK_NAMES": ["PoRep"]}
    clear_harmony()
    caplog.set_level(logging.DEBUG)
    vast.add("warden-a")
    vast.fault("list", "echo_key", times=10)

    run = run_cycle("operator", planner=ScriptPlanner([
        {"tool": "list_instances", "args": {}},
        {"text": 'done <verdict>{"action": false, "state_changed": false}</verdict>'},
    ]))

    assert any(KEY in h.get("Authorization", "") for _, _, _, h in vast.requests)  # the key was really sent
    alert = Alert.objects.get(kind="provider_error")
    assert "HTTP 502" in alert.message and "[REDACTED]" in alert.message  # the echo was cut out
    context = json.dumps(build_context(run=run).messages)
    texts = [alert.message, context, caplog.text,
             json.dumps(list(Step.objects.values_list("observation", "detail"))),
             json.dumps(list(AuditLog.objects.values_list("reason", "before", "after")))]
    client.force_login(alice)
    for name in ("dashboard", "fleet", "alerts", "settings"):
        texts.append(client.get(reverse(name)).content.decode())
    texts.append(client.get(reverse("run", args=[run.number])).content.decode())
    for text in texts:
        assert KEY not in text
