"""Reset is one confirmation: the dashboard's box says once what it clears and keeps, and its
button resets (confirm=yes); the clears/keeps text appears once on the page.

Real parts: PostgreSQL and the Django test client.
"""

import pytest

from agent.models import SessionState

pytestmark = pytest.mark.django_db


def test_the_box_says_it_once_and_its_button_resets(client, alice):
    client.force_login(alice)
    html = client.get("/").content.decode()
    box = html[html.index('id="reset-box"'):html.index("</details>", html.index('id="reset-box"'))]
    assert box.count("<b>Clears:</b>") == 1 and html.count("<b>Keeps:</b>") == 1
    assert 'name="confirm" value="yes"' in box and "Yes, clear the chat and reset" in box
    before = SessionState.get().epoch
    resp = client.post("/actions/reset/", {"confirm": "yes", "reason": ""}, headers={"HX-Request": "true"})
    assert resp.status_code == 200 and SessionState.get().epoch == before + 1
