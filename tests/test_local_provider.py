"""The local provider starts, reports, stops and destroys real worker processes."""

import signal

import psutil
import pytest

from fleet.providers.base import ProviderError
from tests import fleet_support
from tests.fleet_support import FLEET_DB, machine_of, wait_for

pytestmark = FLEET_DB
local_fleet = fleet_support.local_fleet


def by_id(provider, external_id):
    return {p.external_id: p for p in provider.list_instances()}.get(external_id)


def test_it_launches_a_real_worker_that_registers_under_its_name(local_fleet):
    inst = local_fleet.launch(label="demo")

    assert inst.external_id.startswith("local-")
    assert inst.status == "running"
    assert inst.worker_name == inst.external_id
    assert inst.started_at is not None
    assert inst.log_path.endswith(f"workers/{inst.external_id}.log")
    proc = psutil.Process(inst.pid)
    assert "fleet.worker" in " ".join(proc.cmdline())
    assert proc.is_running()
    machine = wait_for(lambda: machine_of(inst.worker_name), what="the worker's harmony_machines row")
    assert machine.harmonymachinedetails.tasks == "PoRep,UpdateProve,PSProve"


def test_it_gives_every_launch_a_new_id(local_fleet):
    first = local_fleet.launch()
    second = local_fleet.launch()
    local_fleet.destroy(second.external_id)
    third = local_fleet.launch()

    nums = [int(i.external_id.split("-")[1]) for i in (first, second, third)]
    assert nums == sorted(set(nums)), nums


def test_it_reports_a_killed_worker_as_exited_with_its_code(local_fleet):
    inst = local_fleet.launch()
    psutil.Process(inst.pid).send_signal(signal.SIGKILL)

    seen = wait_for(
        lambda: (p := by_id(local_fleet, inst.external_id)) and p.status == "exited" and p,
        what="status exited",
    )
    assert seen.exit_code == -9
    assert seen.intended_status == "running"


def test_it_stops_with_sigterm_and_the_worker_exits_cleanly(local_fleet):
    inst = local_fleet.launch()
    wait_for(lambda: machine_of(inst.worker_name), what="registration")

    local_fleet.stop(inst.external_id)

    seen = by_id(local_fleet, inst.external_id)
    assert seen.status == "stopped"
    assert seen.exit_code == 0
    assert not psutil.pid_exists(inst.pid) or psutil.Process(inst.pid).status() == psutil.STATUS_ZOMBIE


def test_it_kills_a_worker_that_ignores_sigterm_after_the_grace(local_fleet, settings):
    settings.WARDEN = {**settings.WARDEN, "STOP_GRACE_S": 0.5}
    inst = local_fleet.launch()
    # wait until the worker runs its own code (registered), so the suspend below is not racing its start-up
    wait_for(lambda: machine_of(inst.worker_name), what="the worker to register")
    # a stopped (SIGSTOP) process cannot act on SIGTERM: only SIGKILL ends it
    psutil.Process(inst.pid).suspend()

    local_fleet.stop(inst.external_id)

    seen = by_id(local_fleet, inst.external_id)
    assert seen.status == "stopped"
    assert seen.exit_code == -9


def test_it_resumes_a_stopped_instance_under_the_same_name(local_fleet):
    inst = local_fleet.launch()
    local_fleet.stop(inst.external_id)
    local_fleet.resume(inst.external_id)

    seen = by_id(local_fleet, inst.external_id)
    assert seen.status == "running"
    assert seen.pid != inst.pid
    assert seen.worker_name == inst.worker_name


def test_it_forgets_a_destroyed_instance_and_its_process_is_gone(local_fleet):
    inst = local_fleet.launch()

    local_fleet.destroy(inst.external_id)

    assert by_id(local_fleet, inst.external_id) is None
    assert not psutil.pid_exists(inst.pid) or psutil.Process(inst.pid).status() == psutil.STATUS_ZOMBIE


def test_it_refuses_an_unknown_instance(local_fleet):
    for call in (local_fleet.stop, local_fleet.destroy, local_fleet.resume):
        with pytest.raises(ProviderError) as err:
            call("local-999")
        assert err.value.code == "not_found"


def test_it_reports_a_malformed_state_file_as_an_error_not_as_no_instances(local_fleet, settings):
    local_fleet.launch()
    (settings.VAR_DIR / "workers" / "local-77.json").write_text("{not json")

    try:
        with pytest.raises(ProviderError) as err:
            local_fleet.list_instances()
        assert err.value.kind == "semantic"
    finally:
        (settings.VAR_DIR / "workers" / "local-77.json").unlink()
