"""The one LLM client every stage uses: an async OpenAI-compatible client with bounded
concurrency, per-call timeouts, classified retries, usage totals and an on-disk cache.

Why our own retry loop instead of the `openai` package's: we need to classify failures (so a
run can report "12 timeouts, 3 server errors"), count retries for manifests, honour Retry-After,
and treat an empty completion or a dropped stream as transient. The cache is keyed by what was
asked (endpoint kind, model, prompt/messages, sampling), never by the server URL, so a finished
run can be replayed offline against no server at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openai

from sprint.core.errors import UserError
from sprint.core.items import RUN_STOP  # the item loop's stop signal, tripped by the circuit breaker
from sprint.llm.failures import TRANSIENT_KINDS, Attempt, LLMError, classify
from sprint.llm.ratelimit import Charge, RateLimiter
from sprint.core.files import atomic_write

log = logging.getLogger(__name__)

MAX_STOP = 4  # vLLM >= 0.32 answers HTTP 400 to more stop strings
BACKOFF_CAP = 30.0  # seconds; the longest we sleep between attempts without a Retry-After
RETRY_AFTER_CAP = 120.0  # seconds; a server asking for longer is treated as asking for this
CHECK_TIMEOUT = 10.0  # seconds for GET /models in check()
MAX_BUDGET_WAITS = 30  # 429s per request that use no retry when a --tpm/--rpm budget is set


OnText = Callable[[str], None]

DEFAULT_MAX_CONNECTION_FAILURES = 10  # failed connections in a row before a client stops calling (0: never)


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters, normalised so equal settings give equal cache keys."""

    max_tokens: int  # always explicit: vLLM's /v1/completions defaults to 16
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None  # identical requests share a cache entry: vary the seed to draw samples
    extra: tuple[tuple[str, Any], ...] = ()  # extra body params, e.g. (("skip_special_tokens", False),)

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        extra = self.extra.items() if isinstance(self.extra, dict) else self.extra
        extra = tuple(sorted((str(k), v) for k, v in extra))
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        if len(stop) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings per request (vLLM rejects more), got {len(stop)}")
        if isinstance(self.max_tokens, bool) or int(self.max_tokens) != self.max_tokens or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        reserved = {"model", "prompt", "messages", "stream", "stream_options", "max_tokens", "stop"}
        clash = reserved.intersection(k for k, _ in extra)
        if clash:
            raise ValueError(f"extra sampling params may not set {sorted(clash)}")
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "extra", extra)
        object.__setattr__(self, "max_tokens", int(self.max_tokens))
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))

    def canonical(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": list(self.stop),
            "seed": self.seed,
            "extra": [[k, v] for k, v in self.extra],
        }

    def body(self) -> dict[str, Any]:
        """Request parameters for the openai client (extra params go in `extra_body`)."""
        params: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.stop:
            params["stop"] = list(self.stop)
        if self.seed is not None:
            params["seed"] = self.seed
        return params


@dataclass
class Completion:
    text: str
    finish_reason: str | None  # "stop" | "length" | ...
    stop_reason: str | None  # the stop string that matched, when the server says (vLLM does)
    prompt_tokens: int
    completion_tokens: int
    cached: bool  # answered from the on-disk cache
    start: float  # time.time() when the first attempt got a concurrency slot / after the last one
    end: float
    attempts: int  # HTTP attempts made (0 for a cache hit)
    # prompt tokens the server found in its prefix cache (vLLM: usage.prompt_tokens_details.cached_tokens,
    # with --enable-prompt-tokens-details); None when it does not say, and for on-disk cache hits
    cached_tokens: int | None = None
    server: str | None = None  # the base URL that answered (None for an on-disk cache hit)


@dataclass
class LLMConfig:
    base_url: str  # e.g. http://127.0.0.1:8000/v1 or https://api.openai.com/v1
    model: str
    api_key_env: str = "OPENAI_API_KEY"  # the key is read from this env var only; "EMPTY" if unset
    max_concurrency: int = 8
    timeout: float = 600.0  # seconds per attempt
    max_retries: int = 3  # retries on transient errors
    backoff: float = 1.0  # base seconds, exponential with jitter, capped
    cache_dir: Path | None = None  # content-addressed cache; None = no cache
    # circuit breaker: after this many failed connections in a row (any call), every call fails at once
    # and the run stops starting items; a dead server then ends a run in seconds, not after every retry
    max_connection_failures: int = DEFAULT_MAX_CONNECTION_FAILURES
    # budgets per minute (sprint.llm.ratelimit); None: unlimited (429s are still retried per request)
    tpm: int | None = None
    rpm: int | None = None

    def __post_init__(self) -> None:
        for name in ("tpm", "rpm"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UserError(f"--{name} must be a positive whole number (or left out for no limit), got {value!r}")
        if self.max_concurrency < 1:
            raise UserError(f"max concurrency must be at least 1, got {self.max_concurrency}")
        if self.timeout <= 0:
            raise UserError(f"timeout must be positive, got {self.timeout}")
        if self.max_retries < 0:
            raise UserError(f"max retries must be >= 0, got {self.max_retries}")
        if self.max_connection_failures < 0:
            raise UserError(f"max connection failures must be >= 0 (0: never stop), got {self.max_connection_failures}")
        if self.cache_dir is not None:
            self.cache_dir = Path(self.cache_dir)


@dataclass
class Usage:
    """Running totals for manifests. Tokens count only what servers generated in this run
    (cache hits carry their recorded counts on the Completion, not here)."""

    calls: int = 0  # complete()/chat() calls, cache hits included
    cache_hits: int = 0
    retries: int = 0  # attempts beyond the first
    failures: int = 0  # calls that ended in LLMError
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # failed attempts by kind
    rate_limiter: dict[str, Any] | None = None  # what the --tpm/--rpm limiter did (sprint.llm.ratelimit)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if out["rate_limiter"] is None:  # only runs with a budget have one
            del out["rate_limiter"]
        return out


def cache_key(kind: str, model: str, payload: Any, sampling: Sampling) -> str:
    """sha256 of a canonical JSON of what was asked; the server URL is deliberately left out."""
    doc = {"kind": kind, "model": model, "payload": payload, "sampling": sampling.canonical()}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class LLMClient:
    """Async client for one model behind one OpenAI-compatible URL.

    Safe to construct outside a running loop: the HTTP client and the concurrency semaphore
    are created inside the loop that first uses them (and again if a later asyncio.run() brings
    a new loop).
    """

    def __init__(self, config: LLMConfig) -> None:
        self.config = config
        self.usage = Usage()
        self._api_key = os.environ.get(config.api_key_env) or "EMPTY"
        self._client: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rng = random.Random()
        self._failed_connections = 0  # in a row, over every call of this client
        self.stopped: str | None = None  # set when the circuit breaker trips: why
        self.limiter = (RateLimiter(config.tpm, config.rpm, config.max_concurrency)
                        if config.tpm or config.rpm else None)

    def __repr__(self) -> str:  # keep the key out of reprs
        return f"LLMClient(base_url={self.config.base_url!r}, model={self.config.model!r})"

    # --- lifecycle ------------------------------------------------------------------------

    def _ensure(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._semaphore is None or self._loop is not loop:
            # A client left over from a finished loop cannot be closed from this one; drop it.
            self._client = openai.AsyncOpenAI(
                base_url=self.config.base_url,
                api_key=self._api_key,
                max_retries=0,
                timeout=self.config.timeout,
            )
            self._semaphore = asyncio.Semaphore(self.config.max_concurrency)
            self._loop = loop
        return self._client, self._semaphore

    async def aclose(self) -> None:
        client, self._client = self._client, None
        loop, self._loop = self._loop, None
        self._semaphore = None
        if client is not None and loop is asyncio.get_running_loop():
            await client.close()

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- public calls ---------------------------------------------------------------------

    # `headers` (e.g. a router's affinity header) and `body` (e.g. vLLM's `priority`) ride along with
    # the request but do not change the answer, so they are not part of the cache key.

    async def complete(self, prompt: str, sampling: Sampling, on_text: OnText | None = None, *,
                       headers: dict[str, str] | None = None, body: dict[str, Any] | None = None) -> Completion:
        """POST /v1/completions with a raw prompt."""
        return await self._call("completions", prompt, sampling, on_text, headers, body)

    async def chat(self, messages: list[dict], sampling: Sampling, on_text: OnText | None = None, *,
                   headers: dict[str, str] | None = None, body: dict[str, Any] | None = None) -> Completion:
        """POST /v1/chat/completions."""
        return await self._call("chat", messages, sampling, on_text, headers, body)

    async def check(self) -> list[str]:
        """Served model ids; UserError when the server is unreachable, refuses us, or lacks the model."""
        client, _ = self._ensure()
        url = self.config.base_url
        try:
            page = await client.models.list(timeout=min(CHECK_TIMEOUT, self.config.timeout))
            served = [m.id for m in page.data]
        except (openai.APIConnectionError, asyncio.TimeoutError):
            raise UserError(
                f"no server answers at {url}; start one with `sprint serve MODEL_DIR` "
                f"(or `vllm serve MODEL`), or pass the right base URL"
            ) from None
        except openai.APIStatusError as exc:
            if exc.status_code in (401, 403):
                raise UserError(
                    f"the server at {url} refused the API key (HTTP {exc.status_code}); "
                    f"put the right key in the {self.config.api_key_env} environment variable"
                ) from None
            if exc.status_code == 404:
                raise UserError(f"{url}/models was not found (HTTP 404); the base URL usually ends in /v1") from None
            raise UserError(f"the server at {url} answered HTTP {exc.status_code} to GET /models") from None
        except openai.APIError as exc:
            raise UserError(f"the server at {url} sent an unreadable model list ({exc.message})") from None
        if self.config.model not in served:
            listing = ", ".join(served) if served else "(none)"
            raise UserError(
                f"model {self.config.model!r} is not served at {url}; served models: {listing}; pass one of them as the model"
            )
        return served

    # --- the retry loop -------------------------------------------------------------------

    async def _call(self, kind: str, payload: Any, sampling: Sampling, on_text: OnText | None,
                    headers: dict[str, str] | None = None, body: dict[str, Any] | None = None) -> Completion:
        if not isinstance(sampling, Sampling):
            raise TypeError("sampling must be a sprint.llm.client.Sampling")
        self.usage.calls += 1
        key = cache_key(kind, self.config.model, payload, sampling)
        hit = self._cache_get(key)
        if hit is not None:
            self.usage.cache_hits += 1
            if on_text is not None:
                on_text(hit.text)
            return hit

        client, semaphore = self._ensure()
        attempts = budget_waits = 0
        start: float | None = None
        while True:
            attempts += 1
            self._refuse_if_stopped(attempts - 1)
            async with semaphore:
                charge = await self.limiter.acquire(payload, sampling.max_tokens) if self.limiter else None
                if start is None:
                    start = time.time()
                result: tuple[str, str | None, str | None, int, int] | None = None
                failure: Attempt | None = None
                try:
                    result = await asyncio.wait_for(
                        self._attempt(client, kind, payload, sampling, on_text, headers, body),
                        timeout=self.config.timeout,
                    )
                except Exception as exc:  # classified below; anything unexpected propagates
                    failure = classify(exc)
                finally:
                    if charge is not None:
                        self._settle(charge, result, failure)
            self._count_connection(failure)
            if failure is None:
                break
            self.usage.errors[failure.kind] = self.usage.errors.get(failure.kind, 0) + 1
            if self.limiter is not None and failure.kind == "rate_limit" and budget_waits < MAX_BUDGET_WAITS:
                budget_waits += 1  # within a budget a 429 means "wait", not "broken": it uses no retry
            if failure.kind not in TRANSIENT_KINDS or attempts - budget_waits > self.config.max_retries:
                self.usage.failures += 1
                plural = "attempt" if attempts == 1 else "attempts"
                message = f"{failure.what} from {self.config.base_url} after {attempts} {plural}"
                if failure.detail:
                    message += f": {failure.detail}"
                message = self._scrub(message)
                raise LLMError(failure.kind, message, status=failure.status, attempts=attempts) from None
            self.usage.retries += 1
            delay = self._delay(attempts, failure.retry_after)
            log.debug("attempt %d failed (%s); retrying in %.2fs", attempts, failure.kind, delay)
            await asyncio.sleep(delay)
            self._refuse_if_stopped(attempts)

        text, finish, stop_reason, prompt_tokens, completion_tokens, cached_tokens = result
        self.usage.prompt_tokens += prompt_tokens
        self.usage.completion_tokens += completion_tokens
        done = Completion(
            text=text,
            finish_reason=finish,
            stop_reason=stop_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached=False,
            start=start,
            end=time.time(),
            attempts=attempts,
            cached_tokens=cached_tokens,
            server=self.config.base_url,
        )
        self._cache_put(key, kind, done)
        return done

    def _settle(self, charge: Charge, result: tuple | None, failure: Attempt | None) -> None:
        """Tell the rate limiter how a request ended (its usage, a 429, or another failure)."""
        assert self.limiter is not None
        if result is not None:
            self.limiter.settle(charge, result[3], result[4])
        elif failure is not None and failure.kind == "rate_limit":
            self.limiter.refused(charge, failure.retry_after)
        else:
            self.limiter.failed(charge)
        self.usage.rate_limiter = self.limiter.stats()

    def _count_connection(self, failure: Attempt | None) -> None:
        """The circuit breaker: count failed connections in a row; any answer from the server resets it."""
        if failure is None or failure.kind not in ("connection", "timeout"):
            self._failed_connections = 0
        elif failure.kind == "connection":
            self._failed_connections += 1
            limit = self.config.max_connection_failures
            if limit and self._failed_connections >= limit and self.stopped is None:
                self.stopped = (f"server at {self.config.base_url} stopped answering after {self._failed_connections} "
                                "connection failures in a row")
                log.debug("circuit breaker tripped: %s", self.stopped)
        if self.stopped is not None:
            stop = RUN_STOP.get()
            if stop is not None:
                stop.trip(self.stopped)

    def _refuse_if_stopped(self, attempts: int) -> None:
        """After the breaker tripped, a call fails at once (a transient `connection` failure: a re-run redoes it)."""
        if self.stopped is not None:
            self.usage.failures += 1
            raise LLMError("connection", self.stopped, attempts=attempts, stopped=True)

    def _delay(self, attempts: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, RETRY_AFTER_CAP)
        ceiling = min(BACKOFF_CAP, self.config.backoff * 2 ** (attempts - 1))
        return ceiling * (0.5 + 0.5 * self._rng.random())

    def _scrub(self, text: str) -> str:
        if self._api_key and self._api_key != "EMPTY" and len(self._api_key) >= 4:
            text = text.replace(self._api_key, "***")
        return text

    async def _attempt(
        self, client: openai.AsyncOpenAI, kind: str, payload: Any, sampling: Sampling, on_text: OnText | None,
        headers: dict[str, str] | None = None, body: dict[str, Any] | None = None,
    ) -> tuple[str, str | None, str | None, int, int, int | None]:
        """One HTTP request; returns (text, finish_reason, stop_reason, prompt_tokens, completion_tokens,
        cached_tokens)."""
        params = sampling.body()
        extra_body = {**dict(sampling.extra), **(body or {})} or None
        if headers:
            params["extra_headers"] = headers
        if kind == "completions":
            create = client.completions.create
            params["prompt"] = payload
        else:
            create = client.chat.completions.create
            params["messages"] = payload
        if on_text is None:
            response = await create(model=self.config.model, extra_body=extra_body, **params)
            if not hasattr(response, "choices"):
                raise Attempt("server_error", "unreadable response", f"got {type(response).__name__}, not a completion")
            if not response.choices:
                raise Attempt("empty", "empty completion", "no choices")
            choice = response.choices[0]
            text = (choice.text if kind == "completions" else choice.message.content) or ""
            finish = choice.finish_reason
            stop_reason = getattr(choice, "stop_reason", None)
            usage = response.usage
        else:
            text, finish, stop_reason, usage = await self._stream(create, kind, params, extra_body, on_text)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        if not text and finish == "length" and completion_tokens == 0:
            raise Attempt("empty", "empty completion", "no text, finish_reason length, 0 tokens")
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        cached_tokens = int(cached) if isinstance(cached, int) else None
        stop = stop_reason if isinstance(stop_reason, str) else None
        return text, finish, stop, prompt_tokens, completion_tokens, cached_tokens

    async def _stream(
        self, create: Any, kind: str, params: dict[str, Any], extra_body: dict | None, on_text: OnText
    ) -> tuple[str, str | None, Any, Any]:
        stream = await create(
            model=self.config.model,
            extra_body=extra_body,
            stream=True,
            stream_options={"include_usage": True},
            **params,
        )
        text = ""
        finish: str | None = None
        stop_reason: Any = None
        usage: Any = None
        saw_choice = False
        async with stream:
            async for chunk in stream:
                if getattr(chunk, "usage", None) is not None:
                    usage = chunk.usage
                for choice in chunk.choices or ():
                    if choice.index != 0:
                        continue
                    saw_choice = True
                    piece = choice.text if kind == "completions" else (choice.delta.content if choice.delta else None)
                    if piece:
                        text += piece
                        on_text(text)
                    if choice.finish_reason is not None:
                        finish = choice.finish_reason
                        stop_reason = getattr(choice, "stop_reason", None)
        if not saw_choice:
            raise Attempt("empty", "empty completion", "the stream had no choices")
        if finish is None:
            raise Attempt("connection", "dropped stream", "it ended before a finish_reason")
        return text, finish, stop_reason, usage

    # --- cache ----------------------------------------------------------------------------

    def cached(self, kind: str, payload: Any, sampling: Sampling) -> Completion | None:
        """The cached answer to this request, if any (batch mode reads what it put there)."""
        return self._cache_get(cache_key(kind, self.config.model, payload, sampling))

    def store(self, kind: str, payload: Any, sampling: Sampling, done: Completion) -> None:
        """Cache an answer obtained another way (a batch's output), as if this client had received it."""
        self._cache_put(cache_key(kind, self.config.model, payload, sampling), kind, done)

    def api(self) -> openai.AsyncOpenAI:
        """The underlying `openai` client (batch mode uses its files and batches endpoints)."""
        return self._ensure()[0]

    def _cache_path(self, key: str) -> Path | None:
        if self.config.cache_dir is None:
            return None
        return self.config.cache_dir / key[:2] / f"{key}.json"

    def _cache_get(self, key: str) -> Completion | None:
        path = self._cache_path(key)
        if path is None or not path.is_file():
            return None
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            now = time.time()
            return Completion(
                text=entry["text"],
                finish_reason=entry.get("finish_reason"),
                stop_reason=entry.get("stop_reason"),
                prompt_tokens=int(entry.get("prompt_tokens", 0)),
                completion_tokens=int(entry.get("completion_tokens", 0)),
                cached=True,
                start=now,
                end=now,
                attempts=0,
            )
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable cache entry %s", path)
            return None

    def _cache_put(self, key: str, kind: str, done: Completion) -> None:
        path = self._cache_path(key)
        if path is None:
            return
        entry = {
            "kind": kind,
            "model": self.config.model,
            "text": done.text,
            "finish_reason": done.finish_reason,
            "stop_reason": done.stop_reason,
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(entry, ensure_ascii=False), private_tmp=True)  # other runs may share the cache
