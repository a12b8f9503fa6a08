"""The fleet's records: instances we rent or run, demand samples, diagnoses and alerts.

HarmonyDB (Curio's queue) is read through the unmanaged models in ``fleet.harmony``.
"""

from django.db import models

from fleet.harmony import (  # noqa: F401  (registered with the app)
    HarmonyMachine,
    HarmonyMachineDetails,
    HarmonyTask,
    HarmonyTaskHistory,
)

# Provider statuses (vast.ai's ``actual_status`` vocabulary, from vast.ai's instance docs) plus our own.
PENDING_STATUSES = {"created", "loading", "scheduling", "rebooting", ""}
# what makes an instance terminal is fleet.lifecycle.is_terminal (statuses alone do not)
BILLABLE_STATUSES = {"running", "frozen", "loading", "created", "scheduling", "rebooting", "stopped"}


class Instance(models.Model):
    """One machine of the fleet: a provider instance (vast.ai, an owned SSH host, a local process).

    ``status`` is what the provider last reported (vast ``actual_status`` terms: created, loading,
    running, stopped, exited, error, unknown, offline); ``intended_status`` what we asked for.
    ``killed_at`` set means the instance is gone (destroyed or vanished) and kept for history.
    ``dph`` is dollars per hour while the GPU is billed (vast ``dph_total``: running, frozen,
    rebooting); ``storage_dph`` dollars per hour for the disk alone, what a stopped (or still
    loading) instance pays (vast.ai's billing: "Storage charges begin at creation. GPU charges begin
    when status reaches running"; 0 where the provider charges nothing, e.g. local and owned hosts).
    Spend is accounted by ``fleet.cost`` from the :class:`StatusChange` rows. ``cordoned`` is Warden's record of an operator's cordon: it is
    re-applied to the worker after a reboot, a resume or a re-registration (``fleet.cordon``).
    """

    provider = models.CharField(max_length=20)
    external_id = models.CharField(max_length=64)
    label = models.CharField(max_length=100, blank=True)
    gpu_name = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=20, default="created")
    intended_status = models.CharField(max_length=20, default="running")
    status_msg = models.TextField(blank=True)
    status_since = models.DateTimeField()
    dph = models.FloatField(default=0.0)
    storage_dph = models.FloatField(default=0.0)
    ssh_host = models.CharField(max_length=255, blank=True)
    ssh_port = models.PositiveIntegerField(null=True, blank=True)
    # local provider: the worker process
    pid = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    log_path = models.CharField(max_length=500, blank=True)
    # Curio machine_name this instance's worker registers under (docs/curio.md, Workers: mapped by machine_name)
    worker_name = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    killed_at = models.DateTimeField(null=True, blank=True)
    killed_by = models.CharField(max_length=100, blank=True)
    kill_reason = models.TextField(blank=True)
    destroy_requested_at = models.DateTimeField(null=True, blank=True)
    cordoned = models.BooleanField(default=False)
    # the provider's machine it runs on (vast machine_id): a failed one is left out of offers
    machine_id = models.CharField(max_length=64, blank=True)
    # set when the reconcile found it at the provider, labelled ours, with no row (fleet.sync)
    adopted_at = models.DateTimeField(null=True, blank=True)
    # the SSH host key it offered on first contact ("<type> <base64>", public: trust on first use,
    # fleet.ssh.InstanceHostKeys); a different key later is refused. Empty: not contacted yet
    ssh_host_key = models.TextField(blank=True)
    ssh_host_key_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        unique_together = [("provider", "external_id")]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.external_id

    @property
    def is_owned_host(self) -> bool:
        """An operator-owned SSH host: never destroyed by the agent or the monitor."""
        return self.provider == "ssh"


class FailedMachine(models.Model):
    """A provider machine an instance of ours failed on; left out of later offer searches.

    SkyPilot's vast provisioner remembers the ``machine_id`` of a failed attempt and retries on a
    different machine (as SkyPilot's vast provisioner does with ``excluded_machine_ids``). ``failures`` counts the
    instances that failed there; ``reason`` is the latest one's.
    """

    provider = models.CharField(max_length=20)
    machine_id = models.CharField(max_length=64)
    instance_ref = models.CharField(max_length=64, blank=True)
    reason = models.TextField(blank=True)
    failures = models.PositiveIntegerField(default=1)
    first_failed_at = models.DateTimeField()
    last_failed_at = models.DateTimeField()

    class Meta:
        unique_together = [("provider", "machine_id")]
        ordering = ["-last_failed_at"]


class DemandSample(models.Model):
    """One read of the demand source.

    ``state``: ``ok`` (read succeeded), ``unknown`` (the source could not be read: every count is
    null, never zero), ``stale`` (the newest good read is too old). ``idle_since`` is when the
    queue was last seen becoming empty (null while tasks are queued, in the backlog or running).
    ``backlog``: work waiting in Curio's pipeline tables with no queue row yet; ``proof_s``: the
    measured median seconds per proof (null: not measured). ``detail``: worker rows no instance
    matches, shared ``host_and_port`` values and fields the source could not read
    (``agent.runtime.observe.unmatched_view``).
    """

    STATES = [("ok", "ok"), ("unknown", "unknown"), ("stale", "stale")]
    taken_at = models.DateTimeField(db_index=True)
    state = models.CharField(max_length=10, choices=STATES)
    error = models.TextField(blank=True)
    queued = models.IntegerField(null=True)
    running = models.IntegerField(null=True)
    workers_expected = models.IntegerField(null=True)
    workers_live = models.IntegerField(null=True)
    workers_dead = models.IntegerField(null=True)
    workers_cordoned = models.IntegerField(null=True)
    backlog = models.IntegerField(null=True)
    proofs_hr = models.FloatField(null=True)
    proof_s = models.FloatField(null=True)
    idle_since = models.DateTimeField(null=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-taken_at"]


class Diagnosis(models.Model):
    """A verdict on one instance's health from evidence gathered over SSH or from the provider.

    ``health``: healthy | degraded | failed. ``fault_class``: host | container | app | network
    (empty when none). ``evidence`` maps each command run to ``{"rc": int, "out": str}`` (redacted);
    ``findings`` are the verdict's own evidence lines, ``confidence`` its 0..1 confidence and
    ``judge`` who gave it (``rules`` or ``model``; ``fleet.diagnostics.Verdict``).
    """

    HEALTH = [("healthy", "healthy"), ("degraded", "degraded"), ("failed", "failed")]
    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="diagnoses")
    taken_at = models.DateTimeField(db_index=True)
    health = models.CharField(max_length=10, choices=HEALTH)
    fault_class = models.CharField(max_length=10, blank=True)
    cause = models.TextField(blank=True)
    source = models.CharField(max_length=10, default="ssh")
    evidence = models.JSONField(default=dict, blank=True)
    findings = models.JSONField(default=list, blank=True)
    confidence = models.FloatField(null=True, blank=True)
    judge = models.CharField(max_length=10, default="rules")

    class Meta:
        ordering = ["-taken_at"]


class Alert(models.Model):
    """Something an operator should look at. Deduplicated per episode by ``key``.

    ``kind`` is one of docs/contract.md's alert kinds (workers_dead, demand_unknown, provider_error,
    prompt_injection, breaker_tripped, destroy_unconfirmed, stuck_provisioning, budget, escalation,
    stale_claim, instance_exited, planner_fallback). ``count``: how many times the condition
    recurred while this alert was open (``fleet.alerts.raise_alert(recurring=True)``).
    """

    STATES = [("firing", "firing"), ("acknowledged", "acknowledged"), ("resolved", "resolved")]
    kind = models.CharField(max_length=40)
    key = models.CharField(max_length=200, db_index=True)
    severity = models.CharField(max_length=4, default="P2")
    message = models.TextField()
    instance = models.ForeignKey(Instance, null=True, blank=True, on_delete=models.SET_NULL)
    state = models.CharField(max_length=15, choices=STATES, default="firing")
    raised_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    count = models.PositiveIntegerField(default=1)
    # why the episode ended, in words ("local-1 destroyed", "demand readable again"): ``fleet.alerts.resolve``
    resolved_reason = models.CharField(max_length=300, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True)
    ack_comment = models.TextField(blank=True)
    # a silence: until then the alert neither notifies nor shows as firing (``agent.actions.alerts.do_silence_alert``)
    silenced_until = models.DateTimeField(null=True, blank=True)
    silenced_by = models.CharField(max_length=150, blank=True)
    silence_comment = models.TextField(blank=True)

    class Meta:
        ordering = ["-raised_at"]

    def is_silenced(self, now) -> bool:
        """True while a silence covers this alert at ``now`` (an aware datetime)."""
        return self.silenced_until is not None and self.silenced_until > now

class StatusChange(models.Model):
    """From ``at`` on, ``instance`` was in ``status``, billed ``dph`` (GPU states) or ``storage_dph``
    (every other state until killed), both in dollars per hour.

    Written by ``fleet.cost`` whenever an ``Instance`` row is saved with a new status or new rates
    (a ``post_save`` receiver, so every writer is covered); ``at`` is the row's ``status_since``.
    """

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="status_changes")
    at = models.DateTimeField()
    status = models.CharField(max_length=20)
    dph = models.FloatField(default=0.0)
    storage_dph = models.FloatField(default=0.0)

    class Meta:
        ordering = ["instance_id", "at", "id"]
        indexes = [models.Index(fields=["instance", "at"])]


class FleetSample(models.Model):
    """The fleet as one cycle saw it, for the Machine Performance charts.

    ``instances``: non-killed instances; ``running``: those with provider status ``running``;
    ``dph``: what the fleet costs per hour at that moment (``fleet.cost.fleet_dph``: GPU rate for
    GPU-billed states, storage rate for the rest); ``target_proofs_hr``: the objective then.
    """

    taken_at = models.DateTimeField(db_index=True)
    instances = models.IntegerField()
    running = models.IntegerField()
    dph = models.FloatField()
    target_proofs_hr = models.FloatField(null=True)

    class Meta:
        ordering = ["-taken_at"]


class ProofCredit(models.Model):
    """One completed proof, credited to the instance whose worker made it, at the time it was
    first seen (``fleet.proof_cost.record_proof_credits``, written at observe).

    Keyed by Curio's ``harmony_task_history.id`` (``history_id``: assigned by the database in
    insertion order). ``instance`` is ours when the proof's ``completed_by_host_and_port`` was the
    address of exactly one Curio row whose ``machine_name`` named one of our instances (else null:
    a node that is not ours, or one that cannot be told apart); it is kept when the instance stops
    or is destroyed. ``gpu_name`` and ``dph`` are the instance's at that time. ``seconds`` is
    ``work_end - work_start`` (both on the node's clock: their difference is sound); ``seen_at`` is
    the database's clock at the read that first saw the proof — windows over credits use it, never
    the node's ``work_end``.
    """

    history_id = models.BigIntegerField(unique=True)
    task_id = models.BigIntegerField()
    name = models.CharField(max_length=16)
    instance = models.ForeignKey(Instance, null=True, blank=True, on_delete=models.SET_NULL, related_name="proof_credits")
    worker_name = models.CharField(max_length=100, blank=True)
    host_and_port = models.CharField(max_length=300, blank=True)
    gpu_name = models.CharField(max_length=64, blank=True)
    dph = models.FloatField(null=True)
    seconds = models.FloatField(null=True)
    work_end = models.DateTimeField(null=True)
    seen_at = models.DateTimeField(db_index=True)
    # the read before the one that saw it (database clock; null: none recorded): it ended between
    seen_after = models.DateTimeField(null=True)

    class Meta:
        ordering = ["-seen_at", "-history_id"]
        indexes = [models.Index(fields=["instance", "seen_at"])]


class CurioRead(models.Model):
    """The database's clock at a recorded read of Curio's task history (``at``): the boundaries
    between which each credited proof ended (``ProofCredit.seen_after`` … ``seen_at``)."""

    at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-at"]


class CurioNodeSeen(models.Model):
    """What Warden saw of one Curio ``harmony_machines`` row over time (``machine_id``): its
    ``host_and_port``, current ``machine_name`` and ``startup_time``, every name it carried
    (``names``, oldest first, at most 20), when its name last changed and when its startup time
    changed (``startups``, ISO times, at most 10). Read by ``fleet.demand.curio`` to tell when two
    nodes share one row (``node_identity``)."""

    machine_id = models.BigIntegerField(unique=True)
    host_and_port = models.CharField(max_length=300, blank=True)
    machine_name = models.CharField(max_length=200, blank=True)
    startup_time = models.DateTimeField(null=True)
    names = models.JSONField(default=list)
    startups = models.JSONField(default=list)
    name_changed_at = models.DateTimeField(null=True)
    first_seen = models.DateTimeField()


class AuditLog(models.Model):
    """Who or what did what, when, why: before and after. Written by every ``do_*`` action.

    ``actor``: ``user:<name>``, ``agent``, ``monitor`` or ``system``.
    """

    at = models.DateTimeField(db_index=True)
    actor = models.CharField(max_length=150)
    verb = models.CharField(max_length=60)
    target = models.CharField(max_length=200, blank=True)
    reason = models.TextField(blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        # the table it has always had: the model moved down from ``agent`` (state-only migrations)
        db_table = "agent_auditlog"
        ordering = ["-at", "-id"]
