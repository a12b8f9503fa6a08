"""Chat: a message is stored and starts a ``chat`` cycle; messages and the agent's reports are shown."""

import contextlib
from datetime import timedelta

import pytest
from django.utils import timezone

from agent.models import Run, Step
from tests.console_support import capture_topics, cycle_messages

HX = {"HX-Request": "true"}


@contextlib.contextmanager
def broker_at(app, url: str):
    """Point the Celery app's publishing connection at ``url`` (a dead port: Redis unreachable).

    The app's connection pools are set aside (not closed) and restored afterwards.
    """
    saved_conf = (app.conf.broker_url, app.conf.broker_transport_options)
    saved_pools = (app._pool, app.amqp._producer_pool)
    app._pool = None
    app.amqp._producer_pool = None
    app.conf.broker_url = url
    app.conf.broker_transport_options = {"socket_connect_timeout": 0.5, "max_retries": 1}
    try:
        yield
    finally:
        if app._pool is not None:
            app._pool.force_close_all()
        app._pool, app.amqp._producer_pool = saved_pools
        app.conf.broker_url, app.conf.broker_transport_options = saved_conf


def test_it_stores_the_message_and_starts_a_chat_cycle(client, alice, broker_queue, django_capture_on_commit_callbacks):
    client.force_login(alice)
    with capture_topics() as topics, django_capture_on_commit_callbacks(execute=True):
        resp = client.post("/actions/message/", {"text": "how many workers are live?"}, headers=HX)
    assert resp.status_code == 200
    body = resp.content.decode()
    assert "sent;" in body and "how many workers" not in body  # the input is cleared after sending
    step = Step.objects.get(kind="message")
    assert step.text == "how many workers are live?" and step.actor == "user:alice" and step.run.trigger == "chat"
    assert "chat-changed" in topics
    queued = cycle_messages("chat")
    assert len(queued) == 1
    # the cycle picks the stored message up; it is not sent a second time
    assert "how many workers are live?" not in repr(queued[0]["args"]) + repr(queued[0]["kwargs"])
    assert "user:alice" in repr(queued[0]["args"]) + repr(queued[0]["kwargs"])


def test_it_shows_messages_and_final_reports_in_order(client, alice):
    t0 = timezone.now() - timedelta(minutes=5)
    run = Run.objects.create(number=1, trigger="chat", planner="rules", status="done", started_at=t0,
                             ended_at=t0 + timedelta(seconds=20), final_report="2 workers live, 0 queued.")
    Step.objects.create(run=run, seq=0, kind="message", actor="user:alice", text="status please", created_at=t0)
    Run.objects.create(number=2, trigger="beat", planner="rules", status="done", started_at=t0, final_report="beat run")
    client.force_login(alice)
    html = client.get("/?partial=chat", headers=HX).content.decode()
    assert html.index("status please") < html.index("2 workers live, 0 queued.")
    assert "beat run" not in html
    assert "<html" not in html


def test_it_keeps_an_empty_message_out_and_explains(client, alice, broker_queue):
    client.force_login(alice)
    resp = client.post("/actions/message/", {"text": "   "}, headers=HX)
    assert "the message is empty" in resp.content.decode()
    assert not Step.objects.exists()
    assert cycle_messages("chat") == []


@pytest.mark.django_db(transaction=True)
def test_it_keeps_the_text_when_the_agent_cannot_be_started(client, alice, settings):
    """Redis (the broker) unreachable: the message is saved, the operator is told, nothing is lost."""
    from console.celery import app

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}}
    client.force_login(alice)
    with broker_at(app, "redis://127.0.0.1:1/0"):  # autocommit: start_cycle publishes at once
        resp = client.post("/actions/message/", {"text": "scale up please"}, headers=HX)
    html = resp.content.decode()
    assert resp.status_code == 200
    assert "message saved, but the agent could not be started" in html
    assert Step.objects.get(kind="message").text == "scale up please"


def test_it_forbids_viewers(client, bob):
    client.force_login(bob)
    assert client.post("/actions/message/", {"text": "hi"}, headers=HX).status_code == 403
    assert not Step.objects.exists()
