"""The chat answer as it streams: model deltas coalesced into a few frames per second.

The ``llm`` planner streams a chat run's model calls (``agent.model.model_client.chat`` with
``on_delta``); a :class:`ChatStream` is that ``on_delta``. It gathers the text and the names of the
tool calls the model starts, and hands them on as one frame at most every :data:`INTERVAL_S`
(100 ms: one channel-layer message per token would fill the layer), plus
one when the model call ends. A frame is a dict::

    {"run": <run number>, "turn": <turn index>, "text": "<new text since the last frame>",
     "tools": ["<tool name started since the last frame>", ...]}

Verdict blocks (``<verdict>…</verdict>``) are never shown as text: the text after an
opening ``<`` that may begin ``<verdict>`` is held back until it is known not to, and everything
inside a block is dropped.

Frames go through :func:`fleet.events.stream` (sent at once, not on commit: they are not database
state); the console forwards them to the sockets of users who see the chat. The text is redacted
(``fleet.secrets.redact``) piece by piece. What the run stores (its text steps, final answer and
call steps) stays the record; a lost frame only delays what the page shows until the chat region
re-fetches.
"""

import time

from agent.chat.verdicts import CLOSE, OPEN
from fleet.events import stream
from fleet.secrets import redact

#: seconds between frames while text arrives
INTERVAL_S = 0.1


class VerdictFilter:
    """Feeds streamed text through, dropping ``<verdict>…</verdict>`` blocks.

    :meth:`feed` returns the text that can be shown now; a possible start of a block (``<``,
    ``<ver`` …) is held until the next piece decides it. :meth:`end` returns what was held when the
    stream ends (an unclosed block is dropped: it is a verdict, even if malformed).
    """

    def __init__(self):
        self._held = ""
        self._inside = False

    def feed(self, piece: str) -> str:
        text = self._held + piece
        self._held = ""
        out = []
        while text:
            if self._inside:
                stop = text.find(CLOSE)
                if stop < 0:
                    # keep a possible partial closing tag, drop the rest of the block
                    keep = _partial_suffix(text, CLOSE)
                    self._held = text[len(text) - keep:] if keep else ""
                    return "".join(out)
                text = text[stop + len(CLOSE):]
                self._inside = False
                continue
            start = text.find(OPEN)
            if start >= 0:
                out.append(text[:start])
                text = text[start + len(OPEN):]
                self._inside = True
                continue
            keep = _partial_suffix(text, OPEN)
            out.append(text[:len(text) - keep])
            self._held = text[len(text) - keep:] if keep else ""
            break
        return "".join(out)

    def end(self) -> str:
        held, self._held = self._held, ""
        return "" if self._inside else held


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ChatStream:
    """The ``on_delta`` of a chat run's model calls (``LlmPlanner(on_delta=ChatStream(n))``).

    ``send(frame)`` receives each frame (default :func:`fleet.events.stream`); ``interval`` is the
    least time between frames in seconds; ``now`` a monotonic clock. Frames are sent from the
    thread that calls it (the Celery worker running the cycle). Raises nothing: a failing ``send``
    is the broadcaster's to log.
    """

    def __init__(self, run_number: int, *, send=None, interval: float = INTERVAL_S, now=time.monotonic):
        if send is None:
            send = stream
        self.run_number = run_number
        self.send = send
        self.interval = interval
        self.now = now
        self.turn = 0
        self.frames = 0
        self._text: list[str] = []
        self._tools: list[str] = []
        self._last = 0.0
        self._filter = VerdictFilter()

    def begin_turn(self, turn: int) -> None:
        """A model call for turn ``turn`` starts (the planner calls this before each request)."""
        self.flush()
        self.turn = turn
        self._filter = VerdictFilter()

    def __call__(self, kind: str, text: str) -> None:
        """One delta: ``kind`` ``"text"`` (a content piece) or ``"tool"`` (a tool call's name)."""
        if kind == "text":
            shown = self._filter.feed(text or "")
            if shown:
                self._text.append(shown)
        elif kind == "tool":
            self._tools.append(str(text)[:80])
        if self.now() - self._last >= self.interval:
            self.flush()

    def flush(self, *, final: bool = False) -> None:
        """Send what was gathered as one frame (nothing when nothing was); ``final`` also releases
        text held by the verdict filter (the model call ended)."""
        if final:
            rest = self._filter.end()
            if rest:
                self._text.append(rest)
        if not self._text and not self._tools:
            return
        frame = {"run": self.run_number, "turn": self.turn, "text": redact("".join(self._text)), "tools": self._tools}
        self._text, self._tools = [], []
        self._last = self.now()
        self.frames += 1
        self.send(frame)
