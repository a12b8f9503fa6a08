"""The agent's memory (``agent.memory.store``): remember/recall through real cycles,
structured facts that do not decay, long-term memories that halve every 7 days, the 20-message
short-term buffer that promotes important messages on eviction, consolidation every 5th run
(rule-made facts from host faults and rejections), full-text recall on PostgreSQL, word-share
recall on SQLite, and the lines the llm planner puts in its prompt."""

from datetime import timedelta

import pytest
from django.db import connection

from agent.memory import model_digest
from agent.memory import store as memory
from agent.models import Approval, MemoryFact, ShortTermMessage
from agent.runtime.approvals import do_decide
from agent.runtime.loop import resume_run
from fleet.models import Diagnosis, Instance
from tests.rails_support import calls, fleet_entry, rails_world, verdict

pytestmark = pytest.mark.django_db

KEY = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" * 2


def test_remember_and_recall_through_a_real_cycle():
    with rails_world() as w:
        run = w.cycle([
            {"tool": "remember", "args": {"category": "machine_perf", "key": "v-1 proof time",
                                          "value": "v-1 proves a 32GiB sector in 41 minutes", "importance": 0.7}},
            {"tool": "recall", "args": {"query": "proof time of v-1"}},
            verdict(),
        ])
    store, find = calls(run)
    assert (store.outcome, find.outcome) == ("executed", "executed")
    assert "41 minutes" in find.observation and "machine_perf" in find.observation
    fact = MemoryFact.objects.get(category="machine_perf", key="v-1 proof time")
    assert (fact.kind, fact.source, fact.importance) == ("fact", "agent", 0.7)


def test_a_bad_importance_is_an_invalid_args_observation_and_nothing_is_stored():
    with rails_world() as w:
        run = w.cycle([{"tool": "remember", "args": {"category": "incident", "key": "k", "value": "v",
                                                     "importance": 3.0}}, verdict()])
    assert calls(run)[0].reason_code == "invalid_args"
    assert not MemoryFact.objects.exists()


def test_secrets_are_redacted_before_they_are_stored():
    with rails_world():
        fact, _ = memory.remember("provider_note", "vast key", f"the key is {KEY}")
    assert KEY not in MemoryFact.objects.get(pk=fact.pk).value


def test_a_structured_fact_is_permanent_until_changed_and_a_memory_halves_every_week():
    with rails_world() as w:
        fact, _ = memory.remember("provider_note", "vast region", "EU offers are cheaper", importance=0.8)
        mem, _ = memory.remember("incident", "v-1 reboot", "v-1 rebooted twice", importance=0.8, kind="memory")
        w.clock.advance(7 * 86400)
        assert memory.score(fact) == pytest.approx(0.8)
        assert memory.score(mem) == pytest.approx(0.4)
        w.clock.advance(7 * 86400)
        assert memory.score(mem) == pytest.approx(0.2)
        changed, created = memory.remember("provider_note", "vast region", "US offers are cheaper now", importance=0.6)
    assert not created and changed.pk == fact.pk and MemoryFact.objects.get(pk=fact.pk).value == "US offers are cheaper now"


def test_recall_ranks_by_text_match_times_decayed_score():
    with rails_world() as w:
        memory.remember("incident", "old gpu fault", "v-1 lost its GPU: Xid 79 fallen off the bus", importance=0.9,
                        kind="memory")
        w.clock.advance(21 * 86400)  # three half-lives: 0.9 → 0.1125
        memory.remember("incident", "new gpu fault", "v-2 lost its GPU: Xid 79 fallen off the bus", importance=0.5,
                        kind="memory")
        memory.remember("provider_note", "billing", "vast bills by the second", importance=1.0)
        found = memory.recall("GPU fallen off the bus")
    assert [f["key"] for f in found] == ["new gpu fault", "old gpu fault"]  # billing does not match
    assert found[0]["score"] > found[1]["score"] > 0
    assert MemoryFact.objects.filter(key="new gpu fault", last_used_at__isnull=False).exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="full-text search is PostgreSQL's")
def test_postgres_full_text_search_matches_word_forms():
    with rails_world():
        memory.remember("machine_perf", "v-3 slow", "v-3 proving slowly since the driver update")
        memory.remember("machine_perf", "v-4 fast", "v-4 is fast")
        found = memory.recall("slow proofs after updating drivers")  # websearch ANDs; any-word fallback, stemmed
    assert [f["key"] for f in found][0] == "v-3 slow"


def test_the_sqlite_ranking_is_the_share_of_query_words_found(monkeypatch):
    monkeypatch.setattr(connection, "vendor", "sqlite")
    with rails_world():
        memory.remember("incident", "a", "queue stuck and workers dead", importance=0.5)
        memory.remember("incident", "b", "workers dead", importance=0.9)
        memory.remember("incident", "c", "nothing related", importance=1.0)
        found = memory.recall("queue stuck workers dead")
    # a: 4/4 × 0.5 = 0.5; b: 2/4 × 0.9 = 0.45; c: no word
    assert [(f["key"], f["score"]) for f in found] == [("a", 0.5), ("b", 0.45)]


def test_recall_filters_by_category():
    with rails_world():
        memory.remember("incident", "x", "demand reader timed out")
        memory.remember("provider_note", "y", "demand spikes at night")
        assert [f["key"] for f in memory.recall("demand", category="provider_note")] == ["y"]


def test_recall_for_prompt_gives_lines_best_first_and_falls_back_to_the_best_overall():
    with rails_world():
        memory.remember("rule_learned", "keep local-5", "operators keep local-5 warm", importance=0.9)
        memory.remember("provider_note", "vast", "vast offers vanish within minutes", importance=0.4)
        assert memory.recall_for_prompt("vast offers", limit=5) == ["[provider_note] vast: vast offers vanish within minutes"]
        assert memory.recall_for_prompt("zebra", limit=1) == ["[rule_learned] keep local-5: operators keep local-5 warm"]


def test_the_buffer_keeps_20_messages_and_promotes_important_ones_on_eviction():
    with rails_world():
        promoted = []
        promoted += memory.buffer_message("never stop local-5 during business hours", "user:alice")
        promoted += memory.buffer_message("how many workers are live?", "user:alice")
        for i in range(19):
            promoted += memory.buffer_message(f"status question {i}", "user:bob")
        assert promoted == [] or [f.value for f in promoted] == ["never stop local-5 during business hours"]
        assert ShortTermMessage.objects.count() == memory.BUFFER_SIZE
        promoted += memory.buffer_message("one more", "user:bob")
    assert ShortTermMessage.objects.count() == memory.BUFFER_SIZE
    assert [f.value for f in promoted] == ["never stop local-5 during business hours"]
    fact = MemoryFact.objects.get()
    assert (fact.kind, fact.source, fact.importance) == ("memory", "promotion", 0.8)
    assert not ShortTermMessage.objects.filter(text__startswith="how many").exists()  # evicted, not promoted


def test_operator_messages_of_a_run_enter_the_buffer_once():
    with rails_world() as w:
        run = w.cycle([verdict()], trigger="chat", message="always keep one spare 4090")
        model_digest.after_run(run)  # closing it again buffers nothing more
    assert ShortTermMessage.objects.filter(actor="user:alice", text="always keep one spare 4090", importance=0.8).count() == 1


def test_every_fifth_run_consolidates_host_faults_and_rejections():
    fleet = [fleet_entry("local-4"), fleet_entry("local-5")]
    calm = {"state": "ok", "active": False, "queued": 0, "running": 0, "idle_min": 90}
    with rails_world(fleet, calm) as w:
        Diagnosis.objects.create(instance=Instance.objects.get(external_id="local-4"), taken_at=w.clock.now(),
                                 health="failed", fault_class="host", cause="kernel oops: GPU fell off the bus",
                                 source="ssh", evidence={})
        run = w.cycle([{"tool": "diagnose_instance", "args": {"instance_id": "local-5"}},
                       {"tool": "stop_instance", "args": {"instance_id": "local-5", "reason": "idle"}}])
        do_decide(Approval.objects.get(), "reject", "user:alice", "keep it warm")
        resume_run(run)
        assert run.number < memory.CONSOLIDATE_EVERY
        assert not MemoryFact.objects.filter(source="consolidation").exists()
        # the rejection is still written by agent.runtime.approvals
        assert MemoryFact.objects.get(category="rejection", key="stop_instance local-5").source == "approvals"
        while True:
            run = w.cycle([verdict()])
            if run.number % memory.CONSOLIDATE_EVERY == 0:
                break
            assert not MemoryFact.objects.filter(source="consolidation").exists()
    incident = MemoryFact.objects.get(category="incident", key="host fault local-4")
    assert incident.kind == "memory" and "GPU fell off the bus" in incident.value
    rule = MemoryFact.objects.get(category="rule_learned", key="operators reject stop_instance local-5")
    assert rule.kind == "fact" and "keep it warm" in rule.value


def test_consolidation_is_idempotent():
    with rails_world() as w:
        Diagnosis.objects.create(instance=Instance.objects.get(external_id="v-1"), taken_at=w.clock.now(),
                                 health="failed", fault_class="host", cause="ECC errors", source="ssh", evidence={})
        memory.consolidate()
        w.clock.advance(60)
        memory.consolidate()
        assert MemoryFact.objects.filter(source="consolidation").count() == 1
        # a fault older than the window is not consolidated again
        MemoryFact.objects.all().delete()
        w.clock.advance(memory.CONSOLIDATE_WINDOW.total_seconds() + 60)
        assert memory.consolidate() == []
    assert timedelta(days=7) == memory.CONSOLIDATE_WINDOW
