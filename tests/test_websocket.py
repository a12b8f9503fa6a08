"""The console websocket: a committed state change reaches a connected operator; anonymous is closed 4401."""

import json

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.db import transaction

from fleet.events import emit

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
WS_DB = pytest.mark.django_db(transaction=True)


@pytest.fixture
def memory_layer(settings):
    settings.CHANNEL_LAYERS = IN_MEMORY


def session_headers(client, user) -> list[tuple[bytes, bytes]]:
    client.force_login(user)
    cookie = f"{django_settings.SESSION_COOKIE_NAME}={client.cookies[django_settings.SESSION_COOKIE_NAME].value}"
    return [(b"cookie", cookie.encode()), (b"origin", b"http://localhost")]


def communicator(headers) -> WebsocketCommunicator:
    from console.asgi import application

    return WebsocketCommunicator(application, "/ws/console/", headers=headers)


@WS_DB
def test_it_pushes_a_committed_change_to_a_connected_operator(client, alice, memory_layer):
    headers = session_headers(client, alice)

    def change():
        with transaction.atomic():
            emit("runs-changed", "fleet-changed")

    async def scenario():
        ws = communicator(headers)
        connected, _ = await ws.connect()
        assert connected
        assert await ws.receive_nothing(timeout=0.1)
        await database_sync_to_async(change)()
        first = json.loads(await ws.receive_from(timeout=2))
        second = json.loads(await ws.receive_from(timeout=2))
        await ws.disconnect()
        return first, second

    assert async_to_sync(scenario)() == ({"trigger": "runs-changed"}, {"trigger": "fleet-changed"})


@WS_DB
def test_it_sends_nothing_before_commit(client, alice, memory_layer):
    headers = session_headers(client, alice)

    def rolled_back():
        try:
            with transaction.atomic():
                emit("fleet-changed")
                raise RuntimeError("abort")
        except RuntimeError:
            pass

    async def scenario():
        ws = communicator(headers)
        await ws.connect()
        await database_sync_to_async(rolled_back)()
        quiet = await ws.receive_nothing(timeout=0.3)
        await ws.disconnect()
        return quiet

    assert async_to_sync(scenario)() is True


@WS_DB
def test_it_closes_an_anonymous_socket_with_4401(memory_layer):
    async def scenario():
        ws = communicator([(b"origin", b"http://localhost")])
        connected, _ = await ws.connect()
        closed = await ws.receive_output(timeout=1)
        await ws.wait()
        return connected, closed

    connected, closed = async_to_sync(scenario)()
    assert connected  # accepted first: a pre-accept rejection would make htmx retry forever
    assert closed == {"type": "websocket.close", "code": 4401}


@WS_DB
def test_it_rejects_a_foreign_origin(client, alice, memory_layer):
    headers = [h for h in session_headers(client, alice) if h[0] != b"origin"] + [(b"origin", b"http://evil.example")]

    async def scenario():
        ws = communicator(headers)
        connected, _ = await ws.connect()
        return connected

    assert async_to_sync(scenario)() is False


@WS_DB
def test_it_closes_the_socket_when_the_user_logs_out(client, alice, memory_layer):
    headers = session_headers(client, alice)

    async def scenario():
        ws = communicator(headers)
        await ws.connect()
        await database_sync_to_async(client.post)("/logout/")
        closed = await ws.receive_output(timeout=2)
        return closed

    assert async_to_sync(scenario)() == {"type": "websocket.close", "code": 4401}
