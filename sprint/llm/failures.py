"""What went wrong in one call, in words a run can count: every failure is classified into one
of ERROR_KINDS (timeout, server error, rate limit, ...), and the transient ones are retried."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from typing import Any

import openai

# context_length: the prompt alone fills the model's context (HTTP 400 saying so): a long trajectory, not a broken request
ERROR_KINDS = frozenset({"timeout", "server_error", "rate_limit", "bad_request", "context_length", "auth", "not_found",
                         "connection", "empty"})


TRANSIENT_KINDS = frozenset({"timeout", "server_error", "rate_limit", "connection", "empty"})


class LLMError(Exception):
    """A classified failure after retries; `kind` is one of ERROR_KINDS."""

    def __init__(self, kind: str, message: str, *, status: int | None = None, attempts: int = 0,
                 stopped: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.attempts = attempts
        self.stopped = stopped  # refused by the circuit breaker: retrying now is pointless


class Attempt(Exception):
    """One failed attempt, classified; retried when its kind is transient.

    `what` names the failure ("server error 500"); `detail` is the server's own words, if any.
    """

    def __init__(
        self, kind: str, what: str, detail: str = "", *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(what)
        self.kind = kind
        self.what = what
        self.detail = " ".join(detail.split())[:200]
        self.status = status
        self.retry_after = retry_after


def retry_after(headers: Any) -> float | None:
    """Seconds from `retry-after-ms` / `Retry-After` (seconds or an HTTP date), if present."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def server_message(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if message:
            return str(message)
    return exc.message


def classify(exc: BaseException) -> Attempt:
    """Map an exception from one attempt to an error kind; unexpected exceptions propagate."""
    if isinstance(exc, Attempt):
        return exc
    if isinstance(exc, (asyncio.TimeoutError, openai.APITimeoutError)):
        return Attempt("timeout", "request timed out")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return Attempt("connection", "connection failure", f"{type(cause).__name__}: {cause}" if cause else exc.message)
    if isinstance(exc, openai.APIStatusError):
        status, message, headers = exc.status_code, server_message(exc), exc.response.headers
        if status == 429:
            return Attempt("rate_limit", "rate limit (HTTP 429)", message, status=status, retry_after=retry_after(headers))
        if status == 408:
            return Attempt("timeout", "request timed out (HTTP 408)", message, status=status)
        if status >= 500:
            return Attempt("server_error", f"server error {status}", message, status=status, retry_after=retry_after(headers))
        if status in (401, 403):
            return Attempt("auth", f"authentication failure (HTTP {status})", message, status=status)
        if status == 404:
            return Attempt("not_found", "not found (HTTP 404)", message, status=status)
        if any(words in message.lower() for words in ("context length", "context_length")):
            return Attempt("context_length", f"context full (HTTP {status})", message, status=status)
        return Attempt("bad_request", f"bad request (HTTP {status})", message, status=status)
    if isinstance(exc, openai.APIError):  # e.g. an error event inside a stream
        return Attempt("server_error", "server error", exc.message)
    if isinstance(exc, json.JSONDecodeError):
        return Attempt("server_error", "unreadable response", "the body is not JSON")
    raise exc
