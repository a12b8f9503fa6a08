"""Demand from Curio's HarmonyDB tables (a real Curio, or the local demo queue).

Reads the unmanaged models of ``fleet.harmony`` through the ORM on alias ``harmony``, so the
same code reads the SQLite demo and a real Curio on PostgreSQL or Yugabyte (curio.md §3.4).
Three queries whatever the fleet size: machines (with their details), tasks grouped by owner
and name, and the count of successful proofs over the last hour.
"""

from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, Min

from fleet.clock import clock
from fleet.demand.base import DemandError, DemandReading, WorkerView
from fleet.harmony import HARMONY_ALIAS, HarmonyMachine, HarmonyTask, HarmonyTaskHistory


def harmony_unreadable(exc: Exception, alias: str = HARMONY_ALIAS) -> str:
    """One line naming the setting and what to do, for an error reading the harmony database."""
    from django.db import connections

    cfg = connections[alias].settings_dict
    where = cfg.get("NAME", "?")
    if cfg.get("HOST"):
        where = f"{cfg['HOST']}:{cfg.get('PORT') or ''}/{where}"
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (
        f"harmony database unreadable ({where}: {detail}); check HARMONY_DATABASE_URL "
        "(for the demo run `python manage.py demo prepare`)"
    )


class HarmonyDemandSource:
    """Reads demand from HarmonyDB on database alias ``using`` (default ``harmony``).

    Definitions (curio.md §3.3-3.4, DESIGN.md invariant 1):

    - ``queued``: proving tasks (``WARDEN["TASK_NAMES"]``) with no owner, plus those owned by a
      machine that is not live (Curio has not requeued them yet: they are still demand);
    - ``running``: proving tasks owned by a live machine;
    - a machine is live when ``last_contact`` is within ``3 * WARDEN["HEARTBEAT_S"]`` seconds of
      ``clock.now()``;
    - ``workers_expected``: instances with status ``running`` whose worker heartbeats, or that
      started more than ``WARDEN["STARTUP_GRACE_S"]`` ago (``started_at``, else ``status_since``):
      the grace only excuses a worker that is not heartbeating yet (issue 9 §1.7);
    - ``workers_starting``: running instances inside the grace whose worker is not live yet;
    - ``workers_live``: expected instances whose worker row is live and not cordoned;
      ``workers_cordoned``: live and ``unschedulable`` (draining, not dead);
      ``workers_dead``: the rest of the expected — stale heartbeat or no row at all;
    - ``proofs_hr``: successful history rows of proving tasks with ``work_end`` in the last hour;
    - ``oldest_queued_s``: age of the oldest queued task, seconds (None when none is queued).

    ``workers`` has a :class:`WorkerView` for every machine row that has a ``machine_name``
    (the newest row per name) and for every expected instance without one (``live=False``).
    ``read`` raises :class:`DemandError` naming HARMONY_DATABASE_URL when the database cannot be
    read; ``fleet.demand.read_demand`` turns that into ``state="unknown"``.
    """

    def __init__(self, using: str = HARMONY_ALIAS):
        self.using = using

    def read(self, instances) -> DemandReading:
        """Read demand for our non-killed ``instances`` (``fleet.models.Instance`` rows)."""
        warden = settings.WARDEN
        now = clock.now()
        live_after = now - timedelta(seconds=3 * warden["HEARTBEAT_S"])
        names = list(warden["TASK_NAMES"])
        try:
            machines = list(
                HarmonyMachine.objects.using(self.using).values(
                    "id", "last_contact", "unschedulable", "harmonymachinedetails__machine_name"
                )
            )
            task_groups = list(
                HarmonyTask.objects.using(self.using)
                .values("owner_id", "name")
                .annotate(n=Count("id"), oldest=Min("posted_time"))
                .order_by()
            )
            proofs = (
                HarmonyTaskHistory.objects.using(self.using)
                .filter(result=True, name__in=names, work_end__gte=now - timedelta(hours=1), work_end__lte=now)
                .count()
            )
        except DatabaseError as exc:
            raise DemandError(harmony_unreadable(exc, self.using)) from exc

        live_ids = {m["id"] for m in machines if m["last_contact"] >= live_after}
        owned: dict[int, int] = {}
        queued = running = 0
        oldest = None
        for g in task_groups:
            owner = g["owner_id"]
            if owner is not None:
                owned[owner] = owned.get(owner, 0) + g["n"]
            if g["name"] not in names:
                continue
            if owner is not None and owner in live_ids:
                running += g["n"]
            else:
                queued += g["n"]
                if g["oldest"] is not None and (oldest is None or g["oldest"] < oldest):
                    oldest = g["oldest"]

        workers: dict[str, WorkerView] = {}
        for m in sorted(machines, key=lambda m: m["last_contact"]):  # newest row per name wins
            name = m["harmonymachinedetails__machine_name"]
            if not name:
                continue
            workers[name] = WorkerView(
                name=name,
                live=m["id"] in live_ids,
                unschedulable=bool(m["unschedulable"]),
                owned_tasks=owned.get(m["id"], 0),
                last_contact=m["last_contact"],
                machine_id=m["id"],
            )

        grace = timedelta(seconds=warden["STARTUP_GRACE_S"])
        expected = live = cordoned = starting = 0
        for inst in instances:
            if getattr(inst, "killed_at", None) is not None or inst.status != "running":
                continue
            since = inst.started_at or inst.status_since
            name = inst.worker_name or inst.external_id
            view = workers.get(name)
            # the grace only excuses a worker not heartbeating yet: a live one is live (issue 9 §1.7)
            if (since is None or since > now - grace) and not (view is not None and view.live):
                starting += 1
                continue
            expected += 1
            if view is None:
                workers[name] = WorkerView(name=name, live=False)
            elif view.live and view.unschedulable:
                cordoned += 1
            elif view.live:
                live += 1

        return DemandReading(
            state="ok",
            queued=queued,
            running=running,
            workers_expected=expected,
            workers_live=live,
            workers_dead=expected - live - cordoned,
            workers_cordoned=cordoned,
            workers_starting=starting,
            proofs_hr=float(proofs),
            active=running > 0,
            oldest_queued_s=(now - oldest).total_seconds() if oldest is not None else None,
            taken_at=now,
            workers=workers,
        )
