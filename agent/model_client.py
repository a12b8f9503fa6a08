"""The model endpoint: configuration, the API key resolved at use, one chat-completions call with
retries, and its record (:class:`agent.models.ModelCall`).

Any OpenAI-compatible ``/chat/completions`` endpoint (OpenAI, vLLM, Ollama, llama.cpp's server,
OpenRouter) is reached through the pinned ``openai`` SDK with its own retries off: 429, 5xx,
connection errors and timeouts are *transient* and retried here with exponential backoff slept on
the shared clock (``fleet.clock``), at most :data:`STRIKES` attempts (seed 000's error classes,
issue 7 §1). Anything else (400, 401, 404, a 200 without choices) is *permanent*: not retried.

The API key is a reference — ``WARDEN_MODEL_API_KEY_ENV`` (a variable's name) or
``WARDEN_MODEL_API_KEY_FILE`` (a path) — resolved by :func:`fleet.secrets.resolve` for each call
and handed to the SDK only; it is never stored, logged, shown or put in a prompt.
"""

import json
import time
from dataclasses import dataclass

import openai
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from fleet.clock import clock
from fleet.secrets import redact, resolve

#: attempts before a cycle gives the model up and falls back to the ``rules`` planner
STRIKES = 3
#: characters of a request or response kept per model call (what the run page shows)
LOG_CHARS = 60_000


class ModelError(Exception):
    """A model call failed. ``kind``: ``transient`` (429, 5xx, timeout, connection) or
    ``permanent``; ``attempts``: how many requests were made."""

    def __init__(self, message: str, *, kind: str = "permanent", attempts: int = 1):
        super().__init__(message)
        self.kind = kind
        self.attempts = attempts


@dataclass(frozen=True)
class ModelConfig:
    """Where and how to call the model. ``key_ref`` is ``env:NAME``, ``file:/path`` or empty
    (no key: local servers such as Ollama accept any). Prices are $ per million tokens."""

    base_url: str
    model: str
    key_ref: str = ""
    timeout_s: float = 60.0
    max_tokens: int = 2048
    temperature: float = 0.2
    price_in: float = 0.0
    price_out: float = 0.0

    @classmethod
    def from_settings(cls) -> "ModelConfig | None":
        """The configured model (``settings.MODEL``), or ``None`` when base URL or model is unset."""
        from django.conf import settings

        m = settings.MODEL
        if not (m["BASE_URL"] and m["MODEL"]):
            return None
        ref = f"env:{m['API_KEY_ENV']}" if m["API_KEY_ENV"] else f"file:{m['API_KEY_FILE']}" if m["API_KEY_FILE"] else ""
        return cls(base_url=m["BASE_URL"], model=m["MODEL"], key_ref=ref, timeout_s=m["TIMEOUT_S"],
                   max_tokens=m["MAX_TOKENS"], temperature=m["TEMPERATURE"], price_in=m["PRICE_IN"],
                   price_out=m["PRICE_OUT"])

    def key_name(self) -> str:
        """What the settings page may show: the reference, never the value."""
        return self.key_ref or "(none)"

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        """Dollars for one call: tokens × price per million."""
        return tokens_in * self.price_in / 1e6 + tokens_out * self.price_out / 1e6


def _api_key(cfg: ModelConfig) -> str:
    # the SDK refuses an empty key; servers without auth ignore the placeholder
    return resolve(cfg.key_ref) if cfg.key_ref else "no-key"


def transient(exc: BaseException) -> bool:
    """True for errors worth retrying: timeouts, connection errors, 429 and 5xx."""
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return False


@dataclass
class Reply:
    """One answered call: the parsed ``message`` (dict, as the wire sent it), token usage (from
    the API's ``usage``; 0 when absent), its cost in dollars and the ModelCall rows written."""

    message: dict
    tokens_in: int
    tokens_out: int
    cost: float
    usage_reported: bool


def _record(run, cfg: ModelConfig, request: dict, *, status: str, response: str = "", error: str = "",
            tokens_in: int = 0, tokens_out: int = 0, t0: float = 0.0):
    from agent.models import ModelCall

    if run is None:
        return None
    seq = ModelCall.objects.filter(run=run).count() + 1
    return ModelCall.objects.create(
        run=run, seq=seq, model=cfg.model[:120], status=status,
        request=redact(json.dumps(request, sort_keys=True, default=str))[:LOG_CHARS],
        response=redact(response)[:LOG_CHARS], error=redact(error)[:2000],
        tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cfg.cost(tokens_in, tokens_out),
        created_at=clock.now(), duration_ms=round((time.monotonic() - t0) * 1000, 1) if t0 else None)


def _streamed(client, request: dict, on_delta) -> str:
    """Stream one request; ``on_delta(kind, text)`` gets each content piece (``"text"``) and each
    tool call's name as it starts (``"tool"``). Returns a ``chat.completion``-shaped JSON body
    assembled from the chunks (usage from the last chunk, when the server sends it)."""
    message: dict = {"role": "assistant", "content": None}
    calls: dict[int, dict] = {}
    usage = None
    stream = client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
    try:
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage.model_dump()
            for choice in chunk.choices[:1]:
                delta = choice.delta
                role = getattr(delta, "role", None)
                if role:
                    message["role"] = role
                extra = getattr(delta, "model_extra", None) or {}
                if extra.get("tool_call_id"):
                    message["tool_call_id"] = extra["tool_call_id"]
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
    finally:
        stream.close()
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return json.dumps({"object": "chat.completion", "streamed": True, "choices": [{"index": 0, "message": message}],
                       "usage": usage})


def chat(cfg: ModelConfig, messages: list[dict], tools: list[dict], *, run=None, on_delta=None) -> Reply:
    """One chat-completions request (retried while transient) and its record per attempt.

    With ``on_delta`` (a callable ``(kind, text)``) the request streams (``stream: true``) and
    ``on_delta`` sees the answer as it arrives (see :func:`_streamed`); the :class:`Reply` is the
    same either way. Returns a :class:`Reply`. Raises :class:`ModelError` (``kind``
    ``transient`` after :data:`STRIKES` failed attempts, ``permanent`` at once otherwise) and
    ``fleet.secrets.SecretReferenceError`` when the key reference cannot be resolved.
    """
    request = {"model": cfg.model, "messages": messages, "max_tokens": cfg.max_tokens,
               "temperature": cfg.temperature}
    if tools:
        request["tools"] = tools
    shown = {**request, "tools": [t["function"]["name"] for t in tools], "stream": on_delta is not None}
    attempts = 0

    def once() -> Reply:
        nonlocal attempts
        attempts += 1
        t0 = time.monotonic()
        client = openai.OpenAI(base_url=cfg.base_url, api_key=_api_key(cfg), timeout=cfg.timeout_s, max_retries=0)
        try:
            if on_delta is not None:
                body = _streamed(client, request, on_delta)
            else:
                raw = client.chat.completions.with_raw_response.create(**request)
                body = raw.http_response.text
        except openai.APIStatusError as exc:
            _record(run, cfg, shown, status=f"http_{exc.status_code}", response=exc.response.text, error=str(exc), t0=t0)
            raise
        except openai.APIError as exc:
            _record(run, cfg, shown, status="timeout" if isinstance(exc, openai.APITimeoutError) else "unreachable",
                    error=f"{type(exc).__name__}: {exc}", t0=t0)
            raise
        finally:
            client.close()
        try:
            data = json.loads(body)
            message = data["choices"][0]["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            _record(run, cfg, shown, status="bad_body", response=body, error=f"no choices[0].message ({exc})", t0=t0)
            raise ModelError(f"the model answered 200 without a usable message ({type(exc).__name__})") from None
        usage = data.get("usage") or {}
        tin, tout = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        _record(run, cfg, shown, status="ok", response=body, tokens_in=tin, tokens_out=tout, t0=t0)
        return Reply(message=message, tokens_in=tin, tokens_out=tout, cost=cfg.cost(tin, tout),
                     usage_reported=bool(usage))

    retrying = Retrying(stop=stop_after_attempt(STRIKES), wait=wait_exponential(multiplier=1, min=1, max=8),
                        retry=retry_if_exception(transient), sleep=clock.sleep, reraise=False)
    try:
        return retrying(once)
    except RetryError as exc:
        last = exc.last_attempt.exception()
        raise ModelError(f"{attempts} attempts failed; last: {_describe(last)}", kind="transient", attempts=attempts) from None
    except ModelError:
        raise
    except openai.APIError as exc:
        raise ModelError(_describe(exc), kind="permanent", attempts=attempts) from None


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection error"
    return redact(f"{type(exc).__name__}: {exc}")


def active_planner() -> dict:
    """What the header and the settings page show about the planner: ``{"planner": "llm" |
    "rules", "model", "base_url" (userinfo and query dropped), "key" (the reference's name, never
    its value), "timeout_s", "max_tokens", "temperature", "price_in", "price_out"}``."""
    from urllib.parse import urlsplit, urlunsplit

    cfg = ModelConfig.from_settings()
    if cfg is None:
        return {"planner": "rules"}
    parts = urlsplit(cfg.base_url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return {"planner": "llm", "model": cfg.model, "base_url": urlunsplit((parts.scheme, netloc, parts.path, "", "")),
            "key": cfg.key_name(), "timeout_s": cfg.timeout_s, "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature, "price_in": cfg.price_in, "price_out": cfg.price_out}
