"""The ``http`` demand source: a JSON endpoint that returns the demand fields (docs/operations.md, The http demand source).

``GET WARDEN_DEMAND_URL`` (optional ``Authorization: Bearer <token>``, the token a reference:
``WARDEN_DEMAND_TOKEN_ENV`` names a variable, ``WARDEN_DEMAND_TOKEN_FILE`` a file; resolved for
each read, never stored or shown) must answer 200 with a JSON object::

    {"queued": 12,            # required: proving tasks waiting for a worker
     "running": 3,            # required: proving tasks a live worker owns
     "backlog": 0,            # work waiting upstream with no queue entry yet (counted as demand)
     "proof_s": 240.5,        # measured median seconds per proof per worker (sizing uses it)
     "proof_s_by_gpu": {"RTX 4090": 240.5},   # the same per GPU model
     "proofs_hr": 40,         # proofs completed over the window below
     "rate_window_s": 900,    # that window, seconds
     "oldest_queued_s": 600,
     "taken_at": "2026-12-01T01:00:00Z",   # when measured; older or further ahead than 2 observe intervals: stale
     "workers": [{"name": "rig-1", "live": true, "unschedulable": false, "owned_tasks": 1}]}

``workers`` (each ``name`` is an instance's worker name, its Curio ``machine_name``) gives the
worker counts, computed against our instances as the ``curio`` source does; without it they are
unknown (None, named in ``unreadable``), and no guard lets a scale-down pass on unknown counts.

A timeout, a refused connection, a status other than 200, a body that is not JSON, or a field
missing or of the wrong type is ``unknown`` with the reason (never zero: docs/safety.md invariant 7).
"""

import time
from datetime import UTC, datetime
from typing import Annotated

import httpx
from django.conf import settings
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleet.clock import clock
from fleet.demand.base import DemandError, DemandReading, WorkerView, count_workers
from fleet.secrets import SecretReferenceError, redact, resolve

#: the most of a body read (a demand answer is a few hundred bytes)
MAX_BODY = 1_000_000
#: the largest count taken (the demand sample's integer columns hold up to 2**31 - 1)
MAX_COUNT = 2**31 - 1
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
#: a measured duration or rate: finite and not negative (JSON ``NaN`` cannot be stored)
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class WorkerBody(BaseModel):
    """One worker as the endpoint reports it."""

    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=100)
    live: bool
    unschedulable: bool = False
    owned_tasks: Count = 0


class DemandBody(BaseModel):
    """The endpoint's answer (module docstring); unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore")
    queued: Count
    running: Count
    backlog: Count | None = None
    proof_s: Seconds | None = None
    proof_s_by_gpu: dict[str, Seconds] | None = None
    proofs_hr: float | None = Field(None, ge=0, allow_inf_nan=False)
    rate_window_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    oldest_queued_s: float | None = Field(None, ge=0, allow_inf_nan=False)
    taken_at: datetime | None = None
    workers: list[WorkerBody] | None = None


def token_ref() -> str:
    """The bearer token's reference (``env:NAME`` / ``file:/path``), or "" for none."""
    w = settings.WARDEN
    if w.get("DEMAND_TOKEN_ENV"):
        return f"env:{w['DEMAND_TOKEN_ENV']}"
    if w.get("DEMAND_TOKEN_FILE"):
        return f"file:{w['DEMAND_TOKEN_FILE']}"
    return ""


class HTTPDemandSource:
    """Reads demand from ``url`` (default WARDEN_DEMAND_URL) within ``timeout_s`` seconds (default
    WARDEN_DEMAND_TIMEOUT_S, for the connect and each read, and for the whole body: an answer dripped
    slowly times out too). ``read`` raises :class:`DemandError` with the
    reason for every failure in the module docstring."""

    kind = "http"

    def __init__(self, url: str | None = None, timeout_s: float | None = None):
        self.url = url if url is not None else settings.WARDEN.get("DEMAND_URL", "")
        self.timeout_s = timeout_s if timeout_s is not None else settings.WARDEN.get("DEMAND_TIMEOUT_S", 5.0)

    def fetch(self) -> DemandBody:
        """GET the endpoint and validate its body; raises :class:`DemandError`."""
        if not self.url:
            raise DemandError("http demand source: WARDEN_DEMAND_URL is not set")
        headers = {"Accept": "application/json"}
        ref = token_ref()
        if ref:
            try:
                headers["Authorization"] = f"Bearer {resolve(ref)}"
            except SecretReferenceError as exc:
                raise DemandError(f"http demand source: {exc}") from None
        where = redact(self.url)
        # httpx's timeout bounds each read; a body dripped a byte at a time is bounded here, as a whole
        deadline = time.monotonic() + self.timeout_s
        try:
            with httpx.Client(timeout=self.timeout_s, follow_redirects=False) as client:
                with client.stream("GET", self.url, headers=headers) as resp:
                    body = b""
                    for chunk in resp.iter_bytes():
                        body += chunk
                        if len(body) > MAX_BODY:
                            raise DemandError(f"demand endpoint {where}: body larger than {MAX_BODY} bytes")
                        if time.monotonic() > deadline:
                            raise httpx.ReadTimeout("the body took too long")
        except httpx.TimeoutException:
            raise DemandError(f"demand endpoint {where}: timed out after {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise DemandError(f"demand endpoint {where}: {type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise DemandError(f"demand endpoint {where}: HTTP {resp.status_code} {redact(body[:120].decode(errors='replace'))!r}")
        if not body.strip():
            raise DemandError(f"demand endpoint {where}: empty body")
        try:
            return DemandBody.model_validate_json(body)
        except ValidationError as exc:
            err = exc.errors()[0]
            if err["type"] == "json_invalid":
                return self._bad(where, f"not JSON ({body[:60].decode(errors='replace')!r}…)")
            field = ".".join(str(x) for x in err["loc"]) or "the body"
            return self._bad(where, f"{field}: {err['msg']}")

    @staticmethod
    def _bad(where: str, why: str):
        raise DemandError(f"demand endpoint {where}: bad body: {redact(why)}")

    def read(self, instances) -> DemandReading:
        """Read demand for our non-killed ``instances`` (``fleet.models.Instance`` rows)."""
        b = self.fetch()
        now = clock.now()
        state, error = "ok", ""
        if b.taken_at is not None:
            taken = b.taken_at if b.taken_at.tzinfo else b.taken_at.replace(tzinfo=UTC)
            age = (now - taken).total_seconds()
            limit = 2 * settings.WARDEN["OBSERVE_INTERVAL_S"]
            if age > limit:
                state, error = "stale", f"the endpoint's reading is {age:.0f} s old (limit {limit} s)"
            elif -age > limit:
                # a frozen endpoint stamping a future time would otherwise never go stale
                state, error = "stale", (f"the endpoint's reading is dated {-age:.0f} s in the future (limit {limit} s): "
                                         "its clock or its taken_at is wrong")
        unreadable: dict[str, str] = {}
        counts = _workers(instances, b.workers, now)
        if b.workers is None:
            for f in ("workers_live", "workers_dead", "workers_cordoned"):
                unreadable[f] = "the demand endpoint sent no workers"
        return DemandReading(
            state=state, error=error, queued=b.queued, running=b.running, backlog=b.backlog, proof_s=b.proof_s,
            proof_s_by_gpu=b.proof_s_by_gpu, proofs_hr=b.proofs_hr, oldest_queued_s=b.oldest_queued_s, taken_at=now,
            unreadable=unreadable, rate_window_s=b.rate_window_s, **counts,
        )


def _workers(instances, workers: list[WorkerBody] | None, now) -> dict:
    """Worker fields of the reading against our instances, counted by
    :func:`fleet.demand.base.count_workers` (the rule every source uses). Without ``workers`` only
    ``workers_expected`` and ``workers_starting`` are known; the rest are None."""
    views = {w.name: WorkerView(name=w.name, live=w.live, unschedulable=w.unschedulable, owned_tasks=w.owned_tasks)
             for w in workers or []}
    c = count_workers(instances, views, now=now)
    if workers is None:
        return {"workers_expected": c.expected, "workers_starting": c.starting, "workers_live": None, "workers_dead": None,
                "workers_cordoned": None, "workers": {}, "unmatched": None}
    ours = {i.worker_name or i.external_id for i in instances if getattr(i, "killed_at", None) is None}
    unmatched = [{"machine_id": None, "host_and_port": "", "name": w.name, "live": w.live, "cordoned": w.unschedulable,
                  "owned_tasks": w.owned_tasks} for w in workers if w.name not in ours]
    return {**c.fields(), "workers": views, "unmatched": unmatched}
