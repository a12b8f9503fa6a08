"""A local OpenAI-compatible chat-completions server that plays recorded responses (tests, replay).

A real HTTP server on loopback (``http.server`` in a thread). Each ``POST …/chat/completions``
takes the next entry of ``responses`` (SCENARIOS.md ``model_responses``):

- a JSON body, served with HTTP 200 whatever it holds (an error object included);
- ``{"http_status": N, "body": ...}``: served with status ``N``;
- ``{"timeout": true}``: never answered (the connection is held until the client gives up or the
  server stops);
- when the list runs out: 500.

A request with ``"stream": true`` gets a 200 body as server-sent events in the wire format
(``chat.completion.chunk`` objects, then ``data: [DONE]``). Requests are kept (``requests``:
JSON bodies; ``headers``: their headers, names lower-cased) so tests can check what was sent.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def sse_chunks(body: dict) -> list[dict]:
    """A ``chat.completion`` body as the chunk objects a streaming server sends (content split in
    pieces of 8 characters, each tool call's name first then its arguments), usage in the last."""
    base = {k: body.get(k) for k in ("id", "model", "created")}
    base["object"] = "chat.completion.chunk"
    chunks = []
    for choice in body.get("choices") or []:
        idx = choice.get("index", 0)
        msg = choice.get("message") or {}
        first = {"role": msg.get("role", "assistant")}
        if msg.get("tool_call_id"):
            first["tool_call_id"] = msg["tool_call_id"]
        chunks.append({**base, "choices": [{"index": idx, "delta": first, "finish_reason": None}]})
        text = msg.get("content") or ""
        for i in range(0, len(text), 8):
            chunks.append({**base, "choices": [{"index": idx, "delta": {"content": text[i:i + 8]}, "finish_reason": None}]})
        for n, call in enumerate(msg.get("tool_calls") or []):
            fn = call.get("function") or {}
            chunks.append({**base, "choices": [{"index": idx, "finish_reason": None, "delta": {"tool_calls": [
                {"index": n, "id": call.get("id"), "type": "function", "function": {"name": fn.get("name"), "arguments": ""}}]}}]})
            args = fn.get("arguments") or ""
            for i in range(0, len(args), 16):
                chunks.append({**base, "choices": [{"index": idx, "finish_reason": None, "delta": {"tool_calls": [
                    {"index": n, "function": {"arguments": args[i:i + 16]}}]}}]})
        chunks.append({**base, "choices": [{"index": idx, "delta": {}, "finish_reason": choice.get("finish_reason", "stop")}]})
    if body.get("usage"):
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    return chunks


class StandIn:
    """The server. ``start()`` returns ``self``; ``base_url`` ends in ``/v1``; ``stop()`` frees
    held connections and the port. Usable as a context manager. ``chunk_delay_s``: seconds slept
    between streamed chunks (a model that writes at a human-visible pace; 0 by default)."""

    def __init__(self, responses: list, *, chunk_delay_s: float = 0.0):
        self.chunk_delay_s = chunk_delay_s
        self.responses = list(responses)
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._next = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="model-standin", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> "StandIn":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def take(self, body: dict, headers: dict):
        """The entry for one request (``None`` when the list has run out)."""
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            if self._next >= len(self.responses):
                return None
            entry = self.responses[self._next]
            self._next += 1
            return entry

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet: the tests read ``requests``
                pass

            def _send(self, status: int, payload) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": "standin", "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                size = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(size)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    self._send(400, {"error": {"message": "request body is not JSON"}})
                    return
                entry = standin.take(body, {k.lower(): v for k, v in self.headers.items()})
                if entry is None:
                    self._send(500, {"error": {"message": "the stand-in has no more recorded responses", "type": "server_error"}})
                    return
                if isinstance(entry, dict) and entry.get("timeout") is True:
                    standin._stopping.wait(120)
                    self.close_connection = True
                    return
                status, payload = 200, entry
                if isinstance(entry, dict) and "http_status" in entry:
                    status, payload = int(entry["http_status"]), entry.get("body")
                if status == 200 and body.get("stream") and isinstance(payload, dict) and "choices" in payload:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for chunk in sse_chunks(payload):
                        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                        self.wfile.flush()
                        if standin.chunk_delay_s:
                            standin._stopping.wait(standin.chunk_delay_s)
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self._send(status, payload)

        return Handler
