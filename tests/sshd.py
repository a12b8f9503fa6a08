"""A real OpenSSH server on a loopback port for the diagnostics tests (Debian's ``/usr/sbin/sshd``).

:class:`SSHServer` writes everything into one temporary directory — a host key, a client key
pair, ``authorized_keys``, ``sshd_config``, the pid file and a ``bin/`` directory that comes
first on the PATH of every SSH session (``SetEnv PATH=...``) — and runs
``sshd -D -e -f <config>`` as a child process on a free ``127.0.0.1`` port. The login user is
the current user (root here, ``PermitRootLogin prohibit-password``). Nothing outside the
temporary directory is touched except ``/run/sshd``, the privilege-separation directory sshd
refuses to start without (created empty when missing). The real ``~/.ssh`` is never read.

Tests play GPU fault outputs (``tests/gpu_outputs.py``) with :meth:`SSHServer.fake`
(a fake ``nvidia-smi`` printing a fixed text and exiting with a fixed code) and
:meth:`SSHServer.remove` (the command is missing: the shell answers rc 127).

Use the :func:`sshd` fixture (import it into a test module), or the class as a context manager.
"""

import os
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

import paramiko
import pytest

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")

#: healthy ``nvidia-smi -L`` output captured on an H200
HEALTHY_L = "GPU 0: NVIDIA H200 (UUID: GPU-af6c3b9f-248b-ed93-3ea3-397b89873ea4)"
#: NVML_ERROR_GPU_IS_LOST (15), a host-level fault
GPU_LOST = "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost. Reboot the system to recover this GPU"
#: the container lost its device cgroup access (host nvidia-smi still works)
NVML_UNKNOWN_IN_CONTAINER = "Failed to initialize NVML: Unknown Error"
#: driver not loaded (NVML 9)
DRIVER_NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` (a loopback address) that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 10.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with code {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.5) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"sshd did not answer on 127.0.0.1:{port} within {timeout} s")


class SSHServer:
    """One ``sshd`` on ``127.0.0.1:port`` with a temporary host key and one authorized client key.

    Attributes once started: ``host``, ``port``, ``user``, ``key_file`` (the client's private key,
    OpenSSH PEM), ``bin_dir`` (first on the sessions' PATH), ``root`` (the temporary directory),
    ``proc`` (the sshd process). :meth:`stop` ends sshd and every session process it started.
    """

    def __init__(self, root: Path, extra_hosts: list[str] | None = None, port: int = 0):
        self.root = Path(root)
        self.host = "127.0.0.1"
        #: further loopback addresses (``127.0.1.1`` …) the same sshd listens on, each a "host" of its
        #: own for the client (one pooled connection each): the fan-out bench. sshd takes at most 16
        #: listen sockets in all (its MAX_LISTEN_SOCKS)
        self.extra_hosts = list(extra_hosts or [])
        #: a given port (another sshd, with another host key, on the address of one that stopped)
        self.wanted_port = port
        self.port = 0
        self.user = os.environ.get("USER") or _current_user()
        self.bin_dir = self.root / "bin"
        self.key_file = self.root / "client_key"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.root / "sshd.log"

    # --- set-up ----------------------------------------------------------------------------
    def start(self) -> "SSHServer":
        """Write keys and config, start sshd, wait until it answers. Raises RuntimeError."""
        if not SSHD.exists():
            raise RuntimeError("sshd not found at /usr/sbin/sshd: apt-get install openssh-server (.ci/run does)")
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.bin_dir.mkdir(exist_ok=True)
        host_key = self.root / "ssh_host_ed25519_key"
        # paramiko cannot write Ed25519 private keys; RSA for the host and the client
        hk = paramiko.RSAKey.generate(2048)
        hk.write_private_key_file(str(host_key))
        if self.key_file.exists():  # a key given by the caller (several servers, one client key)
            client = paramiko.RSAKey.from_private_key_file(str(self.key_file))
        else:
            client = paramiko.RSAKey.generate(2048)
            client.write_private_key_file(str(self.key_file))
        os.chmod(self.key_file, 0o600)
        os.chmod(host_key, 0o600)
        (self.root / "authorized_keys").write_text(f"{client.get_name()} {client.get_base64()} warden-test\n")
        self.port = self.wanted_port or free_port(self.host)
        config = self.root / "sshd_config"
        config.write_text(
            "\n".join([
                f"Port {self.port}",
                f"ListenAddress {self.host}",
                *(f"ListenAddress {h}" for h in self.extra_hosts),
                f"HostKey {host_key}",
                f"PidFile {self.root / 'sshd.pid'}",
                f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PrintMotd no",
                "PrintLastLog no",
                "UseDNS no",
                "MaxStartups 200",
                "MaxSessions 50",
                f"SetEnv PATH={self.bin_dir}:/usr/local/bin:/usr/bin:/bin",
                "",
            ])
        )
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(SSHD), "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_listening(self.port, self.proc, host=self.host)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}; log: {self.log()}") from None
        return self

    def stop(self) -> None:
        """SIGTERM sshd's process group (listener and sessions), SIGKILL after 5 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, 15)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(timeout=5)

    def log(self) -> str:
        """sshd's log (``-e``: errors and connections go to stderr, captured here)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> "SSHServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- what the sessions see -------------------------------------------------------------
    def script(self, name: str, body: str) -> Path:
        """Put an executable ``name`` (a ``/bin/sh`` script with ``body``) first on the sessions' PATH."""
        path = self.bin_dir / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path

    def fake(self, name: str, out: str, rc: int = 0, *, stderr: bool = False, sleep_s: float = 0) -> Path:
        """A fake command that prints ``out`` (to stderr when ``stderr``) and exits ``rc``."""
        quoted = out.replace("'", "'\"'\"'")
        redirect = " 1>&2" if stderr else ""
        pause = f"sleep {sleep_s}\n" if sleep_s else ""
        return self.script(name, f"{pause}printf '%s\\n' '{quoted}'{redirect}\nexit {rc}")

    def profile(self, name: str) -> Path:
        """Serve the recorded outputs of ``tests.gpu_outputs.PROFILES[name]``: a fake ``nvidia-smi``
        answering ``-L``, ``--query-gpu=…`` and ``-q`` with their recorded text and exit code, a fake
        ``dmesg``, a fake ``journalctl`` and the worker's log file. Returns the log file's path."""
        from tests.gpu_outputs import PROFILES

        p = PROFILES[name]
        out = self.root / "out"
        out.mkdir(exist_ok=True)
        for key in ("-L", "query", "ecc", "dmesg"):
            rc, text = p[key]
            (out / f"{key}.txt").write_text(text if text.endswith("\n") else text + "\n")
            (out / f"{key}.rc").write_text(str(rc))
        self.script("nvidia-smi", f"""
case "$1" in
  -L) k=-L;;
  --query-gpu=*) k=query;;
  -q) k=ecc;;
  *) echo "nvidia-smi: unexpected arguments $*" >&2; exit 2;;
esac
read rc < "{out}/$k.rc"; cat "{out}/$k.txt"; exit $rc""")
        self.script("dmesg", f'read rc < "{out}/dmesg.rc"; cat "{out}/dmesg.txt"; exit $rc')
        self.script("journalctl", 'printf "%s\\n" "2026-12-01T01:00:00+0000 host systemd[1]: Started curio.service."')
        log = self.root / "worker.log"
        log.write_text(p["log"])
        return log

    def remove(self, name: str) -> None:
        """Remove a fake command; a real one must not exist either (the shell answers rc 127)."""
        (self.bin_dir / name).unlink(missing_ok=True)
        if shutil.which(name, path="/usr/local/bin:/usr/bin:/bin"):
            pytest.skip(f"a real {name} is installed on this machine")

    def session_count(self) -> int:
        """How many per-connection sshd processes are alive (children of the listener)."""
        import psutil

        try:
            return len(psutil.Process(self.proc.pid).children())
        except psutil.Error:
            return 0


class SilentHost:
    """A TCP listener on a free loopback port that accepts connections and never sends a byte (an
    SSH port whose daemon hangs): the client must give up at its banner timeout. Context manager;
    ``host``, ``port``, ``accepted`` (connections accepted so far)."""

    def __init__(self, host: str = "127.0.0.1"):
        import threading

        self.host = host
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            self._held.append(conn)  # held open, silent

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        for c in self._held:
            c.close()
        self.sock.close()

    def __enter__(self) -> "SilentHost":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def sshd(tmp_path_factory):
    """A running :class:`SSHServer` (stopped at teardown) with a healthy fake ``nvidia-smi``."""
    server = SSHServer(tmp_path_factory.mktemp("sshd"))
    server.start()
    server.fake("nvidia-smi", HEALTHY_L)
    try:
        yield server
    finally:
        server.stop()
