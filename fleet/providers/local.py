"""The ``local`` provider: each instance is a real demo worker process on this machine.

State lives in ``settings.VAR_DIR / "workers"``, one set of files per instance:

- ``local-N.json`` — written by this provider: name, log path, created time, intended status;
- ``local-N.run.json`` — written by the supervisor (``python -m fleet.worker --supervise``)
  that launches the worker: worker pid and process start time, then its exit code (negative
  signal number when a signal killed it);
- ``local-N.log`` — the worker's stdout/stderr (kept after destroy, for post-mortems).

Processes start in a new session (``start_new_session=True``) so they outlive the launcher (a
restarting Celery worker). ``list_instances`` reads the state files and checks the worker pid
with psutil (pid and start time must both match, so a recycled pid is not mistaken for ours):
``running``, ``created`` (supervisor starting), ``stopped`` (we stopped it; ``exit_code``
set) or ``exited`` (it ended on its own or was killed; ``exit_code`` set, or None when the
supervisor itself vanished). A destroyed instance is no longer listed.

The children's environment comes from :func:`child_env` — the one place tests and the console
use to point workers at the right databases and knobs.
"""

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, urlsplit

import psutil
from django.conf import settings
from django.db import connections

from fleet.models import Instance
from fleet.providers.base import Provider, ProviderError, ProviderInstance

ID_RE = re.compile(r"^local-(\d{1,18})$")
_extra_env: dict[str, str] = {}
_children: list[subprocess.Popen] = []  # supervisors we started; polled so none stays a zombie


def set_child_env(overrides: dict[str, str] | None) -> None:
    """Add ``overrides`` to every launched worker's environment (``None`` clears them)."""
    _extra_env.clear()
    if overrides:
        _extra_env.update({k: str(v) for k, v in overrides.items()})


def _db_url_for(alias: str, setting: str) -> str | None:
    """``setting``'s URL rewritten to name the database ``alias`` really uses (e.g. a test DB)."""
    raw = os.environ.get(setting, "")
    cfg = connections[alias].settings_dict
    if not cfg["ENGINE"].endswith("postgresql"):
        return None  # SQLite: the child derives the same file from WARDEN_VAR_DIR / the inherited URL
    if raw:
        parts = urlsplit(raw)
        if parts.path.lstrip("/") == cfg["NAME"]:
            return raw
        return parts._replace(path="/" + quote(cfg["NAME"])).geturl()
    auth = quote(cfg.get("USER") or "")
    if cfg.get("PASSWORD"):
        auth += ":" + quote(cfg["PASSWORD"])
    host = cfg.get("HOST") or "127.0.0.1"
    port = f":{cfg['PORT']}" if cfg.get("PORT") else ""
    return f"postgres://{auth}@{host}{port}/{quote(cfg['NAME'])}"


def child_env() -> dict[str, str]:
    """The environment every worker process gets.

    The launcher's environment, plus: the database URLs of the databases this process actually
    uses (so a worker launched under pytest writes to the test databases), ``WARDEN_VAR_DIR``,
    and the demo knobs (heartbeat, proof length, task names) from the current settings, then
    any :func:`set_child_env` overrides.
    """
    env = dict(os.environ)
    for alias, setting in (("default", "DATABASE_URL"), ("harmony", "HARMONY_DATABASE_URL")):
        url = _db_url_for(alias, setting)
        if url:
            env[setting] = url
    warden = settings.WARDEN
    env["WARDEN_VAR_DIR"] = str(settings.VAR_DIR)
    env["WARDEN_HEARTBEAT_S"] = str(int(warden["HEARTBEAT_S"]))
    env["WARDEN_PROOF_SECONDS"] = str(warden["PROOF_SECONDS"])
    env["WARDEN_TASK_NAMES"] = ",".join(warden["TASK_NAMES"])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(_extra_env)
    return env


def _reap() -> None:
    for child in list(_children):
        if child.poll() is not None:
            _children.remove(child)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ProviderError(f"local: unreadable state file {path}: {exc}", kind="semantic", code="bad_state") from exc


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _process(pid: int | None, create_time: float | None) -> psutil.Process | None:
    """The live (non-zombie) process ``pid`` if it is the one started at ``create_time``."""
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 0.05:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


class LocalProvider(Provider):
    """Demo worker processes on this machine (the embedded default provider).

    ``root``: state directory (default ``settings.VAR_DIR / "workers"``, read at call time).
    Every call raises :class:`ProviderError` on failure (``not_found`` for an unknown id).
    """

    name = "local"

    def __init__(self, root: Path | str | None = None):
        self._root = Path(root) if root else None

    # --- files ---------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        root = self._root or Path(settings.VAR_DIR) / "workers"
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ProviderError(f"local: cannot use {root}: {exc}; check WARDEN_VAR_DIR", code="io") from exc
        return root

    def _meta_path(self, external_id: str) -> Path:
        if not ID_RE.match(external_id or ""):
            raise ProviderError(f"local: no instance {external_id!r}", code="not_found")
        return self.root / f"{external_id}.json"

    def _run_path(self, external_id: str) -> Path:
        return self.root / f"{external_id}.run.json"

    def _meta(self, external_id: str) -> dict:
        meta = _read_json(self._meta_path(external_id))
        if meta is None:
            raise ProviderError(f"local: no instance {external_id!r}", code="not_found")
        return meta

    def _next_id(self) -> str:
        """``local-N`` with N one past both the counter file and any id in our database."""
        highest = 0
        for ext in Instance.objects.filter(provider=self.name).values_list("external_id", flat=True):
            m = ID_RE.match(ext)
            if m:
                highest = max(highest, int(m.group(1)))
        counter = self.root / "counter"
        with open(counter, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            raw = fh.read().strip()
            n = max(int(raw) if raw.isdigit() else 0, highest) + 1
            fh.seek(0)
            fh.truncate()
            fh.write(str(n))
        return f"local-{n}"

    # --- processes -------------------------------------------------------------------------
    def _start(self, external_id: str, meta: dict) -> None:
        _reap()
        run_path = self._run_path(external_id)
        run_path.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "fleet.worker", "--supervise", "--state", str(run_path), "--name", meta["name"]]
        if meta.get("cordoned"):
            cmd.append("--cordoned")  # Warden's cordon survives the restart
        with open(meta["log_path"], "ab") as log:
            try:
                proc = subprocess.Popen(
                    cmd,
                    cwd=str(settings.BASE_DIR),
                    env=child_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise ProviderError(f"local: cannot start worker: {exc}", kind="transient", code="spawn") from exc
        _children.append(proc)
        meta["supervisor_pid"] = proc.pid
        try:
            meta["supervisor_create_time"] = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            meta["supervisor_create_time"] = None
        meta["intended_status"] = "running"
        _write_json(self._meta_path(external_id), meta)
        # wait (briefly) for the supervisor to record the worker's pid
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if (_read_json(run_path) or {}).get("worker_pid"):
                return
            if proc.poll() is not None:
                raise ProviderError(
                    f"local: worker supervisor exited with code {proc.returncode}; see {meta['log_path']}",
                    kind="transient",
                    code="supervisor_exited",
                )
            time.sleep(0.05)

    def _worker(self, external_id: str) -> tuple[dict | None, psutil.Process | None]:
        run = _read_json(self._run_path(external_id))
        if not run:
            return None, None
        return run, _process(run.get("worker_pid"), run.get("worker_create_time"))

    def _view(self, external_id: str, meta: dict) -> ProviderInstance:
        run, proc = self._worker(external_id)
        intended = meta.get("intended_status", "running")
        status, msg, exit_code, pid, started = "created", "", None, None, None
        if run:
            pid = run.get("worker_pid")
            started = datetime.fromisoformat(run["started_at"]) if run.get("started_at") else None
            exit_code = run.get("exit_code")
        if proc is not None:
            status = "running"
            msg = "stopping" if intended == "stopped" else ""
        elif run and run.get("ended_at"):
            status = "stopped" if intended == "stopped" else "exited"
            msg = f"worker exited with code {exit_code}"
        elif run:
            status = "stopped" if intended == "stopped" else "exited"
            msg = "worker process gone and its supervisor did not record an exit code"
        elif _process(meta.get("supervisor_pid"), meta.get("supervisor_create_time")) is None:
            status = "stopped" if intended == "stopped" else "exited"
            msg = f"worker never started; see {meta.get('log_path')}"
        return ProviderInstance(
            external_id=external_id,
            status=status,
            intended_status=intended,
            status_msg=msg,
            gpu_name=meta.get("gpu_name", "local-cpu"),
            dph=float(meta.get("dph", 0.0)),
            label=meta.get("label", ""),
            pid=pid,
            exit_code=exit_code,
            log_path=meta.get("log_path", ""),
            worker_name=meta.get("name", external_id),
            started_at=started,
            extra={"created_at": meta.get("created_at")},
        )

    # --- the Provider interface -----------------------------------------------------------
    def list_instances(self) -> list[ProviderInstance]:
        """Every instance not destroyed, with its real process state (see the module docstring)."""
        _reap()
        try:
            paths = sorted(p for p in self.root.glob("local-*.json") if not p.name.endswith(".run.json"))
        except OSError as exc:
            raise ProviderError(f"local: cannot list {self.root}: {exc}", code="io") from exc
        out = []
        for path in paths:
            external_id = path.name[: -len(".json")]
            if not ID_RE.match(external_id):
                continue
            meta = _read_json(path)
            if meta is None:  # destroyed between glob and read
                continue
            out.append(self._view(external_id, meta))
        return out

    def launch(self, *, gpu_name: str = "", offer_id: str = "", label: str = "") -> ProviderInstance:
        """Start a new worker process; returns it (``status`` running once its pid is known)."""
        external_id = self._next_id()
        meta = {
            "name": external_id,
            "log_path": str(self.root / f"{external_id}.log"),
            "created_at": datetime.now(UTC).isoformat(),
            "gpu_name": gpu_name or "local-cpu",
            "label": label,
            "dph": float(settings.WARDEN["LOCAL_DPH"]),
            "intended_status": "running",
        }
        _write_json(self._meta_path(external_id), meta)
        self._start(external_id, meta)
        return self._view(external_id, self._meta(external_id))

    def stop(self, external_id: str) -> None:
        """SIGTERM the worker, wait ``WARDEN["STOP_GRACE_S"]``, then SIGKILL; idempotent."""
        meta = self._meta(external_id)
        meta["intended_status"] = "stopped"
        _write_json(self._meta_path(external_id), meta)
        _, proc = self._worker(external_id)
        if proc is not None:
            try:
                proc.terminate()
                _, alive = psutil.wait_procs([proc], timeout=float(settings.WARDEN["STOP_GRACE_S"]))
                for p in alive:
                    p.kill()
                psutil.wait_procs(alive, timeout=5)
            except psutil.NoSuchProcess:
                pass
            except psutil.Error as exc:
                raise ProviderError(f"local: cannot stop {external_id}: {exc}", code="signal") from exc
        self._await_exit_record(external_id)

    def _await_exit_record(self, external_id: str, timeout: float = 5.0) -> None:
        """Give the supervisor a moment to write the exit code after the worker ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = _read_json(self._run_path(external_id))
            meta = _read_json(self._meta_path(external_id)) or {}
            if (
                not run
                or run.get("ended_at")
                or _process(meta.get("supervisor_pid"), meta.get("supervisor_create_time")) is None
            ):
                return
            time.sleep(0.05)

    def kill_worker(self, external_id: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to the running worker of ``external_id``; returns its pid.

        The supervisor records the exit (``-9`` for SIGKILL) and the instance lists as
        ``exited``. Raises ``ProviderError`` (``not_running``) if no worker process is running.
        """
        self._meta(external_id)
        _, proc = self._worker(external_id)
        if proc is None:
            raise ProviderError(f"local: {external_id} has no running worker", code="not_running")
        try:
            proc.send_signal(sig)
        except psutil.Error as exc:
            raise ProviderError(f"local: cannot signal {external_id}: {exc}", code="signal") from exc
        if sig == signal.SIGKILL:
            try:
                proc.wait(timeout=5)
            except psutil.Error:
                pass
            self._await_exit_record(external_id)
        return proc.pid

    def resume(self, external_id: str) -> None:
        """Start the worker of a stopped or exited instance again (same name); no-op if running."""
        meta = self._meta(external_id)
        if self._worker(external_id)[1] is not None:
            if meta.get("intended_status") != "running":
                meta["intended_status"] = "running"
                _write_json(self._meta_path(external_id), meta)
            return
        self._start(external_id, meta)

    def set_cordon(self, external_id: str, on: bool) -> None:
        """Record Warden's cordon in the instance's state file: its worker starts cordoned."""
        meta = self._meta(external_id)
        if bool(meta.get("cordoned")) != on:
            meta["cordoned"] = on
            _write_json(self._meta_path(external_id), meta)

    def reboot(self, external_id: str) -> None:
        """Stop, then start again."""
        self.stop(external_id)
        self.resume(external_id)

    def destroy(self, external_id: str) -> None:
        """Stop the worker and forget the instance (the log file is kept)."""
        self.stop(external_id)
        self._run_path(external_id).unlink(missing_ok=True)
        self._meta_path(external_id).unlink(missing_ok=True)
