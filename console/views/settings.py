"""The settings page, observe-only mode and the session reset."""

import os
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods
from django_htmx.http import trigger_client_event

from agent.actions.session import do_reset_session, do_set_observe_only
from agent.actions.settings import OverrideError, baseline_settings, do_update_overrides, policy_keys
from agent.models import SessionState
from agent.policy.limits import LIMIT_RANGES
from agent.policy.table import effective_limits, effective_policy, unattended
from agent.replay.evaluation import standing
from console.forms import (
    ObserveOnlyForm,
    ResetForm,
    SettingsForm,
)
from console.templatetags.console_extras import can_act
from console.views.common import (
    HtmxHttpRequest,
    _form_errors,
    _page_context,
    _safe_next,
    actor_of,
    operator_required,
)
from console.views.dashboard import _flash_response
from fleet.providers import ProviderError
from fleet.providers import ssh as owned
from fleet.providers.vastai import settings_view
from fleet.secrets import redact


# --- observe-only switch, reset session ---------------------------------------------------------
@operator_required
def set_observe_only(request: HtmxHttpRequest) -> HttpResponse:
    """The observe-only switch (``do_set_observe_only``): ``on=1`` stops every side effect; the agent
    still observes and proposes, its calls shown as "would have done". htmx: the switch partial."""
    form = ObserveOnlyForm(request.POST)
    if not form.is_valid():  # both fields are optional (a missing ``on`` means off); a reason may be too long
        return _flash_response(request, False, _form_errors(form))
    on = bool(form.cleaned_data.get("on"))
    state = do_set_observe_only(on, actor_of(request), form.cleaned_data.get("reason", ""))
    if request.htmx:
        resp = render(request, "console/partials/observe_only.html", _page_context(request, state=state))
        trigger_client_event(resp, "settings-changed")
        return resp
    messages.success(request, f"observe-only {'on: nothing executes' if on else 'off'}")
    return redirect(_safe_next(request, "/"))


@operator_required
def reset_session(request: HtmxHttpRequest) -> HttpResponse:
    """ "Reset session" (``do_reset_session``) in two steps, both POST: without ``confirm=yes`` nothing
    changes and the confirmation is shown — what a reset clears and what it keeps — with the form
    that confirms (htmx: swapped in place of the "New conversation" box; without JavaScript: a page). With
    ``confirm=yes`` it clears the conversation; runs stay on the Runs pages, run numbers keep
    counting, objectives and memory stay."""
    form = ResetForm(request.POST)
    if not form.is_valid():
        flash = {"ok": False, "text": _form_errors(form)}
    elif not form.confirmed():
        ctx = _page_context(request, reset_form=form, state=SessionState.get())
        if request.htmx:
            return render(request, "console/partials/reset_confirm.html", ctx)
        return render(request, "console/reset_confirm.html", ctx)
    else:
        state = do_reset_session(actor_of(request), form.cleaned_data.get("reason", "") or "operator pressed Reset session")
        flash = {"ok": True, "text": f"session reset: new conversation (epoch {state.epoch}); runs and settings kept"}
    if request.htmx:
        resp = render(request, "console/partials/reset_session.html", _page_context(request, reset_flash=flash),
                      status=200)
        if flash["ok"]:
            trigger_client_event(resp, "runs-changed")
            trigger_client_event(resp, "chat-changed")
        return resp
    return _flash_response(request, flash["ok"], flash["text"])


# --- providers and demand sources (read-only: configured by environment) ------------------------
def _where(url: str, *, path: bool = True) -> str:
    """``url`` without credentials, query or fragment (``scheme://host:port/path``); "" if unset.
    ``path=False`` leaves the path out too (an HTTP endpoint's path may carry a token)."""
    if not url:
        return ""
    try:
        p = urlsplit(url)
        host = p.hostname or ""
        port = f":{p.port}" if p.port else ""
    except ValueError:
        return "(not a valid URL)"
    shown = p.path if path else ("/…" if p.path.strip("/") else "")
    return f"{p.scheme}://{host}{port}{shown}" if p.scheme else "(not a valid URL)"


def _env_ref(name: str) -> dict:
    """A variable named as a reference: its name and whether it is set (never its value)."""
    return {"name": name, "set": bool(os.environ.get(name))}


def _file_ref(path: str) -> dict:
    """A file named as a reference: its path and whether it can be read (never its content)."""
    return {"name": path, "set": bool(path) and os.access(path, os.R_OK)}


def sources_context() -> dict:
    """The providers and demand sources in use, by reference only: setting names, variable names,
    file paths and addresses without credentials — never a secret's value (docs/safety.md invariant 6).
    Owned hosts are listed from WARDEN_SSH_HOSTS_FILE (name, address, user, key file); their
    commands are not shown (a command line may carry a secret)."""
    w = settings.WARDEN
    hosts, hosts_error = [], ""
    path = owned.hosts_file()
    if path:
        try:
            hosts = [{"name": h.name, "address": f"{h.host}:{h.port}", "user": h.user, "gpu_name": h.gpu_name,
                      "worker_name": h.curio_name, "key": _file_ref(h.key_file) if h.key_file else None}
                     for h in owned.load_hosts(path)]
        except ProviderError as exc:
            hosts_error = redact(str(exc))
    token = None
    if w.get("DEMAND_TOKEN_ENV"):
        token = {"kind": "variable", **_env_ref(w["DEMAND_TOKEN_ENV"])}
    elif w.get("DEMAND_TOKEN_FILE"):
        token = {"kind": "file", **_file_ref(w["DEMAND_TOKEN_FILE"])}
    return {
        "provider": w["PROVIDER"],
        "owned": {
            "file": _file_ref(path) if path else None,
            "hosts": hosts,
            "error": hosts_error,
            "default_key": _file_ref(w["SSH_KEY_FILE"]) if w.get("SSH_KEY_FILE") else None,
            "default_user": w["SSH_USER"],
        },
        "demand_source": w["DEMAND_SOURCE"],
        "harmony": {"setting": "HARMONY_DATABASE_URL", "set": bool(os.environ.get("HARMONY_DATABASE_URL")),
                    "where": _where(os.environ.get("HARMONY_DATABASE_URL", ""))},
        "http": {"setting": "WARDEN_DEMAND_URL", "set": bool(w.get("DEMAND_URL")), "where": _where(w.get("DEMAND_URL", ""), path=False),
                 "timeout_s": w.get("DEMAND_TIMEOUT_S"), "token": token},
    }


# --- settings page ------------------------------------------------------------------------------
def _settings_form(state: SessionState, data=None) -> SettingsForm:
    table = effective_policy(state)
    overrides = (state.overrides or {}).get("policy", {})
    policy = {}
    inherit = []
    for key in policy_keys():
        if key in table:
            policy[key] = table[key]
        else:  # launch_instance:P1..P3 follow launch_instance unless overridden
            inherit.append(key)
            policy[key] = overrides.get(key, "")
    limits = effective_limits(state).values
    return SettingsForm(data, policy=policy, limits={k: limits.get(k) for k in LIMIT_RANGES}, inherit_keys=inherit)


#: each limit in one line, with its unit (the runtime's meaning: ``agent.runtime.breakers``, ``agent.policy.guards``,
#: ``agent.policy.lifecycle``, ``fleet.monitor``); shown beside the identifier on the Settings page
LIMIT_HELP = {
    "max_steps": "planner turns one run may take before it halts (turns)",
    "same_error": "halt when this many errors in a row are the same error (errors)",
    "text_only_spiral": "halt after this many turns in a row with text and no tool call (turns)",
    "three_strikes": "halt after this many failures of one tool in a run (failures)",
    "wall_clock_s": "time budget of one run (seconds)",
    "token_budget": "model tokens in + out one run may spend (tokens)",
    "tool_timeout_s": "how long a tool call may take unless its tool sets its own (seconds)",
    "retry_attempts": "tries of a call that failed transiently, the first included (tries)",
    "observation_max_chars": "longest tool answer the model sees; longer ones keep their head and tail (characters)",
    "repeat_reminders": "after this many identical calls the model is reminded it repeats itself (calls, one reminder each)",
    "diagnosis_fresh_min": "stop and destroy need a diagnosis taken at most this long ago (minutes)",
    "network_recheck_min": "an unreachable-host diagnosis is taken again after this (minutes)",
    "approval_expiry_min": "a parked call waits this long for an operator, then expires unrun (minutes)",
    "provisioning_limit_min": "a launch still created/loading/scheduling after this is terminal (minutes)",
    "offline_grace_min": "an instance offline or unknown with a dead worker this long is terminal (minutes)",
    "claim_max_age_min": "a side effect started and unfinished this long is a stale claim (minutes)",
    "rejection_hold_min": "an operator's rejection stands this long unless demand changes state (minutes)",
    "starve_min": "with work queued and no live worker, a launch pending this long stops blocking another (minutes)",
    "destroy_confirm_min": "a destroyed instance still listed after this is destroy_unconfirmed and sent again (minutes)",
    "launch_rate": "at most N launches in S seconds (launches, seconds)",
    "stopped_destroy_h": "a stopped instance (its disk still billed) is proposed for destroy after this (hours)",
    "retire_window_min": "the sliding window the scale-down budget counts the agent's stops and destroys in (minutes)",
    "retire_budget_pct": "the share of capacity the agent may retire within that window, at least one instance (percent)",
}


def settings_context(state: SessionState, form: SettingsForm) -> dict:
    """The settings form with, per field, its default and whether an override is in force."""
    base_policy, base_limits = baseline_settings(state)
    ov = state.overrides or {}
    rows_policy = [
        {
            "key": key,
            "field": form[name],
            "default": base_policy.get(key, "same as launch_instance"),
            "overridden": key in ov.get("policy", {}),
        }
        for key, name in form.policy_fields
    ]
    rows_limits = [
        {
            "key": key,
            "field": form[name],
            "default": base_limits.get(key),
            "overridden": key in ov.get("limits", {}),
            "range": LIMIT_RANGES[key],
            "help": LIMIT_HELP.get(key, ""),
        }
        for key, name in form.limit_fields
    ]
    return {
        "form": form,
        "rows_policy": rows_policy,
        "rows_limits": rows_limits,
        "state": state,
        "unattended": unattended(),
    }


@login_required
@require_http_methods(["GET", "POST"])
@never_cache
def settings_page(request: HtmxHttpRequest) -> HttpResponse:
    """Policies (auto / approval / forbidden per tool and launch priority), caps, dwell, hold-off,
    diagnosis freshness, approval expiry and breaker limits. POST (operators) saves through
    ``do_update_overrides``: audited with who and why; bad input names the field, saves nothing
    (400)."""
    state = SessionState.get()
    saved = False
    status = 200
    if request.method == "POST":
        if not can_act(request.user):
            return HttpResponseForbidden("viewers cannot act")
        form = _settings_form(state, request.POST)
        if form.is_valid():
            policy, limits = form.overrides()
            try:
                state = do_update_overrides(policy, limits, actor_of(request), form.cleaned_data["reason"])
                saved = True
            except OverrideError as exc:
                name = form.field_name(exc.field)
                form.add_error(name, f"{exc.field}: {exc.message}" if name is None else exc.message)
        if saved:
            if not request.htmx:
                messages.success(request, "settings saved")
                return redirect("settings")
            form = _settings_form(state)
        else:
            status = 400
    else:
        form = _settings_form(state)

    ctx = _page_context(request, saved=saved, model_standing=standing(), **settings_context(state, form))
    if settings.WARDEN["PROVIDER"] == "vastai":
        ctx["vast"] = settings_view()
    if request.htmx:
        resp = render(
            request, "console/partials/settings_form.html", ctx, status=200 if request.method == "POST" else status
        )
        if saved:
            trigger_client_event(resp, "settings-changed")
        return resp
    return render(request, "console/settings.html", {**ctx, "sources": sources_context()}, status=status)
