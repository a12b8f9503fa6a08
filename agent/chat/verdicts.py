"""The verdict block a model's answer carries: ``<verdict>{"action": …, "state_changed": …}</verdict>``.

Found, parsed and removed here for every reader (the loop, the chat stream, the context, the
report, the console): a low room, so none of them imports a planner for it.
"""

import json

OPEN, CLOSE = "<verdict>", "</verdict>"


def verdict_blocks(text: str) -> list[tuple[int, int, str]]:
    """Every ``<verdict>…</verdict>`` block of ``text``, left to right, as ``(start, end, body)``.

    Found with ``str.find`` (linear): a regex ``<verdict>(.*?)</verdict>`` rescans the rest of
    the text from every unclosed ``<verdict>``, which is quadratic in model output.
    """
    blocks, pos = [], 0
    text = text or ""
    while (start := text.find(OPEN, pos)) >= 0:
        stop = text.find(CLOSE, start + len(OPEN))
        if stop < 0:
            break
        blocks.append((start, stop + len(CLOSE), text[start + len(OPEN):stop]))
        pos = stop + len(CLOSE)
    return blocks


def without_verdicts(text: str, sep: str = "", strip: bool = False) -> str:
    """``text`` with its verdict blocks removed, the pieces joined by ``sep``; ``strip`` also drops
    the whitespace around each block (what a reader sees)."""
    text = text or ""
    parts, pos = [], 0
    for start, end, _ in verdict_blocks(text):
        parts.append(text[pos:start])
        pos = end
    parts.append(text[pos:])
    if strip:
        parts = [p.rstrip() if i == 0 else p.lstrip() if i == len(parts) - 1 else p.strip() for i, p in enumerate(parts)]
    return sep.join(parts)


def parse_verdict(text: str) -> tuple[bool, bool] | None:
    """``(action, state_changed)`` from a ``<verdict>{...}</verdict>`` block, or ``None``.

    Both fields must be JSON booleans: ``"yes"``, ``1`` or a missing field is malformed and gives
    ``None`` (unknown), never a guess. Use :func:`has_verdict_block` to tell a
    malformed verdict from a missing one.
    """
    blocks = verdict_blocks(text)
    if not blocks:
        return None
    try:
        data = json.loads(blocks[0][2])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    action, changed = data.get("action"), data.get("state_changed")
    if not isinstance(action, bool) or not isinstance(changed, bool):
        return None
    return action, changed


def has_verdict_block(text: str) -> bool:
    """Whether ``text`` carries a ``<verdict>…</verdict>`` block at all (well-formed or not)."""
    return bool(verdict_blocks(text))
