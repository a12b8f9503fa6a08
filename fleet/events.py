"""Change topics raised by the fleet and the agent, delivered after the transaction commits.

``emit("fleet-changed", "runs-changed")`` schedules one ``changed`` signal per commit; the
console (``console.broadcast``) listens and pushes the topic names to every open console over
the websocket, where each region re-fetches its own partial. Lower layers never import the
console (dependency direction console → agent → fleet). :func:`stream` hands the chat answer's
streamed frames to the console the same way, at once.

Trigger events (:func:`trigger`) go to the agent the same way, on :data:`happened`.

Topics: fleet-changed, demand-changed, runs-changed, chat-changed, approvals-changed,
alerts-changed, actions-changed, settings-changed, rehearsals-changed (a rehearsal started,
advanced or ended), users-changed (superusers' sockets only:
``console.consumers.ROLE_TOPICS``).
"""

from django.db import transaction
from django.dispatch import Signal

#: sent with ``topics=[...]`` after commit
changed = Signal()

#: sent with ``kind=..., detail=...`` after commit: something happened that should start an agent
#: run (``agent.runtime.triggers`` listens; the fleet never imports the agent)
happened = Signal()


def emit(*topics: str) -> None:
    """Announce ``topics`` once the current transaction commits (at once outside one)."""
    topics = tuple(dict.fromkeys(topics))
    transaction.on_commit(lambda: changed.send(sender=None, topics=list(topics)))


#: sent with ``frame={...}`` at once (``agent.chat.chat_stream``: the chat answer as it streams)
streamed = Signal()


def stream(frame: dict) -> None:
    """Hand one chat stream frame (``agent.chat.chat_stream.ChatStream``) to the console now: frames are
    not database state, so they do not wait for a commit."""
    streamed.send(sender=None, frame=frame)


def trigger(kind: str, detail: str = "") -> None:
    """Announce a trigger event ``kind`` (``agent.runtime.triggers.PRIORITY`` names them) once the current
    transaction commits (at once outside one). ``detail`` is a short human text ("i-3 running →
    exited"). A listener's failure is logged, never raised: the Celery beat is the backup."""
    transaction.on_commit(lambda: happened.send_robust(sender=None, kind=kind, detail=detail))
