"""Every rule's number and every tool's policy, in one place.

Defaults come from here and from ``settings.WARDEN`` (env); operators override them on the
settings page, stored in ``SessionState.overrides`` (keys ``policy``, ``limits``). A replay file's
``policy`` and ``objectives`` land in the same overrides. Nothing a planner says changes them.

Policy values: ``auto`` (runs within the guards), ``approval`` (parks for an operator),
``forbidden`` (halts the run: ``forbidden_tool``). Launches are keyed ``launch_instance`` and,
per priority, ``launch_instance:P0`` … ``:P3`` (SCENARIOS.md "policy").
"""

from dataclasses import dataclass

from django.conf import settings

from agent.models import SessionState

PRIORITIES = ("P0", "P1", "P2", "P3")

#: tool -> policy when nothing overrides it (issue 4: stop, destroy, reboot need approval;
#: P0 launches are auto within the caps; P1–P3 need approval)
DEFAULT_POLICY = {
    "list_instances": "auto",
    "get_demand": "auto",
    "search_offers": "auto",
    "diagnose_instance": "auto",
    "remember": "auto",
    "recall": "auto",
    "escalate_human": "auto",
    "launch_instance": "approval",
    "launch_instance:P0": "auto",
    "stop_instance": "approval",
    # resuming an instance we stopped restores capacity we already pay disk for: no approval
    "resume_instance": "auto",
    "reboot_instance": "approval",
    "destroy_instance": "approval",
    # the monitor's own lifecycle actions (SCENARIOS.md cycle order 2: its default is auto)
    "stop_instance:monitor": "auto",
    "reboot_instance:monitor": "auto",
    "destroy_instance:monitor": "auto",
}

#: the actor whose actions take ``TOOL:<actor>`` policy keys
MONITOR = "monitor"

#: breaker thresholds and budgets (SCENARIOS.md reason table; seed 001)
DEFAULT_LIMITS = {
    "max_steps": 12,  # planner turns per run
    "same_error": 2,  # halt when the last N errors are the same
    "text_only_spiral": 5,  # consecutive text-only turns
    "three_strikes": 3,  # failures of one tool in a run
    "wall_clock_s": 300,  # run time budget, seconds
    "token_budget": 60000,  # tokens in + out per run
    "tool_timeout_s": 30,  # default per-tool timeout, seconds
    "retry_attempts": 3,  # attempts for a transient error (first try included)
    "observation_max_chars": 4000,  # longer observations are cut head and tail
    "repeat_reminders": [3, 5, 8],  # advisory repeat reminder thresholds (seed 003)
    "diagnosis_fresh_min": 15,  # stop/destroy need a diagnosis this fresh
    "network_recheck_min": 2,  # a network-class diagnosis (SSH unreachable) is taken again after this (issue 10 §2)
    "approval_expiry_min": 30,
    "provisioning_limit_min": 180,  # stuck created/loading/scheduling past this is terminal
    # SCENARIOS.md "terminal instances", "starvation" and the reason table
    "offline_grace_min": 30,  # provider status unknown/offline this long (worker dead) is terminal
    "claim_max_age_min": 30,  # a side effect claimed and unfinished this long is a stale claim
    "rejection_hold_min": 60,  # an operator's rejection stands this long unless demand changes state
    "starve_min": 30,  # with work queued and no live worker, a launch pending this long stops blocking
    "destroy_confirm_min": 15,  # a destroy still listed this long is destroy_unconfirmed (sent again)
    "launch_rate": [6, 600],  # at most N launches per S seconds (rate_limited)
    # a stopped instance still pays for its disk (vastai.md §2.4): stopped longer than this, the rules
    # planner proposes destroying it (destroy_instance's policy: approval by default)
    "stopped_destroy_h": 24,
    # the scale-down budget (agent.capacity.retire_budget): the agent retires at most
    # max(1, floor(pct% of capacity)) live or starting instances per sliding window
    "retire_window_min": 15,
    "retire_budget_pct": 50,
}


@dataclass(frozen=True)
class Limits:
    """The effective numbers for one run (defaults < env settings < operator overrides)."""

    values: dict

    def __getattr__(self, name):
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def effective_limits(state: SessionState | None = None) -> Limits:
    """Defaults merged with env settings (dwell, hold-off, caps) and the anchor's overrides."""
    state = state or SessionState.get()
    w = settings.WARDEN
    values = dict(DEFAULT_LIMITS)
    values.update(
        dwell_min=w["DWELL_MIN"],
        hold_off_min=w["HOLD_OFF_MIN"],
        max_instances=w["MAX_INSTANCES"],
        max_dph=w["MAX_DPH"],
        startup_grace_s=w["STARTUP_GRACE_S"],
    )
    values.update(state.objectives or {})
    values.update((state.overrides or {}).get("limits", {}))
    values["target_proofs_hr"] = state.target_proofs_hr
    return Limits(values)


def unattended() -> bool:
    """Whether WARDEN_UNATTENDED applies: set, and the provider is the demo's ``local`` one. With a
    provider that costs money (``ssh``, ``vastai``) it never does (settings refuse the pair at start;
    a test or a replay that sets it later is held here too)."""
    return bool(settings.WARDEN.get("UNATTENDED")) and settings.WARDEN.get("PROVIDER", "local") == "local"


def effective_policy(state: SessionState | None = None) -> dict:
    """The policy table: defaults, then WARDEN_UNATTENDED (everything auto, local provider only:
    :func:`unattended`), then overrides."""
    state = state or SessionState.get()
    table = dict(DEFAULT_POLICY)
    if unattended():
        table = dict.fromkeys(table, "auto")
    table.update((state.overrides or {}).get("policy", {}))
    return table


def policy_for(tool: str, args: dict | None, table: dict, actor: str = "agent") -> str:
    """The policy of one call (SCENARIOS.md "policy"): the most specific key present decides.

    ``forbidden`` on ``TOOL`` binds every actor and priority. The monitor's actions take
    ``TOOL:monitor`` (its own default is ``auto``); launches take ``launch_instance:Pn`` before
    ``launch_instance``. A tool the table does not name needs approval.
    """
    if table.get(tool) == "forbidden":
        return "forbidden"
    if actor == MONITOR:
        return table.get(f"{tool}:{MONITOR}", "auto")
    if tool == "launch_instance" and args:
        prio = args.get("launch_priority")
        if isinstance(prio, str) and f"launch_instance:{prio}" in table:
            return table[f"launch_instance:{prio}"]
    return table.get(tool, "approval")


def is_forbidden(tool: str, args: dict | None, table: dict, actor: str = "agent") -> bool:
    """Whether the policy forbids this call: the one test of "forbidden" for the pipeline (before
    and after the arguments are parsed: with ``args`` None only the bare ``TOOL`` key can say so),
    the monitor, the ``rules`` planner and a parked launch at dispatch (:func:`policy_for`'s key
    order: ``forbidden`` on ``TOOL`` binds every actor and priority)."""
    return policy_for(tool, args, table, actor) == "forbidden"
