"""Secrets are referenced, resolved at use, and redacted everywhere text leaves the runtime.

DESIGN.md invariant 6 and seed 003 ("reference, not plaintext"). :func:`resolve` turns a
reference (``env:NAME`` or ``file:/path``) into the value at the moment of use; :func:`redact`
removes secret-shaped strings from any text before it is stored, logged, broadcast, rendered or
sent to the model.
"""

import logging
import os
import re
from pathlib import Path

MARK = "[REDACTED]"

_PATTERNS = [
    # PEM private keys (RSA, EC, OPENSSH, PKCS8), whole block
    re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S),
    # Authorization headers and bearer tokens
    re.compile(r"(?i)\b(bearer|token|basic)\s+[A-Za-z0-9._~+/=-]{12,}"),
    # OpenAI / Anthropic / OpenRouter style keys
    re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"),
    # GitHub tokens
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    # AWS access key ids and Slack tokens
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\bxox[abpr]-[A-Za-z0-9-]{10,}"),
    # JWTs
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
]
# password inside a URL: scheme://user:PASSWORD@host
_URL_PASSWORD = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)([^@\s]+)(@)")
# key=value / "key": "value" where the key names a secret
_KEYED = re.compile(
    r"""(?ix)
    ((?:[\w-]*?(?:api[_-]?key|apikey|secret|password|passwd|pwd|access[_-]?token|auth[_-]?token|private[_-]?key|client[_-]?secret)[\w-]*)
     ["']?\s*[:=]\s*["']?)
    ([^\s"'&,;}]{4,})
    """
)


def redact(text: str) -> str:
    """Return ``text`` with every secret-shaped substring replaced by ``[REDACTED]``.

    Catches PEM private keys, bearer/basic tokens, ``sk-``/GitHub/AWS/Slack keys, JWTs,
    passwords in URLs and ``password=``/``api_key: ...`` pairs. Non-strings are returned as is.
    """
    if not isinstance(text, str) or not text:
        return text
    for pat in _PATTERNS:
        text = pat.sub(MARK, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + MARK + m.group(3), text)
    text = _KEYED.sub(lambda m: m.group(1) + MARK, text)
    return text


def redact_obj(obj):
    """Redact every string inside a JSON-shaped object (dicts, lists, scalars)."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact_obj(v) for v in obj]
    return obj


class SecretReferenceError(ValueError):
    """A secret reference could not be resolved (names the reference, never a value)."""


def resolve(ref: str) -> str:
    """Resolve ``env:NAME`` or ``file:/path`` to the secret's value, at the moment of use.

    Raises :class:`SecretReferenceError` naming the reference when it is malformed, the variable
    is unset or the file is missing. The value is never logged or stored by this function.
    """
    if ref.startswith("env:"):
        name = ref[4:]
        value = os.environ.get(name)
        if not value:
            raise SecretReferenceError(f"secret reference {ref!r}: environment variable {name} is not set")
        return value
    if ref.startswith("file:"):
        path = Path(ref[5:])
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise SecretReferenceError(f"secret reference {ref!r}: cannot read file ({exc.strerror})") from None
    raise SecretReferenceError(f"secret reference {ref!r}: use env:NAME or file:/path")


class RedactingFilter(logging.Filter):
    """Logging filter that redacts secrets from every record's formatted message."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        try:
            msg = record.getMessage()
        except Exception:
            return True
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, ()
        return True
