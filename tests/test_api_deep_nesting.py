"""The JSON API answers a body of deeply nested brackets with a clean JSON 400:
no 500, no HTML, no effect at the provider."""

import json

import pytest

from tests.console_support import BUSY
from tests.scenario_world import entry, scenario_world

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "harmony"])


@pytest.mark.parametrize("body", [
    "[" * 1000 + "]" * 1000,
    '{"reason": ' + "[" * 1000 + "]" * 1000 + "}",
    '{"reason": ' + '{"a": ' * 1000 + "1" + "}" * 1000 + "}",
    "[" * 5_000,  # unclosed too (inside the 16 KB body cap: a larger body is a JSON 413)
], ids=["list", "inside-object", "objects", "unclosed"])
def test_deep_nesting_gets_a_json_400_and_no_effect(client, alice, body):
    with scenario_world([entry("v-1")], BUSY) as provider:
        client.force_login(alice)
        resp = client.post("/api/instances/v-1/reboot/", body, content_type="application/json")
        assert [c for c, _ in provider.calls].count("reboot_instance") == 0
    assert resp.status_code == 400
    assert resp["Content-Type"].startswith("application/json")
    answer = json.loads(resp.content)
    assert answer["ok"] is False and answer["code"] == "invalid"
    assert "nests too deeply; send one flat object" in answer["detail"]


def test_shallow_bad_json_still_says_it_must_be_json(client, alice):
    with scenario_world([entry("v-1")], BUSY):
        client.force_login(alice)
        resp = client.post("/api/instances/v-1/reboot/", "[[[", content_type="application/json")
    assert resp.status_code == 400 and "the body must be JSON" in resp.json()["detail"]
