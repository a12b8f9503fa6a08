"""Bring our ``Instance`` rows in line with what the provider reports.

One provider read, one query for our rows, one for unknown ids, then an UPDATE per changed
row only: the query count does not grow with the fleet unless rows actually change.
"""

from datetime import timedelta

from django.db import transaction

from fleet.clock import clock
from fleet.events import emit, trigger
from fleet.models import Instance
from fleet.providers import get_provider
from fleet.secrets import redact

#: an instance this young may not be listed yet (provider lag): never marked vanished
VANISH_GRACE = timedelta(minutes=10)

#: ProviderInstance field -> Instance field copied on every sync
_COPIED = [
    "status",
    "intended_status",
    "status_msg",
    "gpu_name",
    "dph",
    "ssh_host",
    "ssh_port",
    "pid",
    "exit_code",
    "log_path",
    "worker_name",
    "started_at",
]


def _fields(p) -> dict:
    values = {f: getattr(p, f) for f in _COPIED}
    for f in ("status_msg", "gpu_name", "ssh_host", "log_path", "worker_name", "intended_status"):
        values[f] = values[f] or ""
    values["intended_status"] = values["intended_status"] or "running"
    values["status_msg"] = redact(values["status_msg"])  # provider text is never stored with secrets
    return values


def sync_instances(provider=None) -> list[Instance]:
    """List ``provider`` (default: ``get_provider()``) and update its ``Instance`` rows.

    - a listed instance: status, intended status, message, pid, exit code, log path, worker
      name, started_at... are copied; ``status_since`` moves to ``clock.now()`` when the status
      changes;
    - one of our live rows missing from the list: marked killed (``killed_by="provider"``,
      reason "vanished") unless it was created less than 10 minutes ago;
    - a listed instance we have no row for: adopted (a new row), so nothing that runs is hidden;
    - a listed instance whose destroy we counted as confirmed: live again, its destroy unconfirmed
      (``destroy_requested_at`` kept: the monitor re-sends it with ``destroy_unconfirmed``).

    Emits ``fleet-changed`` (after commit) when anything changed. Returns this provider's
    non-killed instances, newest first. Raises ``ProviderError`` when the provider read fails
    (nothing is changed then).
    """
    provider = provider or get_provider()
    from agent.untrusted import raise_instance_injection, scan_instance

    listed = provider.list_instances()  # raises ProviderError: never read as "no instances"
    for p in listed:  # provider text is data: instruction-like text raises prompt_injection here
        hits = scan_instance(p)
        if hits:
            raise_instance_injection(p.external_id, hits)
    by_id = {p.external_id: p for p in listed}
    now = clock.now()
    changed = False
    stopped_running = 0
    with transaction.atomic():
        names = getattr(provider, "names", {provider.name})
        rows = list(Instance.objects.select_for_update().filter(provider__in=names, killed_at__isnull=True))
        for row in rows:
            p = by_id.pop(row.external_id, None)
            if p is None:
                if row.created_at > now - VANISH_GRACE:
                    continue
                if row.destroy_requested_at is not None:
                    row.killed_at, row.killed_by, row.kill_reason = now, "monitor", "destroy confirmed by re-list"
                else:
                    row.killed_at, row.killed_by, row.kill_reason = now, "provider", "vanished"
                    if row.status == "running":
                        trigger("worker_died", f"{row.external_id} vanished while running")
                        stopped_running += 1
                row.save(update_fields=["killed_at", "killed_by", "kill_reason"])
                changed = True
                continue
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
                    changed = True
            new = [
                Instance(
                    provider=p.extra.get("provider", provider.name),
                    external_id=p.external_id,
                    label=p.label or "",
                    status_since=now,
                    created_at=p.started_at or now,
                    **_fields(p),
                )
                for ext, p in by_id.items()
                if ext not in known  # a killed row still listed: its destroy is unconfirmed; the monitor handles it
            ]
            if new:
                Instance.objects.bulk_create(new)
                changed = True
        if changed:
            emit("fleet-changed")
        live = list(Instance.objects.filter(provider__in=names, killed_at__isnull=True).order_by("-created_at"))
        if stopped_running and not any(i.status == "running" for i in live):
            trigger("workers_all_dead", f"no instance of {provider.name} is running any more")
    return live
