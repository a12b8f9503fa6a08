# Over 500 lines on purpose: config, request, retries, streaming and the record share one error taxonomy.
"""The model endpoint: configuration, the API key resolved at use, one chat-completions call with
retries, and its record (:class:`agent.models.ModelCall`).

Any OpenAI-compatible ``/chat/completions`` endpoint (OpenAI, vLLM, Ollama, llama.cpp's server,
OpenRouter) is reached through the pinned ``openai`` SDK with its own retries off: 429, 5xx,
connection errors and timeouts are *transient* and retried here with exponential backoff slept on
the shared clock (``fleet.clock``), at most :data:`STRIKES` attempts (errors come in classes:
retry what is transient, never what is not). Anything else (400, 401, 404) is *permanent*: not retried.

A 200 is not an answer by itself (docs/model.md, "What counts as a failed answer"): a body with a
top-level ``error`` object, a choice with ``finish_reason: "error"``, no choices, a body that is
not JSON, and on the streamed path an empty stream, an HTML or plain JSON body, malformed
server-sent events or an ``error`` event are each a *failed request* with its ModelCall record
(status ``model_error``, ``bad_body`` or ``bad_stream``): transient when the error's code is 429 or
5xx or absent, permanent otherwise (OpenRouter's documented mid-stream and 200 error shapes).
A 400 saying the prompt exceeds the context window is ``kind="context_length"``: the planner
shrinks its context and asks again.

The request is shaped for what the common servers accept (OpenAI, vLLM, Ollama, llama.cpp's
server, OpenRouter): ``tool_choice: "auto"`` whenever tools are sent (llama.cpp leaves the tools
out of the prompt without it; OpenAI refuses it without tools), an assistant message that carries
tool calls has ``content: ""`` rather than ``null`` (llama.cpp answers 500 to ``null``), tool
schemas without ``minLength``/``maxLength`` (llama.cpp's grammar builder crashes on them; the
pipeline's own schema check still enforces them), and a streamed request with tools that the
server refuses because it streams ("Cannot use tools with stream") is asked again unstreamed, and
that server is not streamed with tools again in this process. A server that reports no ``usage``
(llama.cpp when streaming) gets an estimate, marked ``tokens_estimated`` on the record.

The API key is a reference — ``WARDEN_MODEL_API_KEY_ENV`` (a variable's name) or
``WARDEN_MODEL_API_KEY_FILE`` (a path) — resolved by :func:`fleet.secrets.resolve` for each call
and handed to the SDK only; it is never stored, logged, shown or put in a prompt.
"""

import json
import re
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx
import openai
from django.conf import settings
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from agent.models import ModelCall
from fleet.clock import clock
from fleet.secrets import SecretReferenceError, redact, resolve

#: attempts before a cycle gives the model up and falls back to the ``rules`` planner
STRIKES = 3
#: characters of a request or response kept per model call (what the run page shows)
LOG_CHARS = 60_000


class ModelError(Exception):
    """A model call failed. ``kind``: ``transient`` (429, 5xx, timeout, connection, a failed
    answer with such a code or none), ``permanent`` or ``context_length`` (the prompt exceeds the
    server's window); ``attempts``: how many requests were made."""

    def __init__(self, message: str, *, kind: str = "permanent", attempts: int = 1, window: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.attempts = attempts
        #: for ``context_length``: the window the server's answer names, when it names one
        self.window = window


@dataclass(frozen=True)
class ModelConfig:
    """Where and how to call the model. ``key_ref`` is ``env:NAME``, ``file:/path`` or empty
    (no key: local servers such as Ollama accept any). Prices are $ per million tokens."""

    base_url: str
    model: str
    key_ref: str = ""
    timeout_s: float = 60.0
    max_tokens: int = 512
    temperature: float = 0.2
    price_in: float = 0.0
    price_out: float = 0.0
    #: the model's context window in tokens; 0: read it from the server (:func:`context_window`)
    context_tokens: int = 0
    #: ``auto`` (stream, unless the server refuses to stream with tools), ``on`` or ``off``
    stream: str = "auto"
    #: how tool results are sent: ``tool`` messages (the OpenAI wire format) or ``user`` messages
    #: (for servers whose chat template drops ``tool`` messages: llama-cpp-python's
    #: ``chatml-function-calling`` renders none, so the model never sees a result)
    tool_results: str = "tool"

    @classmethod
    def from_settings(cls) -> "ModelConfig | None":
        """The configured model (``settings.MODEL``), or ``None`` when base URL or model is unset."""
        m = settings.MODEL
        if not (m["BASE_URL"] and m["MODEL"]):
            return None
        ref = f"env:{m['API_KEY_ENV']}" if m["API_KEY_ENV"] else f"file:{m['API_KEY_FILE']}" if m["API_KEY_FILE"] else ""
        return cls(base_url=m["BASE_URL"], model=m["MODEL"], key_ref=ref, timeout_s=m["TIMEOUT_S"],
                   max_tokens=m["MAX_TOKENS"], temperature=m["TEMPERATURE"], price_in=m["PRICE_IN"],
                   price_out=m["PRICE_OUT"], context_tokens=m.get("CONTEXT_TOKENS", 0),
                   stream=m.get("STREAM", "auto"), tool_results=m.get("TOOL_RESULTS", "tool"))

    def key_name(self) -> str:
        """What the settings page may show: the reference, never the value."""
        return self.key_ref or "(none)"

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        """Dollars for one call: tokens × price per million."""
        return tokens_in * self.price_in / 1e6 + tokens_out * self.price_out / 1e6


def _api_key(cfg: ModelConfig) -> str:
    # the SDK refuses an empty key; servers without auth ignore the placeholder
    return resolve(cfg.key_ref) if cfg.key_ref else "no-key"


class FailedAnswer(Exception):
    """One attempt whose answer is unusable although the HTTP exchange succeeded (see the module
    docstring). ``kind``: ``transient`` or ``permanent``; already recorded when raised."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def code_kind(code) -> str:
    """``transient`` for an error code of 429 or 500–599 or none at all, else ``permanent``.
    ``code`` may be an int, a digit string, another string or ``None`` (OpenRouter sends ints;
    others send strings such as ``"rate_limit_exceeded"``, which are permanent unless numeric)."""
    if code is None or code == "":
        return "transient"
    try:
        n = int(str(code).strip())
    except ValueError:
        return "permanent"
    return "transient" if n == 429 or 500 <= n <= 599 else "permanent"


def failed_answer(data) -> tuple[str, str] | None:
    """``(what, kind)`` when a parsed chat-completions body is a failed answer, else ``None``.

    Failed: not a JSON object, a top-level ``error`` object, no choices, a choice with
    ``finish_reason: "error"``, a first choice without a message object. ``kind`` from the
    error's ``code`` (:func:`code_kind`)."""
    if not isinstance(data, dict):
        return "the body is not a JSON object", "transient"
    err = data.get("error")
    if err not in (None, {}, ""):
        code = err.get("code") if isinstance(err, dict) else None
        msg = str(err.get("message") or "") if isinstance(err, dict) else str(err)
        return f"the answer carries an error (code {code if code is not None else 'none'}): {msg[:200]}", code_kind(code)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return "the answer has no choices", "transient"
    for c in choices:
        if isinstance(c, dict) and c.get("finish_reason") == "error":
            cerr = c.get("error") if isinstance(c.get("error"), dict) else {}
            code = cerr.get("code")
            return (f"a choice finished with finish_reason \"error\" (code {code if code is not None else 'none'})"
                    f"{': ' + str(cerr.get('message'))[:200] if cerr.get('message') else ''}", code_kind(code))
    first = choices[0]
    if not isinstance(first, dict) or not isinstance(first.get("message"), dict):
        return "the first choice has no message object", "transient"
    return None


#: phrases of the common servers' "prompt too long" answers (OpenAI "maximum context length",
#: vLLM "maximum context length … tokens", llama.cpp "exceeds the available context size",
#: Ollama/OpenRouter "context length"/"context window")
_CONTEXT_WORDS = ("context length", "maximum context", "context window", "context size", "n_ctx",
                  "too many tokens", "prompt is too long", "exceeds the available context")


def is_context_length(exc: BaseException) -> bool:
    """True for an HTTP 400/413 whose body says the prompt does not fit the model's window."""
    if not isinstance(exc, openai.APIStatusError) or exc.status_code not in (400, 413):
        return False
    text = (exc.response.text if exc.response is not None else str(exc)).lower()
    return any(w in text for w in _CONTEXT_WORDS)


def _named_window(exc: openai.APIStatusError) -> int | None:
    """The window a context-length answer names ("maximum context length is 8192 tokens", vLLM and
    OpenAI; "n_ctx: 8192" / "context size (8192)", llama.cpp), or ``None``."""
    text = exc.response.text if exc.response is not None else str(exc)
    m = re.search(r"(?:maximum context length is|n_ctx|context size)[^0-9]{0,8}(\d{3,7})", text, re.I)
    return int(m.group(1)) if m else None


def transient(exc: BaseException) -> bool:
    """True for errors worth retrying: timeouts, connection errors, 429 and 5xx, failed answers
    whose code is one of those (or absent)."""
    if isinstance(exc, FailedAnswer):
        return exc.kind == "transient"
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return False


@dataclass
class Reply:
    """One answered call: the parsed ``message`` (dict, as the wire sent it), token usage (from
    the API's ``usage``; estimated at 4 characters a token when absent, ``usage_reported``
    false) and its cost in dollars."""

    message: dict
    tokens_in: int
    tokens_out: int
    cost: float
    usage_reported: bool


def _record(run, cfg: ModelConfig, request: dict, *, status: str, response: str = "", error: str = "",
            tokens_in: int = 0, tokens_out: int = 0, t0: float = 0.0, estimated: bool = False):
    if run is None:
        return None
    seq = ModelCall.objects.filter(run=run).count() + 1
    return ModelCall.objects.create(
        run=run, seq=seq, model=cfg.model[:120], status=status,
        request=redact(json.dumps(request, sort_keys=True, default=str))[:LOG_CHARS],
        response=redact(response)[:LOG_CHARS], error=redact(error)[:2000],
        tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cfg.cost(tokens_in, tokens_out),
        tokens_estimated=estimated, created_at=clock.now(), duration_ms=round((time.monotonic() - t0) * 1000, 1) if t0 else None)


class _BadStream(Exception):
    """The streamed answer is unusable (``kind`` as :func:`code_kind`); ``seen`` is what came."""

    def __init__(self, message: str, kind: str, seen: str = ""):
        super().__init__(message)
        self.kind = kind
        self.seen = seen


def _streamed(client, request: dict, on_delta) -> str:
    """Stream one request; ``on_delta(kind, text)`` gets each content piece (``"text"``) and each
    tool call's name as it starts (``"tool"``). Returns a ``chat.completion``-shaped JSON body
    assembled from the chunks (usage from the last chunk, when the server sends it).

    Raises :class:`_BadStream` when the stream is not an answer: no chunk at all (an empty
    stream, or an HTML or plain JSON body the SSE parser finds no event in), an event that is not
    JSON, an ``error`` event, a choice finishing ``"error"``, or chunks that never finish."""
    message: dict = {"role": "assistant", "content": None}
    calls: dict[int, dict] = {}
    usage = None
    chunks = 0
    finished = None
    stream = client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
    ctype = stream.response.headers.get("content-type", "")
    try:
        for chunk in stream:
            chunks += 1
            extra = chunk.model_extra or {}
            if extra.get("error"):
                err = extra["error"]
                code = err.get("code") if isinstance(err, dict) else None
                raise _BadStream(f"the stream carried an error (code {code if code is not None else 'none'})",
                                 code_kind(code), json.dumps(err, default=str)[:2000])
            if chunk.usage is not None:
                usage = chunk.usage.model_dump()
            for choice in chunk.choices[:1]:
                if choice.finish_reason:
                    finished = choice.finish_reason
                delta = choice.delta
                if delta is None:
                    continue
                role = getattr(delta, "role", None)
                if role:
                    message["role"] = role
                dextra = getattr(delta, "model_extra", None) or {}
                if dextra.get("tool_call_id"):
                    message["tool_call_id"] = dextra["tool_call_id"]
                if delta.content:
                    message["content"] = (message["content"] or "") + delta.content
                    if message["role"] == "assistant" and "tool_call_id" not in message:
                        on_delta("text", delta.content)  # a forged tool result is never shown as the answer
                for tc in delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                    if tc.id:
                        slot["id"] = tc.id
                    if tc.function is not None:
                        if tc.function.name:
                            slot["function"]["name"] += tc.function.name
                            on_delta("tool", tc.function.name)
                        if tc.function.arguments:
                            slot["function"]["arguments"] += tc.function.arguments
    except ValueError as exc:  # an event whose data is not JSON (the SDK's json.loads)
        raise _BadStream(f"a server-sent event is not JSON ({type(exc).__name__}: {str(exc)[:120]})", "transient") from None
    except openai.APIError as exc:
        if isinstance(exc, (openai.APIStatusError, openai.APIConnectionError)):
            raise
        body = exc.body if isinstance(exc.body, dict) else {}
        raise _BadStream(f"the stream carried an error event: {redact(str(exc))[:200]}", code_kind(body.get("code")),
                         json.dumps(exc.body, default=str)[:2000]) from None
    finally:
        stream.close()
    if chunks == 0:
        raise _BadStream(f"the stream carried no server-sent event (Content-Type {ctype or 'none'})", "transient")
    if finished == "error":
        raise _BadStream('the streamed choice finished with finish_reason "error"', "transient")
    if finished is None and usage is None:
        raise _BadStream(f"the stream ended after {chunks} chunks without a finish_reason", "transient")
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return json.dumps({"object": "chat.completion", "streamed": True,
                       "choices": [{"index": 0, "message": message, "finish_reason": finished}], "usage": usage})


#: keys dropped from tool schemas on the wire (llama.cpp's grammar builder fails on them; the
#: pipeline checks the arguments against the full pydantic model anyway)
WIRE_DROP_KEYS = ("minLength", "maxLength", "title")


def wire_schema(obj):
    """A JSON schema without :data:`WIRE_DROP_KEYS` at any depth (property names kept)."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "properties" and isinstance(v, dict):
                out[k] = {name: wire_schema(sub) for name, sub in v.items()}
            elif k not in WIRE_DROP_KEYS:
                out[k] = wire_schema(v)
        return out
    if isinstance(obj, list):
        return [wire_schema(v) for v in obj]
    return obj


#: what :func:`wire_messages` puts before a tool result sent as a ``user`` message
TOOL_RESULT_AS_USER = "[runtime] Result of your call {call_id}:\n"


def wire_messages(messages: list[dict], tool_results: str = "tool") -> list[dict]:
    """``messages`` as every common server accepts them: ``content`` never ``null`` (``""``).

    ``tool_results``: ``"tool"`` keeps each tool result a ``tool`` message (the OpenAI wire
    format); ``"user"`` sends it as a ``user`` message headed by :data:`TOOL_RESULT_AS_USER` (the
    call's id), for servers whose chat template renders no ``tool`` message (llama-cpp-python's
    ``chatml-function-calling``: docs/model.md). Raises ``ValueError`` for another mode."""
    if tool_results not in ("tool", "user"):
        raise ValueError(f"tool_results {tool_results!r}: give 'tool' or 'user'")
    out = []
    for m in messages:
        if m.get("content") is None:
            m = {**m, "content": ""}
        if tool_results == "user" and m.get("role") == "tool":
            m = {k: v for k, v in m.items() if k not in ("role", "tool_call_id", "content")} | {
                "role": "user", "content": TOOL_RESULT_AS_USER.format(call_id=m.get("tool_call_id") or "?") + m["content"]}
        out.append(m)
    return out


def estimate(text: str) -> int:
    """Tokens of ``text`` estimated at 4 characters a token (rounded up)."""
    return -(-len(text or "") // 4)


#: base URLs that refused to stream with tools in this process (asked unstreamed from then on)
NO_TOOL_STREAM: set[str] = set()


def _refuses_stream(exc: openai.APIStatusError) -> bool:
    text = (exc.response.text if exc.response is not None else str(exc)).lower()
    return exc.status_code in (400, 422, 500, 501) and "stream" in text


def chat(cfg: ModelConfig, messages: list[dict], tools: list[dict], *, run=None, on_delta=None,
         time_left_s: float | None = None) -> Reply:
    """One chat-completions request (retried while transient) and its record per attempt.

    With ``on_delta`` (a callable ``(kind, text)``) the request streams (``stream: true``) and
    ``on_delta`` sees the answer as it arrives (see :func:`_streamed`); the :class:`Reply` is the
    same either way. ``time_left_s``: seconds the run's wall clock still allows; each attempt's
    timeout is at most that (less what earlier attempts used), and no attempt starts once it is
    spent. Returns a :class:`Reply`. Raises :class:`ModelError` (``kind`` ``transient`` after
    :data:`STRIKES` failed attempts, ``permanent`` at once, ``context_length`` for a 400 saying the
    prompt is too long) and ``fleet.secrets.SecretReferenceError`` when the key reference cannot
    be resolved.
    """
    request = {"model": cfg.model, "messages": wire_messages(messages, cfg.tool_results), "max_tokens": cfg.max_tokens,
               "temperature": cfg.temperature}
    if tools:
        request["tools"] = [wire_schema(t) for t in tools]
        request["tool_choice"] = "auto"
    attempts = 0
    began = clock.monotonic()

    def once() -> Reply:
        nonlocal attempts
        timeout = cfg.timeout_s
        if time_left_s is not None:
            left = time_left_s - (clock.monotonic() - began)
            if left <= 0:
                raise ModelError(f"the run's wall clock was spent after {attempts} attempts", kind="transient",
                                 attempts=attempts)
            timeout = min(timeout, max(0.5, left))
        attempts += 1
        streaming = on_delta is not None and cfg.stream != "off" and not (tools and cfg.base_url in NO_TOOL_STREAM
                                                                           and cfg.stream == "auto")
        shown = {**request, "tools": [t["function"]["name"] for t in tools], "stream": streaming,
                 "timeout_s": round(timeout, 3)}
        t0 = time.monotonic()
        client = openai.OpenAI(base_url=cfg.base_url, api_key=_api_key(cfg), timeout=timeout, max_retries=0)
        try:
            try:
                if streaming:
                    body = _streamed(client, request, on_delta)
                else:
                    raw = client.chat.completions.with_raw_response.create(**request)
                    body = raw.http_response.text
            except openai.APIStatusError as exc:
                if not (streaming and tools and cfg.stream == "auto" and _refuses_stream(exc)):
                    raise
                # the server does not stream with tools (llama.cpp): this attempt asks again unstreamed
                _record(run, cfg, shown, status=f"http_{exc.status_code}", response=exc.response.text,
                        error=f"{exc} (asked again without streaming)", t0=t0)
                NO_TOOL_STREAM.add(cfg.base_url)
                shown = {**shown, "stream": False}
                t0 = time.monotonic()
                raw = client.chat.completions.with_raw_response.create(**request)
                body = raw.http_response.text
        except openai.APIStatusError as exc:
            _record(run, cfg, shown, status=f"http_{exc.status_code}", response=exc.response.text, error=str(exc), t0=t0)
            if is_context_length(exc):
                raise ModelError(f"HTTP {exc.status_code}: the prompt exceeds the model's context window",
                                 kind="context_length", attempts=attempts, window=_named_window(exc)) from None
            raise
        except _BadStream as exc:
            _record(run, cfg, shown, status="bad_stream", response=exc.seen, error=str(exc), t0=t0)
            raise FailedAnswer(str(exc), exc.kind) from None
        except openai.APIError as exc:
            _record(run, cfg, shown, status="timeout" if isinstance(exc, openai.APITimeoutError) else "unreachable",
                    error=f"{type(exc).__name__}: {exc}", t0=t0)
            raise
        finally:
            client.close()
        try:
            data = json.loads(body)
        except ValueError as exc:
            _record(run, cfg, shown, status="bad_body", response=body, error=f"the body is not JSON ({exc})", t0=t0)
            raise FailedAnswer("the model answered 200 with a body that is not JSON", "transient") from None
        failed = failed_answer(data)
        if failed is not None:
            what, kind = failed
            _record(run, cfg, shown, status="model_error", response=body, error=what, t0=t0)
            raise FailedAnswer(f"the model answered 200 with a failed answer: {what}", kind)
        message = data["choices"][0]["message"]
        usage = data.get("usage") or {}
        tin, tout = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        reported = bool(usage) and (tin or tout)
        if not reported:  # llama.cpp sends no usage chunk when streaming: estimate, and say so
            tin = estimate(json.dumps(request["messages"], default=str)) + estimate(json.dumps(request.get("tools") or []))
            out = (message.get("content") or "") if isinstance(message.get("content"), str) else ""
            for c in message.get("tool_calls") or []:
                fn = (c or {}).get("function") or {}
                out += str(fn.get("name") or "") + str(fn.get("arguments") or "")
            tout = estimate(out)
        _record(run, cfg, shown, status="ok", response=body, tokens_in=tin, tokens_out=tout, t0=t0,
                estimated=not reported)
        return Reply(message=message, tokens_in=tin, tokens_out=tout, cost=cfg.cost(tin, tout),
                     usage_reported=bool(reported))

    retrying = Retrying(stop=stop_after_attempt(STRIKES), wait=wait_exponential(multiplier=1, min=1, max=8),
                        retry=retry_if_exception(transient), sleep=clock.sleep, reraise=False)
    try:
        return retrying(once)
    except RetryError as exc:
        last = exc.last_attempt.exception()
        raise ModelError(f"{attempts} attempts failed; last: {_describe(last)}", kind="transient", attempts=attempts) from None
    except ModelError:
        raise
    except FailedAnswer as exc:
        raise ModelError(str(exc), kind="permanent", attempts=attempts) from None
    except openai.APIError as exc:
        raise ModelError(_describe(exc), kind="permanent", attempts=attempts) from None


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, FailedAnswer):
        return str(exc)
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection error"
    return redact(f"{type(exc).__name__}: {exc}")


#: the window assumed when neither the settings nor the server say (a common small-model size)
DEFAULT_CONTEXT_TOKENS = 8192
#: windows read from servers, per (base URL, model), for this process
_WINDOWS: dict[tuple[str, str], tuple[int, str]] = {}


class _NoAnswer(Exception):
    """The server did not answer the metadata requests at all (asked again next time)."""


def _window_from_server(cfg: ModelConfig) -> tuple[int, str] | None:
    """``(tokens, where)`` from the server's own metadata, or ``None`` when it says nothing:
    llama.cpp's ``GET /props`` (``default_generation_settings.n_ctx``, or ``n_ctx``), then the
    model's entry of ``GET /v1/models``: ``max_model_len`` (vLLM), ``context_length``
    (OpenRouter), ``meta.n_ctx`` or ``meta.n_ctx_train`` (llama.cpp). Raises :class:`_NoAnswer`
    when the server could not be reached (the answer is then not remembered)."""
    base = cfg.base_url.rstrip("/")
    root = base[:-3] if base.endswith("/v1") else base
    headers = {"Authorization": f"Bearer {_api_key(cfg)}"}
    try:
        with httpx.Client(timeout=min(5.0, cfg.timeout_s), headers=headers) as http:
            r = http.get(root + "/props")
            if r.status_code == 200:
                props = r.json()
                n = (props.get("default_generation_settings") or {}).get("n_ctx") or props.get("n_ctx")
                if isinstance(n, int) and n > 0:
                    return n, "the server's /props n_ctx"
            r = http.get(base + "/models")
            if r.status_code == 200:
                for m in (r.json() or {}).get("data") or []:
                    if not isinstance(m, dict) or m.get("id") not in (cfg.model, None):
                        continue
                    meta = m.get("meta") or {}
                    for where, n in (("max_model_len", m.get("max_model_len")),
                                     ("context_length", m.get("context_length")),
                                     ("meta.n_ctx", meta.get("n_ctx")), ("meta.n_ctx_train", meta.get("n_ctx_train"))):
                        if isinstance(n, int) and n > 0:
                            return n, f"the server's /models {where}"
    except (httpx.TransportError, SecretReferenceError):
        raise _NoAnswer() from None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return None


def context_window(cfg: ModelConfig, *, with_source: bool = False):
    """The model's context window in tokens: ``WARDEN_MODEL_CONTEXT_TOKENS`` when set, else what the
    server says (:func:`_window_from_server`, read once per process), else
    :data:`DEFAULT_CONTEXT_TOKENS` (a server that did not answer is asked again next time).
    ``with_source``: return ``(tokens, where it came from)``."""
    if cfg.context_tokens > 0:
        found = (cfg.context_tokens, "WARDEN_MODEL_CONTEXT_TOKENS")
    else:
        key = (cfg.base_url, cfg.model)
        found = _WINDOWS.get(key)
        if found is None:
            try:
                found = _WINDOWS[key] = _window_from_server(cfg) or (DEFAULT_CONTEXT_TOKENS, "the default (the server did not say)")
            except _NoAnswer:  # unreachable now: the default this time, asked again next time
                found = (DEFAULT_CONTEXT_TOKENS, "the default (the server did not answer)")
    return found if with_source else found[0]


def public_url(url: str) -> str:
    """``url`` as it may be shown and stored: scheme, host, port and path (userinfo and query,
    which can carry credentials, dropped)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def active_planner() -> dict:
    """What the header and the settings page show about the planner: ``{"planner": "llm" |
    "rules", "model", "base_url" (userinfo and query dropped), "key" (the reference's name, never
    its value), "timeout_s", "max_tokens", "temperature", "price_in", "price_out", "context_tokens", "stream",
    "tool_results"}``."""
    cfg = ModelConfig.from_settings()
    if cfg is None:
        return {"planner": "rules"}
    return {"planner": "llm", "model": cfg.model, "base_url": public_url(cfg.base_url),
            "key": cfg.key_name(), "timeout_s": cfg.timeout_s, "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature, "price_in": cfg.price_in, "price_out": cfg.price_out,
            "context_tokens": cfg.context_tokens or "read from the server", "stream": cfg.stream,
            "tool_results": cfg.tool_results}
