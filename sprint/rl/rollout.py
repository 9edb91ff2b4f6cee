"""One SPRINT rollout for GRPO: the orchestration loop run against a rollout engine.

There is no second planner/executor loop here. `solve_problem` (sprint.inference.orchestration) runs with
the same prompt format, stop strings, phase limit, forced final answer and schedule as
`sprint orchestrate`; only its client is different: `EngineClient` answers the loop's chat calls
with an async `generate(messages, sampling)` (ms-swift's `infer_engine.infer_async` inside
`swift rollout`, a scripted engine in tests) and keeps, for each call, what the trainer needs:
the messages the model continued, the generated token ids and their logprobs.

Rollout choices (they differ from `sprint orchestrate` on purpose, for on-policy training):
- the chat format: the user turn rendered by the policy's template (ms-swift applies it), the
  assistant turn continued from `<think>\\n` + past phases, exactly what SFT trained on;
- no per-call seeds (`seed=None`): the GRPO group's generations of one prompt must differ;
- no redraws: a plan cut at the token limit is kept (closed) rather than redrawn, and a failing
  call ends the trajectory (status error, zero correctness), so every generated token belongs to
  the trajectory that is rewarded;
- sampling temperature/top_p are the trainer's (`swift rlhf --temperature`); token limits, the
  phase limit and the schedule come from `RolloutConfig` (environment variables of the
  `swift rollout` process, since ms-swift gives a scheduler no other configuration channel).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sprint.core.calls import EXECUTOR, PLANNER, CallRecord
from sprint.core.errors import UserError
from sprint.inference.run import RoleSampling
from sprint.llm.client import Completion, OnText, Sampling
from sprint.llm.failures import LLMError
from sprint.core.options import option
from sprint.inference.orchestration import LoopSettings, solve_problem
from sprint.format.prompt_format import PromptFormat, load_agent_prompt
from sprint.rl.rewards import decode_gold, trajectory_infos
from sprint.inference.schedule import check_schedule, schedule_names
from sprint.tasks.registry import Problem, get_task

Counter = Callable[[str], int]


@dataclass
class RolloutConfig:
    """How the rollout server runs the loop; each field is read from its environment variable."""

    max_phases: int = option(12, "phase limit; the answer is forced at this phase (the paper's 12); "
                             "`swift rollout --max_turns N` overrides it", var="SPRINT_RL_MAX_PHASES")
    planner_max_tokens: int = option(1000, "token limit of one planner call (as `sprint orchestrate`)",
                                     var="SPRINT_RL_PLANNER_MAX_TOKENS")
    executor_max_tokens: int = option(4096, "token limit of one executor call", var="SPRINT_RL_EXECUTOR_MAX_TOKENS")
    final_max_tokens: int = option(4096, "token limit of the forced final answer", var="SPRINT_RL_FINAL_MAX_TOKENS")
    schedule: str = option("barrier", "when a phase's executors start (sprint.inference.schedule); the engine does not "
                           "stream, so `stream` starts them when the plan ends, with the stream layout",
                           choices=schedule_names(), var="SPRINT_RL_SCHEDULE")
    agent_prompt: str | None = option(None, "agent prompt file (default prompts/agent.txt; `none`: no agent "
                                      "prompt); must be the one the policy was fine-tuned with",
                                      var="SPRINT_RL_AGENT_PROMPT")
    executor_concurrency: int = option(64, "executor calls in flight per trajectory",
                                       var="SPRINT_RL_EXECUTOR_CONCURRENCY")

    def __post_init__(self) -> None:
        for name in ("max_phases", "planner_max_tokens", "executor_max_tokens", "final_max_tokens",
                     "executor_concurrency"):
            if getattr(self, name) < 1:
                raise UserError(f"{_var(name)} must be at least 1, got {getattr(self, name)}")
        check_schedule(self.schedule)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RolloutConfig:
        """Defaults from the dataclass, each replaced by its variable when set, then `overrides`."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(f.metadata["var"])
            if raw in (None, ""):
                continue
            if f.type in ("int", int):
                try:
                    values[f.name] = int(raw)
                except ValueError:
                    raise UserError(f"{f.metadata['var']} must be an integer, got {raw!r}") from None
            else:
                values[f.name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def loop_settings(self, temperature: float, top_p: float) -> LoopSettings:
        return LoopSettings(
            planner=RoleSampling(temperature, top_p, self.planner_max_tokens),
            executor=RoleSampling(temperature, top_p, self.executor_max_tokens),
            final_max_tokens=self.final_max_tokens,
            max_phases=self.max_phases,
            planner_length_retries=0,
            executor_retries=1,
            problem_retries=0,
            seed=None,
            schedule=self.schedule,
        )

    def prompt_format(self) -> PromptFormat:
        return PromptFormat(agent_prompt=load_agent_prompt(self.agent_prompt), mode="chat", api="chat", think=True)


def _var(name: str) -> str:
    return next(f.metadata["var"] for f in dataclasses.fields(RolloutConfig) if f.name == name)


@dataclass
class Generation:
    """What an engine returns for one call."""

    text: str  # without the stop string (as vLLM's text)
    token_ids: list[int]  # every sampled token (a stop string's tokens included, as vLLM returns them)
    finish_reason: str | None
    prompt_tokens: int
    logprobs: list[float] = field(default_factory=list)  # one per sampled token, or empty
    raw: Any = None  # the engine's own response (ms-swift's ChatCompletionResponse)


@dataclass
class CallSample:
    """One model call of a rollout as the trainer needs it: what the model continued, what it
    sampled, and the loop's record of the call (attached once the loop has recorded it)."""

    messages: list[dict[str, str]]  # what the model continued: user turn (+ the assistant text so far)
    prefix: str  # the assistant text before the generation (prompt context, no loss)
    generation: Generation
    call: CallRecord | None = None  # role, phase, prompt (p.k, or FINAL for a forced final answer), …

    @property
    def role(self) -> str:
        return self.call.role if self.call else ""

    @property
    def phase(self) -> int:
        return self.call.phase if self.call else 0

    @property
    def prompt(self) -> str | None:
        return self.call.prompt if self.call else None


def without_stop(text: str, finish_reason: str | None, stops: tuple[str, ...] | list[str]) -> str:
    """The text as vLLM's own API returns it: cut before the first stop string. ms-swift decodes
    every sampled token instead, so a call that stopped carries the stop string, and the whole token
    that held it (`</Plan_` ends inside the one token `</Plan_1>` of a tokenizer with tag tokens);
    the loop, which writes the closing tags itself, would then write them twice."""
    if finish_reason != "stop":
        return text
    cuts = [i for i in (text.find(stop) for stop in stops if stop) if i >= 0]
    return text[: min(cuts)] if cuts else text


Generate = Callable[[list[dict[str, str]], Sampling], Awaitable[Generation]]


class EngineClient:
    """The loop's client (`chat` like `sprint.llm.client.LLMClient.chat`) answering through `generate`.

    Every successful call is kept in `samples`, in the order the loop records its calls (the loop
    appends its record right after the call returns, with no await in between).
    """

    def __init__(self, generate: Generate) -> None:
        self.generate = generate
        self.samples: list[CallSample] = []

    async def chat(self, messages: list[dict], sampling: Sampling, on_text: OnText | None = None) -> Completion:
        started = time.time()
        try:
            gen = await self.generate([dict(m) for m in messages], sampling)
        except (LLMError, asyncio.CancelledError):
            raise
        except Exception as exc:  # the engine's own failure: the trajectory ends with status error
            raise LLMError("server_error", f"rollout engine failed: {type(exc).__name__}: {exc}") from exc
        prefix = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
        self.samples.append(CallSample([dict(m) for m in messages], prefix, gen))
        if on_text is not None:
            on_text(gen.text)
        return Completion(
            text=gen.text, finish_reason=gen.finish_reason, stop_reason=None, prompt_tokens=gen.prompt_tokens,
            completion_tokens=len(gen.token_ids), cached=False, start=started, end=time.time(), attempts=1,
        )

    async def complete(self, prompt: str, sampling: Sampling, on_text: OnText | None = None) -> Completion:
        raise UserError("RL rollouts use the chat format (the policy's own template); raw prompts are not supported")


@dataclass
class Rollout:
    record: dict[str, Any]  # solve_problem's record (the same as a `sprint orchestrate` record)
    samples: list[CallSample]  # every successful call, planner and executors
    infos: dict[str, Any]  # the trajectory facts and token accounting (rollout_infos)


def problem_from_row(row: Mapping[str, Any]) -> Problem:
    """The problem of one training row (columns written by sprint.rl.grpo_data)."""
    missing = [c for c in ("question", "gold", "task") if row.get(c) in (None, "")]
    if missing:
        raise UserError(f"a training row lacks {', '.join(missing)} (columns: {', '.join(sorted(row))}); build "
                        "the data with `python -m sprint.rl.grpo_data` and pass --vllm_server_pass_dataset true "
                        "to swift rlhf")
    return Problem(id=str(row.get("problem_id", "")), index=int(row.get("index", 0) or 0),
                   question=str(row["question"]), gold=decode_gold(row["gold"]))


async def run_rollout(row: Mapping[str, Any], config: RolloutConfig, generate: Generate, count: Counter,
                      temperature: float, top_p: float) -> Rollout:
    """Solve one training row with the orchestration loop; the calls and facts for the trainer."""
    problem = problem_from_row(row)
    task = get_task(str(row["task"]))
    client = EngineClient(generate)
    record = await solve_problem(problem, task, config.prompt_format(), client, client,
                                 config.loop_settings(temperature, top_p),
                                 asyncio.Semaphore(config.executor_concurrency))
    answered = [c for c in record["calls"] if c["error"] is None]
    if len(answered) != len(client.samples):
        raise AssertionError(f"{len(answered)} successful calls recorded, {len(client.samples)} answered")
    for call, sample in zip(answered, client.samples):
        sample.call = CallRecord.from_dict(call)
    infos = trajectory_infos(record["trajectory"], count, status=record["status"],
                             forced_final=record["forced_final"])
    infos.update({
        "problem_id": problem.id,
        "error": record["error"],
        "num_turns": len(client.samples),  # ms-swift logs it; here: model calls of the trajectory
        "planner_calls": sum(s.role == PLANNER for s in client.samples),
        "executor_calls": sum(s.role == EXECUTOR for s in client.samples),
        "generated_tokens": sum(len(s.generation.token_ids) for s in client.samples),
    })
    return Rollout(record, client.samples, infos)


def token_counter(tokenizer: Any) -> Counter:
    """Tokens of a text for the policy's tokenizer (a transformers tokenizer), no special tokens."""
    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0

    return count
