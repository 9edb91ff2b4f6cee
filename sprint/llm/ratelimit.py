"""Client-side rate limits: stay within a tokens-per-minute and a requests-per-minute budget.

Paid APIs limit tokens and requests per minute and answer HTTP 429 beyond them. Backing off per
request after each 429 wastes the budget (every worker sleeps at once, then all retry together),
so a long curation run either crawls or keeps hitting the limit. This limiter paces requests so
the budget is used evenly:

- a request is charged an estimate before it starts: its prompt tokens (characters divided by a
  characters-per-token ratio learnt from the usage the API returns; 3 until the first answer) plus
  `max_tokens`, which is what OpenAI-style limiters charge at admission;
- when it ends, the charge is corrected to the usage the API returns (prompt + completion tokens);
  a request the server refused costs nothing;
- charges are paced at `tpm / 60` tokens per second with `burst_s` seconds of slack (a virtual
  schedule: the budget is free again at `ready`); `rpm` the same way with a cost of one per request;
- a 429 pauses every request until its `Retry-After` (or 1 s), lowers the pace by 10 % (winning
  back 1 % per success), and halves the requests allowed in flight (winning one back per
  success up to the configured concurrency): the server knows its window better than we do.

One limiter belongs to one client and one event loop (its waits are `asyncio.sleep`s).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

INITIAL_CHARS_PER_TOKEN = 3.0  # cautious (English is ~4, LaTeX and code less) until the API says
DEFAULT_BURST_S = 0.5  # seconds of budget a quiet client may spend at once (servers enforce short windows)
PAUSE_WITHOUT_RETRY_AFTER = 1.0  # seconds every request waits after a 429 that names no time
SLOWDOWN = 0.9  # pace factor after a 429
RECOVERY = 0.01  # pace factor won back per success
MIN_PACE = 0.3


def payload_chars(payload: Any) -> int:
    """Characters of a completion prompt or of chat messages' text."""
    if isinstance(payload, str):
        return len(payload)
    total = 0
    for message in payload or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(str(part.get("text", ""))) for part in content if isinstance(part, dict))
    return total


@dataclass
class Charge:
    """What one request was charged (tokens estimated, and whether it holds an in-flight slot)."""

    tokens: float
    chars: int
    active: bool = True


@dataclass
class RateLimiter:
    """Paces requests within `tpm` tokens and `rpm` requests per minute (None: no such limit)."""

    tpm: int | None = None
    rpm: int | None = None
    max_concurrency: int = 8
    burst_s: float = DEFAULT_BURST_S
    chars_per_token: float = INITIAL_CHARS_PER_TOKEN
    pace: float = 1.0
    concurrency: float = field(init=False)
    in_flight: int = field(default=0, init=False)
    rate_limited: int = field(default=0, init=False)  # 429s seen
    waited_s: float = field(default=0.0, init=False)  # seconds requests spent waiting for budget
    _token_ready: float = field(default=0.0, init=False)
    _request_ready: float = field(default=0.0, init=False)
    _paused_until: float = field(default=0.0, init=False)
    _observed_chars: float = field(default=0.0, init=False)
    _observed_tokens: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        for name in ("tpm", "rpm"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.concurrency = float(self.max_concurrency)

    @property
    def enabled(self) -> bool:
        return bool(self.tpm or self.rpm)

    def estimate(self, payload: Any, max_tokens: int) -> tuple[float, int]:
        """(tokens to charge, prompt characters) for a request before it is sent."""
        chars = payload_chars(payload)
        return chars / self.chars_per_token + max_tokens, chars

    async def acquire(self, payload: Any, max_tokens: int) -> Charge:
        """Wait until the request fits the budgets and an in-flight slot is free; charge it."""
        tokens, chars = self.estimate(payload, max_tokens)
        started = time.monotonic()
        while True:
            now = time.monotonic()
            wait = max(self._paused_until - now,
                       self._token_ready - self.burst_s - now if self.tpm else 0.0,
                       self._request_ready - self.burst_s - now if self.rpm else 0.0)
            if wait <= 0 and self.in_flight < max(1, int(self.concurrency)):
                break
            await asyncio.sleep(wait if wait > 0 else 0.01)
        if self.tpm:
            self._token_ready = max(self._token_ready, now) + tokens / self._rate(self.tpm)
        if self.rpm:
            self._request_ready = max(self._request_ready, now) + 1 / self._rate(self.rpm)
        self.in_flight += 1
        self.waited_s += time.monotonic() - started
        return Charge(tokens, chars)

    def _rate(self, per_minute: int) -> float:
        return per_minute / 60.0 * self.pace

    def settle(self, charge: Charge, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """The request ended with this usage: correct its charge, learn the token ratio, free its slot."""
        self._release(charge)
        if prompt_tokens is None:
            return
        if prompt_tokens > 0 and charge.chars > 0:
            self._observed_chars += charge.chars
            self._observed_tokens += prompt_tokens
            self.chars_per_token = self._observed_chars / self._observed_tokens
        if self.tpm:
            used = prompt_tokens + (completion_tokens or 0)
            self._token_ready -= (charge.tokens - used) / self._rate(self.tpm)
        self.pace = min(1.0, self.pace + RECOVERY)
        self.concurrency = min(float(self.max_concurrency), self.concurrency + 1.0 / max(1.0, self.concurrency))

    def refused(self, charge: Charge, retry_after: float | None) -> None:
        """The server answered 429: the request cost nothing; everyone waits and slows down."""
        self._release(charge)
        self.rate_limited += 1
        if self.tpm:
            self._token_ready -= charge.tokens / self._rate(self.tpm)
        if self.rpm:
            self._request_ready -= 1 / self._rate(self.rpm)
        pause = retry_after if retry_after is not None else PAUSE_WITHOUT_RETRY_AFTER
        self._paused_until = max(self._paused_until, time.monotonic() + pause)
        self.pace = max(MIN_PACE, self.pace * SLOWDOWN)
        self.concurrency = max(1.0, self.concurrency / 2)

    def failed(self, charge: Charge) -> None:
        """Another failure (timeout, server error): unknown usage, keep the estimate, free the slot."""
        self._release(charge)

    def _release(self, charge: Charge) -> None:
        if charge.active:
            charge.active = False
            self.in_flight -= 1

    def stats(self) -> dict[str, Any]:
        """For the manifest's usage: what the limiter did."""
        return {"tpm": self.tpm, "rpm": self.rpm, "rate_limited": self.rate_limited,
                "waited_s": round(self.waited_s, 1), "chars_per_token": round(self.chars_per_token, 3),
                "pace": round(self.pace, 3)}
