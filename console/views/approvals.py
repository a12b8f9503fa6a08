"""The approvals inbox and the approve/reject decision."""

import logging
from urllib.parse import urlparse

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import F
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django_htmx.http import trigger_client_event

from agent.models import Approval
from agent.runtime.approvals import DecisionError, do_decide, note_resume_not_queued
from agent.tasks import start_resume
from console.forms import (
    DecisionForm,
)
from console.templatetags.console_extras import waiting_approvals
from console.views.common import (
    HtmxHttpRequest,
    _is_region,
    _page_context,
    _safe_next,
    _why,
    actor_of,
    operator_required,
)
from fleet.clock import clock
from fleet.models import DemandSample, Instance

log = logging.getLogger(__name__)


# --- approvals inbox ---------------------------------------------------------------------------
APPROVALS_RECENT = 30
#: what an operator is told when a decision is stored but its resume could not be queued
#: (``agent.runtime.sweep``: the monitor's beat task dispatches it once the broker is back)
SWEEP_PROMISE = ("The monitor's sweep dispatches it within a minute of the broker being back, "
                 "and an approval_stalled alert will say what became of it.")


def approvals_context(recent: int = APPROVALS_RECENT) -> dict:
    """Waiting approvals (soonest expiry first) and the newest decided ones: two queries.

    A waiting row past its expiry is shown as expired (the loop marks it ``expired`` on its next
    cycle; ``do_decide`` already refuses it).
    """
    now = clock.now()
    waiting = list(
        Approval.objects.filter(status="waiting")
        .select_related("run", "step", "decided_by")
        .order_by("expires_at", "pk")
    )
    for a in waiting:
        a.seconds_left = (a.expires_at - now).total_seconds()
    attach_situation_now(waiting)
    decided = []
    if recent:
        decided = list(
            Approval.objects.exclude(status="waiting")
            .select_related("run", "step", "decided_by")
            .order_by(F("decided_at").desc(nulls_last=True), "-pk")[:recent]
        )
    return {"waiting": waiting, "decided": decided, "now": now, "open_count": sum(1 for a in waiting if a.seconds_left > 0)}


def attach_situation_now(approvals: list) -> None:
    """Set ``a.now`` on each approval: the situation now, in the shape of ``a.situation`` (the one
    when it was parked, ``agent.runtime.pipeline.situation``), so a card shows then and now side by side
    (docs/console.md). Two queries whatever the number of approvals."""
    if not approvals:
        return
    sample = DemandSample.objects.order_by("-taken_at").first()
    ids = {str((a.args or {}).get("instance_id")) for a in approvals if (a.args or {}).get("instance_id")}
    rows = {}
    for inst in Instance.objects.filter(external_id__in=ids).order_by("killed_at"):
        rows.setdefault(inst.external_id, inst)
    for a in approvals:
        ident = (a.args or {}).get("instance_id")
        target = None
        if ident:
            inst = rows.get(str(ident))
            target = {"id": ident, "status": "absent" if inst is None else ("gone" if inst.killed_at else inst.status)}
        a.now = {
            "demand": sample.state if sample else "unknown",
            "queued": sample.queued if sample else None,
            "workers_live": sample.workers_live if sample else None,
            "workers_expected": sample.workers_expected if sample else None,
            "target": target,
            "read_at": sample.taken_at if sample else None,
        }


@login_required
@require_GET
@never_cache
def approvals_page(request: HtmxHttpRequest) -> HttpResponse:
    """The approvals inbox: waiting calls with approve / reject-with-comment and their expiry,
    then recent decisions. htmx GET: the inbox region only."""
    if _is_region(request) and request.GET.get("partial") == "count":
        return render(request, "console/partials/nav_approvals.html", {"waiting_n": waiting_approvals()})
    ctx = _page_context(request, bulk=True, **approvals_context())
    if _is_region(request):
        return render(request, "console/partials/approvals.html", ctx)
    return render(request, "console/approvals.html", ctx)


def beyond_the_need(approval: Approval) -> bool:
    """Whether ``approval`` parked a launch or resume beyond the need (``situation["need"]["within"]``
    false, written at parking by ``agent.runtime.pipeline.park``): never decided by a bulk approval."""
    return ((approval.situation or {}).get("need") or {}).get("within") is False


#: the most approvals one bulk decision may name
BULK_MAX = 100


@operator_required
def bulk_decide(request: HtmxHttpRequest) -> HttpResponse:
    """Approve or reject several waiting calls at once: ``ids`` (repeated, at most
    :data:`BULK_MAX`), ``decision`` (approve | reject), ``comment`` (required to reject; it goes
    to each). Each one is decided by ``do_decide`` on its own (exactly once: one already decided
    or expired is reported and skipped, the others still go through; a launch or resume parked
    beyond the need is left out of a bulk approval and counted in the answer), then each run concerned is
    resumed once. Nothing selected, too many, or a rejection without a comment: 400, nothing
    decided. htmx gets the inbox region with a line per outcome; a browser a redirect (or the
    inbox with the error)."""
    form = DecisionForm(request.POST)
    raw = request.POST.getlist("ids")
    error, status, lines = "", 200, []
    ids = []
    for value in raw:
        if not (value.isascii() and value.isdigit() and len(value) <= 12):
            error = f"ids must be approval numbers; got {value[:20]!r}"
            break
        ids.append(int(value))
    if not error and not ids:
        error = "select at least one waiting approval"
    elif not error and len(ids) > BULK_MAX:
        error = f"at most {BULK_MAX} approvals at once; {len(ids)} were selected"
    elif not error and not form.is_valid():
        error = "; ".join(e for errs in form.errors.values() for e in errs)
    if error:
        status = 400
    else:
        decision, comment = form.cleaned_data["decision"], form.cleaned_data["comment"]
        decided, left = [], []
        for approval in Approval.objects.filter(pk__in=ids).select_related("run").order_by("pk"):
            if decision == "approve" and beyond_the_need(approval):
                left.append(approval)  # a call beyond the need needs its own approval, on its own card
                continue
            try:
                decided.append(do_decide(approval, decision, actor_of(request), comment, user=request.user))
            except DecisionError as exc:
                lines.append({"ok": False, "text": str(exc)})
        missing = sorted(set(ids) - {a.pk for a in decided} - {a.pk for a in Approval.objects.filter(pk__in=ids)})
        lines += [{"ok": False, "text": f"approval {pk} does not exist"} for pk in missing]
        if left:
            lines.append({"ok": False, "text": f"left out {len(left)} beyond the need (approve each on its own card): "
                          + ", ".join(f"approval {a.pk} ({a.tool})" for a in left)})
        if decided:
            verb = decided[0].status
            lines.insert(0, {"ok": True, "text": f"{verb} {len(decided)}: "
                             + ", ".join(f"approval {a.pk} ({a.tool})" for a in decided)})
        for run_id in dict.fromkeys(a.run_id for a in decided):
            try:
                start_resume(run_id)
            except Exception as exc:  # broker down: the decisions are stored, the resume is not queued
                log.warning("start_resume(%s) failed: %s", run_id, exc)
                note_resume_not_queued([a.pk for a in decided], _why(exc))
                lines.append({"ok": False, "text": f"decided and stored, but the agent could not be resumed: {_why(exc)}. "
                              f"{SWEEP_PROMISE}"})
                break
    if request.htmx:
        ctx = _page_context(request, bulk=True, bulk_answer=True, bulk_error=error, bulk_lines=lines,
                            **approvals_context())
        resp = render(request, "console/partials/approvals.html", ctx)
        if status != 400:  # as in decide_approval: never wipe the error with a refresh
            trigger_client_event(resp, "approvals-changed")
        return resp
    if status == 200:
        for line in lines:
            (messages.success if line["ok"] else messages.error)(request, line["text"])
        return redirect("/approvals/")
    ctx = _page_context(request, bulk=True, error=error, **approvals_context())
    return render(request, "console/approvals.html", ctx, status=status)


@operator_required
def decide_approval(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Approve or reject one parked call (``do_decide``), then enqueue the run's resume.

    Exactly once: ``do_decide`` is a conditional UPDATE, so a double click, a second operator or a
    replayed POST gets 409 naming who decided first, and only the winner enqueues the resume.
    A rejection without a comment is 400. htmx gets the approval's card (status 200, message in
    it); a browser a redirect to ``next`` (or the inbox) or the inbox with the error.
    """
    approval = get_object_or_404(Approval.objects.select_related("run", "step"), pk=pk)
    form = DecisionForm(request.POST)
    error, status, note = "", 200, ""
    if not form.is_valid():
        error, status = "; ".join(e for errs in form.errors.values() for e in errs), 400
    else:
        try:
            approval = do_decide(
                approval,
                form.cleaned_data["decision"],
                actor_of(request),
                form.cleaned_data["comment"],
                user=request.user,
            )
        except DecisionError as exc:
            error, status = str(exc), 409
            approval.refresh_from_db()
        else:
            try:
                start_resume(approval.run_id)
                note = f"{approval.status}; the agent resumes run #{approval.run.number}"
            except Exception as exc:  # broker down: the decision is stored, the resume is not queued
                log.warning("start_resume(%s) failed: %s", approval.run_id, exc)
                note_resume_not_queued([approval.pk], _why(exc))
                note = f"{approval.status} and stored, but the agent could not be resumed: {_why(exc)}. {SWEEP_PROMISE}"
    if request.htmx:
        now = clock.now()
        approval.seconds_left = (approval.expires_at - now).total_seconds()
        attach_situation_now([approval])
        resp = render(
            request,
            "console/partials/approval_card.html",
            # on the inbox page a card keeps its bulk checkbox (the dashboard's column has no bulk form)
            _page_context(request, a=approval, error=error, note=note, now=now,
                          bulk=urlparse(request.htmx.current_url or "").path == "/approvals/"),
        )
        if status != 400:
            # nothing changed on bad input: a refresh of the inbox would wipe the card's error at once
            # (rejecting with an empty comment must never silently do nothing)
            trigger_client_event(resp, "approvals-changed")
        return resp
    if status == 200:
        messages.success(request, f"approval {approval.pk}: {note}")
        return redirect(_safe_next(request, "/approvals/"))
    ctx = _page_context(request, bulk=True, error=error, **approvals_context())
    return render(request, "console/approvals.html", ctx, status=status)
