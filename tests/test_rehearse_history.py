"""A day file written from this installation's records (``agent.rehearse.history``): the arrivals
from proofs completed and the queue's growth, proof times per GPU model, the market at the rates
paid with its price change, loading times, failures and stuck launches, the fleet at the start,
approval delays by hour of the day, target changes, the limits and policy in force; a configured
secret never enters the file; the file is one the day reader accepts.

Real parts: PostgreSQL; instances whose status changes go through ``Instance.save()`` (``fleet.cost``
records them), proof credits through ``fleet.proof_cost.record_proof_credits`` as the observe writes
them, approvals as the pipeline parks them, the target through ``do_set_target``.
"""

import json
import math
from datetime import timedelta

import pytest
from django.utils import timezone

from agent.actions.session import do_set_target
from agent.actions.settings import do_update_overrides
from agent.models import Approval, Run, SessionState, Step
from agent.rehearse.day import parse_day
from agent.rehearse.history import HistoryError, apply_change, day_from_history, parse_span
from fleet.models import AuditLog
from fleet.proof_cost import record_proof_credits
from tests.perf_support import _instance, seed_day

pytestmark = pytest.mark.django_db

SECRET = "plain-vast-key-value-0451"  # not secret-shaped: only the configured reference tells it is one


def _credits(now, rows):
    """``rows``: [(worker, hours before now, seconds)] as the reader hands new proofs to the observe."""
    record_proof_credits([
        {"history_id": n + 1, "task_id": n + 1, "name": "PoRep", "host_and_port": "10.0.0.1:1", "worker": w,
         "seconds": s, "work_end": now - timedelta(hours=ago), "seen_at": now - timedelta(hours=ago)}
        for n, (w, ago, s) in enumerate(rows)])


def _approval(run, seq, created, status, delay_min, reason=""):
    step = Step.objects.create(run=run, seq=seq, kind="call", tool="launch_instance", args={"gpu_name": "RTX 4090"},
                               created_at=created, outcome="parked")
    return Approval.objects.create(run=run, step=step, tool="launch_instance", args={"gpu_name": "RTX 4090"},
                                   reason=reason, idempotency_key=f"k-{seq}", status=status, created_at=created,
                                   expires_at=created + timedelta(minutes=30),
                                   decided_at=created + timedelta(minutes=delay_min) if delay_min is not None else None)


@pytest.fixture
def yesterday(monkeypatch, settings):
    monkeypatch.setenv(settings.VAST["API_KEY_ENV"], SECRET)
    now = timezone.now().replace(microsecond=0)
    h = lambda n: now - timedelta(hours=n)  # noqa: E731
    seed_day(now)  # v-101 RTX 4090 launched at the start, v-102 / v-104 A100 (1.60 then 1.50), v-103 stopped
    _instance("v-105", "RTX 4090", 0.40, 0.02, h(10), [(h(10), "loading"), (h(9.9), "running"), (h(5), "exited")])
    _instance("v-106", "RTX 4090", 0.40, 0.02, h(3), [(h(3), "loading")], killed=h(1))  # never ran
    _instance("v-107", f"RTX {SECRET}", 0.40, 0.02, h(2), [(h(2), "loading")])  # a name that holds the secret
    # three proofs in hour 5 of the day (18.5 h ago), three more later
    _credits(now, [("v-101", 18.5, 55), ("v-101", 18.4, 60), ("v-101", 18.3, 65),
                   ("v-102", 10.2, 25), ("v-102", 10.1, 30), ("v-102", 10.0, 32)])
    run = Run.objects.create(number=1, trigger="beat", planner="rules", status="done", started_at=h(23))
    start = h(24)
    # both decided approvals in one clock hour of the day (start's hour + 1), whatever the minute now
    hour1 = (start + timedelta(hours=1)).replace(minute=0, second=0)
    _approval(run, 1, hour1 + timedelta(minutes=5), "executed", 10, reason=f"key {SECRET}")
    _approval(run, 2, hour1 + timedelta(minutes=30), "rejected", 20)
    _approval(run, 3, hour1 + timedelta(hours=2, minutes=5), "expired", None)
    row_before = AuditLog.objects.count()
    SessionState.objects.filter(pk=SessionState.get().pk).update(target_proofs_hr=120)
    do_set_target(180, "user:alice", f"busy day {SECRET}")
    AuditLog.objects.filter(pk__gt=row_before, verb="set_target").update(at=h(6))  # the change, 18 h into the day
    do_update_overrides({"launch_instance": "approval"}, {"max_instances": 6}, "user:alice", "for the test")
    return now


def test_the_day_follows_the_records(yesterday):
    now = yesterday
    day = day_from_history(24, now=now)
    parse_day(json.loads(json.dumps(day)))  # the day reader accepts it as written
    assert day["start"] == (now - timedelta(hours=24)).isoformat().replace("+00:00", "Z") and day["horizon_h"] == 24

    work = day["work"]
    hourly = work["arrivals"]["hourly"]
    assert len(hourly) == 24
    # hour 5: three proofs done while tasks in the system went from 30 + 2 to 29 + 2: 3 - 1 arrived
    assert hourly[5] == 2.0
    assert hourly[0] == 0.0  # one fewer queued, nothing completed: never a negative arrival
    assert work["queued_at_start"] == 40
    assert work["task_types"] == {"PoRep": 1.0} and work["arrivals"]["hourly_type"] == "PoRep"
    assert work["proof_s"]["RTX 4090"]["median_s"] == 60.0
    assert work["proof_s"]["RTX 4090"]["spread"] == pytest.approx(
        round(math.sqrt(sum((math.log(x) - sum(map(math.log, (55, 60, 65))) / 3) ** 2 for x in (55, 60, 65)) / 3), 3))
    assert work["proof_s"]["A100"]["median_s"] == 30.0

    market = day["market"]
    offers = {o["gpu_name"]: o for o in market["offers"]}
    assert set(offers) == {"RTX 4090", "A100"}  # the instance whose name held the secret is left out
    assert offers["A100"]["dph"] == 1.60  # the first rate of the day; then a price change at the later launch
    assert market["price_changes"] == [{"at_h": 12.0, "gpu_name": "A100", "dph": 1.5}]
    assert offers["A100"]["disk_usd_gb_month"] == pytest.approx(0.05 * 730 / offers["A100"]["disk_gb"], rel=1e-4)
    assert market["fleet"] == [{"gpu_name": "RTX 4090", "count": 1, "dph": 0.45, "status": "stopped"}]  # v-103
    # loading: v-101 30 min, v-102 15 min, v-104 running at once (1 s), v-105 6 min
    assert market["loading"] == {"median_s": (900 + 360) / 2, "p95_s": 1800.0}
    run_hours = 23.5 + 11.75 + 6 + 4.9  # v-101, v-102 (stopped 8 h ago), v-104 (killed 6 h ago), v-105
    assert market["failure_per_hr"] == pytest.approx(1 / run_hours, rel=1e-4)  # v-105 exited
    assert market["stuck_loading_fraction"] == 0.2  # v-106 of five launches (v-107 is left out)

    op = day["operator"]
    start_hour = (now - timedelta(hours=24)).hour
    delays = op["approval_delay_min"]
    assert delays[(start_hour + 1) % 24] == 15.0  # 10 and 20 min: the hour's median
    assert delays[(start_hour + 3) % 24] is None  # only expired: nobody answered
    assert delays[(start_hour + 7) % 24] == 15.0  # no approval that hour: the day's median
    assert op["reject_fraction"] == 0.5
    assert op["target_changes"] == [{"at_h": 18.0, "target_proofs_hr": 180.0}]

    assert day["objectives"]["target_proofs_hr"] == 120.0  # as it was at the start of the day
    assert day["objectives"]["max_instances"] == 6 and day["policy"]["launch_instance"] == "approval"
    assert day["planner"] == "rules"


def test_a_configured_secret_never_enters_the_file(yesterday):
    text = json.dumps(day_from_history(24, now=yesterday))
    assert SECRET not in text and "[REDACTED]" not in text
    assert AuditLog.objects.filter(reason__contains=SECRET).exists()  # it was there to leak


def test_a_change_is_applied_to_the_day(yesterday):
    day = day_from_history(24, now=yesterday)
    changed = apply_change(day, {"stop_instance": "auto", "launch_instance": None}, {"max_instances": 9, "launch_rate": [2, 600]})
    assert changed["objectives"]["max_instances"] == 9 and changed["objectives"]["launch_rate"] == [2, 600]
    assert changed["policy"]["stop_instance"] == "auto" and "launch_instance" not in changed["policy"]
    assert day["objectives"]["max_instances"] == 6  # the original is kept
    parse_day(changed)


def test_spans_are_read_strictly():
    assert parse_span("24h") == 24 and parse_span("90m") == 1.5 and parse_span("2d") == 48
    for bad in ("24", "yesterday", "0m", "8d", "-1h", "1e3h"):
        with pytest.raises(HistoryError, match="span"):
            parse_span(bad)


def test_an_empty_installation_still_writes_a_day(db):
    day = day_from_history(2, now=timezone.now())
    parse_day(day)
    assert day["work"]["arrivals"]["hourly"] == [0.0, 0.0] and day["market"]["offers"] == []


def _rehearse(*args) -> tuple[int, str, str]:
    import io

    from django.core.management import call_command

    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as stop:
        call_command("rehearse", *args, stdout=out, stderr=err)
    return stop.value.code, out.getvalue(), err.getvalue()


def test_the_command_writes_the_file(yesterday, tmp_path):
    from agent.rehearse.day import load_day

    target = tmp_path / "yesterday.json"
    code, out, err = _rehearse("--from-history", "24h", "--out", str(target))
    assert code == 0 and not err and f"wrote {target}: 24 h from " in out and "2 offer(s)" in out
    day, raw = load_day(target)  # the day reader takes it as it is
    assert day.horizon_h == 24 and SECRET not in target.read_text()
    code, out, _ = _rehearse("--from-history", "90m")  # no --out: the JSON on stdout
    assert code == 0 and json.loads(out)["horizon_h"] == 1.5


def test_the_command_refuses_bad_input_in_one_line(db, tmp_path):
    code, _, err = _rehearse("--from-history", "yesterday")
    assert code == 2 and err.strip().count("\n") == 0 and "24h, 90m or 2d" in err
    code, _, err = _rehearse("--from-history", "1h", "--out", str(tmp_path / "no" / "such" / "dir.json"))
    assert code == 2 and "cannot write" in err and "Traceback" not in err
    code, _, err = _rehearse()
    assert code == 2 and "--from-history SPAN" in err
