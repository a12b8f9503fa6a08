"""Bring our ``Instance`` rows in line with what the provider reports.

One provider read, one query for our rows (each loaded once: the rows returned are those objects,
updated in place), one for unknown ids, then an UPDATE per changed row only: the query count does
not grow with the fleet unless rows actually change.
"""

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction

from fleet.audit import do_audit
from fleet.clock import clock
from fleet.events import emit, trigger
from fleet.machines import remember_failure
from fleet.models import Instance, StatusChange
from fleet.providers import get_provider
from fleet.providers.base import ProviderError
from fleet.secrets import redact
from fleet.untrusted import raise_instance_injection, scan_instance

#: statuses that mean the machine failed the instance (its machine is left out of later offers);
#: ``exited`` counts only when we wanted it running
FAILED_STATUSES = {"error", "exited", "unknown", "offline"}


def vanish_grace() -> timedelta:
    """How young an instance may be and still be missing from the list without being marked
    vanished (a provider's list can lag a create): ``WARDEN_VANISH_GRACE_MIN``, default 10 min."""
    return timedelta(minutes=float(settings.WARDEN.get("VANISH_GRACE_MIN", 10)))

#: ProviderInstance field -> Instance field copied on every sync
_COPIED = [
    "status",
    "intended_status",
    "status_msg",
    "gpu_name",
    "dph",
    "storage_dph",
    "ssh_host",
    "ssh_port",
    "pid",
    "exit_code",
    "log_path",
    "worker_name",
    "started_at",
]


#: the copied fields whose value a database round trip can change (the others are text)
_CONVERTED = ("dph", "storage_dph", "ssh_port", "pid", "exit_code", "started_at")


def _stored(field: str, value):
    """``value`` as the database gives it back for ``Instance.field`` (a float field's ``1`` is
    ``1.0``, an aware time is in UTC): the synced rows are returned without being read again, and
    must equal what a re-read would give."""
    value = Instance._meta.get_field(field).to_python(value)
    if isinstance(value, datetime) and value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value


def _fields(p) -> dict:
    values = {f: getattr(p, f) for f in _COPIED}
    for f in ("status_msg", "gpu_name", "ssh_host", "log_path", "worker_name", "intended_status"):
        values[f] = values[f] or ""
    values["intended_status"] = values["intended_status"] or "running"
    values["status_msg"] = redact(values["status_msg"])  # provider text is never stored with secrets
    values["machine_id"] = str((p.extra or {}).get("machine_id") or "")[:64]
    for f in _CONVERTED:
        values[f] = _stored(f, values[f])
    return values


def sync_instances(provider=None) -> list[Instance]:
    """List ``provider`` (default: ``get_provider()``) and update its ``Instance`` rows.

    - a listed instance: status, intended status, message, pid, exit code, log path, worker
      name, started_at... are copied; ``status_since`` moves to ``clock.now()`` when the status
      changes;
    - one of our live rows missing from the list: marked killed (``killed_by="provider"``,
      reason "vanished") unless it was created less than :func:`vanish_grace` ago, and only once
      the provider's ``show`` confirms it gone (:func:`_confirm_missing`: a list that omits an
      instance ``show`` still returns raises ``list_inconsistent``);
    - a listed instance we have no row for (an instance labelled ours: providers list only
      theirs): adopted — a new row with ``adopted_at`` set and an ``adopt_instance`` audit row
      naming ``WARDEN_ORPHANS``; with ``destroy`` the monitor then destroys it
      (``fleet.monitor``), so nothing that runs and bills is hidden or ignored;
    - a row whose status turns failed (``error``; ``exited`` while intended running;
      ``unknown``/``offline``): its machine is remembered (``fleet.machines``) and left out of
      later offers;
    - a listed instance whose destroy we counted as confirmed: live again, its destroy unconfirmed
      (``destroy_requested_at`` kept: the monitor re-sends it with ``destroy_unconfirmed``).

    Emits ``fleet-changed`` (after commit) when anything changed. Returns this provider's
    non-killed instances, newest first. Raises ``ProviderError`` when the provider read fails
    (nothing is changed then).
    """
    provider = provider or get_provider()
    listed = provider.list_instances()  # raises ProviderError: never read as "no instances"
    for p in listed:  # provider text is data: instruction-like text raises prompt_injection here
        hits = scan_instance(p)
        if hits:
            raise_instance_injection(p.external_id, hits)
    by_id = {p.external_id: p for p in listed}
    now = _stored("status_since", clock.now())  # in UTC, as a re-read row would hold it
    changed = False
    grace = vanish_grace()
    names = getattr(provider, "names", {provider.name})
    gone = _confirm_missing(provider, names, set(by_id), now - grace)
    failed: list[Instance] = []
    stopped_running = 0
    with transaction.atomic():
        rows = list(Instance.objects.select_for_update().filter(provider__in=names, killed_at__isnull=True)
                    .order_by("-created_at"))
        live = []  # the rows still live after this sync, each loaded once (not read again below)
        for row in rows:
            p = by_id.pop(row.external_id, None)
            if p is None:
                if row.created_at > now - grace or (gone is not None and row.destroy_requested_at is None
                                                    and row.external_id not in gone):
                    live.append(row)
                    continue  # young, or not yet confirmed gone (next tick)
                if row.destroy_requested_at is not None:
                    row.killed_at, row.killed_by, row.kill_reason = now, "monitor", "destroy confirmed by re-list"
                elif gone and gone.get(row.external_id):
                    row.killed_at, row.killed_by, row.kill_reason = now, "provider", gone[row.external_id][:200]
                else:
                    row.killed_at, row.killed_by, row.kill_reason = now, "provider", "vanished"
                    if row.status == "running":
                        trigger("worker_died", f"{row.external_id} vanished while running")
                        stopped_running += 1
                row.save(update_fields=["killed_at", "killed_by", "kill_reason"])
                changed = True
                continue
            live.append(row)
            values = _fields(p)
            diff = [f for f, v in values.items() if getattr(row, f) != v]
            if not diff:
                continue
            if "status" in diff:
                row.status_since = now
                diff.append("status_since")
                was, became = row.status, values["status"]
                kind = "worker_died" if was == "running" else "instance_state"
                trigger(kind, f"{row.external_id} {was} → {became}")
                stopped_running += was == "running"
                if values["status"] in FAILED_STATUSES and (values["status"] != "exited" or values["intended_status"] == "running"):
                    failed.append(row)
            for f in diff:
                if f != "status_since":
                    setattr(row, f, values[f])
            row.save(update_fields=diff)
            changed = True
        if by_id:
            known = set()
            for row in Instance.objects.select_for_update().filter(provider__in=names, external_id__in=list(by_id)):
                known.add(row.external_id)
                if row.destroy_requested_at is not None and not Instance.objects.filter(
                        provider=row.provider, external_id=row.external_id, killed_at__isnull=True).exists():
                    # a destroy we counted as confirmed, listed again: unconfirmed after all — neither
                    # capacity nor forgotten (the monitor re-sends it and raises destroy_unconfirmed)
                    row.killed_at, row.killed_by, row.kill_reason = None, "", ""
                    for f, v in _fields(by_id[row.external_id]).items():
                        setattr(row, f, v)
                    row.intended_status = "destroyed"
                    row.save()
                    live.append(row)
                    changed = True
            new = [
                Instance(
                    provider=p.extra.get("provider", provider.name),
                    external_id=p.external_id,
                    label=(p.label or "")[:100],
                    status_since=now,
                    created_at=_stored("created_at", p.started_at or now),
                    adopted_at=now,
                    **_fields(p),
                )
                for ext, p in by_id.items()
                if ext not in known  # a killed row still listed: its destroy is unconfirmed; the monitor handles it
            ]
            if new:
                Instance.objects.bulk_create(new)
                # bulk_create sends no post_save: the adopted status's billing period starts here (fleet.cost),
                # or the hours until its first change would count at the storage rate
                StatusChange.objects.bulk_create([StatusChange(instance=r, at=r.status_since, status=r.status, dph=r.dph,
                                                               storage_dph=r.storage_dph) for r in new])
                _audit_adopted(new)
                live += new
                changed = True
        if failed:
            for row in failed:
                remember_failure(row, f"{row.external_id} {row.status}: {row.status_msg[:200]}")
        if changed:
            emit("fleet-changed")
        live.sort(key=lambda r: r.created_at, reverse=True)  # newest first (stable: the query's order for ties)
        if stopped_running and not any(i.status == "running" for i in live):
            trigger("workers_all_dead", f"no instance of {provider.name} is running any more")
    return live


#: at most this many missing instances are confirmed (one ``show`` each) per sync; the rest wait a tick
CONFIRM_MAX = 5


def _confirm_missing(provider, names, listed: set[str], born_before) -> dict[str, str] | None:
    """Which of our live rows past the grace that ``listed`` omits the provider confirms gone, as
    ``{external_id: kill reason}`` ("" for vanished; an instance relabelled at the provider without
    our label is no longer ours and says so).

    A list can be well formed and still wrong (a lagging replica answering an empty page): so a
    provider with ``show`` is asked about each missing instance (at most :data:`CONFIRM_MAX` a sync)
    and only those it answers ``not_found`` for are returned, to be marked vanished. One it still
    shows means the list is not to be trusted: ProviderError ``list_inconsistent`` (semantic; a
    ``provider_error`` alert, nothing changed), never "all vanished". Rows we asked to destroy are
    not asked about (their absence is what we wanted). ``None`` for a provider
    without ``show`` (its list is its truth)."""
    show = getattr(provider, "show", None)
    if show is None:
        return None
    missing = list(Instance.objects.filter(provider__in=names, killed_at__isnull=True, created_at__lte=born_before,
                                           destroy_requested_at__isnull=True)
                   .exclude(external_id__in=listed).order_by("created_at").values_list("external_id", "label")
                   [:CONFIRM_MAX])
    gone: dict[str, str] = {}
    for ext, label in missing:
        try:
            pi = show(ext)
        except ProviderError as exc:
            if exc.code in ("not_found", "no_such_instance"):
                gone[ext] = ""
                continue
            raise
        if label and pi.label != label:  # relabelled at the provider (by hand): no longer ours, though it exists
            gone[ext] = redact(f"relabelled {pi.label!r} at the provider: no longer ours (it still exists and bills)")
            continue
        if pi.status != "destroyed":
            raise ProviderError(f"{provider.name} list omitted instance {ext}, which it still shows {pi.status}: "
                                f"the list is not trusted this tick ({len(listed)} listed)", kind="semantic",
                                code="list_inconsistent")
        gone[ext] = ""
    return gone


def _audit_adopted(rows: list[Instance]) -> None:
    """One ``adopt_instance`` audit row per instance the reconcile adopted (actor ``monitor``)."""
    policy = settings.WARDEN.get("ORPHANS", "adopt")
    then = "the monitor destroys it (WARDEN_ORPHANS=destroy)" if policy == "destroy" else "kept (WARDEN_ORPHANS=adopt)"
    for row in rows:
        do_audit("monitor", "adopt_instance", row.external_id,
                 f"listed by {row.provider} with our label {row.label!r} but no record: adopted; {then}", None,
                 {"status": row.status, "label": row.label, "gpu_name": row.gpu_name, "dph": row.dph})
