"""The local demo: create the queue tables, add proving tasks, kill a worker to watch the agent react.

Used by ``python manage.py demo ...``, ``bootstrap`` and the console buttons. Writing fake tasks
is refused when the demand source is a real Curio (``WARDEN_DEMAND_SOURCE=curio``).
"""

from django.conf import settings
from django.db import DatabaseError

from fleet.clock import clock
from fleet.demand.base import DemandError
from fleet.demand.curio import harmony_unreadable
from fleet.events import emit, trigger
from fleet.harmony import HARMONY_ALIAS, HarmonyTask, ensure_schema
from fleet.models import Instance
from fleet.providers import get_provider
from fleet.providers.base import ProviderError
from fleet.sync import sync_instances

MAX_ENQUEUE = 10_000


def _demo_only(what: str) -> None:
    source = settings.WARDEN["DEMAND_SOURCE"]
    if source != "local":
        raise DemandError(
            f"{what} writes to the demo queue; refused because WARDEN_DEMAND_SOURCE={source} (a real Curio). "
            "Use WARDEN_DEMAND_SOURCE=local for the demo"
        )


def prepare() -> list[str]:
    """Create the HarmonyDB tables on alias ``harmony`` if missing (idempotent).

    Returns the names of the tables created (empty when all exist). Raises ``DemandError``
    naming HARMONY_DATABASE_URL when the database cannot be reached, and refuses for a real Curio
    (its tables are Curio's to create).
    """
    _demo_only("demo prepare")
    try:
        return ensure_schema(HARMONY_ALIAS)
    except DatabaseError as exc:
        raise DemandError(harmony_unreadable(exc)) from exc


def enqueue(n: int, name: str = "PoRep") -> list[int]:
    """Add ``n`` unclaimed tasks named ``name`` to the demo queue; returns their ids.

    ``n``: 1..10,000; ``name``: a task name of at most 16 characters. Raises ``ValueError`` on
    bad input and ``DemandError`` (naming HARMONY_DATABASE_URL) when the queue is unreadable.
    Emits ``demand-changed``, and the trigger ``queue_nonempty`` when no task was waiting before.
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ENQUEUE:
        raise ValueError(f"N must be a whole number from 1 to {MAX_ENQUEUE}, got {n!r}")
    if not name or len(name) > 16 or not name.isidentifier():
        raise ValueError(f"task name must be 1-16 letters/digits (e.g. PoRep), got {name!r}")
    _demo_only("demo enqueue")
    now = clock.now()
    try:
        was_empty = not HarmonyTask.objects.using(HARMONY_ALIAS).filter(owner__isnull=True).exists()
        tasks = HarmonyTask.objects.using(HARMONY_ALIAS).bulk_create(
            [HarmonyTask(name=name, owner=None, posted_time=now, update_time=now, added_by=0) for _ in range(n)]
        )
    except DatabaseError as exc:
        raise DemandError(harmony_unreadable(exc)) from exc
    emit("demand-changed")
    if was_empty:  # the queue went from empty to non-empty: a trigger (agent.runtime.triggers)
        trigger("queue_nonempty", f"{n} {name} task{'s' if n != 1 else ''} queued")
    return [t.id for t in tasks]


def kill_one_worker():
    """SIGKILL the worker process of one running local instance (the oldest); returns it or None.

    The operator's "kill a worker" button: the instance's worker dies without putting its task
    back, its heartbeat stops, and the agent should notice a dead worker. The Instance row is
    re-synced so it shows ``exited`` with code -9. Returns None when no local worker runs.
    """
    provider = get_provider("local")
    candidates = Instance.objects.filter(provider="local", killed_at__isnull=True, status="running").order_by(
        "created_at", "id"
    )
    for inst in candidates:
        try:
            provider.kill_worker(inst.external_id)
        except ProviderError:
            continue  # not actually running any more; try the next
        sync_instances(provider)
        inst.refresh_from_db()
        return inst
    return None
