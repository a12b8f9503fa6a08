"""The observe phase: fleet, demand, alerts and diagnoses, read once per cycle into a :class:`World`.

Reads are not agent steps. A failed provider read raises a ``provider_error`` alert and the
cycle goes on with the last known fleet; a failed demand read is ``unknown`` (never zero) and
raises ``demand_unknown``; expected workers that are dead raise ``workers_dead``; the lifecycle
alerts (``instance_exited``, ``stuck_provisioning`` for a starving launch, ``prompt_injection`` in
provider fields) and the voiding of approvals whose instance is gone (``target_gone``) are
:func:`lifecycle_alerts`. Each alert is raised once per episode and resolved when its condition
clears.
"""

import logging
from datetime import timedelta

from django.conf import settings
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from agent.models import Approval, Run
from agent.policy.claims import settle_claims
from agent.policy.table import Limits
from agent.runtime.runs import close_run
from fleet.alerts import raise_alert, resolve
from fleet.clock import clock
from fleet.cordon import reapply
from fleet.cost import record_fleet_sample
from fleet.demand import DemandReading, read_demand
from fleet.diagnostics import unreachable_alerts
from fleet.events import emit
from fleet.lifecycle import blind, starving, worker_live
from fleet.models import Alert, DemandSample, Diagnosis, Instance
from fleet.proof_cost import record_proof_credits
from fleet.providers import ProviderError
from fleet.secrets import redact
from fleet.sync import sync_instances
from fleet.untrusted import raise_instance_injection, scan_instance


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.kind == "transient"


def _not_sent(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.not_sent


def with_retries(fn, attempts: int = 3, *, side_effect: bool = False):
    """Call ``fn()`` retrying transient ``ProviderError`` with exponential backoff on ``clock``.

    Waits 1 s, 2 s, 4 s … (capped at 8 s) between attempts — virtual seconds under replay.
    With ``side_effect`` only errors known not to have taken effect are retried (HTTP 429, a
    refused connection: ``ProviderError.not_sent``); a timeout or reset after sending is never
    re-sent blind (docs/safety.md invariant 10). Re-raises the last error.
    """
    retrying = Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=1, max=8),
        retry=retry_if_exception(_not_sent if side_effect else _transient),
        sleep=clock.sleep,
        reraise=True,
    )
    try:
        return retrying(fn)
    except RetryError as exc:  # pragma: no cover — reraise=True re-raises the original
        raise exc.last_attempt.exception() from None


class World:
    """What one cycle knows: non-killed instances, the demand reading, latest diagnoses, limits.

    Guards and tools read and refresh it; ``refresh_demand`` re-reads the source (used right
    before every stop or destroy).
    """

    def __init__(self, instances: list[Instance], demand: DemandReading, limits: Limits, policy: dict):
        self.instances = list(instances)
        self.demand = demand
        self.observed = demand  # what the cycle's observation recorded (guards may re-read ``demand``)
        self.limits = limits
        self.policy = policy
        self.provider_error = ""
        # instruction-like text this run saw (provider fields, tool output): forces approval
        self.injection: list[str] = []
        self.diagnoses: dict[int, Diagnosis] = {}
        self._load_diagnoses()

    # -- instances --------------------------------------------------------------------------
    def set_instances(self, instances) -> None:
        self.instances = [i for i in instances if i.killed_at is None]
        self._load_diagnoses()

    def replace(self, inst: Instance) -> None:
        """Put the fresh row ``inst`` in place of its old copy (dropped once killed)."""
        others = [i for i in self.instances if i.pk != inst.pk]
        self.instances = others if inst.killed_at is not None else [*others, inst]

    def instance(self, external_id: str) -> Instance | None:
        for inst in self.instances:
            if inst.external_id == external_id:
                return inst
        return Instance.objects.filter(external_id=external_id).order_by("killed_at").first()

    def worker_for(self, inst: Instance):
        return self.demand.workers.get(inst.worker_name or inst.external_id) if self.demand else None

    # -- diagnoses --------------------------------------------------------------------------
    def _load_diagnoses(self) -> None:
        ids = [i.pk for i in self.instances]
        latest: dict[int, Diagnosis] = {}
        for d in Diagnosis.objects.filter(instance_id__in=ids).order_by("instance_id", "-taken_at"):
            latest.setdefault(d.instance_id, d)
        self.diagnoses = latest

    def add_diagnosis(self, diag: Diagnosis) -> None:
        self.diagnoses[diag.instance_id] = diag

    def fresh_diagnosis(self, inst: Instance) -> Diagnosis | None:
        """The instance's latest diagnosis if younger than ``diagnosis_fresh_min``."""
        d = self.diagnoses.get(inst.pk)
        if d is None:
            return None
        if clock.now() - d.taken_at > timedelta(minutes=self.limits.diagnosis_fresh_min):
            return None
        return d

    # -- demand -----------------------------------------------------------------------------
    def refresh_demand(self) -> DemandReading:
        self.demand = read_and_record_demand(self.instances)
        return self.demand

    @staticmethod
    def demand_view(reading: DemandReading) -> dict:
        """The demand as the agent sees it; unknown counts stay null, never 0."""
        idle_min = None
        if reading.idle_since is not None:
            idle_min = round((clock.now() - reading.idle_since).total_seconds() / 60, 1)
        return {
            "state": reading.state,
            "error": reading.error or None,
            "queued": reading.queued,
            "running": reading.running,
            "workers_expected": reading.workers_expected,
            "workers_live": reading.workers_live,
            "workers_dead": reading.workers_dead,
            "workers_cordoned": reading.workers_cordoned,
            "backlog": reading.backlog,
            **backlog_view(reading),
            "proofs_hr": reading.proofs_hr,
            "proof_s": reading.proof_s,
            "idle_min": idle_min,
            **unmatched_view(reading),
        }

    def summary(self) -> dict:
        """Compact snapshot for the trace and the model's context."""
        return {
            "instances": [
                {"id": i.external_id, "status": i.status, "dph": i.dph, "gpu": i.gpu_name} for i in self.instances
            ],
            "demand": self.demand_view(self.demand),
            "provider_error": self.provider_error or None,
            "target_proofs_hr": self.limits.target_proofs_hr,
        }


def backlog_view(reading: DemandReading) -> dict:
    """The backlog's parts that are not in ``backlog`` itself, when the source knows them: SDR
    sectors whose PoRep is not due yet (``backlog_not_due``), how many of them become due within
    the loading time (``backlog_soon``, counted in ``backlog``), when the first becomes due
    (``backlog_next_due_at``, ISO UTC), the chain head epoch and the loading time used."""
    out = {}
    if reading.backlog_not_due is not None:
        out["backlog_not_due"] = reading.backlog_not_due
        out["backlog_soon"] = reading.backlog_soon
        if reading.backlog_next_due_at is not None:
            out["backlog_next_due_at"] = reading.backlog_next_due_at.isoformat()
        out["chain_epoch"] = reading.chain_epoch
    if reading.loading_s is not None:
        out["loading_s"] = round(reading.loading_s)
    return out


def unmatched_view(reading: DemandReading) -> dict:
    """Worker rows no instance matches (count and ``host:port``, at most 10 listed), ``host_and_port``
    values several rows share, and the fields the source could not read: for the observation and
    the sample's ``detail``. Empty when there is nothing to say."""
    out = {}
    if reading.unmatched:
        out["workers_unmatched"] = len(reading.unmatched)
        out["unmatched"] = [
            {k: u[k] for k in ("host_and_port", "name", "live", "cordoned", "owned_tasks")} for u in reading.unmatched[:10]
        ]
    if reading.workers_unmatched_live:
        out["workers_unmatched_live"] = reading.workers_unmatched_live
    if reading.node_identity:
        out["node_identity"] = [dict(x) for x in reading.node_identity[:10]]
    if reading.shared_hosts:
        out["shared_host_and_port"] = {hp: len(ids) for hp, ids in list(reading.shared_hosts.items())[:10]}
    if reading.unreadable:
        out["unreadable"] = dict(reading.unreadable)
    return out


def read_and_record_demand(instances) -> DemandReading:
    """Read demand, derive ``idle_since`` from earlier samples when the source does not know it,
    store a :class:`DemandSample`, raise/resolve ``demand_unknown`` and ``workers_dead``."""
    reading = read_demand(instances)
    prev = DemandSample.objects.filter(state="ok").order_by("-taken_at").first()
    if (reading.state == "ok" and reading.idle_since is None and reading.queued == 0 and not reading.running
            and not reading.backlog):
        reading.idle_since = prev.idle_since if prev and prev.idle_since else reading.taken_at
    DemandSample.objects.create(
        taken_at=reading.taken_at or clock.now(),
        state=reading.state,
        error=redact(reading.error)[:2000],
        queued=reading.queued,
        running=reading.running,
        workers_expected=reading.workers_expected,
        workers_live=reading.workers_live,
        workers_dead=reading.workers_dead,
        workers_cordoned=reading.workers_cordoned,
        backlog=reading.backlog,
        proofs_hr=reading.proofs_hr,
        proof_s=reading.proof_s,
        idle_since=reading.idle_since if reading.state == "ok" else None,
        detail={**unmatched_view(reading), **backlog_view(reading), **({"workers_starting": reading.workers_starting} if reading.workers_starting is not None else {}),
                "source": reading.source, **({"rate_window_s": reading.rate_window_s} if reading.rate_window_s else {}),
                **{k: getattr(reading, k) for k in ("proof_s_by_gpu", "proof_s_by_worker") if getattr(reading, k)}},
    )
    if reading.history_at is not None:  # Curio's task history was read: credit its new proofs
        record_proof_credits(reading.new_proofs, instances, read_at=reading.history_at)
    if reading.node_identity:
        who = "; ".join(f"{x['instance']}: {x['why']}" for x in reading.node_identity[:5])
        raise_alert("node_identity", f"Curio's rows cannot tell our nodes apart; their liveness is unknown and "
                    f"stopping, rebooting or destroying them needs an operator: {who}", severity="P1")
    elif reading.state == "ok" and reading.workers_live is not None:
        resolve("node_identity")
    if reading.state != "ok":
        raise_alert("demand_unknown", f"demand is {reading.state}: {reading.error or 'no fresh read'}", severity="P1")
    else:
        resolve("demand_unknown", f"demand readable again ({reading.queued} queued, {reading.workers_live} workers live)")
    if reading.workers_dead:
        raise_alert(
            "workers_dead",
            f"{reading.workers_dead} of {reading.workers_expected} expected workers dead; {reading.queued} tasks queued"
            + (f", {reading.backlog} in the backlog" if reading.backlog else ""),
            severity="P0" if not reading.workers_live else "P1",
        )
    elif reading.state == "ok" and reading.workers_dead == 0:  # unknown (None) resolves nothing
        resolve("workers_dead", f"no expected worker is dead any more ({reading.workers_live} of "
                f"{reading.workers_expected} live)")
    emit("demand-changed")
    return reading


def observe(limits: Limits, policy: dict) -> World:
    """Settle doubtful side-effect claims (``agent.policy.claims.settle_claims``), read the fleet (with
    retries) and demand, record a ``FleetSample``; returns the cycle's :class:`World`."""
    settle_claims(limits.claim_max_age_min)  # open claims whose worker died or that are too old
    provider_error = ""
    try:
        instances = with_retries(sync_instances, attempts=limits.retry_attempts)
        resolve("provider_error", "the provider answers again")
    except ProviderError as exc:
        provider_error = f"{exc.code or exc.kind}: {exc}"
        raise_alert("provider_error", f"provider read failed: {provider_error}", severity="P1")
        instances = list(Instance.objects.filter(killed_at__isnull=True))
    try:
        reapply(instances)  # a worker that re-registered has lost Warden's cordon
    except Exception as exc:  # noqa: BLE001 — the demand read below reports a broken harmony database
        logging.getLogger(__name__).warning("cordon re-application failed: %s", exc)
    demand = read_and_record_demand(instances)
    world = World(instances, demand, limits, policy)
    world.provider_error = provider_error
    lifecycle_alerts(world)

    record_fleet_sample(world.instances, limits.target_proofs_hr)  # the Machine Performance charts
    return world


def lifecycle_alerts(world: World) -> None:
    """The observe phase's lifecycle alerts and checks, once per episode each:

    - ``prompt_injection``: instruction-like text in an instance's provider fields (the run then
      needs approval for every side effect: ``world.injection``);
    - ``instance_exited``: an instance that exited or errored while we wanted it running, or whose
      worker stopped heartbeating while it runs, with the evidence (status, exit
      code, message, last heartbeat); resolved when it runs with a live worker again;
    - ``stuck_provisioning``: a launch starving the queue (``fleet.lifecycle.starving``);
    - ``provider_error`` for an owned SSH host that cannot be reached, with a diagnosis (never removed);
    - waiting approvals whose instance is gone are void at once (``target_gone``).

    Each episode ends on its condition (``fleet.alerts.ENDS``), resolved with the reason:
    ``instance_exited`` when the instance runs with a live worker again or was stopped on purpose;
    ``stuck_provisioning`` when it has a live worker, the queue is empty or served by another
    worker, or it left the pending states; ``prompt_injection`` on an instance's field when the
    text is gone from it; and every instance-scoped kind when its instance is destroyed
    (:func:`end_gone_episodes`).
    """
    startup_grace = timedelta(seconds=settings.WARDEN["STARTUP_GRACE_S"])
    # one query for the episodes already open: an open alert is not raised again and only an open
    # one is resolved, so the loop below queries nothing per instance in a steady fleet
    open_keys = set(Alert.objects.filter(kind__in=INSTANCE_KINDS)
                    .exclude(state="resolved").values_list("key", flat=True))
    end_gone_episodes(world, open_keys)

    for inst in world.instances:
        hits = scan_instance(inst)
        if hits:
            world.injection += [f"{inst.external_id} {name}: {frag[:120]}" for name, frag in hits]

            raise_instance_injection(inst.external_id, hits)
        key = f"instance_exited:{inst.external_id}"
        w = world.worker_for(inst)
        for open_key in [k for k in open_keys if k.startswith(f"prompt_injection:instance:{inst.external_id}:")]:
            field = open_key.rsplit(":", 1)[1]
            if field not in {name for name, _ in hits}:
                resolve(open_key, f"the instruction-like text is gone from {inst.external_id}'s {field}")
        if key in open_keys:
            if inst.status == "running" and worker_live(inst, world):
                resolve(key, f"{inst.external_id} runs with a live worker again")
            elif inst.intended_status != "running" and inst.status not in ("exited", "error"):
                resolve(key, f"{inst.external_id} was stopped on purpose (now {inst.status})")
        elif inst.destroy_requested_at is None and inst.intended_status == "running" and inst.status in ("exited", "error"):
            evidence = [f"provider status {inst.status} since {inst.status_since:%Y-%m-%d %H:%M} UTC"]
            if inst.exit_code is not None:
                evidence.append(f"exit code {inst.exit_code}" + (" (killed by SIGKILL)" if inst.exit_code == -9 else ""))
            if inst.status_msg:
                evidence.append(f"message: {inst.status_msg[:200]}")
            raise_alert("instance_exited", f"{inst.external_id} died without being asked to: " + "; ".join(evidence),
                        severity="P1", key=key, instance=inst)
        elif (not blind(world) and inst.status == "running" and w is not None and not w.live and not w.unschedulable
              and w.last_contact is not None and inst.intended_status == "running"
              and clock.now() - inst.status_since > startup_grace):  # a reboot or resume we asked for is excused
            raise_alert("instance_exited", f"{inst.external_id}'s worker {w.name} stopped heartbeating "
                        f"(last contact {w.last_contact:%Y-%m-%d %H:%M:%S} UTC) while the instance runs",
                        severity="P1", key=key, instance=inst)
        stuck_key = f"stuck_provisioning:{inst.external_id}"
        if stuck_key in open_keys and not blind(world) and not starving(inst, world):
            d = world.demand
            why = (f"{inst.external_id} has a live worker" if worker_live(inst, world)
                   else "the queue is empty" if not (d.queued or getattr(d, "backlog", 0))
                   else f"the queue is served ({d.workers_live} workers live)" if d.workers_live
                   else f"{inst.external_id} is {inst.status or 'no longer pending'}")
            resolve(stuck_key, why)
        if starving(inst, world) and stuck_key not in open_keys:
            age = (clock.now() - inst.created_at).total_seconds() / 60
            raise_alert("stuck_provisioning", f"{inst.external_id} still {inst.status or 'provisioning'} after {age:.0f} min "
                        f"with {world.demand.queued} tasks queued and no live worker; it no longer blocks another launch",
                        severity="P1", key=f"stuck_provisioning:{inst.external_id}", instance=inst)
    unreachable_alerts(world.instances, world.worker_for)  # owned hosts SSH cannot reach: alert + diagnosis
    void_gone_approvals()


#: alert kinds whose key names an instance (``<kind>:<external_id>``, or for an owned host's
#: ``provider_error:ssh:<id>`` and an instance field's ``prompt_injection:instance:<id>:<field>``)
INSTANCE_KINDS = ("instance_exited", "stuck_provisioning", "destroy_unconfirmed", "provider_error", "prompt_injection")


def _instance_of_key(key: str) -> str:
    """The external id an instance-scoped alert key names, or "" (``demand_unknown``, a run's key)."""
    parts = key.split(":")
    if parts[0] in ("instance_exited", "stuck_provisioning", "destroy_unconfirmed") and len(parts) >= 2:
        return ":".join(parts[1:])
    if parts[:2] == ["provider_error", "ssh"] and len(parts) >= 3:
        return ":".join(parts[2:])
    if parts[:2] == ["prompt_injection", "instance"] and len(parts) >= 4:
        return ":".join(parts[2:-1])
    return ""


def end_gone_episodes(world: World, open_keys: set[str]) -> int:
    """Resolve the open episodes that can no longer go on: an instance-scoped alert whose instance
    is destroyed (killed) — "local-1 destroyed at 18:04 UTC (by the monitor: terminal exited)" —
    and a run's ``prompt_injection`` (``prompt_injection:<run>:<tool>``) once that run closed.
    ``open_keys``: the open alert keys of :data:`INSTANCE_KINDS` (one query, by the caller); at
    most two more queries, whatever the fleet's size. Returns how many keys were resolved."""
    live = {i.external_id for i in world.instances if i.killed_at is None}
    by_id = {}
    for k in open_keys:
        ext = _instance_of_key(k)
        if ext and ext not in live:
            by_id.setdefault(ext, []).append(k)
    n = 0
    if by_id:
        for inst in Instance.objects.filter(external_id__in=list(by_id), killed_at__isnull=False):
            who = f" by {inst.killed_by}" if getattr(inst, "killed_by", "") else ""
            why = f": {inst.kill_reason[:120]}" if getattr(inst, "kill_reason", "") else ""
            for k in by_id[inst.external_id]:
                n += bool(resolve(k, f"{inst.external_id} destroyed at {inst.killed_at:%H:%M} UTC{who}{why}"))
    runs = {}
    for k in open_keys:
        parts = k.split(":")
        if parts[0] == "prompt_injection" and len(parts) >= 3 and parts[1].isdigit():
            runs.setdefault(int(parts[1]), []).append(k)
    if runs:
        for number, status in Run.objects.filter(number__in=list(runs)).exclude(status__in=("running", "parked")) \
                .values_list("number", "status"):
            for k in runs[number]:
                n += bool(resolve(k, f"run {number} that read the text closed ({status})"))
    return n


def void_gone_approvals() -> int:
    """Void every waiting approval whose instance is gone (killed), at once: ``target_gone``.

    The parked step's outcome becomes ``refused``/``target_gone``; a parked run with nothing left
    waiting is closed. Returns how many were voided."""
    waiting = list(Approval.objects.filter(status="waiting").select_related("step", "run"))
    if not waiting:
        return 0
    ids = {str(a.args.get("instance_id")) for a in waiting if isinstance(a.args, dict) and a.args.get("instance_id")}
    killed = {}
    for inst in Instance.objects.filter(external_id__in=ids).order_by("killed_at"):
        killed.setdefault(inst.external_id, inst)
    n = 0
    runs = set()
    for a in waiting:
        inst = killed.get(str((a.args or {}).get("instance_id")))
        if inst is None or inst.killed_at is None:
            continue
        detail = f"{inst.external_id} is gone ({inst.kill_reason or 'killed'} by {inst.killed_by or 'unknown'}); the approval is void"
        if Approval.objects.filter(pk=a.pk, status="waiting").update(status="void", outcome_detail=f"target_gone: {detail}") != 1:
            continue
        step = a.step
        step.outcome, step.reason_code, step.detail, step.ok = "refused", "target_gone", detail, False
        step.observation = f"ok: false — target_gone: {detail}"
        step.save(update_fields=["outcome", "reason_code", "detail", "observation", "ok"])
        runs.add(a.run)
        n += 1
    for run in runs:
        if run.status == "parked" and not run.approvals.filter(step__outcome="parked").exists():
            run.status = "done"
            close_run(run)
    if n:
        emit("approvals-changed", "runs-changed")
    return n
