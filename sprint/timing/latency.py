"""How long generations take on a GPU: a small latency model and SPRINT's critical path.

Sequential tokens are a proxy for wall-clock time. This module turns tokens into seconds with
the three effects that matter for an interleaved planner/executor schedule:

- prefill: a call first reads its prompt, `ttft_base_s + ttft_per_prompt_token_s × prompt tokens`;
- decode: then it emits tokens one by one, `s_per_token` each when it decodes alone;
- batching: with `n` sequences decoding at once every step is slower,
  `s_per_token × (1 + batch_slowdown × (n − 1))`, and at most `capacity` sequences are served
  at once (the rest queue).

The replay server (`sprint.timing.replay_server`) applies the model to live requests, with contention;
`critical_path` gives the lowest wall-clock one problem can reach under a schedule when it has
the GPU to itself.

Default parameters: a 7-8B model in bf16 served by vLLM on one H100, from a published
measurement where there is one, meant for comparing schedules; `sprint fit-latency` fits them to
your own hardware from `sprint time-replay` measurements (`replay-server --latency-from FILE`).

- Decode: Lambda Labs' vLLM benchmark of Llama-3-8B-Instruct, bf16, one H100 SXM, 10 requests
  sent at once (github.com/LambdaLabsML/vllm-benchmark,
  results/prompt_10/1xH100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2048.json) streams 10
  tokens per 70.3-71.4 ms once the longest request decodes alone, and per 73-75 ms while the
  ten decode together: `s_per_token = 0.0071`, `batch_slowdown = 0.006` (7.1 ms at 1 → 7.5 ms
  at 10). Longer contexts read more KV cache per step (this 7B's is 57 KB per token, so 4k
  tokens of context cost ~1.5% of the weights' 15 GB), so long SPRINT contexts slow a batch more.
- Prefill: the same run's time to first token is 62 ms for all ten prompts (4-399 tokens, 1,369
  in all, prefilled together). Prefill is compute-bound, ~15 GFLOP per prompt token, about 33k
  tokens/s at half the H100's dense bf16 peak: `ttft_per_prompt_token_s = 3e-5`, with
  `ttft_base_s = 0.025` for scheduling, HTTP and the first step (25 + 41 ms + one 7 ms step for
  those 1,369 tokens, against 62 ms measured). vLLM's prefix cache makes repeated prefixes (an
  executor shares the planner's) nearly free; lower `ttft_per_prompt_token_s` to model it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sprint.core.calls import EXECUTOR, FINAL, PLANNER, CallRecord
from sprint.core.errors import UserError
from sprint.format import tags
from sprint.format.trajectory import Counter, Trajectory, render_question

SCHEDULES = ("barrier", "stream")


@dataclass(frozen=True)
class LatencyModel:
    """Seconds for a generation; see the module docstring for the defaults (H100, 7B, bf16)."""

    ttft_base_s: float = 0.025
    ttft_per_prompt_token_s: float = 3e-5
    s_per_token: float = 0.0071
    batch_slowdown: float = 0.006
    capacity: int | None = None  # max sequences served at once; None = unlimited

    def __post_init__(self) -> None:
        for name in ("ttft_base_s", "ttft_per_prompt_token_s", "s_per_token", "batch_slowdown"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"capacity must be at least 1 (or None for unlimited), got {self.capacity}")

    def prefill(self, prompt_tokens: int) -> float:
        """Seconds before decoding starts (the first token arrives one decode step later)."""
        return self.ttft_base_s + self.ttft_per_prompt_token_s * prompt_tokens

    def step(self, decoding: int = 1) -> float:
        """Seconds per generated token while `decoding` sequences (this one included) decode."""
        return self.s_per_token * (1.0 + self.batch_slowdown * (max(1, decoding) - 1))

    def sequential_time(self, n_tokens: int, prompt_tokens: int = 0) -> float:
        """One generation alone on the GPU: prefill, then `n_tokens` decode steps."""
        return self.prefill(prompt_tokens) + n_tokens * self.step(1)


def load_latency_model(path: str | Path) -> LatencyModel:
    """The model in `sprint fit-latency`'s latency.json (or a JSON object of LatencyModel's fields)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the latency model {path} ({exc}); pass fit-latency's latency.json") from None
    fields = data.get("latency_model", data) if isinstance(data, dict) else None
    if not isinstance(fields, dict):
        raise UserError(f"{path} holds no latency model; pass fit-latency's latency.json")
    known = {k: v for k, v in fields.items() if k in LatencyModel.__dataclass_fields__}
    try:
        return LatencyModel(**known)
    except (TypeError, ValueError) as exc:
        raise UserError(f"bad latency model in {path}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Critical path of one SPRINT trajectory.


@dataclass
class PathTiming:
    """A modelled timeline: its calls in seconds from the start of the problem."""

    schedule: str
    total: float
    phase_ends: list[float] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)


def _tags(counter: Counter, *texts: str) -> int:
    return sum(counter(t) for t in texts)


def critical_path_timeline(
    traj: Trajectory,
    model: LatencyModel,
    counter: Counter,
    schedule: str = "barrier",
    prompt_overhead_tokens: int = 0,
    stop_tags: bool = True,
) -> PathTiming:
    """The timeline of `critical_path`: every call with its start and end.

    Token counts are additive (a prompt counts as the sum of its parts), which is exact for a
    word counter and within a few tokens for a BPE tokenizer. Prompts, as the orchestrator
    builds them (raw layout; chat-template tokens go into `prompt_overhead_tokens` together
    with the agent prompt):

    - planner of phase p: overhead + `<Question>…</Question>` + `<think>` + phases 1..p-1
      rendered + `<Plan_p>`; it generates the plan (prompt tags included: they are tokens the
      model writes) and, when `stop_tags`, the closing `</Plan_p>` that stops it;
    - executor p.k: the planner's prompt + the plan it sees (barrier: the whole `…</Plan_p>`;
      stream: the plan up to its own `</prompt_p.k>`) + `<Execution_p>` + `<execution_p.k>`;
      it generates the execution (+ `</execution_p.k>`);
    - final answer: the planner's prompt after the last phase + `<Final_answer>`; it generates
      the answer (+ `</Final_answer>`).

    In-problem batching (a phase's executors slowing each other) and capacity are ignored:
    this is the lower bound for one problem alone on the GPU; the replay server measures the rest.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    step = model.step(1)
    timing = PathTiming(schedule, 0.0)
    context = prompt_overhead_tokens + counter(render_question(traj.question)) + counter(tags.THINK)
    now = 0.0
    for phase in traj.phases:
        p = phase.number
        planner_prompt = context + counter(tags.plan_open(p))
        plan_tokens = counter(phase.plan)
        close_plan = counter(tags.plan_close(p))
        plan_generated = plan_tokens + (close_plan if stop_tags else 0)
        decode_start = now + model.prefill(planner_prompt)
        plan_end = decode_start + plan_generated * step
        timing.calls.append(CallRecord(PLANNER, p, None, planner_prompt, plan_generated, start=now, end=plan_end))
        phase_end = plan_end
        for prompt in phase.prompts:
            execution = phase.execution(prompt.name)
            exec_tokens = counter(execution.text) if execution else 0
            opening = _tags(counter, tags.executions_open(p), tags.execution_open(prompt.name))
            if schedule == "stream":
                seen = counter(phase.plan[: prompt.end])
                start = decode_start + seen * step
            else:
                seen = plan_tokens + close_plan
                start = plan_end
            exec_prompt = planner_prompt + seen + opening
            generated = exec_tokens + (counter(tags.execution_close(prompt.name)) if stop_tags else 0)
            end = start + model.prefill(exec_prompt) + generated * step
            timing.calls.append(CallRecord(EXECUTOR, p, prompt.name, exec_prompt, generated, start=start, end=end))
            phase_end = max(phase_end, end)
        timing.phase_ends.append(phase_end)
        now = phase_end
        context += counter(phase.render())
    if traj.final_answer is not None:
        final_prompt = context + counter(tags.FINAL)
        generated = counter(traj.final_answer) + (counter(tags.FINAL_END) if stop_tags else 0)
        end = now + model.prefill(final_prompt) + generated * step
        phase = (traj.phases[-1].number if traj.phases else 0) + 1  # the answer comes after the last phase
        timing.calls.append(CallRecord(PLANNER, phase, FINAL, final_prompt, generated, start=now, end=end))
        now = end
    timing.total = now
    return timing


def critical_path(traj: Trajectory, model: LatencyModel, counter: Counter, schedule: str = "barrier", **options: Any) -> float:
    """Lowest wall-clock seconds for one problem under `schedule`, with the GPU to itself.

    barrier: a phase's executors start when its plan is complete. stream: executor p.k starts
    as soon as the planner has written its `</prompt_p.k>`, seeing the plan up to there. Either
    way the next phase starts when the plan is finished and all executions are done.
    `options` (`prompt_overhead_tokens`, `stop_tags`) are those of `critical_path_timeline`.
    """
    return critical_path_timeline(traj, model, counter, schedule, **options).total


class PrioritySlots:
    """At most `capacity` sequences at once; waiting requests are admitted lowest `priority` first,
    then in arrival order: vLLM's `--scheduling-policy priority` queue (requests without a priority
    count as 0, so with none given this is first come, first served). Like vLLM's scheduler when
    its sequence limit is reached, a running request is never preempted."""

    def __init__(self, capacity: int) -> None:
        self.free = capacity
        self._waiting: list[tuple[int, int, asyncio.Future]] = []
        self._order = itertools.count()

    def busy(self) -> bool:
        return self.free <= 0

    async def acquire(self, priority: int = 0) -> None:
        if self.free > 0 and not self._waiting:
            self.free -= 1
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot was handed over just as the waiter left: pass it on
            raise

    def release(self) -> None:
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)  # the slot passes straight to the next waiter
                return
        self.free += 1

    @contextlib.asynccontextmanager
    async def slot(self, priority: int = 0) -> Any:
        await self.acquire(priority)
        try:
            yield
        finally:
            self.release()
