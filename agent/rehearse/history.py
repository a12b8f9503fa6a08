"""A day file from this installation's own records: "your own yesterday" (docs/rehearse.md).

:func:`day_from_history` reads the last ``hours`` of records and writes the day they describe in the
schema of :mod:`agent.rehearse.day`, so an operator can rehearse a proposed change on the day that
really happened (``manage.py rehearse --from-history 24h``, or "Rehearse this change on yesterday" on
the Settings page). What comes from where:

- **the work**: tasks arriving in hour ``h`` = proofs completed in it (``fleet.ProofCredit``, every
  worker's; without credits, the demand samples' measured proofs/hr) plus the growth of the tasks in
  the queue (``DemandSample`` queued + running, first and last good read of the hour); never below 0.
  ``queued_at_start`` is the first good read's queue. Proof seconds per GPU model are the credits'
  median and their lognormal spread (the standard deviation of log seconds); a GPU model without
  credits takes the median of all credits, else the demand samples' measured ``proof_s``, else
  ``WARDEN_PROOF_SECONDS``. The task type is the commonest credited task name.
- **the market**: one offer per GPU model the fleet rented in the window, at the median GPU rate it
  paid (``fleet.StatusChange`` of GPU-billed states) and its storage rate as disk $ (over
  ``WARDEN_VAST_DISK_GB``); a rate that changed between launches of one model is a price change at
  the later launch. Loading time: the median and 95th percentile from creation to the first
  ``running``; failures per running hour: changes from ``running`` to ``exited``/``error``/
  ``offline``; stuck launches: instances destroyed before they ever ran; destroys that did not take:
  ``destroy_unconfirmed`` alerts per destroy. The fleet at the start: instances that existed then,
  running or stopped, with their rates.
- **the operator**: approval delays (decided minus parked) by hour of the day, the median of each
  hour; an hour in which approvals only expired is absent (null); an hour with no approval takes the
  day's median. ``reject_fraction``: rejections among decisions. Target changes: the audited
  ``set_target`` actions.
- **objectives and policy**: the limits and the policy table in force now (an override changed during
  the window is not replayed), the target as it was at the start of the window.
- ``heartbeat_s`` is ``WARDEN_OBSERVE_INTERVAL_S``; the planner is ``rules`` (add a ``model``
  section to rehearse the ``llm`` planner).

Secrets never enter the file: it holds numbers, GPU model names and task type names only; those
names are redacted (``fleet.secrets.redact``), and the finished text is checked against every
secret this installation has configured (the values behind its key and token references and
``SECRET_KEY``): a name holding one is dropped. The result is validated with
:func:`agent.rehearse.day.parse_day` before it is returned.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings

from agent.actions.settings import policy_keys
from agent.models import Approval, SessionState
from agent.policy.limits import Limits
from agent.policy.table import effective_limits, effective_policy
from agent.rehearse.day import MAX_HORIZON_H, DayFileError, parse_day
from fleet.clock import clock
from fleet.models import Alert, AuditLog, DemandSample, Instance, ProofCredit, StatusChange
from fleet.secrets import MARK, redact

#: provider states billed at the GPU rate (``fleet.cost``) and states that end a running worker
GPU_STATES = ("running",)
FAILED_STATES = ("exited", "error", "offline")
#: the spans ``--from-history`` takes: ``24h``, ``90m``, ``2d``
SPAN = re.compile(r"(\d{1,4}(?:\.\d{1,3})?) ?([mhd])")
TASK_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


class HistoryError(ValueError):
    """The records cannot make a day file; the message is one line saying why and what to do."""


def parse_span(text: str) -> float:
    """``"24h"`` / ``"90m"`` / ``"2d"`` as hours (``--from-history``); :class:`HistoryError` naming the
    text otherwise, or when it is not between 1 minute and 7 days."""
    m = SPAN.fullmatch(str(text or "").strip()[:20])
    if not m:
        raise HistoryError(f"--from-history takes a span such as 24h, 90m or 2d; got {str(text)[:40]!r}")
    hours = float(m.group(1)) * {"m": 1 / 60, "h": 1, "d": 24}[m.group(2)]
    if not 1 / 60 <= hours <= MAX_HORIZON_H:
        raise HistoryError(f"--from-history {str(text).strip()}: the span must be between 1m and {MAX_HORIZON_H // 24}d")
    return hours


def configured_secrets() -> list[str]:
    """The secret values this installation has configured, read from their references (the vast.ai
    and model API keys, the HTTP demand token: environment variables or files) and ``SECRET_KEY``;
    values shorter than 8 characters are left out (they would match ordinary text)."""
    refs_env = [settings.VAST.get("API_KEY_ENV"), settings.MODEL.get("API_KEY_ENV"),
                settings.WARDEN.get("DEMAND_TOKEN_ENV")]
    refs_file = [settings.VAST.get("API_KEY_FILE"), settings.MODEL.get("API_KEY_FILE"),
                 settings.WARDEN.get("DEMAND_TOKEN_FILE")]
    values = [settings.SECRET_KEY] + [os.environ.get(n, "") for n in refs_env if n]
    for path in refs_file:
        if path:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    values.append(f.read(10_000).strip())
            except OSError:
                pass
    return [v for v in values if isinstance(v, str) and len(v) >= 8]


def _clean_name(text: str, secrets: list[str], limit: int = 64) -> str:
    text = redact(str(text or "").strip())[:limit]
    if MARK in text or any(s in text for s in secrets):
        return ""
    return text


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _h(t: datetime, start: datetime) -> float:
    return round(min(max((t - start).total_seconds() / 3600, 0.0), MAX_HORIZON_H), 4)


def _pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _work(start, end, hours: int, secrets: list[str]) -> tuple[dict, dict]:
    """``(work section, proof seconds per GPU model)`` from demand samples and proof credits."""
    credits = list(ProofCredit.objects.filter(seen_at__gte=start, seen_at__lt=end)
                   .values_list("seen_at", "gpu_name", "seconds", "name"))
    samples = list(DemandSample.objects.filter(taken_at__gte=start, taken_at__lt=end, state="ok")
                   .order_by("taken_at").values_list("taken_at", "queued", "running", "proofs_hr", "proof_s"))
    proofs = [0.0] * hours
    for seen_at, *_ in credits:
        proofs[min(hours - 1, int((seen_at - start).total_seconds() // 3600))] += 1
    by_hour: dict[int, list] = defaultdict(list)
    for row in samples:
        by_hour[min(hours - 1, int((row[0] - start).total_seconds() // 3600))].append(row)
    if not credits:  # no proof history (a JSON demand source): the measured rate, hour by hour
        for h, rows in by_hour.items():
            rates = [r[3] for r in rows if r[3] is not None]
            proofs[h] = statistics.fmean(rates) if rates else 0.0
    in_system = {h: [(r[1] or 0) + (r[2] or 0) for r in rows] for h, rows in by_hour.items()}
    arrivals = []
    for h in range(hours):
        level = in_system.get(h)
        growth = (level[-1] - level[0]) if level else 0
        arrivals.append(round(max(0.0, proofs[h] + growth), 1))
    names = Counter(n for *_, n in credits if n and TASK_TYPE.fullmatch(n) and _clean_name(n, secrets, 32))
    task_type = names.most_common(1)[0][0] if names else "PoRep"
    seconds: dict[str, list[float]] = defaultdict(list)
    for _, gpu, s, _ in credits:
        if s and s > 0:
            seconds[_clean_name(gpu, secrets)].append(float(s))
    proof_s = {}
    for gpu, xs in seconds.items():
        if gpu:
            logs = [math.log(x) for x in xs]
            proof_s[gpu] = {"median_s": round(statistics.median(xs), 3),
                            "spread": round(min(2.0, statistics.pstdev(logs)), 3) if len(xs) > 1 else 0.0}
    every = [x for xs in seconds.values() for x in xs]
    measured = [r[4] for r in samples if r[4]]
    fallback = (statistics.median(every) if every else statistics.median(measured) if measured
                else float(settings.WARDEN["PROOF_SECONDS"]))
    work = {
        "queued_at_start": int(samples[0][1] or 0) if samples and samples[0][0] - start < timedelta(hours=1) else 0,
        "arrivals": {"hourly": arrivals, "hourly_type": task_type},
        "task_types": {task_type: 1.0},
        "looks_dead_s": float(min(86_400, max(1, settings.WARDEN["LOOKS_DEAD_S"]))),
    }
    return work, {"by_gpu": proof_s, "fallback": round(max(0.001, fallback), 3)}


def _market(start, end, secrets: list[str], max_instances: int) -> dict:
    """The market section: offers at the rates paid, price changes, loading, faults, the fleet at the start."""
    insts = list(Instance.objects.filter(created_at__lt=end).exclude(killed_at__lt=start).order_by("created_at"))
    changes: dict[int, list] = defaultdict(list)
    for iid, at, status, dph, sdph in (StatusChange.objects.filter(instance__in=insts, at__lt=end)
                                       .order_by("instance_id", "at", "id")
                                       .values_list("instance_id", "at", "status", "dph", "storage_dph")):
        changes[iid].append((at, status, dph, sdph))
    disk_gb = float(settings.VAST.get("DISK_GB") or 40)
    rates: dict[str, list[float]] = defaultdict(list)
    storage: dict[str, list[float]] = defaultdict(list)
    launches: list[tuple[datetime, str, float]] = []
    loading, run_hours, failures, stuck, launched, fleet = [], 0.0, 0, 0, 0, Counter()
    for inst in insts:
        gpu = _clean_name(inst.gpu_name, secrets)
        if not gpu:
            continue
        rows = changes.get(inst.pk) or [(inst.status_since, inst.status, inst.dph, inst.storage_dph)]
        gpu_rates = [d for _, s, d, _ in rows if s in GPU_STATES and d > 0] or ([inst.dph] if inst.dph > 0 else [])
        rates[gpu] += gpu_rates
        storage[gpu] += [sd for *_, sd in rows if sd > 0] or ([inst.storage_dph] if inst.storage_dph > 0 else [])
        first_run = next((at for at, s, _, _ in rows if s == "running"), None)
        if inst.created_at >= start:
            launched += 1
            if gpu_rates:
                launches.append((inst.created_at, gpu, gpu_rates[0]))
            if first_run is not None:
                loading.append(max(1.0, (first_run - inst.created_at).total_seconds()))
            elif inst.killed_at is not None:
                stuck += 1  # destroyed before it ever ran
        else:  # rented before the day: the fleet at the start, as it stood then
            before = [r for r in rows if r[0] <= start] or rows[:1]
            at_start = before[-1][1]
            if at_start in ("running", "stopped"):
                dph = next((d for _, s, d, _ in reversed(before) if s in GPU_STATES and d > 0), inst.dph)
                fleet[(gpu, round(dph, 4), at_start)] += 1
        # running hours and failures inside the window
        for n, (at, status, _, _) in enumerate(rows):
            until = rows[n + 1][0] if n + 1 < len(rows) else (inst.killed_at or end)
            if status == "running":
                a, b = max(at, start), min(until, end)
                run_hours += max(0.0, (b - a).total_seconds() / 3600)
                if n + 1 < len(rows) and rows[n + 1][1] in FAILED_STATES and start <= rows[n + 1][0] < end:
                    failures += 1
    seen_by_gpu = Counter(_clean_name(i.gpu_name, secrets) for i in insts)
    offers = []
    for gpu in sorted(rates.keys() | storage.keys()):
        dph = round(statistics.median(rates[gpu]), 4) if rates[gpu] else 0.0
        sdph = statistics.median(storage[gpu]) if storage[gpu] else 0.0
        seen = seen_by_gpu[gpu]
        offers.append({"gpu_name": gpu, "dph": min(dph, 1e4), "count": min(100_000, max(seen, max_instances) + seen),
                       "disk_gb": disk_gb, "disk_usd_gb_month": round(min(1e4, sdph * 730 / disk_gb), 6)})
    price_changes, last = [], {}
    for at, gpu, dph in launches:
        if gpu in last and abs(last[gpu] - dph) > 1e-9:
            price_changes.append({"at_h": _h(at, start), "gpu_name": gpu, "dph": round(min(dph, 1e4), 4)})
        last[gpu] = dph
    # a price change names an offer; the offers' price is the first paid in the day when it changed
    first = {}
    for _, gpu, dph in launches:
        first.setdefault(gpu, dph)
    for o in offers:
        if any(p["gpu_name"] == o["gpu_name"] for p in price_changes):
            o["dph"] = round(first[o["gpu_name"]], 4)
    destroys = Instance.objects.filter(destroy_requested_at__gte=start, destroy_requested_at__lt=end).count()
    unconfirmed = Alert.objects.filter(kind="destroy_unconfirmed", raised_at__gte=start, raised_at__lt=end).count()
    market = {
        "offers": offers,
        "failure_per_hr": round(min(60.0, failures / run_hours), 6) if run_hours > 0 else 0.0,
        "stuck_loading_fraction": round(stuck / launched, 4) if launched else 0.0,
        "destroy_fails_fraction": round(min(1.0, unconfirmed / destroys), 4) if destroys else 0.0,
        "price_changes": price_changes,
        "fleet": [{"gpu_name": g, "count": n, "dph": min(d, 1e4), "status": s} for (g, d, s), n in sorted(fleet.items())],
    }
    if loading:
        median = statistics.median(loading)
        market["loading"] = {"median_s": round(median, 1), "p95_s": round(max(median, _pct(loading, 0.95)), 1)}
    return market


def _operator(start, end) -> dict:
    """The operator section: approval delays by hour of the day, rejections, target changes."""
    delays: dict[int, list[float]] = defaultdict(list)
    expired: set[int] = set()
    decided = rejected = 0
    for created, decided_at, status in (Approval.objects.filter(created_at__gte=start, created_at__lt=end)
                                        .values_list("created_at", "decided_at", "status")):
        hour = created.astimezone(start.tzinfo).hour
        if decided_at is not None and status != "expired":
            delays[hour].append(min(MAX_HORIZON_H * 60, max(0.0, (decided_at - created).total_seconds() / 60)))
            decided += 1
            rejected += status == "rejected"
        elif status == "expired":
            expired.add(hour)
    every = [d for ds in delays.values() for d in ds]
    day_median = round(statistics.median(every), 2) if every else 2.0
    profile = []
    for hour in range(24):
        if delays.get(hour):
            profile.append(round(statistics.median(delays[hour]), 2))
        else:
            profile.append(None if hour in expired else day_median)
    changes = []
    for at, after in (AuditLog.objects.filter(verb="set_target", at__gte=start, at__lt=end).order_by("at", "id")
                      .values_list("at", "after")):
        value = (after or {}).get("target_proofs_hr") if isinstance(after, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1e9:
            changes.append({"at_h": _h(at, start), "target_proofs_hr": float(value)})
    return {"approval_delay_min": profile, "reject_fraction": round(rejected / decided, 4) if decided else 0.0,
            "target_changes": changes}


def _target_at(start, end, now_target: float) -> float:
    first = (AuditLog.objects.filter(verb="set_target", at__gte=start, at__lt=end).order_by("at", "id")
             .values_list("before", flat=True).first())
    value = (first or {}).get("target_proofs_hr") if isinstance(first, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else float(now_target)


def objectives_and_policy(state=None) -> tuple[dict, dict]:
    """The limits and the policy table in force (``agent.policy.table``), as a day file's ``objectives`` and
    ``policy`` take them (the replay file's keys, docs/replay.md)."""
    state = state or SessionState.get()
    limits = effective_limits(state).model_dump()
    allowed = set(Limits.model_fields)
    objectives = {}
    for k in sorted(allowed):
        v = limits.get(k)
        if isinstance(v, list | tuple):
            objectives[k] = list(v)
        elif isinstance(v, int | float) and not isinstance(v, bool):
            objectives[k] = v
    keys = set(policy_keys())
    policy = {k: v for k, v in effective_policy(state).items() if k in keys and v in ("auto", "approval", "forbidden")}
    return objectives, policy


def day_from_history(hours: float = 24, *, now: datetime | None = None, name: str = "") -> dict:
    """The day file (a JSON-ready dict, the schema of :mod:`agent.rehearse.day`) of the ``hours``
    (at most a week) before ``now`` (default: the clock's now), from this installation's records as
    the module docstring says. Raises :class:`HistoryError` when ``hours`` is out of range or the
    result does not validate (a bug: the message names the field)."""
    if not (isinstance(hours, int | float) and 1 / 60 <= hours <= MAX_HORIZON_H):
        raise HistoryError(f"the span must be between 1 minute and {MAX_HORIZON_H} hours; got {hours!r}")
    end = (now or clock.now()).replace(microsecond=0)
    start = end - timedelta(hours=hours)
    whole_hours = max(1, math.ceil(hours))
    secrets = configured_secrets()
    state = SessionState.get()
    objectives, policy = objectives_and_policy(state)
    objectives["target_proofs_hr"] = _target_at(start, end, state.target_proofs_hr)
    work, proof = _work(start, end, whole_hours, secrets)
    market = _market(start, end, secrets, int(objectives.get("max_instances") or 1))
    for gpu in {o["gpu_name"] for o in market["offers"]} | {f["gpu_name"] for f in market["fleet"]}:
        work.setdefault("proof_s", {})[gpu] = proof["by_gpu"].get(gpu) or {"median_s": proof["fallback"], "spread": 0.0}
    day = {
        "name": (name or f"history {_iso(start)} to {_iso(end)}")[:200],
        "about": (f"Written from this installation's records of the {hours:g} h before {_iso(end)} "
                  "(manage.py rehearse --from-history): arrivals from proofs completed and the queue's growth, "
                  "the market at the rates paid, approval delays as operators answered; the limits and policy in "
                  "force when it was written."),
        "start": _iso(start),
        "horizon_h": round(float(hours), 4),
        "heartbeat_s": float(min(3600, max(10, settings.WARDEN["OBSERVE_INTERVAL_S"]))),
        "seed": 0,
        "planner": "rules",
        "market": market,
        "work": work,
        "operator": _operator(start, end),
        "objectives": objectives,
        "policy": policy,
    }
    text = json.dumps(day)
    leaked = [s for s in secrets if s in text]
    if leaked:  # unreachable by construction (names are checked one by one); never write it
        raise HistoryError("the day file would hold a configured secret; nothing written")
    try:
        parse_day(json.loads(text), "the day from history")
    except DayFileError as exc:
        raise HistoryError(str(exc)) from None
    return day


def apply_change(day: dict, policy: dict, limits: dict) -> dict:
    """``day`` with a settings change applied (the Settings page's form, as
    ``agent.actions.settings.validate_overrides`` cleaned it): each limit into ``objectives``, each policy key
    into ``policy`` (``None``: back to the default, the key removed). A new dict; ``day`` is kept."""
    out = json.loads(json.dumps(day))
    for key, value in (limits or {}).items():
        if value is None:
            out["objectives"].pop(key, None)
        else:
            out["objectives"][key] = list(value) if isinstance(value, list | tuple) else value
    for key, value in (policy or {}).items():
        if value is None:
            out["policy"].pop(key, None)
        else:
            out["policy"][key] = value
    return out


def write_from_history(span: str, out: str | None, stdout, stderr) -> int:
    """``manage.py rehearse --from-history SPAN [--out FILE]``: the day of the last ``span``
    (:func:`parse_span`) written to ``out`` (a summary line on ``stdout``), or as JSON on ``stdout``
    without it. Returns the exit status: 0 written, 2 a bad span or an unwritable file (one line on
    ``stderr`` naming it and what to do)."""
    try:
        hours = parse_span(span)
        day = day_from_history(hours)
    except HistoryError as exc:
        stderr.write(f"rehearse: {exc}")
        return 2
    text = json.dumps(day, indent=1)
    if not out:
        stdout.write(text)
        return 0
    try:
        Path(out).write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        stderr.write(f"rehearse: --out {out}: cannot write: {exc.strerror or exc}; give a writable file path")
        return 2
    tasks = sum(day["work"]["arrivals"]["hourly"]) + day["work"]["queued_at_start"]
    stdout.write(f"wrote {out}: {hours:g} h from {day['start']}, {len(day['market']['offers'])} offer(s), "
                 f"{tasks:,.0f} task(s); rehearse it with: python manage.py rehearse {out}")
    return 0
