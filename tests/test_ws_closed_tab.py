"""A tab that closes while a change signal is on its way: the consumer drops the frame quietly
(daphne once logged "Attempt to send on a closed protocol" with a traceback).

The ASGI server's ``send`` is daphne's behaviour after the peer went away: autobahn raises
``Disconnected`` from ``sendMessage``; the consumer is the real one."""

import asyncio

from autobahn.exception import Disconnected

from console.consumers import ConsoleConsumer


def test_a_signal_for_a_closed_tab_is_dropped_without_an_error():
    sent = []

    async def send(message):
        if message["type"] == "websocket.send":
            raise Disconnected("Attempt to send on a closed protocol")
        sent.append(message)

    async def go():
        consumer = ConsoleConsumer()
        consumer.base_send = send
        consumer.topics = frozenset({"runs-changed", "fleet-changed"})
        await consumer.console_signal({"type": "console.signal", "topics": ["runs-changed", "fleet-changed"]})

    asyncio.run(go())  # raised Disconnected before


def test_a_signal_for_an_open_tab_is_sent():
    sent = []

    async def send(message):
        sent.append(message)

    async def go():
        consumer = ConsoleConsumer()
        consumer.base_send = send
        consumer.topics = frozenset({"runs-changed"})
        await consumer.console_signal({"type": "console.signal", "topics": ["runs-changed", "users-changed"]})

    asyncio.run(go())
    assert sent == [{"type": "websocket.send", "text": '{"trigger": "runs-changed"}'}]

