"""Settings explain each limit in one line with its unit; an undiagnosed instance says what to do.

Real parts: PostgreSQL and the Django test client.
"""

import pytest
from django.utils import timezone

from agent.policy.limits import FROM_ENV, LIMIT_RANGES
from console.views.settings import LIMIT_HELP
from fleet.models import Instance

pytestmark = pytest.mark.django_db


def test_every_limit_has_a_line_with_its_unit_on_the_page(client, alice):
    assert (set(LIMIT_RANGES) - set(FROM_ENV)) | {"network_recheck_min"} <= set(LIMIT_HELP)
    assert all(text.endswith(")") for text in LIMIT_HELP.values())  # each ends with its unit
    client.force_login(alice)
    html = client.get("/settings/").content.decode()
    assert 'id="help-three_strikes">halt after this many failures of one tool in a run (failures)<' in html
    assert 'id="help-launch_rate">at most N launches in S seconds (launches, seconds)<' in html


def test_an_undiagnosed_instance_says_diagnose_first_and_for_how_long(client, alice):
    now = timezone.now()
    Instance.objects.create(provider="local", external_id="local-1", status="running", status_since=now, created_at=now)
    client.force_login(alice)
    html = client.get("/instances/local-1/").content.decode()
    assert "Diagnose first: stop and destroy need a diagnosis from the last 15 minutes" in html
    assert "HTTP 428" not in html
