"""The SSH transport: run commands on a machine with paramiko (diagnostics, SSH-host providers).

:class:`SSHRunner` is a context manager; connecting raises :class:`Unreachable`. It lives below
both ``fleet.diagnostics`` and ``fleet.providers`` so neither imports the other for it.
"""

from fleet.clock import clock

#: the most characters of one command's output kept
MAX_OUTPUT_CHARS = 2000


class Unreachable(Exception):
    """The command runner could not connect (refused, timeout, auth)."""


class SSHRunner:
    """Runs commands over SSH with paramiko (``key_filename``: a private key file, read at use).

    Used as a context manager so the client (and its transport thread) is closed when the step
    ends, also on error. Connecting is tried ``connect_attempts`` times with ``retry_backoff_s``
    (times the attempt number, on ``clock``) between tries; an authentication failure is not
    retried. Raises :class:`Unreachable` when it cannot connect.
    """

    def __init__(self, host: str, port: int = 22, user: str = "root", key_filename: str | None = None, timeout_s: float = 10,
                 connect_attempts: int = 2, retry_backoff_s: float = 1.0):
        self.host, self.port, self.user, self.key_filename, self.timeout_s = host, port, user, key_filename, timeout_s
        self.connect_attempts, self.retry_backoff_s = connect_attempts, retry_backoff_s
        self.client = None
        self.broken = False  # the session dropped during the step

    def __enter__(self):
        import paramiko

        pkey = None
        if self.key_filename:
            try:
                pkey = paramiko.PKey.from_path(self.key_filename)
            except (OSError, ValueError, paramiko.SSHException) as exc:
                raise Unreachable(f"ssh key {self.key_filename}: cannot load it: {exc}") from None
        attempts = max(1, self.connect_attempts)
        for attempt in range(1, attempts + 1):
            client = paramiko.SSHClient()
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
            try:
                client.connect(
                    self.host,
                    port=self.port,
                    username=self.user,
                    pkey=pkey,
                    timeout=self.timeout_s,
                    banner_timeout=self.timeout_s,
                    auth_timeout=self.timeout_s,
                    allow_agent=False,
                    look_for_keys=self.key_filename is None,
                )
            except paramiko.AuthenticationException as exc:
                client.close()  # permanent: no retry
                raise Unreachable(f"ssh {self.user}@{self.host}:{self.port}: authentication failed: {exc}") from None
            except (TimeoutError, OSError, EOFError, paramiko.SSHException) as exc:
                client.close()
                if attempt < attempts:
                    clock.sleep(self.retry_backoff_s * attempt)  # gpu-faults.md §4.4: retry before a verdict
                    continue
                raise Unreachable(f"ssh {self.host}:{self.port}: {exc or type(exc).__name__} (after {attempts} attempts)") from None
            self.client = client
            return self
        raise Unreachable(f"ssh {self.host}:{self.port}: not attempted")  # pragma: no cover — attempts >= 1

    def run(self, command: str, timeout_s: float = 10) -> tuple[int, str]:
        """Run ``command``; returns (exit code, stdout+stderr truncated).

        A command past ``timeout_s`` answers 124; a broken session (the connection dropped)
        answers 255 with the error text. Never raises for a command's failure.
        """
        import paramiko

        if self.client is None or self.client.get_transport() is None or not self.client.get_transport().is_active():
            self.broken = True
            return 255, "ssh session not active (the connection dropped)"
        try:
            _, stdout, stderr = self.client.exec_command(command, timeout=timeout_s)
            out = stdout.read().decode(errors="replace") + stderr.read().decode(errors="replace")
            rc = stdout.channel.recv_exit_status()
            if rc == -1:  # paramiko: the channel closed without an exit status (connection dropped)
                self.broken = True
                return 255, (out + "\nssh session dropped before the command's exit status arrived")[-MAX_OUTPUT_CHARS:]
            return rc, out[:MAX_OUTPUT_CHARS]
        except TimeoutError as exc:
            return 124, f"timed out after {timeout_s:g}s: {exc}"
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.broken = True
            return 255, f"ssh session failed: {exc or type(exc).__name__}"

    def __exit__(self, *exc):
        if self.client is not None:
            self.client.close()
        return False
