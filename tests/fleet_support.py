"""Shared set-up for the local fleet tests: real worker processes on the test databases.

``local_fleet`` points ``settings.VAR_DIR`` at a temporary directory, shortens the demo knobs
(1 s heartbeat, 1 s proofs), empties the HarmonyDB tables, and yields a ``LocalProvider``;
at teardown every worker it launched is destroyed (SIGTERM, then SIGKILL).
Workers inherit the test database names through ``fleet.providers.local.child_env``.
"""

import json
import time

import psutil
import pytest

from fleet.harmony import HarmonyMachine, HarmonyMachineDetails, HarmonyTask, HarmonyTaskHistory

FLEET_DB = pytest.mark.django_db(transaction=True, databases=["default", "harmony"])


def clear_harmony() -> None:
    for model in (HarmonyTaskHistory, HarmonyTask, HarmonyMachineDetails, HarmonyMachine):
        model.objects.all().delete()


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.1, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def witness_proves(provider, task_ids: list[int], timeout: float = 40.0) -> str:
    """Launch one more worker (the witness) and wait until every task of ``task_ids`` is proved.

    The positive signal behind a "this worker claimed nothing" check: the tasks sat claimable in
    the queue for the witness's whole start-up, so a worker that should not claim them had many
    claim rounds to get it wrong. Returns the witness's ``host_and_port`` (``completed_by`` of
    its proofs); fails the test after ``timeout`` seconds."""
    witness = provider.launch()
    machine = wait_for(lambda: machine_of(witness.worker_name), timeout=timeout, what="the witness to register")
    wait_for(lambda: HarmonyTaskHistory.objects.filter(task_id__in=task_ids, result=True).count() == len(task_ids),
             timeout=timeout, what=f"tasks {task_ids} to be proved")
    return machine.host_and_port


@pytest.fixture
def local_fleet(settings, tmp_path):
    from fleet.providers.local import LocalProvider

    settings.VAR_DIR = tmp_path
    settings.WARDEN = {
        **settings.WARDEN,
        "HEARTBEAT_S": 1,
        "PROOF_SECONDS": 1.0,
        "STOP_GRACE_S": 5.0,
        "STARTUP_GRACE_S": 0,
        "TASK_NAMES": ["PoRep", "UpdateProve", "PSProve"],
        "DEMAND_SOURCE": "local",
        "PROVIDER": "local",
    }
    clear_harmony()
    provider = LocalProvider()
    try:
        yield provider
    finally:
        settings.WARDEN = {**settings.WARDEN, "STOP_GRACE_S": 2.0}
        for meta in sorted((tmp_path / "workers").glob("local-*.json")):
            if not meta.name.endswith(".run.json"):
                try:
                    provider.destroy(meta.name[: -len(".json")])
                except Exception:  # noqa: BLE001 — a broken state file must not leave processes behind
                    kill_recorded_worker(meta.with_name(meta.name[: -len(".json")] + ".run.json"))
        clear_harmony()


def kill_recorded_worker(run_path) -> None:
    try:
        pid = json.loads(run_path.read_text())["worker_pid"]
        psutil.Process(pid).kill()
    except (OSError, ValueError, KeyError, psutil.Error):
        pass


def machine_of(name: str):
    """The ``harmony_machines`` row whose details carry ``machine_name=name`` (or None)."""
    d = HarmonyMachineDetails.objects.filter(machine_name=name).select_related("machine").first()
    return d.machine if d else None
