# Over 500 lines on purpose: connect budget, reuse pool, host keys and commands share one paramiko session.
"""The SSH transport: run commands on a machine with paramiko (diagnostics, SSH-host providers).

:class:`SSHRunner` is a context manager; connecting raises :class:`Unreachable`, whose ``kind``
says how it failed (:data:`KINDS`): a host that accepts TCP and never speaks is ``banner``, not a
traceback. It lives below both ``fleet.diagnostics`` and ``fleet.providers`` so neither imports
the other for it.

Budgets (docs/operations.md, Diagnosis): connecting (TCP, banner, authentication) takes at most
:data:`CONNECT_TIMEOUT_S` seconds in all (paramiko's own banner default is 15 s), so a dead host
costs no more than that; each command has its own timeout. One connection per host is kept in
:data:`POOL` and reused by later runners for :data:`IDLE_REUSE_S` seconds after its last use.
"""

import base64
import hashlib
import logging
import os
import secrets as _secrets
import shlex
import socket
import threading
import time

import paramiko
from paramiko.hostkeys import HostKeyEntry

from fleet.alerts import raise_alert
from fleet.clock import clock
from fleet.models import Instance

#: the most characters of one command's output kept
MAX_OUTPUT_CHARS = 8000
#: seconds for TCP connect + SSH banner + authentication together
CONNECT_TIMEOUT_S = 5.0
#: seconds an idle connection is kept for reuse after its last use
IDLE_REUSE_S = 120.0
#: how an SSH connection failed: ``refused`` (nothing listens), ``timeout`` (no TCP answer),
#: ``banner`` (TCP accepted, no SSH banner in time), ``auth`` (key refused), ``key`` (our key file
#: cannot be read), ``host_key`` (the host offered another host key than the one kept on first
#: contact: refused before authenticating), ``dns`` (no such host), ``reset`` (closed during the
#: handshake), ``protocol`` (another SSH error), ``network`` (another socket error)
KINDS = ("refused", "timeout", "banner", "auth", "key", "host_key", "dns", "reset", "protocol", "network")


class _NoHandshakeTracebacks(logging.Filter):
    """paramiko's transport thread logs a failed handshake as ``Exception (client): …`` plus one
    ERROR record per traceback line. The failure is raised to the caller as a classified
    :class:`Unreachable`, so the traceback lines are dropped and the one-line summary is kept as a
    WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        msg = str(record.msg)
        if msg.startswith("Exception (client)"):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        return False  # a traceback line (paramiko logs them one by one)


logging.getLogger("paramiko.transport").addFilter(_NoHandshakeTracebacks())


class Unreachable(Exception):
    """The command runner could not connect. ``kind`` is one of :data:`KINDS`; the message names
    the host, the port and what happened, never a traceback."""

    def __init__(self, message: str, kind: str = "network"):
        super().__init__(message)
        self.kind = kind


def classify(exc: BaseException) -> str:
    """The :data:`KINDS` entry for an exception raised while connecting (socket or paramiko)."""
    text = str(exc)
    if isinstance(exc, paramiko.BadHostKeyException):
        return "host_key"
    if isinstance(exc, paramiko.AuthenticationException):
        return "auth"
    if isinstance(exc, ConnectionRefusedError) or isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "refused"
    if isinstance(exc, socket.gaierror):
        return "dns"
    if "protocol banner" in text:
        return "banner"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, EOFError | ConnectionResetError | ConnectionAbortedError) or "reset" in text.lower():
        return "reset"
    if isinstance(exc, paramiko.SSHException):
        return "protocol"
    return "network"


_keys: dict[str, tuple[tuple, float, object]] = {}
_keys_lock = threading.Lock()


def load_key(path: str):
    """The private key in file ``path`` (a reference, read at use), as a paramiko ``PKey``.

    Loading an RSA key validates it (about 0.1 s of CPU, twice inside paramiko): a parsed key is
    kept in this process's memory for :data:`IDLE_REUSE_S` seconds while the file is unchanged
    (same size and mtime), never written anywhere. Raises ``OSError``/``ValueError``/``SSHException``."""
    st = os.stat(path)
    stamp = (st.st_mtime_ns, st.st_size)
    now = time.monotonic()
    with _keys_lock:
        hit = _keys.get(path)
        if hit is not None and hit[0] == stamp and now - hit[1] < IDLE_REUSE_S:
            return hit[2]
    key = paramiko.PKey.from_path(path)
    with _keys_lock:
        _keys[path] = (stamp, now, key)
    return key


class SSHPool:
    """One live paramiko client per ``(host, port, user, key file)``, reused for
    :data:`IDLE_REUSE_S` seconds after its last use (several threads may share one: paramiko opens
    one channel per command). A daemon thread closes idle ones; :meth:`close_all` closes every one.
    Connecting to one host is serialised, so concurrent runners for it share a single connection."""

    def __init__(self, idle_s: float = IDLE_REUSE_S):
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._clients: dict[tuple, list] = {}  # key -> [client, last_used (monotonic)]
        self._connecting: dict[tuple, threading.Lock] = {}
        self._reaper: threading.Thread | None = None

    def get(self, key: tuple, connect):
        """A live client for ``key``: the pooled one, else ``connect()``'s (which may raise)."""
        with self._lock:
            gate = self._connecting.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                entry = self._clients.get(key)
                if entry is not None:
                    transport = entry[0].get_transport()
                    if transport is not None and transport.is_active():
                        entry[1] = time.monotonic()
                        return entry[0]
                    self._clients.pop(key, None)
                    entry[0].close()
            client = connect()
            with self._lock:
                self._clients[key] = [client, time.monotonic()]
                self._start_reaper()
            return client

    def release(self, key: tuple, client, broken: bool = False) -> None:
        """The runner is done with ``client``: mark it used now, or drop and close it if ``broken``."""
        with self._lock:
            entry = self._clients.get(key)
            if entry is not None and entry[0] is client:
                if broken:
                    self._clients.pop(key, None)
                else:
                    entry[1] = time.monotonic()
        if broken:
            client.close()

    def reap(self) -> int:
        """Close the clients idle for longer than ``idle_s``; returns how many."""
        now = time.monotonic()
        with self._lock:
            old = [k for k, (_, used) in self._clients.items() if now - used > self.idle_s]
            gone = [self._clients.pop(k)[0] for k in old]
        for c in gone:
            c.close()
        return len(gone)

    def close_all(self) -> None:
        """Close every pooled client (tests, worker shutdown)."""
        with self._lock:
            gone = [e[0] for e in self._clients.values()]
            self._clients.clear()
        for c in gone:
            c.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._clients)

    def _start_reaper(self) -> None:
        if self._reaper is not None and self._reaper.is_alive():
            return
        self._reaper = threading.Thread(target=self._reap_loop, name="ssh-pool-reaper", daemon=True)
        self._reaper.start()

    def _reap_loop(self) -> None:
        while True:
            time.sleep(min(5.0, self.idle_s / 4))
            self.reap()
            with self._lock:
                if not self._clients:
                    self._reaper = None
                    return


#: characters that make a command shell syntax (pipes, quoting, expansion, redirection, lists)
_SHELL_SYNTAX = set("|&;<>()$`\\\"'*?[]{}~#=%!\n")

#: the process's pool of SSH connections
POOL = SSHPool()


class SSHRunner:
    """Runs commands over SSH with paramiko (``key_filename``: a private key file, read at use).

    A context manager: entering takes the host's pooled connection (:data:`POOL`) or opens one,
    leaving hands it back for reuse (or closes it when the session broke). Connecting has
    ``connect_timeout_s`` seconds in all; a refused connection is retried after ``retry_backoff_s``
    (times the attempt number) while that budget lasts, up to ``connect_attempts`` tries;
    nothing else is retried (a silent host would cost the budget again). Raises
    :class:`Unreachable` (with its ``kind``) when it cannot connect.
    """

    def __init__(self, host: str, port: int = 22, user: str = "root", key_filename: str | None = None,
                 timeout_s: float = CONNECT_TIMEOUT_S, connect_attempts: int = 2, retry_backoff_s: float = 1.0,
                 pool: SSHPool | None = None, host_keys: "InstanceHostKeys | None" = None):
        self.host, self.port, self.user, self.key_filename = host, port, user, key_filename
        #: where the host's key is kept (trust on first use); ``None``: any host key is accepted
        self.host_keys = host_keys
        self.connect_timeout_s = min(timeout_s, CONNECT_TIMEOUT_S)
        self.connect_attempts, self.retry_backoff_s = connect_attempts, retry_backoff_s
        self.pool = POOL if pool is None else pool
        self.client = None
        self.reused = False  # the connection came from the pool
        self.broken = False  # the session dropped during the step

    @property
    def key(self) -> tuple:
        return (self.host, int(self.port), self.user, self.key_filename or "")

    def _connect(self):
        pkey = None
        if self.key_filename:
            try:
                pkey = load_key(self.key_filename)
            except (OSError, ValueError, paramiko.SSHException) as exc:
                raise Unreachable(f"ssh key {self.key_filename}: cannot load it: {exc}", "key") from None
        where = f"ssh {self.user}@{self.host}:{self.port}"
        deadline = time.monotonic() + self.connect_timeout_s
        attempt = 0
        while True:
            attempt += 1
            remaining = max(0.05, deadline - time.monotonic())
            try:
                sock = socket.create_connection((self.host, self.port), timeout=remaining)
            except OSError as exc:
                kind = classify(exc)
                backoff = self.retry_backoff_s * attempt
                if kind == "refused" and attempt < self.connect_attempts and time.monotonic() + backoff < deadline:
                    clock.sleep(backoff)  # one failed connection is no verdict: retry within the budget
                    continue
                what = {"refused": "connection refused", "timeout": f"no TCP answer within {remaining:.1f}s",
                        "dns": "host name not known"}.get(kind, str(exc) or type(exc).__name__)
                raise Unreachable(f"{where}: {what} (after {attempt} attempt(s)): {exc}", kind) from None
            client = paramiko.SSHClient()
            if self.host_keys is None:
                client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
            else:  # paramiko checks the kept key (BadHostKeyException) before authenticating
                self.host_keys.prepare(client, self.host, self.port)
            remaining = max(0.05, deadline - time.monotonic())
            try:
                client.connect(
                    self.host, port=self.port, username=self.user, pkey=pkey, sock=sock,
                    # the banner wait ends first, so its error (not a later "No existing session") is raised
                    timeout=remaining, banner_timeout=max(0.05, remaining - 0.2), auth_timeout=remaining,
                    allow_agent=False, look_for_keys=self.key_filename is None,
                )
            except Exception as exc:  # noqa: BLE001 — every handshake failure becomes a classified verdict
                transport = client.get_transport()
                saved = transport.get_exception() if transport is not None else None
                exc = saved or exc  # the transport thread's own error names the cause
                client.close()
                sock.close()
                kind = classify(exc)
                if kind == "host_key":
                    raise Unreachable(f"{where}: {self.host_keys.refuse(exc.key)}", kind) from None
                what = {"banner": f"TCP accepted but no SSH banner within {self.connect_timeout_s:g}s",
                        "auth": "authentication failed"}.get(kind, kind)
                raise Unreachable(f"{where}: {what}: {exc or type(exc).__name__}", kind) from None
            return client

    def __enter__(self):
        before = len(self.pool)
        self.client = self.pool.get(self.key, self._connect)
        self.reused = len(self.pool) == before
        if self.host_keys is not None:
            # a pooled connection may have been opened by a runner that keeps no key: check it too
            transport = self.client.get_transport()
            offered = transport.get_remote_server_key() if transport is not None else None
            if offered is not None and not self.host_keys.check(offered):
                self.pool.release(self.key, self.client, broken=True)
                self.client = None
                raise Unreachable(f"ssh {self.user}@{self.host}:{self.port}: {self.host_keys.refuse(offered)}", "host_key")
        return self

    def run(self, command: str, timeout_s: float = 10, keep: str = "head", max_chars: int = MAX_OUTPUT_CHARS) -> tuple[int, str]:
        """Run ``command``; returns (exit code, stdout and stderr merged, at most
        :data:`MAX_OUTPUT_CHARS`: the head, or the tail when ``keep="tail"``).

        ``max_chars`` overrides the cap. A command past ``timeout_s`` answers 124; a broken session (the connection dropped)
        answers 255 with the error text. Never raises for a command's failure.
        """
        transport = self.client.get_transport() if self.client is not None else None
        if transport is None or not transport.is_active():
            self.broken = True
            return 255, "ssh session not active (the connection dropped)"
        deadline = time.monotonic() + timeout_s
        chunks, size = [], 0
        try:
            chan = transport.open_session(timeout=timeout_s)
            try:
                chan.set_combine_stderr(True)
                chan.exec_command(command)
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"no end of output after {timeout_s:g}s")
                    chan.settimeout(left)
                    data = chan.recv(32768)
                    if not data:
                        break
                    chunks.append(data)
                    size += len(data)
                    if keep == "head" and size > 4 * max_chars:
                        break  # enough: the head is kept
                    if keep == "tail" and size > 8 * max_chars:
                        chunks, size = [b"".join(chunks)[-4 * max_chars:]], 4 * max_chars
                out = b"".join(chunks).decode(errors="replace")
                if not chan.status_event.wait(max(0.0, deadline - time.monotonic())):
                    if not chan.closed and transport.is_active():
                        raise TimeoutError(f"no exit status after {timeout_s:g}s")
                rc = chan.recv_exit_status() if chan.exit_status_ready() else -1
            finally:
                chan.close()
        except TimeoutError as exc:
            if not transport.is_active():
                self.broken = True
                return 255, f"ssh session failed: {exc}"
            return 124, f"timed out after {timeout_s:g}s: {exc}"
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.broken = True
            return 255, f"ssh session failed: {exc or type(exc).__name__}"
        if rc == -1:  # the channel closed without an exit status (connection dropped)
            self.broken = True
            return 255, _cut(out + "\nssh session dropped before the command's exit status arrived", "tail", max_chars)
        return rc, _cut(out, keep, max_chars)

    def run_many(self, commands: list[str], timeout_s: float = 10, keep: list[str] | None = None) -> list[tuple[int, str]]:
        """Run ``commands`` in one SSH session, one after another, each under ``timeout_s`` (the
        host's ``timeout`` utility, where it has one); ``[(exit code, output), …]`` in order, each
        output cut as :meth:`run` cuts it (``keep[i]``: ``head`` or ``tail``).

        One session per host instead of one per command: a session costs the host a fork and a
        login shell, which dominates on a loaded machine. Each command's end is marked with a
        random nonce, so no output (a planted log line) can forge another command's result. A
        command past its timeout answers 124; when the whole batch outlives ``len × timeout_s``
        the unfinished commands answer 124 too; when the session drops, the command it dropped in
        answers 255, ``broken`` is set and the later ones are not in the list.
        """
        keep = keep or ["head"] * len(commands)
        nonce = _secrets.token_hex(8)
        mark = f":warden:{nonce}:"
        t = f"{timeout_s:g}"
        lines = [f'if command -v timeout >/dev/null 2>&1; then T="timeout -k 1 {t}"; else T=""; fi']
        for i, cmd in enumerate(commands):
            # a plain command runs as it is (one process fewer on the host); anything with shell syntax under sh -c
            run = cmd if not set(cmd) & _SHELL_SYNTAX else f"sh -c {shlex.quote(cmd)}"
            lines.append(f"$T {run} </dev/null 2>&1; printf '\\n{mark}{i}:rc=%d:\\n' $?")
        rc, out = self.run("\n".join(lines), timeout_s * len(commands) + 2, max_chars=64 * MAX_OUTPUT_CHARS)
        parts = out.split(mark)
        results: list[tuple[int, str]] = []
        text = parts[0]
        for i, part in enumerate(parts[1:]):
            head, _, rest = part.partition(":\n")
            idx, _, code = head.partition(":rc=")
            if idx != str(i) or not code.lstrip("-").isdigit():
                break  # not our marker's shape: stop rather than guess
            results.append((int(code), _cut(text[:-1] if text.endswith("\n") else text, keep[i])))
            text = rest
        if len(results) < len(commands):
            i = len(results)
            if self.broken:
                results.append((255, _cut(text + f"\nssh session failed: {out[-200:] if rc == 255 else ''}".rstrip(), "tail")))
            else:
                results += [(124, f"timed out: the batch outlived {timeout_s * len(commands) + 2:g}s")
                            for _ in commands[i:]]
        return results

    def __exit__(self, *exc):
        if self.client is not None:
            self.pool.release(self.key, self.client, broken=self.broken)
            self.client = None
        return False


# --- host keys: trust on first use ---------------------------------------------------------------
def key_line(key) -> str:
    """A paramiko ``PKey`` as ``"<type> <base64>"`` (the form ``known_hosts`` uses)."""
    return f"{key.get_name()} {key.get_base64()}"


def fingerprint(line_or_key) -> str:
    """OpenSSH's ``SHA256:…`` fingerprint of a key (a ``PKey`` or a :func:`key_line`)."""
    blob = line_or_key.asbytes() if hasattr(line_or_key, "asbytes") else base64.b64decode(str(line_or_key).split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


class _KeepOnFirstUse:
    """paramiko ``MissingHostKeyPolicy``: no key kept yet → keep this one; a key kept of another
    type → refused like a changed key (paramiko only compares keys of the offered type)."""

    def __init__(self, store: "InstanceHostKeys"):
        self.store = store

    def missing_host_key(self, client, hostname, key):
        kept = self.store.known()
        if kept:
            raise paramiko.BadHostKeyException(hostname, key, _parse(kept))
        self.store.remember(key)


def _parse(line: str):
    entry = HostKeyEntry.from_line(f"kept {line}")
    if entry is None or entry.key is None:
        raise ValueError(f"not a host key line: {line[:60]!r}")
    return entry.key


class InstanceHostKeys:
    """Trust on first use for one ``fleet.models.Instance``: the first SSH host key it offers is
    kept on the instance (``ssh_host_key``, ``ssh_host_key_at``); later connections must offer
    the same key, else they are refused before authenticating (nothing is run on the machine), an
    ``ssh_host_key_changed`` alert is raised and the diagnosis says so (``fleet.diagnostics``).

    The check is paramiko's own: the kept key goes into the client's ``HostKeys`` (a different
    key of that type raises ``BadHostKeyException``) and :class:`_KeepOnFirstUse` is its
    ``MissingHostKeyPolicy``. A machine rebuilt on purpose gets a new key: an operator clears the
    kept one (the instance's ``ssh_host_key``) and the next contact keeps the new one. Source:
    OpenSSH's ``StrictHostKeyChecking=accept-new``.
    """

    def __init__(self, instance):
        self.instance = instance

    def known(self) -> str:
        line = Instance.objects.filter(pk=self.instance.pk).values_list("ssh_host_key", flat=True).first()
        return line or ""

    def prepare(self, client, host: str, port: int) -> None:
        """Load the kept key into ``client``'s host keys and set the first-use policy."""
        kept = self.known()
        if kept:
            try:
                key = _parse(kept)
                client.get_host_keys().add(host if int(port) == 22 else f"[{host}]:{port}", key.get_name(), key)
            except Exception:  # noqa: BLE001 — an unreadable kept key is refused like a changed one
                logging.getLogger(__name__).warning("instance %s: kept host key unreadable", self.instance.pk)
        client.set_missing_host_key_policy(_KeepOnFirstUse(self))

    def check(self, key) -> bool:
        """Whether ``key`` is the kept one; a first key is kept (and is then the kept one)."""
        kept = self.known()
        if not kept:
            self.remember(key)
            return True
        return kept.split()[:2] == key_line(key).split()[:2]

    def remember(self, key) -> None:
        """Keep ``key`` if no key is kept yet (a conditional UPDATE: the first writer wins)."""
        Instance.objects.filter(pk=self.instance.pk, ssh_host_key="").update(
            ssh_host_key=key_line(key), ssh_host_key_at=clock.now())

    def refuse(self, offered) -> str:
        """Raise the ``ssh_host_key_changed`` alert for ``offered`` (a ``PKey``); return the line
        that says why the connection was refused."""
        inst = self.instance
        kept = self.known()
        why = (f"host key changed: it offered {offered.get_name()} {fingerprint(offered)}, not the key kept on first "
               f"contact ({fingerprint(kept) if kept else 'unreadable'}); refused before authenticating, nothing was run. "
               "It may be another machine on this address; if the machine was rebuilt, clear its kept host key")
        raise_alert("ssh_host_key_changed", f"{inst.external_id} ({inst.ssh_host}:{inst.ssh_port or 22}): {why}",
                    severity="P1", key=f"ssh_host_key_changed:{inst.external_id}", instance=inst)
        return why


def _cut(text: str, keep: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[-limit:] if keep == "tail" else text[:limit]
