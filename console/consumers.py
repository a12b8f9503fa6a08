"""The console's one websocket: ``/ws/console/`` pushes change topics to signed-in users.

Protocol (server → browser only): one JSON text frame per topic, ``{"trigger": "<topic>"}``
(topics: ``fleet.events`` docstring). The browser re-fetches the regions that listen for the topic
over plain HTTP. The one exception is the chat answer as it streams: ``{"chat": {"run", "turn",
"text", "tools"}}`` frames (``agent.chat.chat_stream``), a few per second, sent to sockets that get
``chat-changed``; the chat region's re-fetch replaces them with what the run stored. The socket
never carries side effects; anything the browser sends is ignored. A socket gets only the topics of pages its user's role may see (:data:`ROLE_TOPICS`; the
role is read at connect and updated by ``console.set_role`` when a superuser changes it); a topic
not in the table is never sent. An anonymous socket is accepted then closed with code 4401, which htmx 2 does not retry
(a pre-accept rejection becomes close 1006 in the browser, which it retries forever).
"""

import json

from autobahn.exception import Disconnected
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from console.broadcast import GROUP, user_group
from console.users import role_of

#: close code for a socket without a signed-in user
CLOSE_UNAUTHENTICATED = 4401

#: the topics of pages every signed-in user sees (viewers see every console page)
CONSOLE_TOPICS = frozenset({"fleet-changed", "demand-changed", "runs-changed", "chat-changed", "approvals-changed",
                            "alerts-changed", "actions-changed", "settings-changed",
                            "memory-changed", "rehearsals-changed"})
#: the topics each role's socket receives (``console.users`` defines the roles)
ROLE_TOPICS = {
    "viewer": CONSOLE_TOPICS,
    "operator": CONSOLE_TOPICS,
    "superuser": CONSOLE_TOPICS | {"users-changed"},
}


class ConsoleConsumer(AsyncWebsocketConsumer):
    """Forwards ``console.signal`` layer events as ``{"trigger": topic}`` frames."""

    async def connect(self) -> None:
        self.joined: list[str] = []
        self.topics: frozenset = frozenset()
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.topics = ROLE_TOPICS.get(await database_sync_to_async(role_of)(user), frozenset())
        for group in (GROUP, user_group(user.pk)):
            await self.channel_layer.group_add(group, self.channel_name)
            self.joined.append(group)

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        """Ignore client frames: side effects travel over HTTP POST with CSRF, never over the socket."""

    async def console_signal(self, event: dict) -> None:
        """Layer event ``{"type": "console.signal", "topics": [str, ...]}``: one frame per topic."""
        for topic in event.get("topics", []):
            if topic in self.topics:
                try:
                    await self.send(text_data=json.dumps({"trigger": topic}))
                except Disconnected:
                    # the tab closed between the signal and this frame (daphne raises autobahn's
                    # "Attempt to send on a closed protocol"): nothing to deliver, nothing to log
                    return

    async def console_chat(self, event: dict) -> None:
        """Layer event ``{"type": "console.chat", "frame": {...}}``: one ``{"chat": frame}`` frame
        to sockets whose role sees the chat."""
        if "chat-changed" in self.topics:
            await self.send(text_data=json.dumps({"chat": event.get("frame") or {}}))

    async def console_set_role(self, event: dict) -> None:
        """Layer event ``{"type": "console.set_role", "role": str}``: this user's role changed."""
        self.topics = ROLE_TOPICS.get(event.get("role", ""), frozenset())

    async def console_force_close(self, event: dict) -> None:
        """Layer event sent on logout: close this user's socket (auth is only checked at connect)."""
        await self.close(code=CLOSE_UNAUTHENTICATED)
