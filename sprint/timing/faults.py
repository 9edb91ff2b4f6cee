"""Deterministic fault injection for scripted and replay servers.

Both the test server (`tests/fake_server.py`) and the replay server (`sprint/timing/replay_server.py`) use the
same plan so a failure seen in one can be reproduced in the other: the decision for request
number `n` depends only on the plan's seed and `n`, never on timing or thread scheduling.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, fields

from sprint.core.errors import UserError

# Fault names, in the order their rates are stacked on [0, 1).
SERVER_ERROR = "5xx"  # HTTP 500 with a JSON error body
RATE_LIMIT = "429"  # HTTP 429 with a Retry-After header
TIMEOUT = "timeout"  # answer only after `timeout_delay` seconds (the client should give up first)
RESET = "reset"  # close the connection without any response
TRUNCATED = "truncated"  # cut the response body / stream half way, then close the connection
EMPTY = "empty"  # empty text, finish_reason "length", 0 completion tokens
GARBAGE = "garbage"  # a well-formed response whose text is nonsense

FAULTS = (SERVER_ERROR, RATE_LIMIT, TIMEOUT, RESET, TRUNCATED, EMPTY, GARBAGE)

_WORDS = ("blorp", "zzt", "qua", "}{", "<Line", "7x", "\\boxed", "~~", "frob", "##", "nil", "?!")


@dataclass(frozen=True)
class FaultPlan:
    """Per-request fault probabilities; their sum must not exceed 1."""

    rate_5xx: float = 0.0
    rate_429: float = 0.0
    retry_after: float = 0.1  # seconds sent in the Retry-After header of a 429
    rate_timeout: float = 0.0
    timeout_delay: float = 5.0  # seconds a "timeout" request stalls before answering
    rate_reset: float = 0.0
    rate_truncated: float = 0.0
    rate_empty: float = 0.0
    rate_garbage: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        rates = self._rates()
        if any(r < 0 or r > 1 for _, r in rates):
            raise ValueError(f"fault rates must lie in [0, 1]: {dict(rates)}")
        if sum(r for _, r in rates) > 1 + 1e-9:
            raise ValueError(f"fault rates sum to more than 1: {dict(rates)}")
        if self.retry_after < 0 or self.timeout_delay < 0:
            raise ValueError("retry_after and timeout_delay must be >= 0")

    def _rates(self) -> list[tuple[str, float]]:
        return [
            (SERVER_ERROR, self.rate_5xx),
            (RATE_LIMIT, self.rate_429),
            (TIMEOUT, self.rate_timeout),
            (RESET, self.rate_reset),
            (TRUNCATED, self.rate_truncated),
            (EMPTY, self.rate_empty),
            (GARBAGE, self.rate_garbage),
        ]

    @property
    def active(self) -> bool:
        return any(r > 0 for _, r in self._rates())

    def _uniform(self, counter: int, salt: str) -> float:
        digest = hashlib.sha256(f"{self.seed}:{counter}:{salt}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def decide(self, counter: int) -> str | None:
        """The fault for the `counter`-th request (0-based), or None to answer normally."""
        u = self._uniform(counter, "fault")
        edge = 0.0
        for name, rate in self._rates():
            edge += rate
            if u < edge:
                return name
        return None

    def garbage(self, counter: int, words: int = 12) -> str:
        """Deterministic nonsense text to put in place of a real answer."""
        rng = random.Random(self._uniform(counter, "garbage"))
        return " ".join(rng.choice(_WORDS) for _ in range(max(1, words)))

    @classmethod
    def from_spec(cls, spec: str) -> FaultPlan:
        """Parse `"5xx=0.1,429=0.05,timeout=0.02,seed=3"` (names as in FAULTS or field names)."""
        names = {f.name for f in fields(cls)}
        aliases = {name: f"rate_{name}" for name in FAULTS}
        values: dict[str, float | int] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, raw = part.partition("=")
            key = aliases.get(key.strip(), key.strip())
            if not sep or key not in names:
                raise UserError(
                    f"bad fault spec {part!r}; use NAME=VALUE with NAME in "
                    f"{', '.join(FAULTS)}, retry_after, timeout_delay or seed"
                )
            try:
                values[key] = int(raw) if key == "seed" else float(raw)
            except ValueError:
                raise UserError(f"bad number in fault spec {part!r}") from None
        try:
            return cls(**values)  # type: ignore[arg-type]
        except ValueError as exc:
            raise UserError(f"bad fault spec {spec!r}: {exc}") from None
