"""Verdict blocks are parsed, never shown as text; a missing or malformed verdict is recorded as
unknown, never guessed; the "no-op" badge (once "skipped in prompt") explains itself in words.
Real cycles (``run_cycle`` with a script planner) and the real runs pages."""

import pytest

from agent.chat.verdicts import parse_verdict
from tests.rails_support import rails_world

pytestmark = pytest.mark.django_db


def cycle(steps):
    with rails_world() as w:
        return w.cycle(steps)


def page(client, run) -> str:
    return client.get(f"/runs/{run.number}/").content.decode()


def test_a_verdict_is_parsed_and_its_block_is_not_shown(client, alice):
    run = cycle([{"tool": "list_instances", "args": {}},
                 {"text": 'Searched offers. <verdict>{"action": true, "state_changed": false}</verdict>'}])
    assert (run.verdict_action, run.verdict_state_changed) == (True, False) and run.included_in_prompt
    client.force_login(alice)
    html = page(client, run)
    assert "action yes · state changed no" in html
    assert "Searched offers." in html
    assert "verdict&gt;" not in html and "<verdict>" not in html and "state_changed" not in html


@pytest.mark.parametrize("block", [
    '<verdict>{"action": "yes", "state_changed": "no"}</verdict>',  # strings are not booleans
    '<verdict>{"action": 1, "state_changed": 0}</verdict>',
    '<verdict>{"action": true}</verdict>',  # a field missing
    "<verdict>action: true, state_changed: false</verdict>",  # not JSON
    "<verdict>[true, false]</verdict>",
])
def test_a_malformed_verdict_is_recorded_as_unknown(client, alice, block):
    assert parse_verdict(block) is None
    run = cycle([{"text": "Nothing to do. " + block}])
    assert run.status == "done"
    assert run.verdict_action is None and run.verdict_state_changed is None
    assert run.included_in_prompt  # not known to be a no-op: kept in the prompt
    assert run.final_answer.startswith("Nothing to do.")
    client.force_login(alice)
    html = page(client, run)
    assert "model gave no verdict" in html
    assert "Nothing to do." in html and "verdict&gt;" not in html and "<verdict>" not in html


def test_a_missing_verdict_is_recorded_as_unknown(client, alice):
    run = cycle([{"text": "I looked at the fleet."}])  # the planner ends without any verdict
    assert run.verdict_action is None and run.verdict_state_changed is None and run.included_in_prompt
    client.force_login(alice)
    assert "model gave no verdict" in page(client, run)


def test_a_well_formed_verdict_is_not_taken_for_a_malformed_one():
    assert parse_verdict('<verdict>{"action": false, "state_changed": false}</verdict>') == (False, False)
    assert parse_verdict('x <verdict> {"state_changed": true, "action": true} </verdict>') == (True, True)


def test_the_skipped_in_prompt_badge_explains_itself_in_words(client, alice):
    noop = cycle([{"tool": "get_demand", "args": {}},
                  {"text": 'Quiet. <verdict>{"action": false, "state_changed": false}</verdict>'}])
    assert noop.included_in_prompt is False
    client.force_login(alice)
    listing = client.get("/runs/").content.decode()
    assert ">no-op</span>" in listing and "skipped in prompt" not in listing  # plain words, no jargon
    assert "no action, nothing changed: later runs' prompts leave it out" in listing
    html = page(client, noop)
    assert 'id="skipped-note"' in html and "the agent's prompt in later runs leaves it out" in html
    acted = cycle([{"text": 'Did it. <verdict>{"action": true, "state_changed": true}</verdict>'}])
    assert 'id="skipped-note"' not in page(client, acted)
