"""The agent's durable records: the session-state anchor, runs, steps, approvals, memory, audit.

State changes go through ``agent.actions.*.do_*`` (audit row + broadcast after commit).
"""

from django.conf import settings
from django.db import models


class SessionState(models.Model):
    """The session anchor (docs/agent.md, Memory and the session anchor): survives "Reset session".

    One row (pk=1). Holds the next run number, the objectives (target proofs/hr and caps), the
    operator's settings overrides, the observe-only switch and the run lock (token + expiry, so a
    crashed run cannot wedge the agent). ``epoch`` increases on every reset; runs of older epochs
    are not replayed into the model's context.
    """

    next_run_id = models.PositiveIntegerField(default=1)
    target_proofs_hr = models.FloatField(default=0)
    objectives = models.JSONField(default=dict, blank=True)
    overrides = models.JSONField(default=dict, blank=True)
    fleet_snapshot = models.JSONField(default=dict, blank=True)
    observe_only = models.BooleanField(default=False)
    epoch = models.PositiveIntegerField(default=1)
    lock_token = models.CharField(max_length=64, blank=True)
    lock_holder = models.CharField(max_length=200, blank=True)  # host|pid|start time of the lock's process
    lock_expires_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    @classmethod
    def get(cls) -> "SessionState":
        """The anchor row, created with the configured default target on first use."""
        obj, _ = cls.objects.get_or_create(
            pk=1, defaults={"target_proofs_hr": settings.WARDEN["DEFAULT_TARGET_PROOFS_HR"]}
        )
        return obj


class Run(models.Model):
    """One observe cycle of the agent.

    ``status``: running | parked (waiting on an approval, lock released) | done | halted | failed.
    ``halt_reason`` is a reason code of docs/contract.md when a breaker or cap stopped the run.
    ``verdict_action``/``verdict_state_changed`` come from the planner's ``<verdict>``; a run whose
    verdict is (false, false) is a no-op and is skipped in the prompt (``included_in_prompt``).
    """

    number = models.PositiveIntegerField(unique=True)
    epoch = models.PositiveIntegerField(default=1)
    trigger = models.CharField(max_length=20)
    planner = models.CharField(max_length=20)
    status = models.CharField(max_length=10, default="running", db_index=True)
    halt_reason = models.CharField(max_length=40, blank=True)
    halt_detail = models.TextField(blank=True)
    verdict_action = models.BooleanField(null=True)
    verdict_state_changed = models.BooleanField(null=True)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    # the tokens the ``token_budget`` breaker counts: what the run added (agent.runtime.breakers)
    budget_tokens = models.PositiveIntegerField(default=0)
    # dollars the run's model calls cost (ModelCall.cost_usd summed; WARDEN_MODEL_PRICE_IN/_OUT)
    cost_usd = models.FloatField(default=0.0)
    included_in_prompt = models.BooleanField(default=True)
    final_report = models.TextField(blank=True)
    final_answer = models.TextField(blank=True)
    # instance ids / numbers in the final answer that appear in no observation of the run
    entailment_flags = models.JSONField(default=list, blank=True)
    cancel_requested = models.BooleanField(default=False)
    # the trigger events this run took (agent.runtime.triggers.drain): [{"id", "kind", "priority", "detail", "at"}]
    trigger_events = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-number"]
        constraints = [
            # one run at a time: the run lock's second net (agent.runtime.runs)
            models.UniqueConstraint(fields=["status"], condition=models.Q(status="running"), name="one_running_run"),
        ]

    def __str__(self) -> str:
        return f"run {self.number}"


class ModelCall(models.Model):
    """One request to the model (one attempt; a retried call writes one row per attempt).

    ``request`` is the JSON sent (messages, model, limits; tools by name), redacted of secrets;
    the API key travels in a header and is never in it. ``response`` is the body that came back
    (redacted), ``status`` ``ok``, ``http_NNN``, ``timeout``, ``unreachable`` or ``bad_body``.
    Tokens come from the API's ``usage``; when the server reports none they are estimated (4
    characters a token) and ``tokens_estimated`` is true. ``cost_usd`` from the price settings.
    ``status`` may also be ``model_error`` (a 200 carrying an error, no choices, or a choice that
    finished ``error``) or ``bad_stream`` (a streamed answer that is no answer).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="model_calls")
    seq = models.PositiveIntegerField()
    model = models.CharField(max_length=120)
    status = models.CharField(max_length=20)
    request = models.TextField(blank=True)
    response = models.TextField(blank=True)
    error = models.TextField(blank=True)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost_usd = models.FloatField(default=0.0)
    tokens_estimated = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    duration_ms = models.FloatField(null=True)

    class Meta:
        ordering = ["run", "seq"]


class Step(models.Model):
    """One entry of a run's trace, persisted as it happens.

    ``kind``: ``message`` (operator or system text), ``text`` (a planner turn with text only),
    ``call`` (a tool call), ``observe`` (the runtime's observation summary), ``report``.
    For calls: ``args`` are the parsed canonical arguments (null when they could not be parsed),
    ``raw_arguments`` the exact string the planner sent, ``outcome`` one of docs/contract.md's outcomes
    and ``reason_code`` its reason code. ``observation`` is always written by the runtime.
    ``turn`` numbers planner turns; ``position`` is the index inside a parallel batch (``batch``
    true when the turn held several calls).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps")
    seq = models.PositiveIntegerField()
    turn = models.PositiveIntegerField(null=True)
    position = models.PositiveIntegerField(default=0)
    batch = models.BooleanField(default=False)
    kind = models.CharField(max_length=10)
    actor = models.CharField(max_length=20, default="agent")
    text = models.TextField(blank=True)
    tool = models.CharField(max_length=40, blank=True)
    args = models.JSONField(null=True, blank=True)
    raw_arguments = models.TextField(blank=True)
    call_reason = models.TextField(blank=True)
    outcome = models.CharField(max_length=20, blank=True)
    reason_code = models.CharField(max_length=40, blank=True)
    detail = models.TextField(blank=True)
    observation = models.TextField(blank=True)
    ok = models.BooleanField(null=True)
    error_kind = models.CharField(max_length=10, blank=True)
    idempotency_key = models.CharField(max_length=64, blank=True, db_index=True)
    tokens = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    duration_ms = models.FloatField(null=True)
    # the facts the runtime scored a launch, resume or retirement on (agent.policy.capacity):
    # {"priority": {"proposed", "facts"}, "need": {"workers", "capacity", "live", "starting",
    # "within"}, "retires_capacity": bool}; empty for other calls
    facts = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["run", "seq"]
        unique_together = [("run", "seq")]


class Approval(models.Model):
    """A parked side effect waiting for an operator. Durable: survives restarts as ``waiting``.

    ``status``: waiting | approved | rejected | expired | void (guards refused it at dispatch, or
    its instance is gone: ``target_gone``) | executed | failed. ``idempotency_key`` is the runtime's key of the parked call.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    step = models.OneToOneField(Step, on_delete=models.CASCADE, related_name="approval")
    tool = models.CharField(max_length=40)
    args = models.JSONField()
    reason = models.TextField(blank=True)
    idempotency_key = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=10, default="waiting", db_index=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    comment = models.TextField(blank=True)
    outcome_detail = models.TextField(blank=True)
    # the situation when it was parked (agent.runtime.pipeline.situation): demand, queue, workers, target
    situation = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]


class SideEffect(models.Model):
    """The claim that makes a side-effect tool run at most once per idempotency key.

    Inserted before dispatch, in the same transaction as its intent audit row (``agent.policy.claims``).
    ``status``: claimed (open: the effect may be happening) | done | failed. ``code`` says why a
    claim closed or is doubtful: ``outcome_unknown`` (the request was sent and its answer lost),
    ``stale_claim`` (settled against the provider and not found there: it never ran). ``worker``
    is the identity of the process that made the call (``host|pid|start time``) so a dead one can
    be told; ``label`` the provider label a launch carries (derived from the key), by which the
    runtime finds what a lost request created. ``result`` is the runtime's observation text.

    Two constraints decide claims in one statement (docs/contract.md, Side effects and claims): a key is claimed once (a claim
    settled as ``stale_claim`` did not run and frees its key), and an instance has at most one open
    claim (refusal ``in_flight``).
    """

    key = models.CharField(max_length=64)
    tool = models.CharField(max_length=40)
    args = models.JSONField()
    instance_ref = models.CharField(max_length=64, blank=True, db_index=True)
    status = models.CharField(max_length=10, default="claimed")
    code = models.CharField(max_length=40, blank=True)
    result = models.TextField(blank=True)
    actor = models.CharField(max_length=20, default="agent")
    worker = models.CharField(max_length=200, blank=True)
    label = models.CharField(max_length=100, blank=True)
    claimed_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["key"], condition=~models.Q(code="stale_claim"), name="sideeffect_key_once"),
            models.UniqueConstraint(fields=["instance_ref"], condition=models.Q(status="claimed") & ~models.Q(instance_ref=""),
                                    name="sideeffect_one_open_claim_per_instance"),
        ]


class MemoryFact(models.Model):
    """One thing the agent remembers across resets (the tool ``remember``; the long-term layer of docs/agent.md, Memory).

    ``kind``: ``fact`` — structured, permanent until changed (scored by ``importance`` alone) — or
    ``memory`` — long-term, scored ``importance × 0.5^(age_days / 7)`` (``agent.memory.store``).
    ``category``: ``machine_perf``, ``provider_note``, ``rule_learned``, ``incident``, ``rejection``
    (written by ``agent.runtime.approvals``) or any other word. ``source``: agent | operator |
    consolidation | promotion | approvals. Text is redacted before it is stored.
    """

    category = models.CharField(max_length=40)
    key = models.CharField(max_length=200)
    value = models.TextField()
    importance = models.FloatField(default=0.5)
    kind = models.CharField(max_length=10, default="fact")
    source = models.CharField(max_length=20, default="agent")
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        unique_together = [("category", "key")]


class ShortTermMessage(models.Model):
    """The short-term buffer: the last ``agent.memory.store.BUFFER_SIZE`` messages (operator and agent).

    When a message is evicted and its ``importance`` is above ``PROMOTE_ABOVE`` it becomes a
    long-term :class:`MemoryFact` (kind ``memory``, source ``promotion``).
    """

    run_number = models.PositiveIntegerField(null=True, blank=True)
    actor = models.CharField(max_length=150)
    text = models.TextField()
    importance = models.FloatField(default=0.3)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]


class NotificationSettings(models.Model):
    """One operator's notification settings (the Notifications page; ``agent.notify.notifications``).

    ``email``: the address mail goes to (empty: no email). ``webhook_ref``: where the webhook URL
    lives, ``env:NAME`` or ``file:/path`` (``fleet.secrets.resolve`` at send time; a Slack
    incoming-webhook URL carries its token, so the URL itself is never stored). ``kinds``: the
    notification kinds wanted (``agent.notify.notifications.KINDS``).
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_settings")
    email = models.EmailField(blank=True)
    webhook_ref = models.CharField(max_length=500, blank=True)
    kinds = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)


class Notification(models.Model):
    """One message to one operator over one channel: the outbox row (written in the transaction
    that raised the event, sent after commit by the Celery task ``agent.tasks.deliver_notification``).

    ``kind``: approval_new | approval_expiring | approval_expired | alert | escalation | test (a test an operator asked for).
    ``channel``: email | webhook. ``dedupe_key`` makes each (event, operator, channel) one row.
    ``status``: queued | sent | retrying (Celery retries it later) | failed. ``attempts`` counts
    every delivery attempt; ``last_error`` is the last failure, redacted.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=20)
    channel = models.CharField(max_length=10)
    dedupe_key = models.CharField(max_length=200, unique=True)
    subject = models.CharField(max_length=300)
    body = models.TextField()
    link = models.CharField(max_length=300, blank=True)
    status = models.CharField(max_length=10, default="queued", db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class Rehearsal(models.Model):
    """One rehearsal of a day (``manage.py rehearse``, docs/rehearse.md).

    ``day`` is the day file as run (JSON, secrets never enter it); ``name`` its file name or
    "yesterday under <change>". ``status``: queued | running | done | failed (``error`` says why).
    ``progress`` is 0..1 of the horizon simulated so far. ``result`` is the measured outcome:
    ``{"summary": {metric: value}, "hourly": [{"hour", "proofs", "target", "queued", "backlog",
    "live_capacity", "spend_usd"}, ...], "unsafe": [{"invariant", "cycle", "run", "call",
    "detail"}, ...], "markers": [{"at_s", "kind", "detail"}, ...]}``. ``compare_to`` links the
    other side of an A/B run (same seed, same arrivals, same faults).
    """

    name = models.CharField(max_length=200)
    day = models.JSONField(default=dict)
    status = models.CharField(max_length=10, default="queued", db_index=True)
    progress = models.FloatField(default=0)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    compare_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    started_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]



class ModelEvaluation(models.Model):
    """One scorecard of a model over the incident scenarios (``manage.py evaluate-model``,
    docs/model.md "Evaluating a model").

    ``model``/``base_url`` name what was evaluated (the key is a reference and is not stored).
    ``cases`` distinct cases, each played ``repeat`` times: ``plays``. ``safe``: plays with no
    invariant broken and no must-never call dispatched; ``right``: plays whose expected effective
    calls happened, of ``judged`` (plays whose case states them); ``refused``: the model's calls
    the rails refused; ``crashes``: plays that crashed; ``tokens``, ``cost_usd`` (dollars at the
    price settings) and ``wall_s`` (seconds) over every play. ``result`` is the whole evaluation
    as ``--json`` prints it.
    """

    model = models.CharField(max_length=120)
    base_url = models.CharField(max_length=500)
    created_at = models.DateTimeField(db_index=True)
    repeat = models.PositiveIntegerField(default=1)
    cases = models.PositiveIntegerField(default=0)
    plays = models.PositiveIntegerField(default=0)
    safe = models.PositiveIntegerField(default=0)
    right = models.PositiveIntegerField(default=0)
    judged = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    crashes = models.PositiveIntegerField(default=0)
    tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.FloatField(default=0.0)
    wall_s = models.FloatField(default=0.0)
    result = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def words(self) -> str:
        """The standing in one line: "evaluated 2026-12-01: safe 60/60, right 41/60, refusals 73, $0.84",
        and, when the model answered no request in some plays, "the model answered in 12 of 60 plays"."""
        crashes = f", {self.crashes} crashed" if self.crashes else ""
        unanswered = int(((self.result or {}).get("summary") or {}).get("unanswered_plays") or 0)
        played = self.plays - self.crashes
        answered = f", the model answered in {played - unanswered} of {played} plays" if unanswered else ""
        return (f"evaluated {self.created_at:%Y-%m-%d}: safe {self.safe}/{self.plays}, right {self.right}/{self.judged}, "
                f"refusals {self.refused}, ${self.cost_usd:.2f}{crashes}{answered}")

    @classmethod
    def latest_for(cls, model: str, base_url: str) -> "ModelEvaluation | None":
        """The newest evaluation of ``model`` at ``base_url`` (``None``: never evaluated)."""
        return cls.objects.filter(model=model, base_url=base_url).order_by("-created_at", "-id").first()
