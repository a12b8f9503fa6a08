"""``manage.py demo``: prepare, enqueue N, kill-worker; bad input ends with one clear line."""

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from fleet.harmony import HarmonyTask
from fleet.models import Instance
from tests import fleet_support
from tests.fleet_support import FLEET_DB, wait_for

pytestmark = FLEET_DB
local_fleet = fleet_support.local_fleet


def test_it_enqueues_n_tasks_of_a_name(local_fleet, capsys):
    call_command("demo", "enqueue", "3", "--name", "UpdateProve")

    assert HarmonyTask.objects.filter(name="UpdateProve", owner__isnull=True).count() == 3
    assert "enqueued 3 UpdateProve" in capsys.readouterr().out


@pytest.mark.parametrize(("n", "says"), [
    ("0", "must be between 1 and 10,000"), ("-2", "cannot be negative"), ("many", "must be a whole number"),
    ("1.5", "must be a whole number"), ("１０", "digits 0-9"), ("٤", "digits 0-9"), ("1_0", "no _ or space separators"),
    ("1e3", "no sign or exponent"), ("-0", "not even -0"), ("[5]", "not a list"),
])
def test_it_refuses_a_count_that_is_not_a_positive_whole_number(local_fleet, n, says):
    # the operator-number rule (fleet.numbers), as on the dashboard's form
    with pytest.raises(CommandError) as err:
        call_command("demo", "enqueue", n)

    assert str(err.value).startswith("demo enqueue: N ") and says in str(err.value), str(err.value)
    assert "\n" not in str(err.value)
    assert not HarmonyTask.objects.exists()


def test_it_names_the_setting_when_the_harmony_database_is_unreadable(local_fleet):
    with connections["harmony"].cursor() as c:
        c.execute("ALTER TABLE harmony_task RENAME TO harmony_task_gone")
    try:
        with pytest.raises(CommandError) as err:
            call_command("demo", "enqueue", "2")
    finally:
        with connections["harmony"].cursor() as c:
            c.execute("ALTER TABLE harmony_task_gone RENAME TO harmony_task")

    msg = str(err.value)
    assert "HARMONY_DATABASE_URL" in msg and "\n" not in msg


def test_it_refuses_to_write_demo_tasks_into_a_real_curio(local_fleet, settings):
    settings.WARDEN = {**settings.WARDEN, "DEMAND_SOURCE": "curio"}

    with pytest.raises(CommandError) as err:
        call_command("demo", "enqueue", "2")

    assert "WARDEN_DEMAND_SOURCE=curio" in str(err.value)
    assert not HarmonyTask.objects.exists()


def test_prepare_is_idempotent(local_fleet, capsys):
    call_command("demo", "prepare")

    assert "already exist" in capsys.readouterr().out


def test_kill_worker_sigkills_a_running_worker(local_fleet, capsys):
    from fleet.sync import sync_instances

    p = local_fleet.launch()
    sync_instances(local_fleet)

    call_command("demo", "kill-worker")

    row = Instance.objects.get(external_id=p.external_id)
    assert (row.status, row.exit_code) == ("exited", -9)
    assert f"killed {p.external_id}" in capsys.readouterr().out
    wait_for(lambda: local_fleet.list_instances()[0].exit_code == -9, what="exit recorded")


def test_kill_worker_with_nothing_running_says_so(local_fleet):
    with pytest.raises(CommandError) as err:
        call_command("demo", "kill-worker")

    assert "no running local worker" in str(err.value)
