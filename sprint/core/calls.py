"""One model call, as every part of the pipeline records it: `CallRecord`.

Orchestration and the baseline write it into records.jsonl (a record's `calls`); the replay server
keeps one per answered request; time-replay plans calls from recorded ones and measures them again
on an engine (timing.json); the latency fit reads their times; the timeline draws them; the RL
rollout pairs them with the tokens a trainer needs. They all speak one vocabulary, the one
records.jsonl has always used on disk:

- `role`: planner | executor | baseline (who was asked);
- `phase`: the phase the call belongs to (0 for the baseline's one call);
- `prompt`: the prompt name p.k an executor executes; `FINAL` ("final") for the planner's forced
  final answer; None for a plan (and the baseline);
- `start` / `end`: seconds on the clock of whoever made the record (time.time() in records.jsonl,
  time.monotonic() in the replay server, seconds from a run's start in timing.json);
- `prompt_tokens` / `completion_tokens`: as the server's usage says (tags included);
- `cached`: answered from the on-disk response cache; `cached_tokens`: prompt tokens the server
  found in its prefix cache (when it says); `server`: the replica that answered.

Lives in core (the lowest layer) so inference, timing, viewer and rl all import the same class.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

PLANNER = "planner"
EXECUTOR = "executor"
BASELINE = "baseline"
FINAL = "final"  # the prompt name of the planner's forced final answer (and its `kind`)

# The keys of a call in records.jsonl, in the order they are written.
RECORD_KEYS = ("role", "phase", "prompt", "prompt_tokens", "completion_tokens", "finish_reason", "start", "end",
               "cached", "draw", "run", "kept", "error", "cached_tokens", "server")


@dataclass
class CallRecord:
    """One model call: who was asked what, when, how it ended and what it cost.

    `first_token` (when the first generated token arrived) is known only to those who stream
    (the replay server, time-replay); it is written only when set, so records.jsonl rows keep
    exactly their `RECORD_KEYS`.
    """

    role: str  # planner | executor | baseline
    phase: int
    prompt: str | None = None  # p.k for an executor, FINAL for the forced final answer, else None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    start: float = 0.0
    end: float = 0.0
    cached: bool = False
    draw: int = 1  # 1 + index of the redraw (planner length retries, executor retries)
    run: int = 1  # problem-level attempt
    kept: bool = True  # False: failed, cancelled, a plan redrawn for length, or an execution thrown away (stream)
    error: str | None = None
    cached_tokens: int | None = None  # prompt tokens the server had in its prefix cache (when it says)
    server: str | None = None  # the replica that answered (None: on-disk cache hit or failed call)
    first_token: float | None = None  # when the first token arrived (streamed calls); not a records.jsonl key

    @property
    def is_final(self) -> bool:
        """The planner's forced final answer (a planner call named FINAL)."""
        return self.role == PLANNER and self.prompt == FINAL

    @property
    def kind(self) -> str:
        """The role, with the forced final answer told apart from plans: planner | executor | final |
        baseline (what a timeline colours and the replay server counts by)."""
        return FINAL if self.is_final else self.role

    @property
    def label(self) -> str:
        """The call's place in the trajectory: "2" (plan of phase 2), "2.1" (execution_2.1), "final", "baseline"."""
        if self.is_final:
            return FINAL
        if self.role == EXECUTOR:
            return self.prompt or f"{self.phase}.?"
        if self.role == PLANNER:
            return str(self.phase)
        return self.role

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def ttft(self) -> float | None:
        """Seconds to the first token (queueing + prefill), when it is known."""
        return None if self.first_token is None else self.first_token - self.start

    def shifted(self, origin: float, scale: float = 1.0) -> CallRecord:
        """A copy with its times moved to seconds from `origin`, divided by `scale`."""
        first = None if self.first_token is None else (self.first_token - origin) / scale
        return replace(self, start=(self.start - origin) / scale, end=(self.end - origin) / scale, first_token=first)

    def as_dict(self) -> dict[str, Any]:
        """The call as records.jsonl stores it (`first_token` only when known)."""
        row = asdict(self)
        if row["first_token"] is None:
            del row["first_token"]
        return row

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> CallRecord:
        """A call read back from records.jsonl or timing.json, old files included: missing keys take
        their defaults, unknown keys are ignored, and a call stored with role "final" (an older
        spelling) is read as the planner's FINAL call."""
        role = str(row.get("role") or PLANNER)
        prompt = row.get("prompt")
        if role == FINAL:
            role, prompt = PLANNER, FINAL
        first = _number(row.get("first_token"))
        return cls(
            role=role, phase=int(row.get("phase") or 0), prompt=None if prompt is None else str(prompt),
            prompt_tokens=int(row.get("prompt_tokens") or 0), completion_tokens=int(row.get("completion_tokens") or 0),
            finish_reason=row.get("finish_reason"), start=_number(row.get("start")) or 0.0,
            end=_number(row.get("end")) or 0.0, cached=bool(row.get("cached")), draw=int(row.get("draw") or 1),
            run=int(row.get("run") or 1), kept=bool(row.get("kept", True)), error=row.get("error"),
            cached_tokens=row["cached_tokens"] if isinstance(row.get("cached_tokens"), int) else None,
            server=row.get("server"), first_token=first,
        )


def _number(value: Any) -> float | None:
    """A finite number as float, else None (booleans and strings are not times)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)

