"""Checking the text an operator types before any effect (docs/secrets.md, Text operators type).

Each ``do_*`` writes its audit row and announces change topics after commit (``agent.actions``).
"""





def check_text(field: str, value, *, required: bool = False, limit: int = 2000) -> str:
    """``value`` stripped, or ValueError naming ``field`` when it is not storable text.

    Refused before any effect (docs/secrets.md, Text operators type): not a string, a NUL byte (PostgreSQL cannot store
    it), a lone surrogate such as ``\\ud800`` (not encodable as UTF-8), longer than ``limit``
    characters, or empty when ``required``.
    """
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise ValueError(f"{field} must be text")
    if "\x00" in value:
        raise ValueError(f"{field} contains a NUL byte; remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{field} contains an unpaired surrogate (not valid Unicode text); retype it") from None
    value = value.strip()
    if len(value) > limit:
        raise ValueError(f"{field} is longer than {limit:,} characters; shorten it")
    if required and not value:
        raise ValueError(f"say why: the {field} goes to the audit log")
    return value
