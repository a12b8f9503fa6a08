"""Reset session (docs/agent.md, the session anchor): after the browser's confirmation it
clears the conversation — the chat and the model's context start empty, the short-term buffer is
flushed (important messages promoted) — and keeps the run-id sequence, the objectives, the target,
the overrides, the fleet snapshot and long-term memory. Run ids never repeat: across resets, and
across concurrent runs and resets (threads against PostgreSQL, each on its own connection)."""

import threading

import pytest
from django.db import connection, connections

from agent.actions.runs import do_post_message, do_queue_cycle
from agent.actions.session import do_reset_session
from agent.memory import store as memory
from agent.memory.context import build_context
from agent.models import MemoryFact, Run, SessionState, ShortTermMessage
from fleet.models import AuditLog
from tests.rails_support import rails_world, verdict


@pytest.mark.django_db
@pytest.mark.parametrize("htmx", [True, False], ids=["htmx", "no-javascript"])
def test_the_server_asks_first_saying_what_it_keeps_and_clears(client, alice, htmx):
    client.force_login(alice)
    html = client.get("/").content.decode()
    assert 'id="reset-session"' in html and "hx-confirm" not in html[html.index('id="reset-box"'):][:2000]
    # it says what it clears and what it keeps, away from the demo's destructive buttons
    explained = html[html.index('id="reset-explained"'):]
    assert "Clears:" in explained and "Keeps:" in explained and "Nothing on the fleet changes" in explained
    controls = html[html.index('id="controls"'):html.index('id="controls"') + 3000]
    assert "reset-session" not in controls.split("</div>")[0]
    resp = client.post("/actions/reset/", {"reason": "new shift"}, headers={"HX-Request": "true"} if htmx else {})
    html = resp.content.decode()
    assert resp.status_code == 200 and "Reset the session?" in html
    assert "<b>Clears:</b> the chat" in html and "<b>Keeps:</b> run numbers (the next run is #1)" in html
    assert "long-term memory" in html and "waiting approvals" in html
    # the confirming form: a plain POST (works without JavaScript) with confirm=yes and the reason kept
    assert 'name="confirm" value="yes"' in html and 'action="/actions/reset/"' in html and 'value="new shift"' in html
    assert ("<html" in html) is not htmx
    assert SessionState.get().epoch == 1 and not AuditLog.objects.filter(verb="reset_session").exists()
    done = client.post("/actions/reset/", {"reason": "new shift", "confirm": "yes"})
    assert done.status_code == 302 and SessionState.get().epoch == 2
    assert AuditLog.objects.get(verb="reset_session").reason == "new shift"


@pytest.mark.django_db
def test_reset_clears_the_conversation_and_keeps_the_anchor_and_memory(client, alice):
    client.force_login(alice)
    with rails_world() as w:
        state = SessionState.get()
        state.target_proofs_hr = 120
        state.objectives = {"max_dph": 9.5}
        state.fleet_snapshot = {"instances": ["v-1"], "at": "2026-06-09T16:50:00Z"}
        state.save()
        memory.remember("rule_learned", "keep v-1", "operators keep v-1 warm", importance=0.9)
        # answered runs (not no-ops, which the prompt leaves out)
        first = w.cycle([verdict(action=True)], trigger="chat", message="never stop v-1 at night")
        second = w.cycle([verdict(action=True)], trigger="chat", message="how many workers are live?")
        assert "how many workers are live?" in client.get("/").content.decode()
        assert any("how many workers" in str(m.get("content")) for m in build_context().messages)
        assert ShortTermMessage.objects.count() >= 2

        resp = client.post("/actions/reset/", {"reason": "new shift", "confirm": "yes"}, headers={"HX-Request": "true"})
        assert resp.status_code == 200 and "session reset: new conversation" in resp.content.decode()

        # the conversation is gone: chat, model context, short-term buffer
        html = client.get("/").content.decode()
        assert "how many workers are live?" not in html and "No messages yet." in html
        assert not any("how many workers" in str(m.get("content")) for m in build_context().messages)
        assert not ShortTermMessage.objects.exists()
        # ... the important message was promoted, long-term memory stays
        assert MemoryFact.objects.filter(source="promotion", value="never stop v-1 at night").exists()
        assert MemoryFact.objects.filter(category="rule_learned", key="keep v-1").exists()
        # ... the anchor keeps counting and keeps the objectives and snapshot
        state = SessionState.get()
        assert (state.epoch, state.target_proofs_hr) == (2, 120)
        assert state.objectives == {"max_dph": 9.5}
        assert state.fleet_snapshot == {"instances": ["v-1"], "at": "2026-06-09T16:50:00Z"}
        third = w.cycle([verdict()], trigger="chat", message="hello again")
    assert third.number == second.number + 1 > first.number
    assert client.get(f"/runs/{second.number}/").status_code == 200  # earlier runs stay visible
    row = AuditLog.objects.get(verb="reset_session")
    assert row.actor == "user:alice" and row.reason == "new shift" and row.after["promoted_memories"] == 1


@pytest.mark.django_db
def test_run_ids_never_repeat_across_resets():
    with rails_world() as w:
        numbers = []
        for i in range(4):
            numbers.append(do_queue_cycle("user:alice").number)
            numbers.append(do_post_message(f"message {i}", "user:alice").run.number)
            while Run.objects.filter(status="queued").exists():
                w.cycle([verdict()])  # a cycle runs a queued run first: no new number
            do_reset_session("user:alice")
            do_reset_session("user:alice")  # twice in a row: only the epoch moves
            numbers.append(w.cycle([verdict()]).number)  # nothing queued: a new number
    assert numbers == sorted(numbers) and len(numbers) == len(set(numbers)) == 12
    assert list(Run.objects.order_by("number").values_list("number", flat=True)) == list(range(1, 13))
    assert SessionState.get().next_run_id == 13 and SessionState.get().epoch == 9


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent writers need PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_run_ids_never_repeat_across_concurrent_runs_and_resets():
    SessionState.get()
    per_thread, threads = 8, 6
    got: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def work(i: int):
        try:
            start.wait()
            for j in range(per_thread):
                if i % 3 == 0:
                    n = do_queue_cycle(f"user:t{i}").number
                elif i % 3 == 1:
                    n = do_post_message(f"thread {i} message {j}", f"user:t{i}").run.number
                else:
                    do_reset_session(f"user:t{i}")
                    n = do_queue_cycle(f"user:t{i}").number
                with lock:
                    got.append(n)
        except BaseException as exc:  # noqa: BLE001 — reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(60)
    assert not errors, errors
    assert len(got) == per_thread * threads == len(set(got))
    assert sorted(got) == list(range(1, per_thread * threads + 1))
    assert Run.objects.count() == per_thread * threads
    assert SessionState.get().next_run_id == per_thread * threads + 1
    assert SessionState.get().epoch == 1 + per_thread * (threads // 3)
