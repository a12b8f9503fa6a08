"""The claim is the check (docs/contract.md ``in_flight``): 20 simultaneous reboot POSTs
with different request keys start exactly one reboot.

Each POST is a real request through the console's JSON API, sent from its own thread with its own
database connection to PostgreSQL, all released together by a barrier. The scenario provider's
reboot is made to take 2 s (a real reboot takes longer), so every request arrives while the first
is in flight. One INSERT under the partial unique index (one open claim per instance) decides.
"""

import json
import threading
import time

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.test import Client

from agent.models import SideEffect
from fleet.clock import clock
from fleet.models import AuditLog
from tests.console_support import IDLE
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "harmony"])

N = 20


def test_twenty_simultaneous_reboots_start_exactly_one(alice):
    assert connection.vendor == "postgresql"
    with scenario_world([entry("v-1"), entry("v-2")], IDLE) as provider:
        real_reboot = provider.reboot

        def slow_reboot(external_id):
            real_reboot(external_id)
            time.sleep(2)

        provider.reboot = slow_reboot
        barrier = threading.Barrier(N)
        answers: dict[int, tuple[int, dict]] = {}

        def post(i: int) -> None:
            try:
                client = Client()
                client.force_login(alice)
                body = json.dumps({"reason": "wedged", "request_key": f"tab-{i}"})
                barrier.wait()
                resp = client.post("/api/instances/v-1/reboot/", body, content_type="application/json")
                answers[i] = (resp.status_code, resp.json())
            finally:
                connections.close_all()

        threads = [threading.Thread(target=post, args=(i,)) for i in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)

        reboots = [c for c, _ in provider.calls].count("reboot_instance")
    assert len(answers) == N
    statuses = sorted(s for s, _ in answers.values())
    assert statuses == [200] + [409] * (N - 1), answers
    assert {b["code"] for s, b in answers.values() if s == 409} == {"in_flight"}
    assert reboots == 1
    assert SideEffect.objects.filter(tool="reboot_instance").count() == 1
    assert AuditLog.objects.filter(verb="reboot_instance_claimed").count() == 1  # intent, with its claim
    assert AuditLog.objects.filter(verb="reboot_instance").count() == 1  # outcome
    assert AuditLog.objects.filter(verb="reboot_instance_refused").count() == N - 1


def test_the_database_refuses_a_second_open_claim_on_one_instance(db):
    now = clock.now()
    SideEffect.objects.create(key="a", tool="reboot_instance", args={}, instance_ref="v-1", claimed_at=now)
    with pytest.raises(IntegrityError), transaction.atomic():
        SideEffect.objects.create(key="b", tool="stop_instance", args={}, instance_ref="v-1", claimed_at=now)
    # a finished claim blocks nothing; launches (no instance) are not limited by it
    SideEffect.objects.filter(key="a").update(status="done")
    SideEffect.objects.create(key="c", tool="stop_instance", args={}, instance_ref="v-1", claimed_at=now)
    SideEffect.objects.create(key="d", tool="launch_instance", args={}, instance_ref="", claimed_at=now)
    SideEffect.objects.create(key="e", tool="launch_instance", args={}, instance_ref="", claimed_at=now)
    # a key is claimed once, unless its claim was settled as never having run
    with pytest.raises(IntegrityError), transaction.atomic():
        SideEffect.objects.create(key="a", tool="reboot_instance", args={}, instance_ref="v-2", claimed_at=now)
    SideEffect.objects.filter(key="c").update(status="failed", code="stale_claim")
    SideEffect.objects.create(key="c", tool="stop_instance", args={}, instance_ref="v-1", claimed_at=now)
