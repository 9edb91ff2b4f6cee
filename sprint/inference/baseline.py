"""The sequential baseline (`sprint baseline`): one generation per problem from a reasoning model,
with the same agent prompt, question text, grading and run-folder layout as `sprint orchestrate`,
so `sprint evaluate --baseline` compares the two problem by problem. Its sequential tokens are the
generation's length.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from sprint.core.calls import BASELINE, CallRecord
from sprint.inference.run import (
    DEFAULT_URL, InferenceOptions, InferenceRun, RoleSampling, add_stage_arguments, answered_call, call_seed,
    failed_call, handle_stage, outcome_fields, problem_fields, request,
)
from sprint.llm.client import Completion, Sampling
from sprint.llm.failures import TRANSIENT_KINDS, LLMError
from sprint.core.options import check_range, option
from sprint.format.prompt_format import THINK, PromptFormat
from sprint.llm.replicas import ReplicaPool
from sprint.tasks.registry import Problem, TaskAdapter
from sprint.format.trajectory import render_question


@dataclass(kw_only=True)
class BaselineConfig(InferenceOptions):
    """`sprint baseline`: one generation per problem from a sequential model."""

    model: str = option(help="served model name", var="MODEL")
    server_url: str = option(DEFAULT_URL, "OpenAI-compatible base URL, or a comma-separated list of replicas "
                             "(each problem on one, by consistent hashing)", var="SERVER_URL")
    temperature: float = option(0.6, "sampling temperature", flags=("--temp",), var="TEMP")
    top_p: float = option(0.95, "nucleus sampling", var="TOP_P")
    max_tokens: int = option(16384, "token budget of the one generation", var="MAX_TOKENS")
    max_problem_workers: int = option(8, "problems in flight", var="MAX_PROBLEM_WORKERS")
    think: bool = option(True, "do not pre-fill <think>\\n", flags=("--no-think",), var="THINK")
    timeout: float = option(1800.0, "seconds per model call (one long generation)", var="TIMEOUT")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range(BaselineConfig, "temperature", self.temperature, low=0)
        check_range(BaselineConfig, "top_p", self.top_p, low=0.001, high=1)


def baseline_text(fmt: PromptFormat, record: dict) -> str:
    """The trajectory file of a baseline problem: question block, the pre-filled `<think>`, the generation."""
    return render_question(record["question"]) + "\n\n" + (THINK if fmt.think else "") + record["generation"]


async def baseline_problem(
    problem: Problem,
    task: TaskAdapter,
    fmt: PromptFormat,
    client: ReplicaPool,
    sampling: RoleSampling,
    seed: int | None,
    problem_retries: int,
) -> dict[str, Any]:
    """One generation for one problem with the same prompt; sequential tokens = its length."""
    endpoint, payload, extra = fmt.request(problem.question, "")
    params = Sampling(
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=call_seed(seed, problem.id, BASELINE),
        extra=extra,
    )
    started = time.time()
    calls: list[CallRecord] = []
    done: Completion | None = None
    failure: LLMError | None = None
    for attempt in range(1, problem_retries + 2):
        t0 = time.time()
        try:
            done = await request(client, endpoint, payload, params, key=problem.id)
            calls.append(answered_call(BASELINE, 0, None, done, run=attempt))
            failure = None
            break
        except LLMError as exc:
            failure = exc
            calls.append(failed_call(BASELINE, 0, None, t0, f"{exc.kind}: {exc}", run=attempt))
            if exc.kind not in TRANSIENT_KINDS or exc.stopped:  # stopped: the circuit breaker refused it
                break
    generation = done.text if done else ""
    predicted = task.extract(generation) if done else None
    record: dict[str, Any] = {
        **problem_fields(problem, task),
        "predicted": predicted,
        "correct": task.grade(predicted, problem.gold) if done else None,
        "generation": generation,
        "finish_reason": done.finish_reason if done else None,
        "prompt_tokens": done.prompt_tokens if done else 0,
        "completion_tokens": done.completion_tokens if done else 0,
        "sequential_tokens": done.completion_tokens if done else 0,
        **outcome_fields(calls, len(calls), started, failure),
    }
    return record


async def _baseline_async(cfg: BaselineConfig, run: InferenceRun, sampling: RoleSampling, progress: bool) -> dict[str, Any]:
    async with cfg.pool(cfg.server_url, cfg.model, cfg.max_problem_workers) as client:
        if run.pending():
            await client.check()

        def solve(problem: Problem) -> Any:
            return baseline_problem(problem, run.task, run.fmt, client, sampling, cfg.seed, cfg.problem_retries)

        def crash_text(problem: Problem) -> dict[str, Any]:
            return {"generation": "", "finish_reason": None, "sequential_tokens": 0}

        await run.solve_all(solve, cfg.max_problem_workers, progress, lambda r: baseline_text(run.fmt, r), crash_text,
                            cfg.timed_problems)
        return client.usage.as_dict()


def baseline(
    cfg: BaselineConfig, *, overwrite: bool = False, retry_failed: bool = True, progress: bool = True
) -> dict[str, Any]:
    """Evaluate a sequential model on the same problems and prompt; returns the summary."""
    sampling = RoleSampling(cfg.temperature, cfg.top_p, cfg.max_tokens)
    run = InferenceRun.open(cfg, "baseline", cfg.model, think=cfg.think, overwrite=overwrite,
                            retry_failed=retry_failed)
    return run.execute(cfg, [(cfg.server_url, cfg.model, cfg.model_path)],
                       lambda: _baseline_async(cfg, run, sampling, progress))


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_stage_arguments(parser, BaselineConfig)


def handle(args: argparse.Namespace) -> int:
    return handle_stage(args, BaselineConfig, baseline)
