"""Stage 4: SPRINT inference, the planner/executor loop per problem (`sprint orchestrate`).

Per problem, phase after phase: the planner continues the trajectory (agent prompt + question +
`<think>\\n` + past phases) until it closes its plan or answers; its plan is normalised by the
trajectory model; each `<prompt_p.k>` goes to its own executor call, all of a phase's executors
at once; their outputs become `<execution_p.k>` blocks; then the next phase. At phase
`max_phases` the answer is forced by pre-filling `<Final_answer>\\n`.

Choices this module makes:
- The planner is not given `<Plan_p>`: it writes it (or `<Final_answer>`) itself, as in training.
  Its stop strings are tag *prefixes* (`</Plan_`, `<Execution_`), so a wrongly numbered tag
  still ends the call; the trajectory model renumbers everything.
- A planner call that hits its token limit (finish_reason "length") is redrawn with a new seed up
  to `planner_length_retries` times (not at temperature 0, where a redraw is identical); the last
  draw is then kept truncated (the open prompt is closed) and the run goes on.
- A planner that writes neither a plan nor an answer (EOS or `</think>` at once) is asked for
  the answer right away (counted as a forced final answer).
- A `<Final_answer>` written inside a plan ends the problem; the plan before it is kept as the last
  phase and its prompts are still executed, so the stored trajectory is well formed.
- Executor calls failing with a transient error are retried `executor_retries` times (each call
  also has the client's own HTTP retries); then the problem is retried as a whole up to
  `problem_retries` times; then it is recorded as `status: "error"` (`retryable` when transient,
  so re-running the command redoes it). A failure never stops the other problems.
- An unexpected exception while solving one problem (a bug, a surprise in grading) is recorded
  as `status: "crashed"` (retryable) and the run goes on; only a UserError stops it.
- Responses are cached on disk (default OUT_DIR/llm_cache, `--no-cache` to switch off), so a
  resumed run does not pay again for calls answered before a crash. Per-call seeds come from
  `--seed`, so the cache replays the same samples; another seed draws new ones.

Two schedules (`--schedule`, see sprint/inference/schedule.py): barrier (default; what the authors' reference
code does) starts a phase's executors when its plan is complete; stream (what the paper's text
describes) starts each as soon as its `</prompt_p.k>` is written, seeing the plan up to there.
The stored trajectory has the same layout in both.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

from sprint.core.calls import EXECUTOR, FINAL, PLANNER, CallRecord
from sprint.core.errors import UserError
from sprint.inference.run import (
    DEFAULT_URL, InferenceOptions, InferenceRun, RoleSampling, add_stage_arguments, answered_call, call_seed,
    failed_call, handle_stage, is_transient, outcome_fields, problem_fields, request,
)
from sprint.llm.client import Completion, OnText, Sampling
from sprint.llm.failures import TRANSIENT_KINDS, LLMError
from sprint.core.options import check_range, option
from sprint.format.prompt_format import EXECUTOR_STOPS, FINAL_OPEN, FINAL_STOPS, PLANNER_STOPS, PromptFormat
from sprint.llm.replicas import ReplicaPool
from sprint.inference.schedule import Dispatch, check_schedule, make_dispatch, schedule_names
from sprint.tasks.registry import Problem, TaskAdapter
from sprint.format.trajectory import Execution, Phase, Prompt, Trajectory, normalize_plan, open_execution

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class LoopSettings:
    """Everything the per-problem loop needs besides the clients (built by OrchestrationConfig)."""

    planner: RoleSampling
    executor: RoleSampling
    final_max_tokens: int  # the forced final answer (planner sampling otherwise)
    max_phases: int
    planner_length_retries: int
    executor_retries: int
    problem_retries: int
    seed: int | None  # per-call seeds derive from it; None: let the server choose
    schedule: str  # when a phase's executors start (sprint.inference.schedule)
    priority: bool = False  # send vLLM's per-request `priority` (call_priority)

    def __post_init__(self) -> None:
        if self.max_phases < 1:
            raise UserError(f"max phases must be at least 1, got {self.max_phases}")
        check_schedule(self.schedule)
        if min(self.planner_length_retries, self.problem_retries) < 0 or self.executor_retries < 1:
            raise UserError("retry counts must be >= 0 (executor retries >= 1)")


@dataclass(kw_only=True)
class OrchestrationConfig(InferenceOptions):
    """Everything `sprint orchestrate` takes; stored as the run's manifest config."""

    planner_model: str = option(help="served model name of the planner", var="PLANNER_MODEL")
    planner_server_url: str = option(DEFAULT_URL, "OpenAI-compatible base URL of the planner; a comma-separated "
                                     "list of replicas: each problem's calls go to one (consistent hashing)",
                                     flags=("--planner-url", "--planner-server-url"), var="PLANNER_SERVER_URL")
    executor_model: str | None = option(None, "served model name of the executors (default: the planner model)",
                                        var="EXECUTOR_MODEL")
    executor_server_url: str | None = option(None, "base URL(s) of the executors, comma-separated (default: the "
                                             "planner's)",
                                             flags=("--executor-url", "--executor-server-url"),
                                             var="EXECUTOR_SERVER_URL")
    planner_temperature: float = option(0.6, "planner sampling temperature", flags=("--planner-temp",),
                                        var="PLANNER_TEMP")
    planner_top_p: float = option(0.95, "planner nucleus sampling", var="PLANNER_TOP_P")
    planner_max_tokens: int = option(1000, "token limit of one plan; longer plans are redrawn",
                                     var="PLANNER_OUTPUT_TOKEN_LIMIT")
    planner_length_retries: int = option(2, "redraws of a plan cut at the limit (none at temperature 0)",
                                         var="PLANNER_LENGTH_RETRIES")
    executor_temperature: float = option(0.6, "executor sampling temperature", flags=("--executor-temp",),
                                         var="EXECUTOR_TEMP")
    executor_top_p: float = option(0.95, "executor nucleus sampling", var="EXECUTOR_TOP_P")
    executor_retries: int = option(3, "tries of an executor call on transient failures", var="EXECUTOR_RETRIES")
    max_tokens: int = option(4096, "token budget of each executor call and of the final answer", var="MAX_TOKENS")
    max_phases: int = option(12, "phase at which the final answer is forced", var="MAX_PHASES")
    max_problem_workers: int = option(5, "problems in flight", var="MAX_PROBLEM_WORKERS")
    max_execution_workers: int = option(5, "executor calls in flight, over all problems", var="MAX_EXECUTION_WORKERS")
    schedule: str = option(schedule_names()[0], "barrier: executors start when the plan is complete (the authors' "
                           "code); stream: each starts as soon as its </prompt_p.k> is written, seeing the plan up "
                           "to there", choices=schedule_names(), var="SCHEDULE")
    timeout: float = option(600.0, "seconds per model call", var="TIMEOUT")
    priority: bool = option(False, "send vLLM's per-request priority (servers started with --scheduling-policy "
                            "priority): planner calls first, then the executors of the oldest problems",
                            var="PRIORITY")

    def __post_init__(self) -> None:
        self.executor_model = self.executor_model or self.planner_model
        self.executor_server_url = self.executor_server_url or self.planner_server_url
        super().__post_init__()
        check_range(OrchestrationConfig, "max_execution_workers", self.max_execution_workers, low=1)
        for name, low in (("max_phases", 1), ("planner_max_tokens", 1), ("executor_retries", 1),
                          ("planner_length_retries", 0), ("planner_temperature", 0), ("executor_temperature", 0)):
            check_range(OrchestrationConfig, name, getattr(self, name), low=low)
        for name in ("planner_top_p", "executor_top_p"):
            check_range(OrchestrationConfig, name, getattr(self, name), low=0.001, high=1)
        check_schedule(self.schedule)

    def settings(self) -> LoopSettings:
        return LoopSettings(
            planner=RoleSampling(self.planner_temperature, self.planner_top_p, self.planner_max_tokens),
            executor=RoleSampling(self.executor_temperature, self.executor_top_p, self.max_tokens),
            final_max_tokens=self.max_tokens,
            max_phases=self.max_phases,
            planner_length_retries=self.planner_length_retries,
            executor_retries=self.executor_retries,
            problem_retries=self.problem_retries,
            seed=self.seed,
            schedule=self.schedule,
            priority=self.priority,
        )


# ---------------------------------------------------------------------------------------------
# One problem


def call_priority(rank: int, role: str) -> int:
    """vLLM's `priority` of a call (lower is served earlier). Planner calls first: each is alone on
    its problem's critical path and holds up all of the next phase. Then executors by their
    problem's start order (`rank`), the oldest first, so under load the problems begun earliest
    finish first instead of all together at the end (benchmarks/bench_priority.py)."""
    return 0 if role == PLANNER else 1 + rank


class StepFailed(Exception):
    """A planner or executor call that failed for good; `kind` is the LLM error kind."""

    def __init__(self, what: str, error: LLMError, tries: int) -> None:
        times = "once" if tries == 1 else f"{tries} times"
        super().__init__(f"{what} failed {times}: {error.kind}: {error}")
        self.kind = error.kind
        self.stopped = error.stopped  # refused by the circuit breaker: no retry of the problem


@dataclass
class ProblemOutcome:
    trajectory: Trajectory
    forced_final: bool
    truncated_plans: int
    context_full: bool = False  # the trajectory outgrew the model's context: it ends there, unanswered


class ProblemRun:
    """The planner/executor loop for one problem; keeps every call it made, failed ones included."""

    def __init__(
        self,
        problem: Problem,
        fmt: PromptFormat,
        planner: ReplicaPool,
        executor: ReplicaPool,
        settings: LoopSettings,
        executor_slots: asyncio.Semaphore,
        rank: int = 0,
    ) -> None:
        self.rank = rank  # the order this problem started in (call_priority)
        self.problem = problem
        self.fmt = fmt
        self.planner = planner
        self.executor = executor
        self.settings = settings
        self.executor_slots = executor_slots
        self.calls: list[CallRecord] = []
        self.run_number = 1
        self.trajectory = Trajectory(problem.question)
        self.truncated = 0  # plans cut at their token limit, this run

    async def _call(
        self,
        role: str,
        continuation: str,
        stop: tuple[str, ...],
        sampling: RoleSampling,
        phase: int,
        prompt: str | None,
        draw: int,
        max_tokens: int | None = None,
        on_text: OnText | None = None,
        sink: list[CallRecord] | None = None,
    ) -> tuple[Completion, CallRecord]:
        """One model call, recorded in `self.calls` (and `sink`) whatever its outcome."""
        client = self.planner if role == PLANNER else self.executor
        endpoint, payload, extra = self.fmt.request(self.problem.question, continuation)
        params = Sampling(
            max_tokens=max_tokens or sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            stop=stop,
            seed=call_seed(self.settings.seed, self.problem.id, role, phase, prompt, draw),
            extra=extra,
        )
        body = {"priority": call_priority(self.rank, role)} if self.settings.priority else None
        started = time.time()
        try:
            done = await request(client, endpoint, payload, params, on_text, key=self.problem.id, body=body)
        except (LLMError, asyncio.CancelledError) as exc:
            error = f"{exc.kind}: {exc}" if isinstance(exc, LLMError) else "cancelled"
            record = failed_call(role, phase, prompt, started, error, draw, self.run_number)
            self.calls.append(record)
            if sink is not None:
                sink.append(record)
            raise
        record = answered_call(role, phase, prompt, done, draw, self.run_number)
        self.calls.append(record)
        if sink is not None:
            sink.append(record)
        return done, record

    async def _plan(self, context: str, phase: int, dispatch: Dispatch) -> tuple[str, bool]:
        """Raw planner text for `phase` and whether it was cut at the token limit.

        The call is streamed when the schedule listens (`dispatch.on_text`), so executors start on the way.
        """
        s = self.settings
        draws = 1 + (s.planner_length_retries if s.planner.temperature > 0 else 0)
        for draw in range(1, draws + 1):
            try:
                done, record = await self._call(PLANNER, context, PLANNER_STOPS, s.planner, phase, None, draw,
                                                on_text=dispatch.on_text)
            except LLMError as exc:
                raise StepFailed(f"planner call of phase {phase}", exc, 1) from None
            if done.finish_reason != "length":
                return done.text, False
            if draw < draws:
                record.kept = False
                dispatch.redraw()
        return done.text, True

    async def _final(self, context: str, phase: int) -> str:
        try:
            done, _ = await self._call(
                PLANNER, context + FINAL_OPEN, FINAL_STOPS, self.settings.planner, phase, FINAL, 1,
                max_tokens=self.settings.final_max_tokens,
            )
        except LLMError as exc:
            raise StepFailed("forced final answer", exc, 1) from None
        return done.text.strip()

    async def _execute(self, head: str, phase: int, prompt: Prompt, sink: list[CallRecord] | None = None) -> Execution:
        """One executor: it sees the plan of this phase and continues `<execution_p.k>`."""
        continuation = head + open_execution(prompt.name)
        tries = self.settings.executor_retries
        for draw in range(1, tries + 1):
            async with self.executor_slots:
                try:
                    done, _ = await self._call(
                        EXECUTOR, continuation, EXECUTOR_STOPS, self.settings.executor, phase, prompt.name, draw,
                        sink=sink,
                    )
                    return Execution(prompt.name, done.text.strip())
                except LLMError as exc:
                    if exc.kind not in TRANSIENT_KINDS or exc.stopped or draw == tries:
                        raise StepFailed(f"executor {prompt.name}", exc, draw) from None
        raise AssertionError("unreachable")

    async def run(self) -> ProblemOutcome:
        """The loop; a call refused because the trajectory no longer fits the model's context ends the problem
        unanswered (graded wrong, as a sequential generation cut at its token limit), not as a failed run."""
        try:
            return await self._loop()
        except StepFailed as exc:
            if exc.kind != "context_length":
                raise
            log.info("problem %s: %s; it ends unanswered", self.problem.id, exc)
            return ProblemOutcome(self.trajectory, False, self.truncated, context_full=True)

    async def _loop(self) -> ProblemOutcome:
        s = self.settings
        traj = self.trajectory = Trajectory(self.problem.question)
        self.truncated = 0
        for p in range(1, s.max_phases + 1):
            context = traj.render_context()
            if p == s.max_phases:
                traj.final_answer = await self._final(context, p)
                return ProblemOutcome(traj, True, self.truncated)
            dispatch = make_dispatch(s.schedule, self._execute, context, p)
            try:
                raw, cut = await self._plan(context, p, dispatch)
                self.truncated += cut
                out = normalize_plan(raw, p)
                if out.final_answer is None and not out.plan:
                    # nothing usable (EOS or </think> straight away): ask for the answer now
                    traj.final_answer = await self._final(context, p)
                    return ProblemOutcome(traj, True, self.truncated)
                if out.plan:
                    phase = Phase(p, out.plan)
                    phase.executions = await dispatch.collect(out.plan)
                    traj.phases.append(phase)
            finally:
                await dispatch.close()
            if out.final_answer is not None:
                traj.final_answer = out.final_answer
                return ProblemOutcome(traj, False, self.truncated)
        raise AssertionError("unreachable: the last phase always answers")


async def solve_problem(
    problem: Problem,
    task: TaskAdapter,
    fmt: PromptFormat,
    planner: ReplicaPool,
    executor: ReplicaPool,
    settings: LoopSettings,
    executor_slots: asyncio.Semaphore,
    rank: int = 0,
) -> dict[str, Any]:
    """Run the loop for one problem (with problem-level retries) and build its record."""
    runner = ProblemRun(problem, fmt, planner, executor, settings, executor_slots, rank)
    started = time.time()
    outcome: ProblemOutcome | None = None
    failure: BaseException | None = None
    for attempt in range(1, settings.problem_retries + 2):
        runner.run_number = attempt
        try:
            outcome = await runner.run()
            failure = None
            break
        except (StepFailed, LLMError) as exc:
            failure = exc
            if not is_transient(exc) or attempt > settings.problem_retries:
                break
            log.warning("problem %s: %s; retrying the problem (%d/%d)", problem.id, exc, attempt, settings.problem_retries)
    traj = outcome.trajectory if outcome else runner.trajectory
    predicted = traj.answer() if outcome else None
    record: dict[str, Any] = {
        **problem_fields(problem, task),
        "predicted": predicted,
        "correct": task.grade(predicted, problem.gold) if outcome else None,
        "trajectory": traj.render(),
        "num_phases": len(traj.phases),
        "num_prompts": traj.prompt_count,
        "forced_final": outcome.forced_final if outcome else None,
        "truncated_plans": outcome.truncated_plans if outcome else None,
        "context_full": outcome.context_full if outcome else None,
        "prompt_tokens": sum(c.prompt_tokens for c in runner.calls),
        "completion_tokens": sum(c.completion_tokens for c in runner.calls),
        **outcome_fields(runner.calls, runner.run_number, started, failure),
    }
    return record


# ---------------------------------------------------------------------------------------------
# The stage


async def _orchestrate_async(cfg: OrchestrationConfig, run: InferenceRun, progress: bool) -> dict[str, Any]:
    settings = cfg.settings()
    planner_pool = cfg.pool(cfg.planner_server_url, cfg.planner_model, cfg.max_problem_workers)
    executor_pool = cfg.pool(str(cfg.executor_server_url), str(cfg.executor_model), cfg.max_execution_workers)
    async with planner_pool as planner, executor_pool as executor:
        if run.pending():
            await planner.check()
            await executor.check()
        slots = asyncio.Semaphore(cfg.max_execution_workers)
        ranks = itertools.count()  # problems in the order they start (call_priority)

        def solve(problem: Problem) -> Any:
            return solve_problem(problem, run.task, run.fmt, planner, executor, settings, slots, next(ranks))

        def crash_text(problem: Problem) -> dict[str, Any]:
            return {"trajectory": Trajectory(problem.question).render(), "num_phases": 0, "num_prompts": 0,
                    "forced_final": None, "truncated_plans": None}

        await run.solve_all(solve, cfg.max_problem_workers, progress, lambda record: record["trajectory"], crash_text,
                            cfg.timed_problems)
        planner_usage, executor_usage = planner.usage.as_dict(), executor.usage.as_dict()
        if len(planner.replicas) > 1 or len(executor.replicas) > 1:
            planner_usage["routing"], executor_usage["routing"] = planner.stats(), executor.stats()
    return {
        "planner": planner_usage,
        "executor": executor_usage,
        "prompt_tokens": planner_usage["prompt_tokens"] + executor_usage["prompt_tokens"],
        "completion_tokens": planner_usage["completion_tokens"] + executor_usage["completion_tokens"],
    }


def orchestrate(
    cfg: OrchestrationConfig, *, overwrite: bool = False, retry_failed: bool = True, progress: bool = True
) -> dict[str, Any]:
    """Run SPRINT inference over a dataset into `cfg.out_dir`; returns the summary (also in the manifest)."""
    run = InferenceRun.open(cfg, "orchestrate", cfg.planner_model, overwrite=overwrite, retry_failed=retry_failed)
    targets = [(cfg.planner_server_url, cfg.planner_model, cfg.model_path)]
    if cfg.executor_model == cfg.planner_model:
        targets.append((str(cfg.executor_server_url), str(cfg.executor_model), cfg.model_path))
    return run.execute(cfg, targets, lambda: _orchestrate_async(cfg, run, progress))


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_stage_arguments(parser, OrchestrationConfig)


def handle(args: argparse.Namespace) -> int:
    return handle_stage(args, OrchestrationConfig, orchestrate)
