"""Django's secret key: from ``WARDEN_SECRET_KEY`` or generated once into ``<var>/secret_key``.

A key that has been published can sign sessions and password-reset tokens for anyone who read
it, so it is refused wherever it is found. :data:`PUBLISHED_SHA256` lists the SHA-256 of every
key known to be public (one was committed to this repository by mistake: it stays in the git
history, so only its digest is kept here, never the key). A published key in the key file is
replaced by a fresh one at start-up (every session signed with the old key ends: Django's session
and auth hashes no longer verify, and ``bootstrap`` deletes the stored sessions); a published key
in ``WARDEN_SECRET_KEY`` stops the process with one line, since Warden cannot change the
environment.
"""

import hashlib
import os
import secrets
from pathlib import Path

#: SHA-256 (hex) of each secret key known to be public; compared after stripping surrounding spaces
PUBLISHED_SHA256 = frozenset({
    "82c2edb9a35db3bd0a350b3523138c0c956cae0925789503b68e29219c4c02e6",  # var2/secret_key, once committed
})


class PublishedKeyError(ValueError):
    """``WARDEN_SECRET_KEY`` holds a published key (the message says what to do, never the key)."""


def is_published(key: str) -> bool:
    """True when ``key`` (surrounding whitespace ignored) is one of :data:`PUBLISHED_SHA256`."""
    return hashlib.sha256(key.strip().encode()).hexdigest() in PUBLISHED_SHA256


def _write_new(path: Path) -> str:
    """Write a fresh key to ``path`` (mode 0600, atomically: a temporary file renamed over it)."""
    key = secrets.token_urlsafe(50)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    os.replace(tmp, path)
    return key


def load_secret_key(var_dir: Path, environ=os.environ) -> tuple[str, bool]:
    """``(key, replaced)``: the secret key to use, and whether a published key file was replaced.

    ``WARDEN_SECRET_KEY`` wins when set (raises :class:`PublishedKeyError` when it is published);
    otherwise ``var_dir/secret_key`` is read, created when missing and rewritten with a new key
    when it holds a published one."""
    key = environ.get("WARDEN_SECRET_KEY")
    if key:
        if is_published(key):
            raise PublishedKeyError("this key is public (it was committed to the Warden repository); "
                                    "set a new one, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(50))'")
        return key, False
    path = Path(var_dir) / "secret_key"
    if not path.exists():
        return _write_new(path), False
    key = path.read_text().strip()
    if not key or is_published(key):
        return _write_new(path), bool(key)
    return key, False
