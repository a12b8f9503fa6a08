"""A socket gets only what its user's role may see: viewers and operators the console topics,
superusers also ``users-changed``; a topic outside the table is never sent; a frame is only
``{"trigger": topic}``. A deactivated user's open socket is closed and a new one refused."""

import json

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client

from console.consumers import CONSOLE_TOPICS
from console.users import do_set_active, do_set_role
from fleet.events import emit
from tests.test_websocket import communicator, memory_layer, session_headers  # noqa: F401 (fixture)

WS_DB = pytest.mark.django_db(transaction=True)


async def _frames(ws) -> list[dict]:
    frames = []
    while not await ws.receive_nothing(timeout=0.3):
        frames.append(json.loads(await ws.receive_from(timeout=1)))
    return frames


def _emit(*topics):
    with transaction.atomic():
        emit(*topics)


@WS_DB
def test_each_role_gets_its_topics_only(alice, bob, memory_layer):  # noqa: F811
    root = User.objects.create_superuser("root", password="x")
    headers = {name: session_headers(Client(), user) for name, user in [("viewer", bob), ("operator", alice),
                                                                          ("superuser", root)]}

    async def scenario():
        sockets = {name: communicator(h) for name, h in headers.items()}
        for ws in sockets.values():
            assert (await ws.connect())[0]
        await database_sync_to_async(_emit)("users-changed", "fleet-changed", "not-a-topic", "approvals-changed")
        got = {name: await _frames(ws) for name, ws in sockets.items()}
        for ws in sockets.values():
            await ws.disconnect()
        return got

    got = async_to_sync(scenario)()
    console = [{"trigger": "fleet-changed"}, {"trigger": "approvals-changed"}]
    assert got == {"viewer": console, "operator": console,
                   "superuser": [{"trigger": "users-changed"}, *console]}
    assert "users-changed" not in CONSOLE_TOPICS


@WS_DB
def test_a_role_change_keeps_the_socket_and_a_deactivation_closes_it(bob, memory_layer):  # noqa: F811
    headers = session_headers(Client(), bob)

    async def scenario():
        ws = communicator(headers)
        assert (await ws.connect())[0]
        await database_sync_to_async(lambda: do_set_role(bob, "operator", actor="user:root"))()
        after_role = await _frames(ws)
        await database_sync_to_async(lambda: do_set_active(bob, False, actor="user:root"))()
        closed = await ws.receive_output(timeout=2)
        while closed["type"] == "websocket.send":  # the audit row's actions-changed may come first
            closed = await ws.receive_output(timeout=2)
        again = communicator(headers)
        await again.connect()
        refused = await again.receive_output(timeout=2)
        return after_role, closed, refused

    after_role, closed, refused = async_to_sync(scenario)()
    assert after_role == [{"trigger": "actions-changed"}]  # the audit row of the change; users-changed is not theirs
    assert closed == {"type": "websocket.close", "code": 4401}
    assert refused == {"type": "websocket.close", "code": 4401}
