"""The one reader of numbers an operator types: settings limits, the target, demo enqueue, objectives.

An operator's number is a plain ASCII decimal: the digits ``0``-``9``, at most one ``.`` followed by
digits, nothing else. Python's own ``float()``/``int()`` read much more (``1e-320``, full-width
``１０``, Arabic-Indic ``٤``, ``1_0``, ``-0``, ``inf``), which let one form accept what another
refused; every entry point calls :func:`parse_number` (or :func:`parse_number_list`) instead, so
they accept and refuse the same texts with the same words. No sign is accepted: every operator
number is at least 0.

A value that is already a number (a JSON body, a replay file) is judged by the text it was written
as: the ``text`` attribute a JSON number literal carries (``agent.replay.file_format`` keeps it), or
else its ``repr`` (``1e-320``, ``-0.0`` and ``1e+16`` are refused as typed text would be).
"""

import math
import re

#: the only shape accepted: ASCII digits, optionally ``.`` and more digits (``re.ASCII``: ``\d`` is not used)
PLAIN = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,15})?", re.ASCII)
#: the longest list :func:`parse_number_list` reads
LIST_MAX = 10


class NumberError(ValueError):
    """A typed number was refused. ``field`` names it, ``message`` says what was wrong and what to
    write instead; ``str()`` is the one line ``"<field> <message>"``
    (``"max_dph must be a plain decimal with no sign or exponent, e.g. 10 (got '1e-320')"``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field} {message}")
        self.field, self.message = field, message


def fmt(x) -> str:
    """``x`` for a message: whole numbers with thousands commas (``1,000,000``), others as ``:g``."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _text_of(value) -> str:
    if isinstance(value, str):
        return value.strip()
    text = getattr(value, "text", None)
    if isinstance(text, str):
        return text.strip()
    return repr(value)


def _why(text: str, example: str, noun: str) -> str:
    """Why ``text`` is not a plain decimal, in words (the first reason that applies)."""
    if not text:
        return f"must be {noun}, e.g. {example}"
    if text[0] in "-\u2212":
        return f"must be a plain decimal with no sign: it cannot be negative, not even -0, e.g. {example}"
    if any(not c.isascii() and (c.isdigit() or c.isnumeric()) for c in text):
        return f"must be written with the digits 0-9; full-width and other digits are not accepted, e.g. {example}"
    if "[" in text or "]" in text or "," in text:
        return f"must be one number, not a list, e.g. {example}"
    if "_" in text or " " in text:
        return f"must be {noun} written with the digits 0-9 only, no _ or space separators, e.g. {example}"
    if text[0] == "+" or re.fullmatch(r"[0-9.]*[eE][0-9+\-]*", text, re.ASCII):
        return f"must be a plain decimal with no sign or exponent, e.g. {example}"
    return f"must be {noun}, e.g. {example}"


def parse_number(value, field: str, *, low: float, high: float, whole: bool = False,
                 places: int | None = None, example: str | None = None) -> int | float:
    """``value`` (typed text, or a number judged by its text) as a number in ``[low, high]``.

    ``whole``: an ``int`` is returned and a fraction is refused (``6.0`` is 6); otherwise a
    ``float``. ``places``: at most that many decimals. ``example`` is shown in the message
    (default: a value in range). Booleans, lists, ``None`` and every text that is not
    :data:`PLAIN` raise :class:`NumberError` naming ``field``."""
    example = example or fmt(max(low, min(high, 10)))
    noun = "a whole number" if whole else "a number"
    span = f"between {fmt(low)} and {fmt(high)}"
    if isinstance(value, bool) or value is None or isinstance(value, list | tuple | dict):
        kind = "a list" if isinstance(value, list | tuple) else "a mapping" if isinstance(value, dict) else repr(value)
        raise NumberError(field, f"must be {noun} {span}, not {kind}")
    if isinstance(value, float) and not math.isfinite(value):
        raise NumberError(field, f"must be a number (a finite one) {span} (got {value!r})")
    text = _text_of(value)
    if not PLAIN.fullmatch(text):
        raise NumberError(field, f"{_why(text, example, noun)} (got {text[:40]!r})")
    whole_part, _, fraction = text.partition(".")
    if places is not None and len(fraction) > places:
        raise NumberError(field, f"must have at most {places} decimal{'s' if places != 1 else ''} (got {text})")
    if whole and fraction.strip("0"):
        raise NumberError(field, f"must be a whole number {span} (got {text})")
    number = int(whole_part) if whole else float(text)
    if not low <= number <= high:
        raise NumberError(field, f"must be {span} (got {text})")
    return number


def parse_number_list(value, field: str, *, low: float, high: float, whole: bool = True,
                      length: int | None = None) -> list:
    """A flat list of numbers, each read by :func:`parse_number`: a list/tuple, or typed text
    ``"3, 5, 8"`` / ``"[3, 5, 8]"`` (one pair of outer brackets at most). A nested list, an empty
    item or more than :data:`LIST_MAX` items raise :class:`NumberError`; ``length`` fixes the count."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        if "[" in text or "]" in text:
            raise NumberError(field, f"must be a flat list of numbers, e.g. 3, 5, 8 (nested lists are not read; got {value[:40]!r})")
        items = [part.strip() for part in text.split(",")] if text.strip() else []
        if any(not item for item in items):
            raise NumberError(field, "has an empty item; write numbers separated by commas, e.g. 3, 5, 8")
    elif isinstance(value, list | tuple):
        if any(isinstance(v, list | tuple | dict) for v in value):
            raise NumberError(field, "must be a flat list of numbers, e.g. [3, 5, 8] (nested lists are not read)")
        items = list(value)
    else:
        raise NumberError(field, "must be a list of numbers, e.g. 3, 5, 8")
    if len(items) > LIST_MAX:
        raise NumberError(field, f"must hold at most {LIST_MAX} numbers (got {len(items)})")
    if length is not None and len(items) != length:
        raise NumberError(field, f"must be {length} numbers (got {len(items)})")
    return [parse_number(item, field, low=low, high=high, whole=whole) for item in items]
