"""Every rule's number and every tool's policy, in one place.

Defaults come from here and from ``settings.WARDEN`` (env); operators override them on the
settings page, stored in ``SessionState.overrides`` (keys ``policy``, ``limits``). A replay file's
``policy`` and ``objectives`` land in the same overrides. Nothing a planner says changes them.

Policy values: ``auto`` (runs within the guards), ``approval`` (parks for an operator),
``forbidden`` (halts the run: ``forbidden_tool``). Launches are keyed ``launch_instance`` and,
per priority, ``launch_instance:P0`` … ``:P3`` (docs/contract.md, Policy).
"""

from django.conf import settings

from agent.models import SessionState
from agent.policy.limits import FROM_ENV, Limits

PRIORITIES = ("P0", "P1", "P2", "P3")

#: tool -> policy when nothing overrides it (docs/contract.md, Policy: stop, destroy, reboot need approval;
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
    # the monitor's own lifecycle actions (docs/contract.md, The cycle, step 2: its default is auto)
    "stop_instance:monitor": "auto",
    "reboot_instance:monitor": "auto",
    "destroy_instance:monitor": "auto",
}

#: the actor whose actions take ``TOOL:<actor>`` policy keys
MONITOR = "monitor"

def effective_limits(state: SessionState | None = None) -> Limits:
    """The schema's defaults (``agent.policy.limits.Limits``) merged with the env settings
    (``agent.policy.limits.FROM_ENV``: dwell, hold-off, caps, startup grace), the anchor's objectives,
    its operator overrides and its target. Raises ``pydantic.ValidationError`` when a stored
    value is not a limit or not of its type and range (they are checked where they enter)."""
    state = state or SessionState.get()
    w = settings.WARDEN
    values = {name: w[key] for name, key in FROM_ENV.items()}
    values.update(state.objectives or {})
    values.update((state.overrides or {}).get("limits", {}))
    values["target_proofs_hr"] = state.target_proofs_hr
    return Limits(**values)


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
    """The policy of one call (docs/contract.md, Policy): the most specific key present decides.

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
