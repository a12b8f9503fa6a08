"""The Machine Performance tab opens on the span that has data (a 20-minute demo: 1 h), offers
1 h / 6 h / 24 h / 7 d, and keeps an explicit pick.

Real parts: PostgreSQL and the Django test client.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import FleetSample

pytestmark = pytest.mark.django_db(databases=["default", "harmony"])


def _sample(minutes_ago: float):
    FleetSample.objects.create(taken_at=timezone.now() - timedelta(minutes=minutes_ago), instances=1, running=1,
                               dph=0.1, target_proofs_hr=10)


def test_a_twenty_minute_demo_opens_on_one_hour_and_a_pick_is_kept(client, alice):
    _sample(20)
    _sample(1)
    client.force_login(alice)
    html = client.get("/performance/").content.decode()
    assert "Over the last 1 h" in html
    for label in ("last 1 h", "last 6 h", "last 24 h", "last 7 d"):
        assert label in html
    assert "Over the last 24 h" in client.get("/performance/?hours=24").content.decode()


def test_near_miss_three_hours_of_data_open_on_six(client, alice):
    _sample(180)
    client.force_login(alice)
    assert "Over the last 6 h" in client.get("/performance/").content.decode()
