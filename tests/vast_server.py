"""A local vast.ai API server for the tests: the REST shapes of vast.ai's API docs on a
loopback port (a stand-in for an external service, driven through the real ``vastai`` package).

Routes (answers as vast gives them):

- ``GET /api/v1/instances/`` — keyset pages (``limit`` ≤ 25, ``limit ≤ 0`` means 5), filtered by
  ``select_filters`` on ``label`` (``eq``/``in``), ``id`` and ``actual_status``; ``next_token``
  (null at the end) is passed back as ``after_token``; a bad token answers 400;
- ``GET /api/v0/instances/`` — the deprecated list: HTTP 410 ``deprecated_endpoint``;
- ``GET /api/v0/instances/{id}/`` — ``{"instances": row}`` (``null`` when unknown);
- ``PUT /api/v0/asks/{offer}/`` — create: ``{"success": true, "new_contract": id}``;
- ``PUT /api/v0/instances/{id}/`` — ``{"state": "running"|"stopped"}`` or ``{"label": …}``;
- ``PUT /api/v0/instances/reboot/{id}/``;
- ``DELETE /api/v0/instances/{id}/`` — an unknown id answers 404 ``no_such_instance``;
- ``POST /api/v0/bundles/`` — offers filtered by the query (``eq``, ``lte``, ``gte``, ``gt``,
  ``notin`` on the offer's fields), cheapest first, ``limit``.

Every request needs ``Authorization: Bearer <key>`` (else 401 ``auth_error``). :meth:`VastServer.fault`
queues an answer for the next requests to a route: ``"429"`` (plain text ``API requests too
frequent``), ``"empty"`` (200, no body), ``"html"`` (200, a Cloudflare-like page), ``"malformed"``
(200, JSON without ``instances``), ``"blank"`` (200, a well-formed page listing nothing), ``"410"`` (the deprecated answer), ``"new_contract_error"``
(create: the instance is made, stopped, and the answer is a 400 error naming it), ``"slow"`` (create: the
instance is made, the answer sent after ``slow_s`` seconds), ``"500"``, ``"echo_key"`` (502 echoing the Authorization header), ``"echo_key_late"`` (the bare key 170 characters in); route
``list_next`` faults only the pages after the first (and also takes ``"repeat"``: page one again
under a fresh token, a server paging in circles).
``requests`` records ``(method, path, query string, headers)`` of every request.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

TEXT_429 = "API requests too frequent endpoint threshold=2.0"
HTML = "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body>cloudflare</body></html>"

DEFAULT_OFFERS = [
    {"id": 5001, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.42, "gpu_ram": 24564, "reliability": 0.995,
     "cuda_max_good": 12.4, "disk_space": 200.0, "machine_id": 701, "host_id": 91, "geolocation": "Norway, NO",
     "verified": True, "rentable": True},
    {"id": 5002, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.38, "gpu_ram": 24564, "reliability": 0.991,
     "cuda_max_good": 12.2, "disk_space": 100.0, "machine_id": 702, "host_id": 92, "geolocation": "Texas, US",
     "verified": True, "rentable": True},
    {"id": 5003, "gpu_name": "H100 SXM", "num_gpus": 1, "dph_total": 2.10, "gpu_ram": 81559, "reliability": 0.999,
     "cuda_max_good": 12.6, "disk_space": 500.0, "machine_id": 703, "host_id": 93, "geolocation": "Quebec, CA",
     "verified": True, "rentable": True},
    {"id": 5004, "gpu_name": "RTX 3090", "num_gpus": 1, "dph_total": 0.15, "gpu_ram": 24576, "reliability": 0.93,
     "cuda_max_good": 11.8, "disk_space": 30.0, "machine_id": 704, "host_id": 94, "geolocation": "Spain, ES",
     "verified": True, "rentable": True},
]

_OPS = {
    "eq": lambda a, b: a == b, "neq": lambda a, b: a != b, "lte": lambda a, b: a is not None and a <= b,
    "lt": lambda a, b: a is not None and a < b, "gte": lambda a, b: a is not None and a >= b,
    "gt": lambda a, b: a is not None and a > b, "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
}


def _coerce(value, like):
    if isinstance(like, bool) or like is None:
        return value
    if isinstance(like, int | float) and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


class VastServer:
    """The server and its state: ``instances`` (id → row), ``offers``, ``faults`` (route → answers
    queued), ``requests``. ``ssh`` = ``(host, port)`` is given to every created instance;
    ``boot_status`` is a new instance's ``actual_status``."""

    def __init__(self, api_key: str):
        self.api_key = api_key
        self.instances: dict[int, dict] = {}
        self.offers = [dict(o) for o in DEFAULT_OFFERS]
        self.faults: dict[str, list[str]] = {}
        self.requests: list[tuple[str, str, str, dict]] = []
        self.searches: list[dict] = []
        self.slow_s = 2.0  # how late a "slow" answer comes
        self.ssh = ("127.0.0.1", 22)
        self.boot_status = "running"
        self._next_id = 30_000_001
        self._lock = threading.Lock()
        self.httpd = None
        self.thread = None

    # --- set-up ------------------------------------------------------------------------------
    def start(self) -> "VastServer":
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="vast-server", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def fault(self, route: str, answer: str, times: int = 1) -> None:
        """Queue ``answer`` for the next ``times`` requests to ``route`` (list, show, create, state,
        reboot, destroy, search)."""
        self.faults.setdefault(route, []).extend([answer] * times)

    def add(self, label: str, status: str = "running", **fields) -> dict:
        """An instance at vast (as if created earlier, e.g. by hand or by a lost launch)."""
        with self._lock:
            iid = self._next_id
            self._next_id += 1
        row = self._row(iid, label, DEFAULT_OFFERS[0], status)
        row.update(fields)
        self.instances[iid] = row
        return row

    def _row(self, iid: int, label: str, offer: dict, status: str) -> dict:
        return {
            "id": iid, "machine_id": offer["machine_id"], "host_id": offer["host_id"], "actual_status": status,
            "intended_status": "running", "cur_state": "running", "next_state": "running",
            "status_msg": "success, running warden/curio-worker" if status == "running" else "",
            "label": label, "gpu_name": offer["gpu_name"], "num_gpus": 1, "dph_total": offer["dph_total"],
            "ssh_host": self.ssh[0], "ssh_port": self.ssh[1], "public_ipaddr": "127.0.0.1",
            "start_date": time.time(), "extra_env": [], "image_uuid": "", "disk_space": 40.0, "storage_cost": 0.15,
            "cuda_max_good": offer["cuda_max_good"], "reliability2": offer["reliability"],
        }

    def count(self, method: str, path_prefix: str) -> int:
        return sum(1 for m, p, _, _ in self.requests if m == method and p.startswith(path_prefix))


def _handler(server: VastServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _send(self, status: int, body, ctype: str = "application/json"):
            data = body if isinstance(body, bytes) else (json.dumps(body) if not isinstance(body, str) else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _fault(self, route: str) -> bool:
            queue = server.faults.get(route) or []
            if not queue:
                return False
            answer = queue.pop(0)
            if answer in ("new_contract_error", "slow"):
                queue.insert(0, answer)  # handled by create itself
                return False
            if answer == "429":
                self._send(429, TEXT_429, "text/plain")
            elif answer == "empty":
                self._send(200, b"", "application/json")
            elif answer == "html":
                self._send(200, HTML, "text/html; charset=utf-8")
            elif answer == "malformed":
                self._send(200, {"success": True, "total": 3})
            elif answer == "blank":  # a well-formed page that lists nothing, whatever exists (a lagging replica)
                self._send(200, {"instances": [], "instances_found": 0, "next_token": None})
            elif answer == "410":
                self._deprecated()
            elif answer == "echo_key":  # a broken proxy that echoes the request's Authorization header
                self._send(502, f"bad gateway; request had {self.headers.get('Authorization')}", "text/plain")
            elif answer == "echo_key_late":  # the same, 170 characters into the body (where a snippet is cut)
                self._send(502, "x" * 163 + f"header={self.headers.get('Authorization', '')[7:]}", "text/plain")
            elif answer == "500":
                self._send(500, {"success": False, "error": "server_error", "msg": "internal"})
            else:
                raise ValueError(f"unknown fault {answer!r}")
            return True

        def _deprecated(self):
            self._send(410, {"success": False, "error": "deprecated_endpoint",
                             "msg": "/api/v0/instances/ is deprecated. Use /api/v1/instances/ instead."})

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            if not n:
                return {}
            try:
                return json.loads(self.rfile.read(n) or b"{}")
            except ValueError:
                return {}

        def _route(self, method: str):
            parts = urlsplit(self.path)
            server.requests.append((method, parts.path, parts.query, dict(self.headers)))
            body = self._body() if method in ("PUT", "POST", "DELETE") else {}
            if self.headers.get("Authorization") != f"Bearer {server.api_key}":
                return self._send(401, {"success": False, "error": "auth_error", "msg": "Invalid user key"})
            q = {k: v[0] for k, v in parse_qs(parts.query).items()}
            seg = [s for s in parts.path.split("/") if s]
            if method == "GET" and parts.path == "/api/v1/instances/":
                return self._fault("list") or self._list(q)
            if method == "GET" and parts.path == "/api/v0/instances/":
                return self._deprecated()
            if method == "GET" and len(seg) == 4 and seg[:3] == ["api", "v0", "instances"]:
                return self._fault("show") or self._send(200, {"instances": server.instances.get(int(seg[3]))})
            if method == "POST" and parts.path == "/api/v0/bundles/":
                return self._fault("search") or self._search(body)
            if method == "PUT" and len(seg) == 4 and seg[:3] == ["api", "v0", "asks"]:
                return self._fault("create") or self._create(int(seg[3]), body)
            if method == "PUT" and len(seg) == 5 and seg[:4] == ["api", "v0", "instances", "reboot"]:
                return self._fault("reboot") or self._change(int(seg[4]), {"reboot": True})
            if method == "PUT" and len(seg) == 4 and seg[:3] == ["api", "v0", "instances"]:
                return self._fault("state") or self._change(int(seg[3]), body)
            if method == "DELETE" and len(seg) == 4 and seg[:3] == ["api", "v0", "instances"]:
                return self._fault("destroy") or self._destroy(int(seg[3]))
            return self._send(404, {"success": False, "error": "not_found", "msg": f"no route {parts.path}"})

        def do_GET(self):
            self._route("GET")

        def do_PUT(self):
            self._route("PUT")

        def do_POST(self):
            self._route("POST")

        def do_DELETE(self):
            self._route("DELETE")

        # --- routes --------------------------------------------------------------------------
        def _list(self, q: dict):
            try:
                filters = json.loads(q.get("select_filters") or "{}")
                limit = int(q.get("limit") or 25)
            except ValueError:
                return self._send(400, {"success": False, "error": "invalid_args", "msg": "bad select_filters"})
            limit = 5 if limit <= 0 else min(limit, 25)
            rows = sorted(server.instances.values(), key=lambda r: r["id"])
            for col, cond in filters.items():
                if col not in ("label", "id", "actual_status", "gpu_name", "verification"):
                    return self._send(400, {"success": False, "error": "invalid_args", "msg": f"cannot filter {col}"})
                for op, val in cond.items():
                    rows = [r for r in rows if _OPS[op](r.get(col), val)]
            after = q.get("after_token")
            queue = server.faults.get("list_next") or []
            if after and queue and queue[0] == "repeat":  # page one again, under a token never sent before
                queue.pop(0)
                return self._send(200, {"instances": rows[:limit], "next_token": f"tok-0.{len(server.requests)}"})
            if after and self._fault("list_next"):
                return None
            if after:
                if not after.startswith("tok-"):
                    return self._send(400, {"success": False, "error": "invalid_args", "msg": "bad after_token"})
                rows = [r for r in rows if r["id"] > int(after[4:].split(".")[0])]
            page = rows[:limit]
            more = len(rows) > limit
            labels = {}
            for r in server.instances.values():
                labels[r["label"]] = labels.get(r["label"], 0) + 1
            self._send(200, {"instances": page, "instances_found": len(rows), "total_instances": len(server.instances),
                             "label_counts": labels, "next_token": f"tok-{page[-1]['id']}" if more else None})

        def _search(self, body: dict):
            server.searches.append(body)
            found = []
            for o in server.offers:
                ok = True
                for col, cond in body.items():
                    if not isinstance(cond, dict) or col not in o:
                        continue
                    for op, val in cond.items():
                        if op in _OPS and not _OPS[op](o.get(col), _coerce(val, o.get(col))):
                            ok = False
                if ok:
                    found.append(o)
            found.sort(key=lambda o: o["dph_total"])
            self._send(200, {"offers": found[: int(body.get("limit") or 64)]})

        def _create(self, offer_id: int, body: dict):
            offer = next((o for o in server.offers if o["id"] == offer_id), None)
            if offer is None:
                return self._send(400, {"success": False, "error": "invalid_args", "msg": f"offer {offer_id} unavailable"})
            if not body.get("image"):
                return self._send(400, {"success": False, "error": "invalid_args", "msg": "image required"})
            with server._lock:
                iid = server._next_id
                server._next_id += 1
            row = server._row(iid, body.get("label") or "", offer, server.boot_status)
            row["extra_env"] = [[k, v] for k, v in (body.get("env") or {}).items()]
            row["image_uuid"] = body["image"]
            row["disk_space"] = body.get("disk")
            server.instances[iid] = row
            server.offers.remove(offer)
            queue = server.faults.get("create") or []
            if queue and queue[0] == "slow":  # made, then answered too late: the client has given up
                queue.pop(0)
                time.sleep(server.slow_s)
            if queue and queue[0] == "new_contract_error":
                queue.pop(0)
                row.update(actual_status="stopped", intended_status="stopped", cur_state="stopped", next_state="stopped",
                           status_msg="stopped: bid too low")
                return self._send(400, {"success": False, "error": "invalid_price", "msg": "bid below minimum",
                                        "new_contract": iid})
            self._send(200, {"success": True, "new_contract": iid})

        def _change(self, iid: int, body: dict):
            row = server.instances.get(iid)
            if row is None:
                return self._send(404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"})
            if body.get("reboot"):
                row.update(actual_status="running", status_msg="success, rebooted")
            elif body.get("state") in ("running", "stopped"):
                st = body["state"]
                row.update(actual_status=st, intended_status=st, cur_state=st, next_state=st)
            elif "label" in body:
                row["label"] = body["label"]
            else:
                return self._send(400, {"success": False, "error": "invalid_args", "msg": "nothing to change"})
            self._send(200, {"success": True})

        def _destroy(self, iid: int):
            if server.instances.pop(iid, None) is None:
                return self._send(404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"})
            self._send(200, {"success": True})

    return Handler
