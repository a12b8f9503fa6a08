"""The active model's scorecard (``ModelEvaluation``) on the settings page beside the model, and on
the runs list as its standing; another model's scorecard is not shown as this one's."""

import pytest
from django.urls import reverse

from agent.model.model_client import ModelConfig
from agent.models import Run
from agent.replay.evaluation import Case, run_case, store, suite_dir, summarize
from tests.evalmodel_support import good_model

pytestmark = pytest.mark.django_db(transaction=True)


def _evaluate(model: str) -> object:
    """A real play of one suite case by the good stand-in model, stored as ``model``'s scorecard."""
    case = Case("rules-live-worker-is-capacity", suite_dir() / "rules-live-worker-is-capacity.json", "suite")
    with good_model() as m:
        cfg = ModelConfig(base_url=m.base_url, model=model, timeout_s=5)
        result = run_case(case, cfg)
    Run.objects.all().delete()  # the play's records are the evaluation's, not the console's
    return store(summarize([result], model=model, base_url="https://user:pw@models.example.test/v1?k=1"))


def test_the_settings_page_and_runs_list_show_the_active_models_standing(client, alice, settings):
    settings.MODEL = {**settings.MODEL, "BASE_URL": "https://models.example.test/v1", "MODEL": "smollm2-135m"}
    ev = _evaluate("smollm2-135m")
    assert ev.base_url == "https://models.example.test/v1"  # userinfo and query never stored
    words = ev.words()
    assert words.startswith(f"evaluated {ev.created_at:%Y-%m-%d}: safe 1/1, right 1/1, refusals 0, $")
    client.force_login(alice)
    page = client.get(reverse("settings")).content.decode()
    model_block = page.split('id="model-settings"', 1)[1].split("</dl>", 1)[0]
    assert "smollm2-135m" in model_block and words in model_block
    runs = client.get(reverse("runs")).content.decode()
    standing = runs.split('id="runs-model-standing"', 1)[1].split("</dl>", 1)[0]
    assert "smollm2-135m" in standing and words in standing


def test_near_miss_another_models_scorecard_is_not_this_ones(client, alice, settings):
    settings.MODEL = {**settings.MODEL, "BASE_URL": "https://models.example.test/v1", "MODEL": "qwen2.5-7b"}
    other = _evaluate("smollm2-135m")
    client.force_login(alice)
    page = client.get(reverse("settings")).content.decode()
    model_block = page.split('id="model-settings"', 1)[1].split("</dl>", 1)[0]
    assert "not evaluated yet" in model_block and other.words() not in page
    runs = client.get(reverse("runs")).content.decode()
    assert "not evaluated yet" in runs.split('id="runs-model-standing"', 1)[1] and other.words() not in runs


def test_without_a_model_the_runs_list_shows_no_standing(client, alice, settings):
    settings.MODEL = {**settings.MODEL, "BASE_URL": "", "MODEL": ""}
    client.force_login(alice)
    assert 'id="runs-model-standing"' not in client.get(reverse("runs")).content.decode()


def test_a_standing_says_when_the_model_answered_in_only_some_plays():
    ev = _evaluate("smollm2-135m")
    assert "the model answered" not in ev.words()  # the good stand-in answered in its play
    ev.result["summary"]["unanswered_plays"] = 1
    ev.plays, ev.crashes = 3, 0
    assert ev.words().endswith(", the model answered in 2 of 3 plays")
