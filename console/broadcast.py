"""Push ``fleet.events.changed`` topics to every open console over the channel layer.

``fleet.events.emit`` fires the ``changed`` signal after commit; :func:`on_changed` forwards the
topic list to group ``console`` as ``{"type": "console.signal", "topics": [...]}``. A broken
channel layer (Redis unreachable) is logged and swallowed: a page refresh still shows the truth,
and the action that emitted must not fail because nobody could be told.
"""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

#: the channel-layer group every signed-in console joins (``console.consumers`` joins it)
GROUP = "console"


def user_group(user_id: int) -> str:
    """The per-user group, used to close a user's sockets when they log out."""
    return f"user.{user_id}"


def send_topics(topics: list[str]) -> bool:
    """Group-send ``topics`` to the console group. Returns False (and logs) when the layer fails."""
    layer = get_channel_layer()
    if layer is None or not topics:
        return False
    try:
        async_to_sync(layer.group_send)(GROUP, {"type": "console.signal", "topics": list(topics)})
    except Exception as exc:  # redis down, layer full: never break the caller
        log.warning("console broadcast of %s failed: %s", topics, exc)
        return False
    return True


def on_changed(sender, topics=(), **kwargs) -> None:
    """Receiver for :data:`fleet.events.changed` (connected in ``ConsoleConfig.ready``)."""
    send_topics(list(topics))


def on_streamed(sender, frame=None, **kwargs) -> None:
    """Receiver for :data:`fleet.events.streamed`: one chat stream frame (``agent.chat.chat_stream``) to
    the console group as ``{"type": "console.chat", "frame": {...}}``. A failing layer is logged:
    the chat region's next re-fetch shows what the run stored."""
    layer = get_channel_layer()
    if layer is None or not frame:
        return
    try:
        async_to_sync(layer.group_send)(GROUP, {"type": "console.chat", "frame": frame})
    except Exception as exc:
        log.warning("chat stream frame for run %s not sent: %s", frame.get("run"), exc)


def send_to_user(user_id: int, event: dict) -> bool:
    """Send a layer ``event`` to one user's open sockets (``console.force_close`` closes them,
    ``console.set_role`` changes the topics they get). Returns False (and logs) when the layer fails."""
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        async_to_sync(layer.group_send)(user_group(user_id), event)
    except Exception as exc:
        log.warning("sending %s to the sockets of user %s failed: %s", event.get("type"), user_id, exc)
        return False
    return True


def on_logged_out(sender, request=None, user=None, **kwargs) -> None:
    """Receiver for ``user_logged_out``: close that user's open sockets."""
    if user is not None:
        send_to_user(user.pk, {"type": "console.force_close"})
