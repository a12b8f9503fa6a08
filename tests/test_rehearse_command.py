"""``manage.py rehearse`` end to end: a child on scratch SQLite plays the day, the parent stores
the rehearsal and prints the table; ``--compare`` gives two linked rows and their difference."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.models import Rehearsal
from tests.days_support import day, window

ROOT = Path(__file__).resolve().parent.parent


def _run(*args, database_url: str):
    env = {k: v for k, v in os.environ.items() if k != "WARDEN_REHEARSE_DB_DIR"}
    env["DATABASE_URL"] = database_url  # the parent stores its rows in the test database
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), "rehearse", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_compare_plays_the_same_day_under_two_policies_and_stores_both(tmp_path):
    from django.db import connection

    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    a = window(day("bursty"), 8.9)
    b = {**a, "name": "launches without approval", "policy": {"launch_instance": "auto"}}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    done = _run(str(tmp_path / "a.json"), "--compare", str(tmp_path / "b.json"), "--hours", "0.75", database_url=url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("A: bursty day") and lines[1].startswith("B: bursty day under launches without approval")
    header = next(line for line in lines if line.startswith("metric"))
    assert header.split() == ["metric", "A", "B", "difference"]
    rows = list(Rehearsal.objects.order_by("pk"))
    assert len(rows) == 2 and all(r.status == "done" and r.progress == 1.0 for r in rows)
    assert rows[0].compare_to_id == rows[1].pk and rows[1].compare_to_id == rows[0].pk
    sa, sb = rows[0].result["summary"], rows[1].result["summary"]
    assert sa["proofs_arrived"] == sb["proofs_arrived"] == 200  # same arrivals on both sides
    assert sb["approvals_asked_by_tool"].get("launch_instance", 0) == 0  # B never asks to launch
    assert rows[0].result["unsafe"] == [] and rows[1].result["unsafe"] == []
    delivered = next(line for line in lines if line.startswith("proofs_delivered")).split()
    assert int(delivered[3].replace(",", "")) == sb["proofs_delivered"] - sa["proofs_delivered"]
