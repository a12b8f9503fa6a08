"""sync_instances brings Instance rows in line with the provider: states, exit codes, vanished rows."""

from datetime import timedelta

import psutil
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.events import changed
from fleet.models import Instance
from fleet.providers.base import ProviderError
from fleet.sync import sync_instances
from tests import fleet_support
from tests.fleet_support import FLEET_DB, wait_for

pytestmark = FLEET_DB
local_fleet = fleet_support.local_fleet


@pytest.fixture
def topics():
    seen = []

    def receiver(sender, topics, **kw):
        seen.extend(topics)

    changed.connect(receiver)
    yield seen
    changed.disconnect(receiver)


def test_it_records_a_launched_instance_with_its_process(local_fleet, topics):
    p = local_fleet.launch()

    [row] = sync_instances(local_fleet)

    assert (row.provider, row.external_id, row.status, row.pid) == ("local", p.external_id, "running", p.pid)
    assert row.worker_name == p.external_id and row.log_path == p.log_path
    assert row.started_at == p.started_at
    assert row.adopted_at is not None  # launched behind Warden's back (no launch recorded it): adopted, audited
    assert topics == ["actions-changed", "fleet-changed"]


def test_it_records_the_exit_code_and_when_the_status_changed(local_fleet, topics):
    p = local_fleet.launch()
    [row] = sync_instances(local_fleet)
    before = row.status_since
    psutil.Process(p.pid).kill()
    wait_for(lambda: local_fleet.list_instances()[0].status == "exited", what="exit")

    [row] = sync_instances(local_fleet)

    assert (row.status, row.exit_code) == ("exited", -9)
    assert row.status_since > before
    assert topics == ["actions-changed", "fleet-changed", "fleet-changed"]  # the adoption's audit row, then two changes


def test_an_unchanged_fleet_emits_nothing_and_costs_the_same_queries_at_any_size(local_fleet, topics):
    counts = []
    for n in (1, 3):
        while len(local_fleet.list_instances()) < n:
            local_fleet.launch()
        sync_instances(local_fleet)
        topics.clear()
        with CaptureQueriesContext(connection) as q:
            rows = sync_instances(local_fleet)
        assert len(rows) == n
        counts.append(len(q))
    assert counts[0] == counts[1]
    assert topics == []


def test_a_vanished_instance_is_marked_killed_unless_it_is_young(local_fleet):
    now = timezone.now()
    for ext, age in (("local-900", timedelta(minutes=20)), ("local-901", timedelta(minutes=1))):
        Instance.objects.create(
            provider="local", external_id=ext, status="running", status_since=now - age, created_at=now - age
        )

    live = sync_instances(local_fleet)

    assert [r.external_id for r in live] == ["local-901"]
    gone = Instance.objects.get(external_id="local-900")
    assert (gone.killed_by, gone.kill_reason) == ("provider", "vanished")
    assert gone.killed_at is not None


def test_a_failed_provider_read_raises_and_changes_nothing(local_fleet, settings):
    now = timezone.now() - timedelta(hours=1)
    Instance.objects.create(
        provider="local", external_id="local-900", status="running", status_since=now, created_at=now
    )
    bad = settings.VAR_DIR / "workers" / "local-5.json"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_text("{broken")
    try:
        with pytest.raises(ProviderError):
            sync_instances(local_fleet)
    finally:
        bad.unlink()

    assert Instance.objects.get(external_id="local-900").killed_at is None
