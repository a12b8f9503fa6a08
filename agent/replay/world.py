"""Replay's world: the scenario's fleet, demand, objectives and policy set up in the current database, and the isolation (provider, demand source, clock) a replay runs inside."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import Group, User

from agent.models import SessionState, SideEffect
from agent.policy.table import DEFAULT_POLICY
from agent.replay.file_format import (
    Scenario,
)
from fleet import demand as demand_mod
from fleet import providers as providers_mod
from fleet.clock import VirtualClock, clock, use_clock
from fleet.demand.scenario import ScenarioDemandSource
from fleet.events import changed
from fleet.models import AuditLog, Diagnosis, Instance
from fleet.providers.scenario import FaultBook, ScenarioProvider

OPERATOR_USERNAME = "replay-operator"


def setup_world(sc: Scenario, provider) -> None:
    """Write the scenario's starting state into the current database, on the current (virtual) clock.

    Instance rows from ``fleet`` (not for ``known: false`` entries; ``created_at``/``status_since``
    from ``age_min``/``status_age_min``; ``worker_name`` and ``ssh_host`` = the instance id),
    healthy Diagnosis rows for ``diagnosed_min_ago``, SideEffect and AuditLog rows for ``history``
    (``state: claimed`` leaves the SideEffect ``claimed``; a done destroy or stop records the
    instance's destroy- or stop-requested time), the session anchor's objectives, policy
    overrides and observe-only switch. Also an operator user who answers approvals.
    """
    now = clock.now()
    state = SessionState.get()
    set_objectives(state, sc.objectives)
    overrides = dict(state.overrides or {})
    overrides["policy"] = {**overrides.get("policy", {}), **file_policy(sc.policy)}
    state.overrides = overrides
    state.observe_only = sc.session.observe_only
    state.save()

    by_id = {}
    for f in sc.fleet:
        if not f.known:
            continue  # the provider lists it; our database has no row (a lost launch answer)
        created = now - timedelta(minutes=f.age_min)
        status_age = f.status_age_min if f.status_age_min is not None else f.age_min
        by_id[f.id] = Instance.objects.create(
            provider=f.provider or provider.name,
            external_id=f.id,
            label=f.id,
            gpu_name=f.gpu_name,
            status=f.actual_status,
            intended_status=f.intended_status,
            status_msg=f.status_msg,
            status_since=now - timedelta(minutes=status_age),
            dph=f.dph,
            ssh_host=f.id if f.ssh is not None else "",
            ssh_port=22 if f.ssh is not None else None,
            worker_name=f.id,
            created_at=created,
            started_at=created,
        )
        if f.diagnosed_min_ago is not None:
            Diagnosis.objects.create(
                instance=by_id[f.id],
                taken_at=now - timedelta(minutes=f.diagnosed_min_ago),
                health="healthy",
                fault_class="",
                cause="on record (scenario)",
                source="ssh",
                evidence={},
            )
    requested_field = {"destroy_instance": "destroy_requested_at", "stop_instance": "stop_requested_at"}
    instance_fields = {f.name for f in Instance._meta.get_fields()}
    for n, h in enumerate(sc.history):
        at = now - timedelta(minutes=h.min_ago)
        if h.tool == "launch_instance":
            gpu = next((f.gpu_name for f in sc.fleet if f.id == h.instance), "")
            args = {"gpu_name": gpu, "launch_priority": "P1", "reason": "scenario history"}
        else:
            args = {"instance_id": h.instance or "", "reason": "scenario history"}
        claimed = h.state == "claimed"
        SideEffect.objects.create(
            key=f"history:{n}",
            tool=h.tool,
            args=args,
            instance_ref=h.instance or "",
            status="claimed" if claimed else "done",
            result="" if claimed else "(scenario history)",
            actor="agent",
            claimed_at=at,
            finished_at=None if claimed else at,
        )
        AuditLog.objects.create(
            at=at, actor="agent", verb=h.tool, target=h.instance or "",
            reason="scenario history" + (" (claimed, never finished)" if claimed else ""), after=args,
        )
        field = requested_field.get(h.tool)
        if not claimed and field in instance_fields and h.instance in by_id:
            Instance.objects.filter(pk=by_id[h.instance].pk).update(**{field: at})
    user, _ = User.objects.get_or_create(username=OPERATOR_USERNAME)
    group, _ = Group.objects.get_or_create(name="operators")
    user.groups.add(group)


def file_policy(policy: dict) -> dict:
    """The file's ``policy`` as overrides: naming ``TOOL`` replaces the product's default for every
    priority key of that tool the file does not name (``launch_instance: approval`` also covers
    ``:P0``). ``TOOL:monitor`` keys are left alone: the monitor keeps its own default unless the
    file names that key (``forbidden`` on ``TOOL`` binds it anyway, in the pipeline)."""
    out = dict(policy)
    for key in DEFAULT_POLICY:
        tool, _, qual = key.partition(":")
        if qual and qual != "monitor" and tool in policy and key not in policy:
            out[key] = policy[tool]
    return out


def set_objectives(state, objectives: dict) -> None:
    """Set ``objectives`` on the session anchor as an operator would (``target_proofs_hr`` on the
    anchor, the rest merged into its objectives). The caller saves ``state``."""
    merged = dict(state.objectives or {})
    merged.update(objectives)
    state.objectives = merged
    if objectives.get("target_proofs_hr") is not None:
        state.target_proofs_hr = float(objectives["target_proofs_hr"])


def provider_name(sc: Scenario) -> str:
    """The name the scenario provider registers under: the fleet's one provider name, else ``scenario``.

    Instance rows carry it, so ``get_provider(instance.provider)`` reaches the scenario provider and
    an ``ssh`` fleet is an operator-owned one (``Instance.is_owned_host``).
    """
    names = {f.provider for f in sc.fleet}
    return names.pop() if len(names) == 1 else "scenario"


class World:
    """The replay's stand-ins for one file: ``provider`` (the scenario provider), ``demand``
    (the scenario demand source) and ``clock`` (the virtual clock)."""

    def __init__(self, provider, demand, clock):
        self.provider, self.demand, self.clock = provider, demand, clock

    def move_to(self, at) -> None:
        """Move the virtual clock forward to ``at`` (never back: sleeps may have passed it)."""
        ahead = (at - self.clock.now()).total_seconds()
        if ahead > 0:
            self.clock.advance(ahead)

    def change_fleet(self, entries) -> None:
        """Apply a moment's ``fleet`` changes at the provider and to Curio's view of the workers."""
        for e in entries:
            data = e.model_dump(exclude_none=True)
            self.provider.put(data)
            mine = next((f for f in self.demand.fleet if f["id"] == e.id), None)
            if mine is None:
                mine = {"id": e.id}
                self.demand.fleet.append(mine)
            if e.worker is not None:
                mine["worker"] = e.worker.model_dump()
            elif e.gone:
                mine.pop("worker", None)  # a machine the provider no longer has runs no worker


@contextlib.contextmanager
def isolated(sc: Scenario):
    """The replay's world for the ``with`` block: virtual clock at ``now``, scenario provider and
    demand source, no broadcasts (the ``changed`` signal's receivers are detached), no Celery
    broker, product-default policy (``WARDEN_UNATTENDED`` ignored). Yields the provider (its
    :class:`World` is its ``world`` attribute)."""
    vclock = VirtualClock(sc.now)
    saved_receivers = changed.receivers
    saved_unattended = settings.WARDEN.get("UNATTENDED")
    changed.receivers = []
    changed.sender_receivers_cache.clear()
    settings.WARDEN["UNATTENDED"] = False
    try:
        with use_clock(vclock):
            fleet = [f.model_dump() for f in sc.fleet]
            faults = FaultBook([f.model_dump() for f in sc.provider_faults])
            provider = ScenarioProvider(fleet, [o.model_dump() for o in sc.offers], faults, name=provider_name(sc))
            source = ScenarioDemandSource(sc.demand.model_dump(), fleet)
            provider.world = World(provider, source, vclock)
            providers_mod.set_override(provider)
            demand_mod.set_override(source)
            yield provider
    finally:
        providers_mod.set_override(None)
        demand_mod.set_override(None)
        settings.WARDEN["UNATTENDED"] = saved_unattended
        changed.receivers = saved_receivers
        changed.sender_receivers_cache.clear()
