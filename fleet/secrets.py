"""Secrets are referenced, resolved at use, and redacted where text enters.

A secret is a reference, never plaintext. :func:`resolve` turns a reference (``env:NAME`` or
``file:/path``) into the value at the moment of use; :func:`redact` removes secret-shaped strings
from any text. Stored text is redacted once, where it is written: every text column of ``agent``
and ``fleet`` (:func:`install_field_redaction`); logs by :class:`RedactingFilter`; what is sent
without being stored (the chat stream) by its sender. ``docs/secrets.md`` tells the whole rule.

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
  (not when X is a plain word such as "required" or "incorrect"). A quoted X (``"…"`` or ``'…'``,
  JSON-escaped or not) is secret up to its closing quote, spaces included, at most
  :data:`QUOTED_MAX` characters and not past a line end; an unquoted X runs to the next whitespace
  or quote, punctuation included (``Tr0ub4dor&3`` is one value);
- a bare run of 64 or more hex digits (vast.ai API keys are 64 hex; so are raw private keys,
  ``0x``-prefixed or not), except a digest labelled ``sha256:``.

Not secrets, never redacted: hex runs under 64 digits (idempotency keys are 40 hex, operator
keys 36, git commits 40, dashless UUIDs 32), instance ids (``v-123``, ``local-1``), GPU UUIDs
(``GPU-xxxxxxxx-xxxx-…``), offer ids and ``sha256:`` digests.

Cost: one scan per shape, then the spans are merged. No pattern has a nested or an
unbounded-then-failable repeat (only a trailing greedy repeat is unbounded, and it cannot fail
once started), and token shapes start only where a run starts, so a run of letters is entered
once: work is proportional to the input (``bench/redaction.py`` measures it,
``tests/test_regex_fuzz.py`` bounds every pattern and fuzzes the redactor).
"""

import functools
import logging
import os
import re
import stat
from pathlib import Path

from django.apps import apps
from django.db import models

MARK = "[REDACTED]"

#: characters of a log message kept after redaction (a 404 with a 1 MB path logs this much)
LOG_CAP = 2000

_K = r"A-Za-z0-9_\-"  # the characters keys and tokens are made of


def _at_word_start(literals: list[str], before: str = _K) -> str:
    """``literals`` as an alternation that matches only where a run starts: the character before
    is not in ``before`` (or is the ``n``/``r``/``t`` of a JSON escape such as ``\\n``). The
    literal comes first so the engine can skip ahead to it; the check looks back from its end."""
    return "(?:" + "|".join(
        rf"{re.escape(lit)}(?:(?<![{before}]{re.escape(lit)})|(?<=\\[nrt]{re.escape(lit)}))" for lit in literals
    ) + ")"


_KEY_NAMES = (  # factored by first letter; the lookahead before it lets most positions fail at once
    r"a(?:pi[ _\-]?(?:key|token|secret)|pikey|ccess[ _\-]?token|uth[ _\-]?token)"
    r"|s(?:ecret|ession[ _\-]?token)|p(?:ass(?:word|wd|phrase)|wd|rivate[ _\-]?key)"
    r"|refresh[ _\-]?token|c(?:lient[ _\-]?secret|redentials?)"
)
#: the value of a keyed secret: quoted, up to its closing quote (at most :data:`QUOTED_MAX` characters,
#: not past a line end or a backslash, so an escaped quote in JSON text closes it too); unquoted, to
#: the next whitespace or quote (``Tr0ub4dor&3`` is one value). Three groups, one of which matches.
QUOTED_MAX = 256
# an unquoted value that is itself the key of a pair ("passwd is password: X") is not the value: the
# scan moves on and takes the inner pair whole
# (possessive repeats: none of them can give back a character the next part needs)
_NEXT_KEY = rf"(?:{_KEY_NAMES})[\w\-]{{0,40}}+(?:\\{{0,3}}+[\"'])?(?:[ \t]{{0,4}}+[:=]|[ \t]{{1,4}}+is[ \t])"
_VALUE = (rf"(?:\\{{0,3}}\"(?P<dq>[^\"\\\n]{{1,{QUOTED_MAX}}}+)|\\{{0,3}}'(?P<sq>[^'\\\n]{{1,{QUOTED_MAX}}}+)"
          rf"|(?!{_NEXT_KEY})(?P<secret>[^\s\"'\\]{{4,}}))")
_VALUE_GROUPS = ("dq", "sq", "secret")
#: ``(name, pattern, the group that is the secret, or a tuple of groups of which one matched)``; each
#: pattern is scanned on its own and the secret spans of all of them are merged, so one shape never
#: hides another
SHAPES = [
    # PEM private key header; redact() extends the span to the END line (or the end of the text)
    ("pem", re.compile(r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY-----"), 0),
    # password in a URL: scheme://user:PASSWORD@host (the user and host are kept)
    ("url_password", re.compile(r"://[^:/@\s]{0,256}:(?P<secret>[^@\s/]{1,256})@"), "secret"),
    # authorization schemes; "HF_TOKEN=…" counts, "prompt_tokens=…" does not
    ("authorization", re.compile("(?=[BbTt])" + _at_word_start(["bearer", "token", "basic"], "A-Za-z0-9")
                                 + r"(?:[ \t]{1,8}|[ \t]{0,4}[:=][ \t]{0,4})(?P<secret>[A-Za-z0-9._~+/=\-]{12,})", re.I),
     "secret"),
    # provider-prefixed keys
    ("prefixed_key", re.compile(_at_word_start(["sk-", "sk_live_", "sk_test_", "rk_live_", "ghp_", "gho_", "ghu_",
                                                "ghs_", "ghr_", "github_pat_", "glpat-", "hf_", "npm_", "xoxa-",
                                                "xoxb-", "xoxp-", "xoxr-"]) + rf"[{_K}]{{10,}}"), 0),
    ("aws_key_id", re.compile(_at_word_start(["AKIA", "ASIA"]) + r"[0-9A-Z]{16}(?![A-Za-z0-9])"), 0),
    ("google_key", re.compile(_at_word_start(["AIza"]) + rf"[{_K}]{{30,}}"), 0),
    ("jwt", re.compile(_at_word_start(["eyJ"], _K + ".") + rf"[{_K}]{{8,4096}}\.[{_K}]{{8,4096}}\.[{_K}]{{8,}}"), 0),
    # key = value pairs whose key names a secret; quotes may be escaped (JSON inside a JSON string);
    # the key's tail is possessive (what follows it is never a word character)
    ("keyed", re.compile(
        rf"(?=[AaSsPpRrCc])(?P<key>(?:{_KEY_NAMES})[\w\-]{{0,40}}+)(?:\\{{0,3}}[\"'])?"
        r"(?:[ \t]{0,4}(?:[:=]|=>)[ \t]{0,4}|[ \t]{1,4}is(?:[ \t]{0,4}:)?[ \t]{1,4})" + _VALUE, re.I), _VALUE_GROUPS),
    # command-line flags: --password X, --password=X, --api-key "X Y"
    ("flag", re.compile(_at_word_start(["--"], r"\w\-") + r"(?:password|passwd|passphrase|api-key|apikey|token|secret"
                        r"|client-secret|access-token|auth-token)(?:[ \t]{1,4}|=)(?=[^\-])" + _VALUE, re.I),
     _VALUE_GROUPS),
    # bare hex of 64+ digits
    ("hex_key", re.compile(r"(?<![0-9A-Fa-f])(?<!sha256:)[0-9A-Fa-f]{64,}"), 0),
]
# prose that follows "password is" without being one
_NOT_VALUES = frozenset(
    "required incorrect invalid wrong missing empty unset none null expired correct changed reset"
    " ok valid being still now not too the a an set stored hidden redacted".split()
)


def _not_a_secret(key: str, value: str) -> bool:
    """A keyed value that is kept: a plain word, a reference (``env:``/``file:``), the mark, or the
    value of a key that names where a secret lives (``password_file``, ``api_key_ref``)."""
    return (value.lower().strip(".!,;:)]}>") in _NOT_VALUES or value.startswith(("env:", "file:", MARK))
            or key.lower().endswith(("file", "ref", "path", "env", "_name")))


def secret_spans(text: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans of ``text`` that are secrets, sorted and merged (see the module
    docstring for the shapes). Linear: each pattern is one bounded scan, each PEM block is searched
    for its END once."""
    spans = []
    for name, pattern, group in SHAPES:
        covered = pos = 0
        while (m := pattern.search(text, pos)) is not None:
            pos = max(m.end(), m.start() + 1)
            part = group if not isinstance(group, tuple) else next(g for g in group if m.start(g) >= 0)
            start, end = m.span(part)
            if name in ("keyed", "flag") and m.group(part).endswith(":"):
                # the "value" may itself hold a key ("passwd is X-Api-Key: V"): when a pair starts
                # inside it, scan again from there so the inner pair is taken whole (the next search
                # finds that pair, past the current one: still one forward pass)
                inner = pattern.search(text, start)
                if inner is not None and inner.start() < end:
                    pos = inner.start()
                    continue
            if name == "pem":
                if end <= covered:
                    continue  # a header inside a block already cut (one that only starts in it is cut on its own)
                stop = text.find("-----END", end)
                if stop < 0:
                    end = len(text)
                else:
                    close = text.find("-----", stop + 8, stop + 80)
                    end = close + 5 if close >= 0 else stop + 8
                covered = end
            elif name in ("keyed", "flag") and _not_a_secret(m.groupdict().get("key") or "", m.group(part)):
                continue
            spans.append((start, end))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def redact(text: str) -> str:
    """Return ``text`` with every secret-shaped substring replaced by ``[REDACTED]``.

    Shapes: the module docstring and :data:`SHAPES`. Linear in ``len(text)``; idempotent
    (``redact(redact(t)) == redact(t)``). Non-strings and empty strings are returned as is.
    """
    if not isinstance(text, str) or not text:
        return text
    out, pos = [], 0
    for start, end in secret_spans(text):
        out.append(text[pos:start])
        out.append(MARK)
        pos = end
    out.append(text[pos:])
    return "".join(out)


#: texts up to this many characters are memoised by :func:`redact_cached` (provider fields, statuses
#: and labels repeat on every instance and every cycle)
CACHED_MAX = 1024


@functools.lru_cache(maxsize=8192)
def _redact_short(text: str) -> str:
    return redact(text)


def redact_cached(text: str) -> str:
    """:func:`redact`, memoised for texts of at most :data:`CACHED_MAX` characters."""
    if isinstance(text, str) and len(text) <= CACHED_MAX:
        return _redact_short(text)
    return redact(text)


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


#: the largest secret file read (a PEM key is a few KB): a reference to a log or a device is an error
SECRET_FILE_MAX = 64 * 1024


def resolve(ref: str) -> str:
    """Resolve ``env:NAME`` or ``file:/path`` to the secret's value, at the moment of use.

    Raises :class:`SecretReferenceError` naming the reference when it is malformed, the variable
    is unset, the file is missing, not a regular file (a FIFO, a device) or larger than
    :data:`SECRET_FILE_MAX` bytes. The value is never
    logged or stored by this function.
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
            # non-blocking open: a FIFO with no writer would block the page or the worker for ever
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise SecretReferenceError(f"secret reference {ref!r}: cannot read file ({exc.strerror})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise SecretReferenceError(f"secret reference {ref!r}: not a regular file (a device, pipe or "
                                       "directory); put the secret alone in a file")
        with os.fdopen(fd, "rb") as f:
            try:
                data = f.read(SECRET_FILE_MAX + 1)  # a little past the cap: a log ends here
            except OSError as exc:
                raise SecretReferenceError(f"secret reference {ref!r}: cannot read file ({exc.strerror})") from None
        if len(data) > SECRET_FILE_MAX:
            raise SecretReferenceError(f"secret reference {ref!r}: the file is larger than {SECRET_FILE_MAX} bytes; "
                                       "it must hold the secret alone")
        return data.decode(errors="replace").strip()
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


# --- redaction where text enters: every text column Warden stores --------------------------------

#: the apps whose stored text is redacted on every write (their managed models; Curio's own tables,
#: unmanaged models of ``fleet.harmony``, are Curio's data and are not written by Warden except the
#: demo queue and the cordon flag)
REDACTED_APPS = ("agent", "fleet")


def text_fields(app_labels=REDACTED_APPS):
    """``(model, field)`` for every ``CharField``/``TextField``/``JSONField`` (subclasses too) of
    every managed model of ``app_labels``: the columns :func:`install_field_redaction` covers."""
    for model in apps.get_models():
        if model._meta.app_label in app_labels and model._meta.managed:
            for field in model._meta.concrete_fields:
                if isinstance(field, models.CharField | models.TextField | models.JSONField):
                    yield model, field


def redact_value(field, value):
    """``value`` as the column ``field`` stores it: a string redacted (:func:`redact_cached`), a
    JSON value redacted throughout (:func:`redact_obj`; keys too), anything else (``None``, a
    number, a query expression) unchanged. A redacted string longer than the field's
    ``max_length`` (the mark is 10 characters) is cut to it."""
    if isinstance(value, str):
        clean = redact_cached(value)
    elif isinstance(value, dict | list | tuple):
        clean = redact_obj(value)
    else:
        return value
    if clean == value:
        return value
    cap = getattr(field, "max_length", None)
    if isinstance(clean, str) and cap and len(clean) > cap:
        clean = clean[:cap]
    return clean


def install_field_redaction(app_labels=REDACTED_APPS) -> int:
    """Make every text column of ``app_labels`` (:func:`text_fields`) redact what is written to it.

    The one redaction point for stored text (a model field written from a provider, a worker, a
    log, the model or an operator): each field's ``pre_save`` (``save()``, ``create()``,
    ``bulk_create()``: the instance keeps the redacted value too) and its ``get_db_prep_value``
    (also ``QuerySet.update()`` and exact lookups, so ``filter(key=raw)`` finds the row stored
    from the same raw text) pass the value through :func:`redact_value`. Fields are patched in
    place, so migrations see no change and a field added later is covered by the same loop.
    Called once from ``fleet.apps.FleetConfig.ready``; returns how many fields it covered
    (idempotent)."""
    n = 0
    for _model, field in text_fields(app_labels):
        n += 1
        if getattr(field, "_warden_redacts", False):
            continue
        orig_pre_save, orig_prep = field.pre_save, field.get_db_prep_value

        def pre_save(model_instance, add, _orig=orig_pre_save, _field=field):
            value = _orig(model_instance, add)
            clean = redact_value(_field, value)
            if clean is not value:
                setattr(model_instance, _field.attname, clean)
            return clean

        def get_db_prep_value(value, connection, prepared=False, _orig=orig_prep, _field=field):
            return _orig(redact_value(_field, value), connection, prepared)

        field.pre_save, field.get_db_prep_value = pre_save, get_db_prep_value
        field._warden_redacts = True
    return n
