"""Secrets are referenced, resolved at use, and redacted everywhere text leaves the runtime.

DESIGN.md invariant 6 and seed 003 ("reference, not plaintext"). :func:`resolve` turns a
reference (``env:NAME`` or ``file:/path``) into the value at the moment of use; :func:`redact`
removes secret-shaped strings from any text before it is stored, logged, broadcast, rendered or
sent to the model.

Which shapes are secrets (the one list; ``tests/secret_corpus.py`` holds an example of each):

- PEM private keys (``-----BEGIN ... PRIVATE KEY-----``): the whole block, to its END line or
  the end of the text;
- authorization values: ``Bearer``/``Token``/``Basic`` followed by 12+ token characters;
- prefixed keys: ``sk-``/``sk_live_``/``rk_live_`` (OpenAI, Anthropic, OpenRouter, Stripe),
  ``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_``/``github_pat_`` (GitHub), ``glpat-`` (GitLab),
  ``hf_`` (Hugging Face), ``AKIA…`` (AWS key id), ``AIza…`` (Google), ``xox?-`` (Slack),
  ``npm_``, and JWTs (``eyJ….….…``);
- the password of a URL (``scheme://user:PASSWORD@host``);
- the value of a pair whose key names a secret (api key, secret, password, passphrase, token,
  credential, private key), however it is written: ``password=X``, ``"api_key": "X"``,
  ``api key: X``, ``AWS_SECRET_ACCESS_KEY = X``, ``--password X`` and prose ``password is X``
  (not when X is a plain word such as "required" or "incorrect");
- a bare run of 64 or more hex digits (vast.ai API keys are 64 hex; so are raw private keys,
  ``0x``-prefixed or not), except a digest labelled ``sha256:``.

Not secrets, never redacted: hex runs under 64 digits (idempotency keys are 40 hex, operator
keys 36, git commits 40, dashless UUIDs 32), instance ids (``v-123``, ``local-1``), GPU UUIDs
(``GPU-xxxxxxxx-xxxx-…``), offer ids and ``sha256:`` digests.

Cost: one left-to-right scan. Every pattern is free of nested or unbounded-then-failable
repeats (only a trailing greedy repeat is unbounded, and it cannot fail once started), and each
start is anchored so a run of letters is entered once; work is proportional to the input
(``bench/redaction.py`` measures it, ``tests/test_regex_fuzz.py`` checks the shapes).
"""

import logging
import os
import re
from pathlib import Path

MARK = "[REDACTED]"

#: characters of a log message kept after redaction (a 404 with a 1 MB path logs this much)
LOG_CAP = 2000

# one start per run: a shape never begins inside a run of the characters it is made of
_KEY_CHARS = r"A-Za-z0-9_\-"
_SECRET_KEY_NAMES = (
    r"api[ _\-]?key|apikey|api[ _\-]?token|api[ _\-]?secret|secret|password|passwd|passphrase|pwd"
    r"|access[ _\-]?token|auth[ _\-]?token|refresh[ _\-]?token|session[ _\-]?token|private[ _\-]?key"
    r"|client[ _\-]?secret|credentials?"
)
_SHAPES = re.compile(
    "|".join([
        # PEM private key header; the block to its END line is cut by redact()
        r"(?P<pem>-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY-----)",
        # password in a URL: scheme://user:PASSWORD@host (the user and host are kept)
        r"(?P<url>://[^:/@\s]{0,256}:)(?P<urlpw>[^@\s/]{1,256})@",
        # authorization schemes; "HF_TOKEN=…" counts, "prompt_tokens=…" does not
        r"(?<![A-Za-z0-9])(?i:(?P<auth>(?:bearer|token|basic)(?:[ \t]{1,8}|[ \t]{0,4}[:=][ \t]{0,4})))"
        r"(?P<authv>[A-Za-z0-9._~+/=\-]{12,})",
        # provider-prefixed keys and JWTs
        rf"(?<![{_KEY_CHARS}])(?:sk-|sk_live_|rk_live_|sk_test_|gh[pousr]_|github_pat_|glpat-|hf_|npm_|xox[abpr]-)"
        rf"[{_KEY_CHARS}]{{10,}}",
        r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])",
        rf"(?<![{_KEY_CHARS}])AIza[{_KEY_CHARS}]{{30,}}",
        rf"(?<![{_KEY_CHARS}.])eyJ[{_KEY_CHARS}]{{8,4096}}\.[{_KEY_CHARS}]{{8,4096}}\.[{_KEY_CHARS}]{{8,}}",
        # key = value pairs whose key names a secret
        rf"(?P<kv>(?P<kvk>(?i:{_SECRET_KEY_NAMES})[\w\-]{{0,40}})[\"']?"
        r"(?:[ \t]{0,4}(?:[:=]|=>)[ \t]{0,4}|[ \t]{1,4}(?i:is)(?:[ \t]{0,4}:)?[ \t]{1,4})[\"']?)"
        r"(?P<kvv>[^\s\"'&,;}<>]{4,})",
        # command-line flags: --password X, --api-key X
        r"(?P<flag>(?<![\w\-])--(?i:password|passwd|passphrase|api-key|apikey|token|secret|client-secret|access-token"
        r"|auth-token)[ \t]{1,4})(?P<flagv>[^\s\"'&,;}<>\-][^\s\"'&,;}<>]{3,})",
        # bare hex of 64+ digits
        r"(?<![0-9A-Fa-f])(?<!sha256:)[0-9A-Fa-f]{64,}",
    ])
)
# prose that follows "password is" without being one
_NOT_VALUES = frozenset(
    "required incorrect invalid wrong missing empty unset none null expired correct changed reset"
    " ok valid being still now not too the a an set stored hidden redacted".split()
)


def _not_a_secret(key: str, value: str) -> bool:
    """A keyed value that is kept: a plain word, a reference (``env:``/``file:``), the mark, or the
    value of a key that names where a secret lives (``password_file``, ``api_key_ref``)."""
    return (value.lower().strip(".!") in _NOT_VALUES or value.startswith(("env:", "file:", MARK))
            or key.lower().endswith(("file", "ref", "path", "env", "_name")))


def redact(text: str) -> str:
    """Return ``text`` with every secret-shaped substring replaced by ``[REDACTED]``.

    Shapes: the module docstring. Linear in ``len(text)``; idempotent
    (``redact(redact(t)) == redact(t)``). Non-strings and empty strings are returned as is.
    """
    if not isinstance(text, str) or not text:
        return text
    out: list[str] = []
    pos = 0
    search = _SHAPES.search
    while (m := search(text, pos)) is not None:
        start, end = m.span()
        out.append(text[pos:start])
        if m.group("pem") is not None:
            out.append(MARK)
            stop = text.find("-----END", end)
            if stop < 0:
                end = len(text)
            else:
                close = text.find("-----", stop + 8, stop + 80)
                end = close + 5 if close >= 0 else stop + 8
        elif m.group("urlpw") is not None:
            out.append(m.group("url") + MARK + "@")
        elif m.group("authv") is not None:
            out.append(m.group("auth") + MARK)
        elif m.group("kvv") is not None:
            out.append(m.group(0) if _not_a_secret(m.group("kvk"), m.group("kvv")) else m.group("kv") + MARK)
        elif m.group("flagv") is not None:
            out.append(m.group(0) if _not_a_secret("", m.group("flagv")) else m.group("flag") + MARK)
        else:
            out.append(MARK)
        if end == start:  # cannot happen (every shape consumes), but never loop forever
            end += 1
            out.append(text[start:end])
        pos = end
    out.append(text[pos:])
    return "".join(out)


def redact_obj(obj):
    """Redact every string inside a JSON-shaped object (dicts, lists, tuples, scalars); dict keys too."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact(k) if isinstance(k, str) else k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
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
    """Logging filter that redacts secrets from every record's formatted message and cuts it to
    :data:`LOG_CAP` characters (a 404 for a 1 MB path logs 2,000 characters of it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        try:
            msg = record.getMessage()
        except Exception:
            return True
        # redact a little past the cap, so a secret straddling the cut is caught whole
        clean = redact(msg[: LOG_CAP + 512])
        if len(msg) > LOG_CAP:
            clean = f"{clean[:LOG_CAP]}… [{len(msg)} characters, cut to {LOG_CAP}]"
        if clean != msg:
            record.msg, record.args = clean, ()
        return True
