"""A local OpenAI-compatible chat-completions server that plays recorded responses (tests, replay).

A real HTTP server on loopback (``http.server`` in a thread). Each ``POST …/chat/completions``
takes the next entry of ``responses`` (a replay file's ``model_responses``, docs/replay.md):

- a JSON body, served with HTTP 200 whatever it holds (an error object included);
- ``{"http_status": N, "body": ...}``: served with status ``N``;
- ``{"timeout": true}``: never answered (the connection is held until the client gives up or the
  server stops; each connection the client closed while waiting is counted in ``abandoned``);
- when the list runs out: 500.

- ``{"raw": "text", "content_type": "..."}`` (tests only): served with HTTP 200 byte for byte,
  whatever the request asked (an HTML page, an empty or malformed event stream).

A request with ``"stream": true`` gets a 200 body as server-sent events in the wire format
(``chat.completion.chunk`` objects, then ``data: [DONE]``). Requests are kept (``requests``:
JSON bodies; ``headers``: their headers, names lower-cased) so tests can check what was sent.

``server`` imitates one server kind's documented quirks (what each accepts and refuses; the
sources are each project's server docs and issue trackers):

- ``llamacpp`` (llama.cpp's ``llama-server``): without ``tool_choice: "auto"`` the tools are left
  out of the prompt, so the recorded answer's tool calls are dropped (text only); an assistant
  message whose ``content`` is ``null`` → 500 ("Failed to parse messages"); a tool schema holding
  ``minLength``/``maxLength`` → 500 (its JSON-schema-to-grammar converter fails); a streamed
  request with tools → 500 "Cannot use tools with stream"; streaming sends no usage chunk;
  ``GET /props`` reports ``default_generation_settings.n_ctx`` (``context``);
- ``openai``: ``tool_choice`` without ``tools`` → 400; ``GET /v1/models`` carries no window;
- ``vllm``: ``tool_choice`` without ``tools`` → 400; ``GET /v1/models`` reports ``max_model_len``;
- ``ollama``: a message ``content`` that is neither a string nor a list → 400;
- ``openrouter``: ``GET /v1/models`` reports ``context_length`` (its failed answers, a 200
  carrying an ``error`` object, are recorded responses).

``responder`` (tests): a callable given each request's JSON body that returns the entry to
serve (any of the shapes above), in place of the ``responses`` list — a scripted model that
answers what it is asked. ``models``: the model names served; a request for another answers 404
with OpenAI's ``model_not_found`` error (the shape vLLM and OpenRouter also use).

``context`` (tokens): a request whose messages and tools (JSON, 4 characters a token) plus
``max_tokens`` exceed it answers 400 in that server's words ("maximum context length", "exceeds
the available context size").
"""

import json
import select
import socket
import threading
import time
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

    SERVERS = ("generic", "llamacpp", "openai", "vllm", "ollama", "openrouter")

    def __init__(self, responses: list, *, chunk_delay_s: float = 0.0, server: str = "generic",
                 context: int | None = None, responder=None, models=None):
        if server not in self.SERVERS:
            raise ValueError(f"unknown server kind {server!r}; use one of {', '.join(self.SERVERS)}")
        self.server = server
        self.context = context
        self.responder = responder
        self.models = set(models) if models is not None else None
        self.chunk_delay_s = chunk_delay_s
        self.responses = list(responses)
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        #: unanswered (``timeout``) requests whose connection the client closed
        self.abandoned = 0
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

    def refusal(self, body: dict) -> tuple[int, dict] | None:
        """``(status, error body)`` when this server kind refuses the request ``body``, else ``None``."""
        tools = body.get("tools") or []
        msgs = body.get("messages") or []
        if self.models is not None and body.get("model") not in self.models:
            return 404, {"error": {"message": f"The model `{body.get('model')}` does not exist or you do not have access to it.",
                                   "type": "invalid_request_error", "param": None, "code": "model_not_found"}}
        if self.context is not None:
            used = -(-len(json.dumps(msgs) + json.dumps(tools)) // 4) + int(body.get("max_tokens") or 0)
            if used > self.context:
                if self.server == "llamacpp":
                    return 400, {"error": {"code": 400, "type": "exceed_context_size_error",
                                           "message": "the request exceeds the available context size, try increasing it"}}
                return 400, {"error": {"type": "BadRequestError", "code": 400, "message":
                                       f"This model's maximum context length is {self.context} tokens. However, you "
                                       f"requested {used} tokens. Please reduce the length of the messages."}}
        if self.server in ("openai", "vllm") and body.get("tool_choice") is not None and not tools:
            return 400, {"error": {"message": "'tool_choice' is only allowed when 'tools' are specified", "type":
                                   "invalid_request_error", "param": "tool_choice"}}
        if self.server == "ollama":
            for m in msgs:
                if not isinstance(m.get("content"), (str, list)):
                    return 400, {"error": {"message": "json: cannot unmarshal content of the message", "type": "invalid_request_error"}}
        if self.server == "llamacpp":
            for m in msgs:
                if m.get("role") == "assistant" and m.get("content") is None:
                    return 500, {"error": {"code": 500, "type": "server_error",
                                           "message": "Failed to parse messages: Expected 'content' (ref: assistant with null content)"}}
            if "minLength" in json.dumps(tools) or "maxLength" in json.dumps(tools):
                return 500, {"error": {"code": 500, "type": "server_error",
                                       "message": "JSON schema conversion failed: unsupported minLength/maxLength in grammar"}}
            if tools and body.get("stream"):
                return 500, {"error": {"code": 500, "type": "server_error", "message": "Cannot use tools with stream"}}
        return None

    def shaped(self, body: dict, payload):
        """The recorded ``payload`` as this server kind would answer ``body`` (llama.cpp without
        ``tool_choice: "auto"`` never saw the tools: no tool calls)."""
        if self.server == "llamacpp" and isinstance(payload, dict) and body.get("tool_choice") != "auto":
            payload = json.loads(json.dumps(payload))
            for c in payload.get("choices") or []:
                msg = c.get("message") or {}
                if msg.pop("tool_calls", None) is not None:
                    msg["content"] = msg.get("content") or "I would check the fleet."
                    c["finish_reason"] = "stop"
        return payload

    def take(self, body: dict, headers: dict):
        """The entry for one request (``None`` when the list has run out)."""
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            if self.responder is not None:
                return self.responder(body)
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
                kind, ctx = standin.server, standin.context
                if self.path.rstrip("/").endswith("/models"):
                    entry = {"id": "standin", "object": "model"}
                    if ctx and kind == "vllm":
                        entry["max_model_len"] = ctx
                    elif ctx and kind == "openrouter":
                        entry["context_length"] = ctx
                    elif ctx and kind == "llamacpp":
                        entry["meta"] = {"n_ctx_train": ctx * 4}  # trained for more than the server runs
                    self._send(200, {"object": "list", "data": [entry]})
                elif self.path.rstrip("/") == "/props" and kind == "llamacpp":
                    self._send(200, {"default_generation_settings": {"n_ctx": ctx or 4096}, "total_slots": 1})
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
                refused = standin.refusal(body)
                if refused is not None:
                    with standin._lock:  # the server refused it: the recorded answer stays for the next request
                        if entry is not None and standin.responder is None:
                            standin._next -= 1
                    self._send(*refused)
                    return
                if isinstance(entry, dict) and "raw" in entry:
                    data = str(entry["raw"]).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", entry.get("content_type", "text/plain"))
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if entry is None:
                    self._send(500, {"error": {"message": "the stand-in has no more recorded responses", "type": "server_error"}})
                    return
                if isinstance(entry, dict) and entry.get("timeout") is True:
                    # hold the request until the client closes the connection (end of file on
                    # the socket) or the server stops
                    deadline = time.monotonic() + 120
                    while not standin._stopping.is_set() and time.monotonic() < deadline:
                        if select.select([self.connection], [], [], 0.05)[0]:
                            if self.connection.recv(1, socket.MSG_PEEK) == b"":
                                with standin._lock:
                                    standin.abandoned += 1
                                break
                    self.close_connection = True
                    return
                status, payload = 200, standin.shaped(body, entry)
                if isinstance(entry, dict) and "http_status" in entry:
                    status, payload = int(entry["http_status"]), entry.get("body")
                if status == 200 and body.get("stream") and isinstance(payload, dict) and "choices" in payload:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    chunks = sse_chunks(payload)
                    if standin.server == "llamacpp":  # no usage chunk when streaming
                        chunks = [c for c in chunks if not c.get("usage")]
                    for chunk in chunks:
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
