"""The Users page uses the console's table style and UTC ISO times like every other page.

Real parts: PostgreSQL and the Django test client.
"""

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User

pytestmark = pytest.mark.django_db


def test_last_login_is_utc_iso_and_the_table_is_the_consoles(client):
    root = User.objects.create_superuser("root", password="root-pass-1")
    client.force_login(root)
    User.objects.filter(pk=root.pk).update(last_login=datetime(2026, 12, 1, 17, 59, 3, tzinfo=UTC))
    html = client.get("/users/").content.decode()
    assert "2026-12-01 17:59:03 UTC" in html and "p.m." not in html
    assert '<table class="grid users" id="users">' in html
    assert 'class="add-user-form"' in html
