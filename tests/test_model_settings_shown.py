"""The header says which planner is active, and the settings page names the model and the key's
reference — never the key (docs/safety.md invariant 6: secrets are never shown)."""

import pytest
from django.urls import reverse

KEY = "sk-proj-" + "Wx4" * 16


@pytest.mark.django_db
def test_without_a_model_the_header_says_rules(client, alice, settings):
    settings.MODEL = {**settings.MODEL, "BASE_URL": "", "MODEL": ""}
    client.force_login(alice)
    page = client.get(reverse("settings")).content.decode()
    assert "planner: rules" in page
    assert "no model configured" in page


@pytest.mark.django_db
def test_with_a_model_the_pages_name_it_and_the_key_reference_only(client, alice, settings, monkeypatch):
    monkeypatch.setenv("WARDEN_TEST_MODEL_KEY", KEY)
    settings.MODEL = {**settings.MODEL, "BASE_URL": "https://user:pw@api.example.test/v1?x=1", "MODEL": "gpt-4o-mini",
                      "API_KEY_ENV": "WARDEN_TEST_MODEL_KEY", "PRICE_IN": 0.15, "PRICE_OUT": 0.6}
    client.force_login(alice)
    page = client.get(reverse("settings")).content.decode()
    assert "planner: llm · gpt-4o-mini" in page
    assert "env:WARDEN_TEST_MODEL_KEY" in page
    assert "https://api.example.test/v1" in page
    assert KEY not in page and "user:pw" not in page
    assert "planner: llm · gpt-4o-mini" in client.get(reverse("runs")).content.decode()


@pytest.mark.django_db
def test_the_settings_page_says_how_tool_results_are_sent(client, alice, settings):
    settings.MODEL = {**settings.MODEL, "BASE_URL": "http://127.0.0.1:9/v1", "MODEL": "smollm2", "TOOL_RESULTS": "user"}
    client.force_login(alice)
    page = client.get(reverse("settings")).content.decode()
    assert "· user messages" in page and "WARDEN_MODEL_TOOL_RESULTS" in page
    settings.MODEL = {**settings.MODEL, "TOOL_RESULTS": "tool"}
    assert "· tool messages" in client.get(reverse("settings")).content.decode()
