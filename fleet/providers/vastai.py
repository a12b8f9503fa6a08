# Over 500 lines on purpose: one provider: calls, status mapping, pacing, adoption share a client.
"""The ``vastai`` provider: rented GPU instances on vast.ai.

Calls go through the official ``vastai`` package (``vastai.api.instances``, ``vastai.api.offers``
and its ``VastClient``, which sends the key as ``Authorization: Bearer``, never in the URL). The
one call it answers without letting us see the body — the v1 instance list — is sent through the
same client to the documented endpoint, ``GET /api/v1/instances/``, page by page (``next_token``
passed back as ``after_token``; at most 25 a page), so an empty, HTML or malformed page is an
error and never "no instances" (docs/safety.md invariant 7).

Facts: vast.ai's own API docs (statuses, per-endpoint rate limits, labels, create errors), as
docs/operations.md "Renting on vast.ai" restates them.

- **Ours**: an instance is ours when its vast ``label`` starts with ``VAST["LABEL_PREFIX"]``
  (``warden-``); only those are listed. Launches carry ``<prefix><label>``.
- **Statuses** (:func:`map_status`): ``actual_status`` in vast's vocabulary, with ``null`` →
  ``created``; a ``status_msg`` of one of the failure classes (:func:`status_class`: image pull,
  container start, NVML) that reports a failure before the instance runs → ``error``; an
  unfamiliar status → ``created`` (pending, as SkyPilot does) with the raw value in the message;
  ``cur_state == next_state == intended_status == "stopped"`` while not asked by us is noted
  as interrupted (dstack: an outbid spot).
- **Errors** (:class:`fleet.providers.base.ProviderError` codes): ``http_429`` (transient,
  retried with exponential backoff: vast sends no Retry-After), ``search_quota`` (the daily
  search quota: not retried), ``auth`` (401, or 404 ``auth_error``/"Session expired": never
  retried), ``http_410`` (a deprecated endpoint), ``empty_body``/``html_body``/``malformed``
  (semantic), ``timeout``/``connection_refused``/``connection_reset`` (transient), otherwise
  vast's ``error`` field (``invalid_args``...). Messages never carry the key: it is only in a
  request header, and every message is redacted.
- **Destroy** answered ``no_such_instance``/``not_found`` is done. **Create** answered with an
  error that still names ``new_contract`` adopts that instance (it exists and bills).
- **Pacing**: at most one request per ``VAST["MIN_INTERVAL_S"]`` per endpoint (per process),
  and tenacity's exponential backoff on 429 (``BACKOFF_S`` doubling up to ``BACKOFF_MAX_S``,
  ``RETRY_429`` attempts in all).
- **Failed machines** (``fleet.machines``) are left out of every offer search.
"""

import json
import math
import re
import threading
import time
from datetime import UTC, datetime

import requests
import tenacity
from django.conf import settings
from vastai.api import instances, offers
from vastai.api.client import VastClient
from vastai.api.query import offers_alias, offers_fields, offers_mult, parse_query

from fleet.machines import excluded_machines
from fleet.providers.base import Provider, ProviderError, ProviderInstance
from fleet.secrets import SecretReferenceError, redact, resolve

#: the classes vast's own self-test gives a ``status_msg``
PULL_FAILURE_RE = re.compile(r"pull|manifest|not found|unauthorized|denied|repository does not exist|no such image", re.I)
START_FAILURE_RE = re.compile(
    r"daemon|container|oci runtime|runc|nvidia-container|docker|exited|exec format error|permission denied|mount|entrypoint",
    re.I,
)
NVML_FAILURE_RE = re.compile(r"nvml|nvidia-smi|driver/library version mismatch|failed to initialize.{0,80}nvidia", re.I)
CLASS_NAMES = {"pull": "image pull failed", "start": "container start failed", "nvml": "NVML failure"}
#: a field name in a vast query string (``gpu_ram>=20``, ``machine_id notin [1,2]``)
QUERY_FIELD_RE = re.compile(r"(?<![\w.])([A-Za-z_]\w{0,40}) {0,4}(?:[<>!=]|(?:not)?in )")
#: words that make a classified message a failure rather than progress ("Pulling image" is progress)
FAILED_RE = re.compile(r"error|fail|denied|unauthori[sz]ed|not found|does not exist|no such|mismatch|unable|invalid", re.I)

#: vast ``actual_status`` values taken as they are (vast.ai's instance docs); others map through _ALIASES
KNOWN_STATUSES = {"created", "loading", "running", "stopped", "frozen", "exited", "rebooting", "unknown", "offline",
                  "scheduling"}
_ALIASES = {"restarting": "rebooting", "starting": "loading", "provisioning": "created", "inactive": "stopped"}
#: vast error fields that mean the instance is already gone (dstack; the OpenAPI spec)
GONE_ERRORS = {"no_such_instance", "not_found"}
PAGE_LIMIT = 25  # the v1 list's most per page
MAX_PAGES = 400  # 10,000 instances: a server that never ends its pages is an error, not a hang


def status_class(msg: str) -> str:
    """The failure class of a vast ``status_msg``: ``pull``, ``nvml``, ``start`` or ``""``.

    Regexes from vast's self-test; NVML is checked before the broader start
    class, pull before both. A class says what the message is about, not that it failed:
    :func:`map_status` also asks for a failure word.
    """
    msg = msg or ""
    if PULL_FAILURE_RE.search(msg):
        return "pull"
    if NVML_FAILURE_RE.search(msg):
        return "nvml"
    if START_FAILURE_RE.search(msg):
        return "start"
    return ""


def map_status(row: dict, label_prefix: str = "") -> tuple[str, str, str, dict]:
    """``(status, intended_status, status_msg, facts)`` for one vast instance row.

    ``status`` is in our vocabulary (vast ``actual_status`` terms plus ``error``); ``facts`` holds
    ``actual_status``, ``cur_state``, ``next_state``, ``status_class`` and ``interrupted``.
    Rules: vast.ai's instance docs, and what SkyPilot's and dstack's vast backends do:

    - ``actual_status`` null → ``created`` (provisioning);
    - ``created`` with "OCI runtime create failed" → ``error`` (dstack);
    - not ``running``, and a pull/start/NVML-class message reporting a failure → ``error``;
    - ``cur_state == next_state == intended_status == "stopped"`` → ``stopped``, interrupted;
    - an unfamiliar status → ``created`` (pending; SkyPilot's default), named in the message.
    """
    raw = row.get("actual_status")
    # a non-string status (a number, a list, an object) is unfamiliar, never a crash
    raw = raw.strip().lower() if isinstance(raw, str) else (None if raw is None else str(raw)[:40])
    intended = str(row.get("intended_status") or "running").strip().lower()
    msg = str(row.get("status_msg") or "").strip()
    cls = status_class(msg)
    cur, nxt = row.get("cur_state"), row.get("next_state")
    facts = {"actual_status": raw, "cur_state": cur, "next_state": nxt, "status_class": cls, "interrupted": False}
    if raw is None or raw == "":
        status = "created"
    elif raw in KNOWN_STATUSES:
        status = raw
    elif raw in _ALIASES:
        status = _ALIASES[raw]
    else:
        status = "created"
        msg = f"vast status {str(raw)[:40]!r} not recognised; treated as pending. {msg}".strip()
    if status != "running" and cls and FAILED_RE.search(msg):
        status = "error"
        msg = f"{CLASS_NAMES[cls]}: {msg}"
    elif status == "created" and "oci runtime create failed" in msg.lower():
        status = "error"
    if cur == nxt == intended == "stopped":
        facts["interrupted"] = True
        status = "stopped" if status not in ("error", "exited") else status
    if status == "exited" and not msg:
        msg = "container exited"
    return status, ("stopped" if intended in ("stopped", "exited") else "running"), msg, facts


def _dt(value) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(value), tz=UTC) if value not in (None, "") else None
    except (TypeError, ValueError, OverflowError):
        return None


#: hours in an average month (8,760 / 12): vast prices storage in $ per GB per month
HOURS_PER_MONTH = 730.0


def storage_dph(row: dict) -> float:
    """What the instance's disk costs per hour, in dollars: ``storage_cost`` ($/GB/month, as the
    ``vastai`` package documents it) × ``disk_space`` (GB) / 730 h. Billed from creation, and the
    only charge while stopped (vast's docs). 0.0 when either field is missing or not a number."""
    try:
        value = float(row.get("storage_cost") or 0.0) * float(row.get("disk_space") or 0.0) / HOURS_PER_MONTH
    except (TypeError, ValueError):
        return 0.0
    return value if value > 0 and value != float("inf") else 0.0


def to_instance(row: dict) -> ProviderInstance:
    """A vast instance row (v1 list or v0 show) as a :class:`ProviderInstance`.

    Raises ProviderError ``malformed`` when the row has no integer ``id``, or a ``dph_total`` that
    is NaN, infinite or negative (a price no cap could be checked against).
    """
    if not isinstance(row, dict) or not isinstance(row.get("id"), int) or isinstance(row.get("id"), bool):
        raise ProviderError(f"vast: an instance row without an integer id: {redact(str(row))[:200]}",
                            kind="semantic", code="malformed")
    status, intended, msg, facts = map_status(row)
    try:
        ssh_port = int(row["ssh_port"]) if row.get("ssh_port") not in (None, "") else None
    except (TypeError, ValueError, OverflowError):
        ssh_port = None
    if ssh_port is not None and not 0 < ssh_port < 65536:  # not a port (and past the column's range)
        ssh_port = None
    try:
        dph = float(row.get("dph_total") or 0.0)
    except (TypeError, ValueError):
        dph = 0.0
    if not math.isfinite(dph) or dph < 0:  # NaN compares false with every cap: the budget guard would never see it
        raise ProviderError(f"vast: instance {row['id']} has a bad dph_total {redact(str(row.get('dph_total')))[:40]!r} "
                            "(not a finite price ≥ 0)", kind="semantic", code="malformed")
    label = str(row.get("label") or "").strip()
    return ProviderInstance(
        storage_dph=storage_dph(row),
        external_id=str(row["id"]),
        status=status,
        intended_status=intended,
        status_msg=msg,
        gpu_name=str(row.get("gpu_name") or "").strip(),
        dph=dph,
        label=label,
        ssh_host=str(row.get("ssh_host") or "").strip(),
        ssh_port=ssh_port,
        worker_name=label or str(row["id"]),
        started_at=_dt(row.get("start_date")),
        extra={
            **facts,
            "machine_id": "" if row.get("machine_id") is None else str(row["machine_id"]),
            "host_id": "" if row.get("host_id") is None else str(row["host_id"]),
            "num_gpus": row.get("num_gpus"),
            "public_ipaddr": row.get("public_ipaddr") or "",
        },
    )


def to_offer(o: dict) -> dict:
    """A vast offer as the fleet's offer dict: ``id`` (int), ``gpu_name``, ``num_gpus``, ``dph``
    ($/hr, vast ``dph_total``), ``gpu_ram_gb`` (vast answers MB), ``reliability``, ``cuda``,
    ``disk_gb``, ``machine_id``, ``host_id``, ``geolocation``, ``verified``."""
    def num(key, scale=1.0):
        try:
            return round(float(o[key]) / scale, 4) if o.get(key) is not None else None
        except (TypeError, ValueError):
            return None

    return {
        "id": o.get("id"),
        "gpu_name": str(o.get("gpu_name") or ""),
        "num_gpus": o.get("num_gpus"),
        "dph": num("dph_total") or 0.0,
        "gpu_ram_gb": num("gpu_ram", 1000.0),
        "reliability": num("reliability") if o.get("reliability") is not None else num("reliability2"),
        "cuda": num("cuda_max_good"),
        "disk_gb": num("disk_space"),
        "machine_id": "" if o.get("machine_id") is None else str(o["machine_id"]),
        "host_id": "" if o.get("host_id") is None else str(o["host_id"]),
        "geolocation": str(o.get("geolocation") or ""),
        "verified": o.get("verified"),
    }


class Pacer:
    """At most one request per ``interval`` seconds per endpoint (vast limits each endpoint on its
    own, as a least interval between requests: docs/operations.md). Thread-safe; per process."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}

    def wait(self, endpoint: str, interval: float) -> float:
        """Sleep until ``endpoint`` may be called again; returns the seconds slept."""
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next.get(endpoint, 0.0))
            self._next[endpoint] = at + max(0.0, interval)
        delay = at - now
        if delay > 0:
            time.sleep(delay)
        return delay

    def reset(self) -> None:
        with self._lock:
            self._next.clear()


PACER = Pacer()


def _error_field(body) -> str:
    if isinstance(body, dict):
        for key in ("error", "detail", "msg", "message"):
            if isinstance(body.get(key), str) and body[key]:
                return body[key]
    return ""


def _body_json(resp: requests.Response):
    try:
        return resp.json()
    except ValueError:
        return None


def _snippet(resp: requests.Response) -> str:
    text = (resp.text or "").strip().replace("\n", " ")
    return redact(text)[:200] or "(empty body)"


def http_error(what: str, resp: requests.Response) -> ProviderError:
    """The :class:`ProviderError` for vast's HTTP error answer ``resp`` to ``what`` (see the module
    docstring for the codes)."""
    code = resp.status_code
    body = _body_json(resp)
    err = _error_field(body)
    text = f"vast {what}: HTTP {code}: {_snippet(resp)}"
    if code == 429:
        if err == "search_quota_exceeded":
            return ProviderError(text + "; the daily search quota resets at 00:00 UTC", kind="permanent", code="search_quota")
        return ProviderError(text, kind="transient", code="http_429")
    if code == 401 or err == "auth_error" or (code == 404 and "session expired" in (resp.text or "").lower()):
        return ProviderError(text + "; check the key WARDEN_VAST_API_KEY_ENV/_FILE names", kind="permanent", code="auth")
    if code == 410:
        return ProviderError(text, kind="permanent", code="http_410")
    if code >= 500:
        return ProviderError(text, kind="transient", code=f"http_{code}")
    return ProviderError(text, kind="permanent", code=err if err and len(err) <= 40 and " " not in err else f"http_{code}")


def parse_json(what: str, resp: requests.Response) -> dict:
    """The JSON object of a 2xx answer; raises ProviderError ``empty_body``, ``html_body`` or
    ``malformed`` (semantic) for anything else."""
    text = (resp.text or "").strip()
    if not text:
        return _raise(ProviderError(f"vast {what}: HTTP {resp.status_code} with an empty body", kind="semantic",
                                    code="empty_body"))
    ctype = resp.headers.get("Content-Type", "")
    if "html" in ctype.lower() or text[:1] == "<":
        return _raise(ProviderError(f"vast {what}: an HTML page instead of JSON: {_snippet(resp)}", kind="semantic",
                                    code="html_body"))
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return _raise(ProviderError(f"vast {what}: not a JSON object: {_snippet(resp)}", kind="semantic", code="malformed"))
    return body


def _raise(exc: Exception):
    raise exc


def settings_view() -> dict:
    """The vast settings as an operator may see them (the settings page): the key by its
    reference (``env:NAME`` / ``file:/path``) and whether it resolves — never its value."""
    cfg, warden = settings.VAST, settings.WARDEN
    ref = f"file:{cfg['API_KEY_FILE']}" if cfg.get("API_KEY_FILE") else (f"env:{cfg['API_KEY_ENV']}" if cfg.get("API_KEY_ENV") else "")
    try:
        resolved = bool(ref) and bool(resolve(ref))
    except SecretReferenceError:
        resolved = False
    return {
        "url": cfg["URL"], "key_ref": ref or "(none)", "key_resolves": resolved, "image": cfg.get("IMAGE") or "",
        "disk_gb": cfg.get("DISK_GB"), "env_set": bool(cfg.get("ENV")), "offer_query": cfg.get("OFFER_QUERY") or "",
        "offer_type": cfg.get("OFFER_TYPE"), "label_prefix": cfg.get("LABEL_PREFIX"), "min_interval_s": cfg.get("MIN_INTERVAL_S"),
        "retry_429": cfg.get("RETRY_429"), "backoff_s": cfg.get("BACKOFF_S"), "backoff_max_s": cfg.get("BACKOFF_MAX_S"),
        "orphans": warden.get("ORPHANS", "adopt"), "vanish_grace_min": warden.get("VANISH_GRACE_MIN", 10),
    }


class VastProvider(Provider):
    """Instances rented on vast.ai (``WARDEN_PROVIDER=vastai``); configuration: ``settings.VAST``.

    Every call raises :class:`ProviderError` on failure (codes in the module docstring).
    """

    name = "vastai"

    def __init__(self, config: dict | None = None):
        self._config = config

    @property
    def cfg(self) -> dict:
        return self._config or settings.VAST

    # --- transport ---------------------------------------------------------------------------
    def _key(self) -> str:
        cfg = self.cfg
        ref = f"file:{cfg['API_KEY_FILE']}" if cfg.get("API_KEY_FILE") else (
            f"env:{cfg['API_KEY_ENV']}" if cfg.get("API_KEY_ENV") else "")
        if not ref:
            raise ProviderError("vast: no API key reference; set WARDEN_VAST_API_KEY_ENV (the NAME of the variable "
                                "holding the key) or WARDEN_VAST_API_KEY_FILE", kind="permanent", code="config")
        try:
            return resolve(ref)
        except SecretReferenceError as exc:
            raise ProviderError(f"vast: {exc}", kind="permanent", code="config") from None

    def _client(self):
        # retry=1: one attempt per call; pacing and the 429 backoff are ours (the package's 0.15 s
        # ×1.5 is far too short for a fleet manager: docs/operations.md)
        return VastClient(api_key=self._key(), server_url=self.cfg["URL"], retry=1,
                          timeout=float(self.cfg.get("TIMEOUT_S", 30)))

    def _call(self, endpoint: str, fn):
        """Run ``fn(client)`` paced per ``endpoint``, backing off exponentially on 429; package
        and transport exceptions become :class:`ProviderError`."""
        cfg = self.cfg
        client = self._client()

        def once():
            PACER.wait(endpoint, float(cfg.get("MIN_INTERVAL_S", 1.0)))
            try:
                return fn(client)
            except ProviderError:
                raise
            except requests.HTTPError as exc:
                if exc.response is None:
                    raise ProviderError(f"vast {endpoint}: {redact(str(exc))[:200]}", kind="transient", code="http") from None
                raise http_error(endpoint, exc.response) from None
            except requests.Timeout:
                raise ProviderError(f"vast {endpoint}: timed out after {cfg.get('TIMEOUT_S', 30):g} s", kind="transient",
                                    code="timeout") from None
            except requests.ConnectionError as exc:
                refused = "refused" in str(exc).lower() or "NewConnectionError" in repr(exc)
                raise ProviderError(f"vast {endpoint}: cannot connect to {cfg['URL']}" if refused
                                    else f"vast {endpoint}: connection lost", kind="transient",
                                    code="connection_refused" if refused else "connection_reset") from None
            except requests.RequestException as exc:
                raise ProviderError(f"vast {endpoint}: {type(exc).__name__}", kind="transient", code="http") from None
            except (ValueError, KeyError, TypeError, AttributeError) as exc:  # the package reading a bad body
                raise ProviderError(f"vast {endpoint}: malformed answer ({type(exc).__name__})", kind="semantic",
                                    code="malformed") from None

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, ProviderError) and e.code == "http_429"),
            wait=tenacity.wait_exponential(multiplier=float(cfg.get("BACKOFF_S", 2.0)),
                                           max=float(cfg.get("BACKOFF_MAX_S", 60.0))),
            stop=tenacity.stop_after_attempt(int(cfg.get("RETRY_429", 5))),
            reraise=True,
        )
        return retrying(once)

    @staticmethod
    def _ok(what: str, body) -> dict:
        """A 2xx answer that still says ``success: false`` is an error named by vast's ``error``."""
        if not isinstance(body, dict):
            raise ProviderError(f"vast {what}: not a JSON object", kind="semantic", code="malformed")
        if body.get("success") is False:
            err = _error_field(body) or "failed"
            raise ProviderError(f"vast {what}: {redact(err)[:60]}: {redact(str(body.get('msg') or ''))[:200]}",
                                kind="permanent", code=err if len(err) <= 40 and " " not in err else "failed")
        return body

    # --- reads -------------------------------------------------------------------------------
    def _pages(self, select_filters: dict) -> list[dict]:
        """Every row of ``GET /api/v1/instances/`` for ``select_filters``, every page. Raises
        ProviderError ``malformed`` for a bad or repeated ``next_token``, a page repeating an
        instance of an earlier one, or more than :data:`MAX_PAGES` pages."""
        rows, token, seen, seen_ids = [], None, set(), set()
        for _ in range(MAX_PAGES):
            params = {"select_filters": select_filters, "order_by": [{"col": "id", "dir": "asc"}], "limit": PAGE_LIMIT}
            if token:
                params["after_token"] = token

            def page(client, params=params):
                resp = client.get("/api/v1/instances/", query_args=params)
                if resp.status_code >= 400:
                    raise http_error("list", resp)
                return parse_json("list", resp)

            body = self._call("GET /api/v1/instances/", page)
            if not isinstance(body.get("instances"), list):
                raise ProviderError(f"vast list: the answer has no 'instances' list (keys: {sorted(body)[:8]})",
                                    kind="semantic", code="malformed")
            ids = [r["id"] for r in body["instances"] if isinstance(r, dict) and isinstance(r.get("id"), int)]
            if seen_ids.intersection(ids):  # keyset pages never overlap: a server paging in circles
                raise ProviderError(f"vast list: page {len(seen) + 2} repeats instances of an earlier page",
                                    kind="semantic", code="malformed")
            seen_ids.update(ids)
            rows.extend(body["instances"])
            token = body.get("next_token")
            if not token:
                return rows
            if not isinstance(token, str) or token in seen:
                raise ProviderError("vast list: a bad or repeated next_token", kind="semantic", code="malformed")
            seen.add(token)
        raise ProviderError(f"vast list: more than {MAX_PAGES} pages", kind="semantic", code="malformed")

    def _ours(self, label: str) -> bool:
        return bool(label) and label.startswith(self.cfg.get("LABEL_PREFIX") or "warden-")

    def vast_label(self, label: str) -> str:
        """The vast label a launch carries: ``label``, prefixed with ``LABEL_PREFIX`` unless it
        already starts with it (≤ 1,024 chars)."""
        prefix = self.cfg.get("LABEL_PREFIX") or "warden-"
        return (label if label.startswith(prefix) else prefix + label)[:1024]

    def list_instances(self) -> list[ProviderInstance]:
        """Every instance labelled ours (all v1 pages). Raises ProviderError: an empty, HTML or
        malformed page, a 410 and a failed request are errors, never "no instances"."""
        return [to_instance(r) for r in self._pages({}) if isinstance(r, dict) and self._ours(str(r.get("label") or ""))]

    def find_by_label(self, label: str) -> list[ProviderInstance]:
        """Instances whose vast label is :meth:`vast_label` of ``label`` (server-side filter)."""
        if not label:
            return []
        return [to_instance(r) for r in self._pages({"label": {"eq": self.vast_label(label)}})]

    def show(self, external_id: str) -> ProviderInstance:
        """One instance (``GET /api/v0/instances/{id}/``). Raises ProviderError ``not_found``."""
        iid = self._id(external_id)

        row = self._call("GET /api/v0/instances/{id}/", lambda c: instances.show_instance(c, iid))
        if row is None:
            raise ProviderError(f"vast: no instance {external_id}", kind="permanent", code="not_found")
        return to_instance(row)

    @staticmethod
    def _id(external_id) -> int:
        try:
            return int(str(external_id))
        except ValueError:
            # not "not_found": destroy counts that as done, and nothing was sent (an owned host's name routed here)
            raise ProviderError(f"vast: {redact(str(external_id))[:40]!r} is not a vast instance id", kind="permanent",
                                code="invalid_id") from None

    def offer_query(self, *, gpu_name: str = "", max_dph: float | None = None, min_gpu_ram_gb: float | None = None,
                    min_reliability: float | None = None, min_cuda: float | None = None,
                    min_disk_gb: float | None = None) -> dict:
        """The search body: ``VAST["OFFER_QUERY"]`` (vast query syntax; its defaults: verified,
        rentable, not external) with the given filters on top (server units: GPU RAM in MB) and
        the failed machines excluded. Raises ProviderError ``config`` for a bad default query."""
        text = self.cfg.get("OFFER_QUERY") or ""
        for name in QUERY_FIELD_RE.findall(text):  # a misspelt field would be dropped silently by the package
            if name not in offers_fields and name not in offers_alias:
                raise ProviderError(f"vast: WARDEN_VAST_OFFER_QUERY names an unknown field {name!r}; use the fields of "
                                    "`vastai search offers --help`", kind="permanent", code="config")
        base = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True}, "rented": {"eq": False}}
        try:
            query = parse_query(text, base, offers_fields, offers_alias, offers_mult) if text else base
        except (ValueError, SyntaxError, TypeError, KeyError, IndexError) as exc:
            raise ProviderError(f"vast: WARDEN_VAST_OFFER_QUERY is not a vast query ({exc}); e.g. "
                                "'num_gpus=1 reliability>=0.98 cuda_vers>=12.0'", kind="permanent", code="config") from None
        if gpu_name:
            query["gpu_name"] = {"eq": gpu_name.replace("_", " ")}
        if max_dph is not None:
            query["dph_total"] = {"lte": float(max_dph)}
        if min_gpu_ram_gb is not None:
            query["gpu_ram"] = {"gte": float(min_gpu_ram_gb) * 1000}
        if min_reliability is not None:
            query["reliability"] = {"gte": float(min_reliability)}
        if min_cuda is not None:
            query["cuda_max_good"] = {"gte": float(min_cuda)}
        if min_disk_gb is not None:
            query["disk_space"] = {"gte": float(min_disk_gb)}
        excluded = self._excluded()
        if excluded:
            query["machine_id"] = {"notin": sorted(int(m) if m.isdigit() else m for m in excluded)}
        return query

    def _excluded(self) -> set[str]:
        return excluded_machines(self.name)

    def search_offers(self, *, gpu_name: str = "", max_dph: float | None = None, limit: int = 10,
                      min_gpu_ram_gb: float | None = None, min_reliability: float | None = None,
                      min_cuda: float | None = None, min_disk_gb: float | None = None) -> list[dict]:
        """Offers matching the default filter and the given ones, cheapest first (``POST
        /api/v0/bundles/``), as :func:`to_offer` dicts; offers on failed machines are dropped
        (also here, whatever the server did with the filter)."""
        query = self.offer_query(gpu_name=gpu_name, max_dph=max_dph, min_gpu_ram_gb=min_gpu_ram_gb,
                                 min_reliability=min_reliability, min_cuda=min_cuda, min_disk_gb=min_disk_gb)
        found = self._call("POST /api/v0/bundles/", lambda c: offers.search_offers(
            c, query=query, offer_type=self.cfg.get("OFFER_TYPE", "on-demand"), order=[["dph_total", "asc"]],
            limit=max(1, int(limit or 10)), storage=float(self.cfg.get("DISK_GB", 40)), no_default=True))
        if not isinstance(found, list):
            raise ProviderError("vast search: 'offers' is not a list", kind="semantic", code="malformed")
        excluded = self._excluded()
        out = [to_offer(o) for o in found if isinstance(o, dict) and str(o.get("machine_id")) not in excluded]
        out.sort(key=lambda o: o["dph"])
        return out[: max(0, int(limit or 10))]

    # --- changes -----------------------------------------------------------------------------
    def launch(self, *, gpu_name: str = "", offer_id: str = "", label: str = "") -> ProviderInstance:
        """Create an instance from ``offer_id`` (else the cheapest offer of ``gpu_name``) with the
        configured image, disk, env (plus ``CURIO_NODE_NAME=<label>`` unless the env sets it: the
        Curio node name Warden maps the instance by) and onstart, labelled :meth:`vast_label` (``PUT
        /api/v0/asks/{offer}/``). An error answer naming ``new_contract`` adopts that instance
        (its message says so). Raises ProviderError (``config`` without an image, ``not_found``
        without an offer)."""
        cfg = self.cfg
        if not cfg.get("IMAGE"):
            raise ProviderError("vast: no image to run; set WARDEN_VAST_IMAGE", kind="permanent", code="config")
        if not offer_id:
            offers = self.search_offers(gpu_name=gpu_name, limit=5)
            if not offers:
                raise ProviderError(f"vast: no offer matches gpu_name={gpu_name!r} and WARDEN_VAST_OFFER_QUERY",
                                    kind="permanent", code="not_found")
            offer_id = str(offers[0]["id"])
        oid = self._id(offer_id)
        vlabel = self.vast_label(label or "warden")
        env = cfg.get("ENV") or ""
        if "CURIO_NODE_NAME=" not in env:  # the worker registers under the name Warden maps it by
            env = f"{env} -e CURIO_NODE_NAME={vlabel}".strip()

        def create(client):
            try:
                return instances.create_instance(client, oid, image=cfg["IMAGE"], disk=float(cfg.get("DISK_GB", 40)),
                                                 env=env or None, label=vlabel, onstart_cmd=cfg.get("ONSTART") or None,
                                                 ssh=True, direct=True)
            except requests.HTTPError as exc:
                body = _body_json(exc.response) if exc.response is not None else None
                if isinstance(body, dict) and body.get("new_contract"):
                    return body  # an error that still created an instance: adopted below
                raise

        body = self._call("PUT /api/v0/asks/{id}/", create)
        contract = body.get("new_contract") if isinstance(body, dict) else None
        if not isinstance(contract, int) or isinstance(contract, bool):
            if isinstance(body, dict) and body.get("success") is False:
                self._ok("create", body)
            raise ProviderError(f"vast create: the answer names no new_contract: {redact(str(body))[:200]}",
                                kind="semantic", code="malformed")
        note = ""
        if body.get("success") is not True:
            note = (f"create answered {redact(_error_field(body) or 'an error')[:60]!s} but named contract {contract}: "
                    "adopted (it exists and bills)")
        try:
            pi = self.show(str(contract))
        except ProviderError:
            pi = ProviderInstance(external_id=str(contract), status="created", label=vlabel, worker_name=vlabel,
                                  gpu_name=gpu_name)
        pi.label = pi.label or vlabel
        if note:
            pi.status_msg = f"{note}. {pi.status_msg}".strip()
            pi.extra["adopted_from_error"] = True
        return pi

    def _change(self, endpoint: str, fn) -> dict:
        return self._ok(endpoint, self._call(endpoint, fn))

    def stop(self, external_id: str) -> None:
        """``PUT /api/v0/instances/{id}/ {"state": "stopped"}`` (the disk is kept and billed)."""
        iid = self._id(external_id)
        self._change("PUT /api/v0/instances/{id}/", lambda c: instances.stop_instance(c, iid))

    def resume(self, external_id: str) -> None:
        """``PUT /api/v0/instances/{id}/ {"state": "running"}``."""
        iid = self._id(external_id)
        self._change("PUT /api/v0/instances/{id}/", lambda c: instances.start_instance(c, iid))

    def reboot(self, external_id: str) -> None:
        """``PUT /api/v0/instances/reboot/{id}/``."""
        iid = self._id(external_id)
        self._change("PUT /api/v0/instances/reboot/{id}/", lambda c: instances.reboot_instance(c, iid))

    def destroy(self, external_id: str) -> None:
        """``DELETE /api/v0/instances/{id}/``; ``no_such_instance``/``not_found`` counts as done."""
        iid = self._id(external_id)
        try:
            self._change("DELETE /api/v0/instances/{id}/", lambda c: instances.destroy_instance(c, iid))
        except ProviderError as exc:
            if exc.code in GONE_ERRORS:
                return
            raise
