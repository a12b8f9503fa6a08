"""What a rehearsal measures (docs/rehearse.md "What is measured") and the oracle it is scored against.

:func:`measure` turns a played :class:`agent.rehearse.sim.Rehearsal` into the result stored on
``agent.models.Rehearsal.result``: ``summary`` (the keys of :data:`SUMMARY_KEYS`), ``hourly``
(one row per hour: proofs delivered, tasks arrived, the target, queued and backlog at the
hour's end, mean live workers, $ spent in the hour and the GPU part of it), ``unsafe`` and ``markers``.

The oracle is the **delivered-work lower bound** (:func:`work_lower_bound`, named by the summary's
``oracle`` key): every proof delivered within the horizon, its drawn seconds priced at the cheapest
$ per proof of the day, plus one median loading period per machine the busiest hour needs beyond
those running at the start. This rehearsal cannot have spent less (the argument is in the
function's docstring), so ``oracle_ratio`` = spent / that bound is ≥ 1; disk is left out of the
bound, so a day that keeps stopped disks pays for them in the ratio. A clairvoyant schedule meeting
the same queue-wait p95 would be a tighter bound; it is not computed.
"""

from __future__ import annotations

import math

from agent.models import Approval, ModelCall, Run, Step
from agent.policy.table import effective_limits

#: the summary's keys, in the table's order
SUMMARY_KEYS = (
    "hours", "proofs_delivered", "proofs_arrived", "target_met_hours", "queue_wait_p50_s", "queue_wait_p95_s",
    "queue_wait_max_s", "waiting_no_worker_min", "usd_gpu", "usd_disk", "usd_total", "usd_per_proof", "oracle", "oracle_usd",
    "oracle_ratio", "approvals_asked", "approvals_asked_by_tool", "approvals_approved", "approvals_rejected",
    "approvals_expired", "actions_by_themselves", "launches", "late_launches", "resumes", "stops", "destroys", "destroys_not_taken",
    "reboots", "flaps", "failures", "preemptions", "stuck_loading", "cycles", "runs", "model_tokens_in",
    "model_tokens_out", "model_usd", "unsafe",
)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = max(0, min(len(values) - 1, math.ceil(q * len(values)) - 1))
    return round(values[k], 1)


#: what the summary's ``oracle`` key says the ratio is against
ORACLE = "delivered-work lower bound"
#: a proof's median seconds on a GPU model the day gives none for (``DayWorld``'s own default)
DEFAULT_PROOF_S = 60.0


def lowest_prices(day) -> dict[str, float]:
    """GPU model → the lowest $/hr a machine of it could be had for on ``day``: its offers' prices
    at the start and after every price change, and the starting fleet's own prices."""
    low: dict[str, float] = {}
    entries = [(o.gpu_name, o.dph) for o in day.market.offers]
    entries += [(c.gpu_name, c.dph) for c in day.market.price_changes]
    entries += [(f.gpu_name, f.dph) for f in day.market.fleet if f.dph is not None]
    for gpu, dph in entries:
        low[gpu] = min(low.get(gpu, dph), dph)
    return low


def work_lower_bound(day, tasks, *, horizon: float, running_at_start: int = 0,
                     loading_periods=(), resumes: int = 0) -> dict:
    """The delivered-work lower bound of what the rehearsal of ``day`` spent on GPUs, in $.

    ``tasks``: the world's tasks (``agent.rehearse.world.Task``; those with ``done`` ≤ ``horizon``
    s count, each with its drawn ``took`` seconds on its ``gpu``); ``running_at_start``: machines
    running when the day began; ``loading_periods``: every launch's seconds from rented to running;
    ``resumes``: resumes requested (each took ``day.market.resume_s``). Returns ``{"usd",
    "proof_usd", "loading_usd", "machines_needed", "loadings"}`` ($, $, $, machines, machines).

    - **proofs**: ``rate`` = min over GPU models of (lowest $/hr × median proof s), the cheapest $
      per proof. A delivered proof took ``took`` s on a machine of ``gpu`` that cost at least that
      model's lowest price, so it cost at least ``took × rate / median(gpu) / 3600``: its drawn
      seconds at the cheapest $ per proof.
    - **loading**: in each clock hour of the horizon the delivered proofs kept machines busy ``B``
      s (their proving intervals clipped to the hour); a machine gives at most 3600 s an hour, so
      ``ceil(B / 3600)`` machines existed then (the busiest hour's is ``machines_needed``). Those
      beyond ``running_at_start`` were launched (and paid their loading) or resumed (and paid
      ``resume_s``) earlier: each is priced one median loading period — or the day's shortest
      loading or resume periods when they were shorter, so it stays a bound — at the lowest $/hr
      of any machine.

    Proof and loading seconds are disjoint periods of GPU billing, so their sum bounds ``usd_gpu``
    from below (disk is not in it). Tasks not delivered within the horizon add nothing: the
    rehearsal did not pay to prove them. 0 when no offer or fleet has a price.
    """
    low = lowest_prices(day)
    if not low:
        return {"usd": 0.0, "proof_usd": 0.0, "loading_usd": 0.0, "machines_needed": 0, "loadings": 0}
    medians = {g: p.median_s for g, p in day.work.proof_s.items()}

    def median(gpu: str) -> float:
        return medians.get(gpu, DEFAULT_PROOF_S)

    rate = min(dph * median(g) for g, dph in low.items())
    done = [t for t in tasks if t.done is not None and t.done <= horizon]
    proof_usd = sum(t.took * rate / median(t.gpu) for t in done) / 3600
    busy: dict[int, float] = {}
    for t in done:
        lo, hi = t.done - t.took, t.done
        for h in range(max(0, int(lo // 3600)), int(hi // 3600) + 1):
            part = min(hi, (h + 1) * 3600) - max(lo, h * 3600)
            if part > 0:
                busy[h] = busy.get(h, 0.0) + part
    needed = max((math.ceil(b / 3600 - 1e-9) for b in busy.values()), default=0)
    loadings = max(0, needed - running_at_start)
    typical = day.market.loading.median_s
    pool = sorted([*loading_periods, *([day.market.resume_s] * resumes)])[:loadings]
    loading_usd = min(low.values()) * sum(min(typical, p) for p in pool) / 3600
    return {"usd": proof_usd + loading_usd, "proof_usd": proof_usd, "loading_usd": loading_usd,
            "machines_needed": needed, "loadings": loadings}


def flaps(world, hold_off_min: float) -> int:
    """Retirements (stop, destroy) followed by a launch or resume within ``hold_off_min``."""
    launches = sorted(world.launched_at)
    n = 0
    for r in world.retired_at:
        if any(r <= t <= r + hold_off_min * 60 for t in launches):
            n += 1
    return n


def measure(reh) -> dict:
    """The result of the played rehearsal ``reh`` (see the module docstring)."""
    day, w = reh.day, reh.world
    horizon = reh.horizon
    runs = Run.objects.filter(number__gte=reh.first_run)
    tasks = [t for t in w.tasks if t.arrived < horizon]
    done = [t for t in tasks if t.done is not None]
    waits = [(t.claimed if t.claimed is not None else horizon) - t.arrived for t in tasks]
    approvals = Approval.objects.filter(run__in=runs)
    by_tool: dict[str, int] = {}
    for tool in approvals.values_list("tool", flat=True):
        by_tool[tool] = by_tool.get(tool, 0) + 1
    approved = sum(1 for m in reh.markers if m["kind"] == "approval_approved")
    rejected = approvals.filter(status="rejected").count()
    expired = approvals.filter(status="expired").count()
    self_run = Step.objects.filter(run__in=runs, kind="call", outcome="executed",
                                   tool__in=("launch_instance", "stop_instance", "resume_instance", "reboot_instance",
                                             "destroy_instance")).count()
    calls = ModelCall.objects.filter(run__in=runs)
    tokens_in = sum(calls.values_list("tokens_in", flat=True))
    tokens_out = sum(calls.values_list("tokens_out", flat=True))
    model_usd = sum(calls.values_list("cost_usd", flat=True))
    usd = w.gpu_usd + w.disk_usd
    oracle = work_lower_bound(day, w.tasks, horizon=horizon, running_at_start=w.running_at_start,
                              loading_periods=w.loading_samples, resumes=w.counts["resumes"])["usd"]
    hours = math.ceil(horizon / 3600 - 1e-9)
    hourly = []
    met = 0
    for h in range(hours):
        lo, hi = h * 3600, min(horizon, (h + 1) * 3600)
        proofs = sum(1 for t in done if lo <= t.done < hi)
        in_hour = [s for s in reh.samples if lo <= s["t"] < hi]
        upto_hi = [s for s in reh.samples if s["t"] <= hi]
        last = upto_hi[-1] if upto_hi else None
        target = in_hour[0]["target"] if in_hour else 0.0
        prev = [s for s in reh.samples if s["t"] <= lo]
        spend_lo = prev[-1]["spend"] if prev else 0.0
        spend_hi = last["spend"] if last else spend_lo
        gpu_lo = prev[-1]["gpu"] if prev else 0.0
        gpu_hi = last["gpu"] if last else gpu_lo
        arrived = sum(1 for t in tasks if lo <= t.arrived < hi)
        if proofs >= min(target * (hi - lo) / 3600, arrived) - 0.5:
            met += 1
        hourly.append({"hour": h, "proofs": proofs, "target": target, "arrived": arrived,
                       "queued": last["queued"] if last else 0, "backlog": last["backlog"] if last else 0,
                       "live_capacity": round(sum(s["live"] for s in in_hour) / len(in_hour), 2) if in_hour else 0,
                       "spend_usd": round(spend_hi - spend_lo, 4), "spend_gpu_usd": round(gpu_hi - gpu_lo, 4)})
    limits = effective_limits()
    summary = {
        "hours": round(horizon / 3600, 3),
        "proofs_delivered": len(done),
        "proofs_arrived": len(tasks),
        "target_met_hours": met,
        "queue_wait_p50_s": _pct(waits, 0.5),
        "queue_wait_p95_s": _pct(waits, 0.95),
        "queue_wait_max_s": round(max(waits), 1) if waits else None,
        "waiting_no_worker_min": reh.no_worker_min,
        "usd_gpu": round(w.gpu_usd, 4),
        "usd_disk": round(w.disk_usd, 4),
        "usd_total": round(usd, 4),
        "usd_per_proof": round(usd / len(done), 5) if done else None,
        "oracle": ORACLE,
        "oracle_usd": round(oracle, 4),
        "oracle_ratio": round(usd / oracle, 3) if oracle > 0 else None,
        "approvals_asked": sum(by_tool.values()),
        "approvals_asked_by_tool": by_tool,
        "approvals_approved": approved,
        "approvals_rejected": rejected,
        "approvals_expired": expired,
        "actions_by_themselves": self_run,
        "launches": w.counts["launches"],
        "late_launches": w.counts["late_launches"],
        "resumes": w.counts["resumes"],
        "stops": w.counts["stops"],
        "destroys": w.counts["destroys"],
        "destroys_not_taken": w.counts["destroys_not_taken"],
        "reboots": w.counts["reboots"],
        "flaps": flaps(w, float(limits.hold_off_min)),
        "failures": w.counts["failures"],
        "preemptions": w.counts["preemptions"],
        "stuck_loading": w.counts["stuck_loading"],
        "cycles": reh.cycles,
        "runs": runs.count(),
        "model_tokens_in": tokens_in,
        "model_tokens_out": tokens_out,
        "model_usd": round(model_usd, 6),
        "unsafe": len(reh.unsafe),
    }
    return {"summary": summary, "hourly": hourly, "unsafe": reh.unsafe, "markers": sorted([*reh.markers, *w.marks], key=lambda m: m["at_s"])}
