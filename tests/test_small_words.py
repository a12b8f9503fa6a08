"""Small words that must agree: the target input shows the number as the card does; the exit
line's verb agrees with the number of workers.

Real parts: PostgreSQL and the Django test client; ``console.shutdown`` as the exit hook calls it.
"""

import pytest

from agent.models import SessionState
from console.shutdown import workers_line


@pytest.mark.django_db
def test_the_target_input_shows_540_not_540_0(client, alice):
    SessionState.objects.update_or_create(pk=1, defaults={"target_proofs_hr": 540.0})
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert 'name="target" value="540"' in html and 'id="card-target">540<' in html


def test_the_exit_line_agrees_with_one_worker_and_with_many():
    assert workers_line(["local-4"]) == ("Warden console stopped. 1 local demo worker (local-4) keeps running, as a "
                                         "real fleet's machines would: `make stop` ends it.")
    assert "2 local demo workers (local-1, local-2) keep running" in workers_line(["local-1", "local-2"])
