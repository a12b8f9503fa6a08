"""The Rehearsals pages: every rehearsal of a day (``manage.py rehearse`` or "Rehearse this change on
yesterday" on the Settings page), and one rehearsal's outcome: the summary in words and units, the
charts of its day (queue and backlog, live capacity against the target, cumulative $, with markers
where approvals waited and where an unsafe decision happened) and, while it runs, a progress bar.

The numbers are the stored ``agent.models.Rehearsal.result`` (its docstring gives the shape); the
charts are drawn in the browser by the vendored Chart.js (``static/rehearsal.js``) from the series
this view puts in the page as JSON. A running rehearsal's progress is stored on its row by the task
(``agent.tasks.rehearse``), which announces ``rehearsals-changed`` on the websocket: the page's region
re-fetches itself, and once the rehearsal is done nothing announces and nothing is fetched.
"""

from collections import Counter

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from agent.actions.runs import do_start_rehearsal
from agent.actions.settings import OverrideError, validate_overrides
from agent.models import Rehearsal, SessionState
from agent.rehearse.day import DayFileError, policy_differences
from agent.rehearse.history import HistoryError, apply_change, day_from_history, objectives_and_policy
from console.templatetags.console_extras import age, join_list
from console.views.common import (
    HtmxHttpRequest,
    _form_errors,
    _is_region,
    _page_context,
    actor_of,
    operator_required,
    page_number,
)
from console.views.settings import _settings_form

#: rehearsals per page of the list
ON_PAGE = 50
#: the most markers listed on a rehearsal's page (the rest are counted by kind)
MARKERS_SHOWN = 200

#: the summary's metrics in words, in the order shown: key of ``result["summary"]`` → (words, unit).
#: Units: ``n`` a count, ``usd`` dollars, ``usd4`` dollars to 4 places ($ per proof), ``s`` seconds,
#: ``min`` minutes, ``ratio`` a plain ratio (× the oracle), ``pct`` a share 0..1 shown in percent,
#: ``per_hr`` proofs per hour, ``tokens`` model tokens. A key not listed is shown by its name.
SUMMARY = {
    "hours": ("hours rehearsed", "h"),
    "proofs_delivered": ("proofs delivered", "n"),
    "proofs_arrived": ("tasks arrived", "n"),
    "target_met_hours": ("hours the delivered rate met the target (or the work there was)", "n"),
    "queue_wait_p50_s": ("queue wait, arrival to claim: median", "s"),
    "queue_wait_p95_s": ("queue wait, arrival to claim: 95th percentile", "s"),
    "queue_wait_max_s": ("queue wait, arrival to claim: longest", "s"),
    "waiting_no_worker_min": ("minutes with work waiting and no live worker", "min"),
    "usd_gpu": ("spent on GPUs", "usd"),
    "usd_disk": ("spent on disk", "usd"),
    "usd_total": ("spent, GPU and disk", "usd"),
    "usd_per_proof": ("$ per proof", "usd4"),
    "oracle": ("the oracle the ratio uses", ""),
    "oracle_usd": ("the oracle's $", "usd"),
    "oracle_ratio": ("spent against the oracle", "ratio"),
    "approvals_asked": ("approvals asked", "n"),
    "approvals_asked_by_tool": ("approvals asked, by tool", "n"),
    "approvals_approved": ("approvals approved", "n"),
    "approvals_rejected": ("approvals rejected", "n"),
    "approvals_expired": ("approvals expired unanswered", "n"),
    "actions_by_themselves": ("actions run by themselves (no approval needed)", "n"),
    "launches": ("launches", "n"),
    "late_launches": ("launches whose worker came up after the work had drained", "n"),
    "resumes": ("resumes", "n"),
    "stops": ("stops", "n"),
    "destroys": ("destroys", "n"),
    "destroys_not_taken": ("destroys that did not take", "n"),
    "reboots": ("reboots", "n"),
    "flaps": ("flaps: a retirement followed by a launch within the hold-off", "n"),
    "failures": ("instances that failed while running", "n"),
    "preemptions": ("preemptions", "n"),
    "stuck_loading": ("launches stuck loading", "n"),
    "cycles": ("agent cycles run", "n"),
    "runs": ("runs recorded", "n"),
    "model_tokens_in": ("model tokens in", "tokens"),
    "model_tokens_out": ("model tokens out", "tokens"),
    "model_usd": ("model spend", "usd"),
    "unsafe": ("unsafe decisions", "n"),
}


def in_units(value, unit: str) -> str:
    """``value`` in words with its ``unit`` (:data:`SUMMARY`): ``"$12.40"``, ``"95 s"``, ``"1.25 ×"``,
    ``"3 h 5 min"`` for long waits; ``"not measured"`` for None; a mapping (a count by tool) as
    ``"launch_instance 3, stop_instance 1"``."""
    if value is None:
        return "not measured"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if unit == "usd":
        return f"${value:,.2f}"
    if unit == "usd4":
        return f"${value:,.4f}"
    if unit == "s":
        return f"{value:.0f} s" if value < 90 else f"{age(value)} ({value:,.0f} s)"
    if unit == "h":
        return f"{value:,.4g} h"
    if unit == "min":
        return f"{value:,.0f} min"
    if unit == "ratio":
        return f"{value:.2f} ×"
    if unit == "pct":
        return f"{100 * value:.0f}%"
    if unit == "per_hr":
        return f"{value:,.1f} proofs/hr"
    if unit == "tokens":
        return f"{value:,.0f} tokens"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def summary_rows(summary: dict) -> list[dict]:
    """The summary as rows ``{"key", "words", "value"}``: the :data:`SUMMARY` metrics first in its
    order, then any other key by its name."""
    summary = summary if isinstance(summary, dict) else {}
    rows = [{"key": k, "words": words, "value": in_units(summary[k], unit)}
            for k, (words, unit) in SUMMARY.items() if k in summary]
    rows += [{"key": k, "words": k.replace("_", " "), "value": in_units(v, "")}
             for k, v in summary.items() if k not in SUMMARY]
    return rows


def _num(v):
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def marker_kind(kind: str) -> str:
    """A marker's chart kind: ``unsafe`` (an unsafe decision), ``approval`` (an approval waited) or
    ``other``."""
    kind = str(kind or "")
    if "unsafe" in kind:
        return "unsafe"
    if "approval" in kind:
        return "approval"
    return "other"


def day_proof_s(day: dict) -> float | None:
    """The day's median seconds per proof over its GPU models (``work.proof_s``), None without any:
    what turns live workers into proving capacity (proofs/hr = workers × 3600 / seconds)."""
    table = ((day or {}).get("work") or {}).get("proof_s") or {}
    medians = [_num(v.get("median_s")) for v in table.values() if isinstance(v, dict)]
    medians = [m for m in medians if m and m > 0]
    if not medians:
        return None
    medians.sort()
    mid = len(medians) // 2
    return medians[mid] if len(medians) % 2 else (medians[mid - 1] + medians[mid]) / 2


def chart_series(result: dict, proof_s: float | None = None) -> dict:
    """The charts' series from a result: each a list of ``[hour from the day's start, value]``
    (null where the hour did not measure it), drawn as steps: hour ``h``'s value spans ``h`` to
    ``h + 1`` (one closing point more than there are hours). ``live_workers`` is the hour's mean of live workers
    (``hourly[].live_capacity``); ``capacity`` the same in proofs/hr at ``proof_s`` seconds a proof
    (null without it). ``spend_cum`` is the running sum of ``spend_usd`` at each hour's end;
    ``approval`` and ``unsafe`` are the markers ``[hour, words]``."""
    hourly = [h for h in (result.get("hourly") or []) if isinstance(h, dict)]
    out = {k: [] for k in ("queued", "backlog", "live_workers", "capacity", "target", "proofs", "spend_cum")}
    total = 0.0
    for i, h in enumerate(hourly):
        x = _num(h.get("hour"))
        x = i if x is None else x
        for k in ("queued", "backlog", "target", "proofs"):
            out[k].append([x, _num(h.get(k))])
        live = _num(h.get("live_capacity"))
        out["live_workers"].append([x, live])
        out["capacity"].append([x, round(live * 3600 / proof_s, 1) if live is not None and proof_s else None])
        spend = _num(h.get("spend_usd"))
        if spend is not None:
            total += spend
        out["spend_cum"].append([x + 1, round(total, 4) if spend is not None else None])
    if hourly:
        out["spend_cum"].insert(0, [out["spend_cum"][0][0] - 1, 0])
        for k in ("queued", "backlog", "live_workers", "capacity", "target", "proofs"):
            out[k].append([out[k][-1][0] + 1, out[k][-1][1]])  # the last hour's step reaches its end
    marks = {"approval": [], "unsafe": []}
    for m in result.get("markers") or []:
        if not isinstance(m, dict) or _num(m.get("at_s")) is None:
            continue
        kind = marker_kind(m.get("kind"))
        if kind in marks:
            marks[kind].append([round(m["at_s"] / 3600, 4), str(m.get("detail") or m.get("kind"))[:200]])
    return {**out, **marks}


def chart_frame(rehearsal: Rehearsal, series: dict) -> dict:
    """The charts' x range in hours: 0 to the day's horizon (``horizon_h`` of the day file, else the
    last hour measured)."""
    horizon = _num((rehearsal.day or {}).get("horizon_h"))
    last = max((p[0] for p in series["queued"]), default=0) + 1
    return {"start": 0, "end": horizon if horizon else last}


def _summary_of(r: Rehearsal) -> dict:
    return (r.result or {}).get("summary") or {} if isinstance(r.result, dict) else {}


def list_context(page: int = 1) -> dict:
    """One page of rehearsals, newest first, each with its headline numbers (proofs delivered, $
    spent, $ per proof, unsafe decisions) in words. Two queries."""
    pager = Paginator(Rehearsal.objects.defer("day").order_by("-created_at", "-id"), ON_PAGE).get_page(page)
    rows = []
    for r in pager.object_list:
        s = _summary_of(r)
        unsafe = s.get("unsafe")
        if unsafe is None and isinstance(r.result, dict) and "unsafe" in r.result:
            unsafe = len(r.result["unsafe"] or [])
        rows.append({"r": r, "proofs": in_units(s.get("proofs_delivered"), "n") if "proofs_delivered" in s else "",
                     "spend": in_units(s.get("usd_total"), "usd") if "usd_total" in s else "",
                     "per_proof": in_units(s.get("usd_per_proof"), "usd4") if "usd_per_proof" in s else "",
                     "unsafe": unsafe, "pct": round(100 * (r.progress or 0))})
    return {"rehearsals": rows, "pager": pager}


def _signed(value, unit: str) -> str:
    text = in_units(abs(value), unit)
    return "0" if value == 0 else ("+" if value > 0 else "−") + text


def comparison(r: Rehearsal) -> dict | None:
    """An A/B pair's two columns (``r`` and its ``compare_to``, both done): ``{"a", "b", "rows"}``
    with A the earlier row (the current settings, or ``manage.py rehearse``'s first file) and each
    row ``{"key", "words", "a", "b", "difference"}`` in words and units (the difference B − A, for
    numbers only), ``"changed"``: what B runs differently from A (``{"key", "a", "b"}``, from
    :func:`agent.rehearse.day.policy_differences`), and ``"same_outcome"``: every measure came out
    equal. None when ``r`` has no pair or either side has no summary yet."""
    other = r.compare_to
    if other is None:
        return None
    a, b = sorted((r, other), key=lambda x: x.pk)
    sa, sb = _summary_of(a), _summary_of(b)
    if not sa or not sb:
        return None
    rows = []
    for key in [*SUMMARY, *[k for k in sa if k not in SUMMARY]]:
        if key not in sa and key not in sb:
            continue
        words, unit = SUMMARY.get(key, (key.replace("_", " "), ""))
        va, vb = sa.get(key), sb.get(key)
        diff = _signed(round(vb - va, 6), unit) if _num(va) is not None and _num(vb) is not None else ""
        rows.append({"key": key, "words": words, "a": in_units(va, unit), "b": in_units(vb, unit), "difference": diff})
    changed = [{"key": k, "a": "default" if va is None else va, "b": "default" if vb is None else vb}
               for k, va, vb in policy_differences(a.day or {}, b.day or {})]
    same = all(row["a"] == row["b"] for row in rows)
    return {"a": a, "b": b, "rows": rows, "changed": changed, "same_outcome": same}


def detail_context(r: Rehearsal) -> dict:
    """One rehearsal: its facts, progress (percent), summary rows, unsafe decisions, markers in words
    and the chart series and frame."""
    result = r.result if isinstance(r.result, dict) else {}
    proof_s = day_proof_s(r.day)
    series = chart_series(result, proof_s)
    markers = [m for m in result.get("markers") or [] if isinstance(m, dict)]
    # approvals, unsafe decisions and target changes in full; launches, retirements and faults (a big
    # day has thousands) up to MARKERS_SHOWN in all, the rest counted by kind
    key = [m for m in markers if marker_kind(m.get("kind")) != "other" or m.get("kind") == "target"]
    rest = [m for m in markers if m not in key]
    room = max(0, MARKERS_SHOWN - len(key))
    hidden = Counter(str(m.get("kind")) for m in rest[room:])
    markers = sorted(key + rest[:room], key=lambda m: _num(m.get("at_s")) or 0)
    return {
        "r": r,
        "pct": round(100 * max(0.0, min(1.0, r.progress or 0))),
        "finished": r.status in ("done", "failed"),
        "summary": summary_rows(result.get("summary") or {}),
        "comparison": comparison(r),
        "unsafe": [u for u in result.get("unsafe") or [] if isinstance(u, dict)],
        "markers": [{**m, "chart": marker_kind(m.get("kind")),
                     "at_h": _num(m.get("at_s")) / 3600 if _num(m.get("at_s")) is not None else None} for m in markers],
        "markers_hidden": sorted(hidden.items()),
        "has_charts": bool(result.get("hourly")),
        "proof_s": proof_s,
        "series": series,
        "frame": chart_frame(r, series),
        "day_facts": day_facts(r.day),
    }


def day_facts(day: dict) -> list[tuple[str, str]]:
    """A few facts of the day file in words: horizon, heartbeat, seed, planner."""
    day = day if isinstance(day, dict) else {}
    facts = []
    if _num(day.get("horizon_h")) is not None:
        facts.append(("horizon", f"{day['horizon_h']:g} h"))
    if _num(day.get("heartbeat_s")) is not None:
        facts.append(("heartbeat", f"{day['heartbeat_s']:g} s"))
    if day.get("seed") is not None:
        facts.append(("random seed", str(day["seed"])))
    if day.get("planner"):
        facts.append(("planner", str(day["planner"])))
    return facts


@login_required
@require_GET
@never_cache
def rehearsals_page(request: HtmxHttpRequest) -> HttpResponse:
    """The rehearsals, 50 a page, newest first (``?page=N``; a bad page: 400 naming it). htmx GET:
    the table only (re-fetched on ``rehearsals-changed``)."""
    try:
        page = page_number(request.GET)
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain")
    ctx = _page_context(request, **list_context(page))
    if _is_region(request):
        return render(request, "console/partials/rehearsals.html", ctx)
    return render(request, "console/rehearsals.html", ctx)


@login_required
@require_GET
@never_cache
def rehearsal_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """One rehearsal: progress bar while it runs; once done the summary in words and units, the unsafe
    decisions (each naming its cycle and call), the charts and their markers; the error when it
    failed. htmx GET: the region only (re-fetched on ``rehearsals-changed``). 404 for an unknown one."""
    r = Rehearsal.objects.filter(pk=pk).select_related("compare_to").first()
    if r is None:
        raise Http404(f"no rehearsal {pk}")
    ctx = _page_context(request, **detail_context(r))
    if _is_region(request):
        return render(request, "console/partials/rehearsal.html", ctx)
    return render(request, "console/rehearsal.html", ctx)


def change_words(before: tuple[dict, dict], after: tuple[dict, dict]) -> list[str]:
    """What a settings change changes, one entry per key: ``"max_instances 4 → 6"``,
    ``"stop_instance approval → auto"`` (``before`` and ``after``: ``(objectives, policy)`` as a day
    file takes them)."""
    out = []
    for part in (0, 1):
        old, new = before[part], after[part]
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                out.append(f"{key} {join_list(old.get(key, 'default'))} → {join_list(new.get(key, 'default'))}")
    return out


def _rehearse_answer(request, ok: bool, text: str, rehearsal=None) -> HttpResponse:
    if request.htmx:
        return render(request, "console/partials/rehearse_change.html",
                      {"ok": ok, "text": text, "rehearsal": rehearsal})
    if ok:
        return redirect("rehearsal", rehearsal.pk)
    return HttpResponseBadRequest(text, content_type="text/plain")


@operator_required
def rehearse_change(request: HtmxHttpRequest) -> HttpResponse:
    """"Rehearse this change on yesterday" (the Settings page; operators, like saving): the settings
    form as posted, checked as saving checks it but not saved, applied to the day file of the last
    ``rehearse_hours`` (24, the default, 6 or 1) of this installation's records
    (``agent.rehearse.history``), stored and started as a rehearsal
    (``agent.actions.runs.do_start_rehearsal``): when the form changes anything, an A/B pair — the day
    under the current settings and under the change — whose page shows both columns. htmx: a line linking the rehearsal's page (or
    naming what was wrong); without JavaScript: a redirect to that page, or 400 with the error."""
    hours = {"24": 24, "6": 6, "1": 1}.get(request.POST.get("rehearse_hours") or "24")
    if hours is None:
        return _rehearse_answer(request, False, "rehearse_hours must be 24, 6 or 1 (the hours of records to rehearse)")
    data = request.POST.copy()
    if not (data.get("reason") or "").strip():
        data["reason"] = "rehearse this change on yesterday"  # nothing is saved: no reason is owed
    state = SessionState.get()
    form = _settings_form(state, data)
    if not form.is_valid():
        return _rehearse_answer(request, False, _form_errors(form))
    try:
        policy, limits = validate_overrides(*form.overrides())
        day = day_from_history(hours)
    except OverrideError as exc:
        return _rehearse_answer(request, False, f"{exc.field}: {exc.message}")
    except HistoryError as exc:
        return _rehearse_answer(request, False, str(exc))
    changed = apply_change(day, policy, limits)
    words = change_words(objectives_and_policy(state), (changed["objectives"], changed["policy"]))
    span = "yesterday" if hours == 24 else f"the last {hours} h"
    name = f"{span} under " + (", ".join(words) if words else "the current settings")
    changed["name"] = name[:200]
    # a change is played beside the current settings: the same day (seed, arrivals, faults) twice
    base_name = f"{span} under the current settings"
    baseline = {**day, "name": base_name} if words else None
    try:
        row = do_start_rehearsal(changed, name, actor_of(request), form.cleaned_data["reason"],
                                 change={"policy": policy, "limits": limits}, baseline=baseline,
                                 baseline_name=base_name)
    except DayFileError as exc:
        return _rehearse_answer(request, False, str(exc))
    return _rehearse_answer(request, True, name, rehearsal=row)
