"""Stage 4: SPRINT inference (planner/executor orchestration) and the sequential baseline.

Per problem, phase after phase: the planner continues the trajectory (agent prompt + question +
`<think>\\n` + past phases) until it closes its plan or answers; its plan is normalised by the
trajectory model; each `<prompt_p.k>` goes to its own executor call, all of a phase's executors
at once; their outputs become `<execution_p.k>` blocks; then the next phase. At phase
`max_phases` the answer is forced by pre-filling `<Final_answer>\\n`.

Choices this module makes (documented in the CLI help as well):
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

Two schedules (`--schedule`):
- barrier (default; what the authors' reference code does): a phase's executors start when its
  plan is complete, and each sees the whole plan `<Plan_p>…</Plan_p>`.
- stream (what the paper's text describes): the planner call is streamed and executor p.k starts
  as soon as its prompt is settled in the text generated so far (see `settled_prompts`). Its
  context is the past phases + `<Plan_p>\n` + the normalised plan up to and including its own
  `</prompt_p.k>` + `\n\n<Execution_p>\n<execution_p.k>\n`: no `</Plan_p>` (the plan is not
  finished) and none of the later prompts. Every executor of the phase gets this context, also
  one started only when the plan ends (a prompt cut by the token limit, a cache hit), so the
  requests depend on the final plan only, never on timing. A planner stream that restarts (the
  client retried a dropped stream) keeps the executors whose plan prefix the new text repeats and
  cancels the others once it diverges; a plan redrawn for length cancels them all. The stored
  trajectory has the same layout in both schedules.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sprint.data import resolve_local, safe_id
from sprint.errors import UserError
from sprint.latency import SCHEDULES
from sprint.llm import TRANSIENT_KINDS, Completion, LLMClient, LLMConfig, LLMError, OnText, Sampling
from sprint.records import RunDir
from sprint.stage import crash_record, resolve_cache_dir
from sprint.tasks import TASK_NAMES, Problem, TaskAdapter, get_task, load_problems
from sprint.trajectory import Execution, Phase, Prompt, Trajectory, normalize_plan, render_question

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
AGENT_PROMPT_PATH = REPO_ROOT / "prompts" / "agent.txt"
THINK = "<think>\n"
FINAL_OPEN = "<Final_answer>\n"
PROMPT_MODES = ("chat", "raw")
APIS = ("completions", "chat")
DEFAULT_URL = "http://127.0.0.1:8000/v1"

# At most 4 stop strings per request (vLLM rejects more). Prefixes catch wrongly numbered tags.
PLANNER_STOPS = ("</Plan_", "<Execution_", "</Final_answer>", "</think>")
EXECUTOR_STOPS = ("</execution_", "<execution_", "</Execution_", "<Plan_")
FINAL_STOPS = ("</Final_answer>", "</think>")
# vLLM's chat endpoint: continue the last (assistant) message instead of opening a new turn.
CONTINUE_EXTRA = (("add_generation_prompt", False), ("continue_final_message", True))


# ---------------------------------------------------------------------------------------------
# What the model is sent


def load_agent_prompt(path: str | Path | None = None) -> str:
    """The agent prompt (prompts/agent.txt unless `path`); "none" means no agent prompt at all."""
    if path is not None and str(path).lower() == "none":
        return ""
    p = Path(path) if path is not None else AGENT_PROMPT_PATH
    try:
        return p.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UserError(f"cannot read the agent prompt {p} ({exc.strerror}); pass --agent-prompt PATH") from None


def _with_think(text: str) -> str:
    """End the generation prompt with exactly one `<think>\\n` (R1 templates already add it)."""
    if text.endswith(THINK):
        return text
    if text.endswith("<think>"):
        return text + "\n"
    return text + THINK


def load_chat_template(tokenizer: str) -> Callable[[str], str]:
    """A function rendering one user turn with the model's chat template plus the generation prompt.

    The rendered text goes to /v1/completions, whose tokenizer adds BOS itself; so a BOS that the
    template writes is removed when the tokenizer would add one anyway (no double BOS).
    """
    from transformers import AutoTokenizer

    local = resolve_local(tokenizer)
    source = str(local) if local is not None else tokenizer
    try:
        tok = AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # missing folder, no hub access, broken files
        raise UserError(
            f"cannot load the tokenizer {tokenizer!r} for the chat template ({type(exc).__name__}); "
            "pass --tokenizer DIR (a folder with tokenizer_config.json), or --prompt-mode raw"
        ) from None
    if not getattr(tok, "chat_template", None):
        raise UserError(f"tokenizer {tokenizer!r} has no chat template; pass another --tokenizer or use --prompt-mode raw")
    bos = tok.bos_token or ""
    ids = tok("x").input_ids if bos else []
    strip_bos = bool(bos) and bool(ids) and ids[0] == tok.bos_token_id

    def render(user_turn: str) -> str:
        text = tok.apply_chat_template(
            [{"role": "user", "content": user_turn}], tokenize=False, add_generation_prompt=True
        )
        if strip_bos and text.startswith(bos):
            text = text[len(bos):]
        return text

    return render


@dataclass
class PromptFormat:
    """How a request is built from a question and the assistant text generated so far.

    mode "chat": the user turn rendered with the model's chat template (what it was trained on);
    mode "raw": the authors' inference format, agent prompt + question + `<think>\\n` with no
    template. api "chat" sends messages to /v1/chat/completions with the assistant turn continued
    (vLLM's `continue_final_message`), for servers that only render templates themselves.
    """

    agent_prompt: str
    mode: str = "raw"
    api: str = "completions"
    template: Callable[[str], str] | None = None  # user turn -> rendered text (chat mode, completions)
    think: bool = True  # start the assistant turn with `<think>\n`

    def __post_init__(self) -> None:
        if self.mode not in PROMPT_MODES:
            raise UserError(f"unknown prompt mode {self.mode!r}; use chat or raw")
        if self.api not in APIS:
            raise UserError(f"unknown API {self.api!r}; use completions or chat")
        if self.api == "chat" and self.mode == "raw":
            raise UserError("--api chat always applies the server's chat template; use --prompt-mode chat with it")
        if self.api == "completions" and self.mode == "chat" and self.template is None:
            raise UserError("prompt mode chat needs the model's chat template; pass --tokenizer or use --prompt-mode raw")

    def user_turn(self, question: str) -> str:
        """The user message the model was fine-tuned on (packing renders the same one)."""
        if not self.agent_prompt:
            return render_question(question) + "\n\n"
        from sprint.packing import sft_user_content

        return sft_user_content(self.agent_prompt, question)

    def head(self, question: str) -> str:
        """The completions text before the assistant's own output."""
        if self.mode == "raw":
            return self.user_turn(question) + (THINK if self.think else "")
        assert self.template is not None
        text = self.template(self.user_turn(question))
        return _with_think(text) if self.think else text

    def request(self, question: str, continuation: str) -> tuple[str, Any, tuple]:
        """(endpoint, payload, extra params) for a call continuing the assistant text `continuation`."""
        if self.api == "completions":
            return "completions", self.head(question) + continuation, ()
        messages: list[dict[str, str]] = [{"role": "user", "content": self.user_turn(question)}]
        assistant = (THINK if self.think else "") + continuation
        if not assistant:
            return "chat", messages, ()
        messages.append({"role": "assistant", "content": assistant})
        return "chat", messages, CONTINUE_EXTRA


def build_prompt_format(
    mode: str, api: str, tokenizer: str | None, agent_prompt: str, think: bool = True
) -> PromptFormat:
    template = None
    if mode == "chat" and api == "completions":
        if not tokenizer:
            raise UserError("prompt mode chat needs a tokenizer; pass --tokenizer (or --model-path) or use --prompt-mode raw")
        template = load_chat_template(tokenizer)
    return PromptFormat(agent_prompt=agent_prompt, mode=mode, api=api, template=template, think=think)


# ---------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class RoleSampling:
    """Per-role sampling: how hot and how long."""

    temperature: float = 0.6
    top_p: float = 0.95
    max_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise UserError(f"max tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise UserError(f"bad sampling: temperature {self.temperature} (>= 0), top_p {self.top_p} (in (0, 1])")


@dataclass(frozen=True)
class LoopSettings:
    """Everything the per-problem loop needs besides the clients."""

    planner: RoleSampling = field(default_factory=lambda: RoleSampling(max_tokens=1000))
    executor: RoleSampling = field(default_factory=RoleSampling)
    final_max_tokens: int = 4096  # the forced final answer (planner sampling otherwise)
    max_phases: int = 12
    planner_length_retries: int = 2
    executor_retries: int = 3
    problem_retries: int = 1
    seed: int | None = 0  # per-call seeds derive from it; None: let the server choose
    schedule: str = "barrier"  # barrier | stream: when a phase's executors start (module docstring)

    def __post_init__(self) -> None:
        if self.max_phases < 1:
            raise UserError(f"max phases must be at least 1, got {self.max_phases}")
        if self.schedule not in SCHEDULES:
            raise UserError(f"unknown schedule {self.schedule!r}; use {' or '.join(SCHEDULES)}")
        if min(self.planner_length_retries, self.problem_retries) < 0 or self.executor_retries < 1:
            raise UserError("retry counts must be >= 0 (executor retries >= 1)")


def call_seed(seed: int | None, *parts: object) -> int | None:
    """A per-call seed fixed by the run seed and the call's place (problem, role, phase, draw)."""
    if seed is None:
        return None
    key = ":".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") & 0x7FFFFFFF


# ---------------------------------------------------------------------------------------------
# One problem


@dataclass
class CallRecord:
    """One model call as stored in records.jsonl.

    `prompt` is the prompt name p.k for an executor, "final" for the forced final answer, else None.
    """

    role: str  # planner | executor
    phase: int
    prompt: str | None
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    start: float
    end: float
    cached: bool
    draw: int = 1  # 1 + index of the redraw (planner length retries, executor retries)
    run: int = 1  # problem-level attempt
    kept: bool = True  # False: failed, cancelled, a plan redrawn for length, or an execution thrown away (stream)
    error: str | None = None


class StepFailed(Exception):
    """A planner or executor call that failed for good; `kind` is the LLM error kind."""

    def __init__(self, what: str, error: LLMError, tries: int) -> None:
        times = "once" if tries == 1 else f"{tries} times"
        super().__init__(f"{what} failed {times}: {error.kind}: {error}")
        self.kind = error.kind


@dataclass
class ProblemOutcome:
    trajectory: Trajectory
    forced_final: bool
    truncated_plans: int


async def _request(
    client: LLMClient, endpoint: str, payload: Any, sampling: Sampling, on_text: OnText | None = None
) -> Completion:
    if endpoint == "completions":
        return await client.complete(payload, sampling, on_text)
    return await client.chat(payload, sampling, on_text)


# A probe appended to a partial plan: it would lengthen (so change) any prompt that is still open,
# and cannot touch a prompt that is already closed or followed by the next prompt's opening tag.
_SETTLE_PROBE = "x</prompt>"


def settled_prompts(raw: str, phase: int) -> tuple[str, list[Prompt]]:
    """The normalised plan of a partial planner output and its prompts that more text cannot change.

    `normalize_plan` closes a prompt left open (at a blank line or the end), so the prompts of a
    partial text are not all finished. A prompt is settled when the normalised result is the same
    with the probe appended: its closing tag has been written, or the next prompt has opened, or
    the plan was cut (`<Final_answer>`, `<Execution_`). Settled prompts, and the plan text before
    their ends, stay exactly as they are in the normalised final plan.
    """
    plan = normalize_plan(raw, phase).plan
    probed = normalize_plan(raw + _SETTLE_PROBE, phase).plan
    settled = []
    for now, later in zip(Phase(phase, plan).prompts, Phase(phase, probed).prompts):
        if now != later:
            break
        settled.append(now)
    return plan, settled


class ProblemRun:
    """The planner/executor loop for one problem; keeps every call it made, failed ones included."""

    def __init__(
        self,
        problem: Problem,
        fmt: PromptFormat,
        planner: LLMClient,
        executor: LLMClient,
        settings: LoopSettings,
        executor_slots: asyncio.Semaphore,
    ) -> None:
        self.problem = problem
        self.fmt = fmt
        self.planner = planner
        self.executor = executor
        self.settings = settings
        self.executor_slots = executor_slots
        self.calls: list[CallRecord] = []
        self.run_number = 1
        self.trajectory = Trajectory(problem.question)

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
        client = self.planner if role == "planner" else self.executor
        endpoint, payload, extra = self.fmt.request(self.problem.question, continuation)
        params = Sampling(
            max_tokens=max_tokens or sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            stop=stop,
            seed=call_seed(self.settings.seed, self.problem.id, role, phase, prompt, draw),
            extra=extra,
        )
        started = time.time()
        try:
            done = await _request(client, endpoint, payload, params, on_text)
        except (LLMError, asyncio.CancelledError) as exc:
            error = f"{exc.kind}: {exc}" if isinstance(exc, LLMError) else "cancelled"
            record = CallRecord(role, phase, prompt, 0, 0, None, started, time.time(), False, draw, self.run_number,
                                False, error)
            self.calls.append(record)
            if sink is not None:
                sink.append(record)
            raise
        record = CallRecord(
            role, phase, prompt, done.prompt_tokens, done.completion_tokens, done.finish_reason,
            done.start, done.end, done.cached, draw, self.run_number,
        )
        self.calls.append(record)
        if sink is not None:
            sink.append(record)
        return done, record

    async def _plan(self, context: str, phase: int, dispatch: StreamDispatch | None = None) -> tuple[str, bool]:
        """Raw planner text for `phase` and whether it was cut at the token limit.

        With a `dispatch` (stream schedule) the call is streamed and executors start on the way.
        """
        s = self.settings
        draws = 1 + (s.planner_length_retries if s.planner.temperature > 0 else 0)
        on_text = dispatch.on_text if dispatch is not None else None
        for draw in range(1, draws + 1):
            try:
                done, record = await self._call("planner", context, PLANNER_STOPS, s.planner, phase, None, draw,
                                                on_text=on_text)
            except LLMError as exc:
                raise StepFailed(f"planner call of phase {phase}", exc, 1) from None
            if done.finish_reason != "length":
                return done.text, False
            if draw < draws:
                record.kept = False
                if dispatch is not None:
                    dispatch.redraw()
        return done.text, True

    async def _final(self, context: str, phase: int) -> str:
        try:
            done, _ = await self._call(
                "planner", context + FINAL_OPEN, FINAL_STOPS, self.settings.planner, phase, "final", 1,
                max_tokens=self.settings.final_max_tokens,
            )
        except LLMError as exc:
            raise StepFailed("forced final answer", exc, 1) from None
        return done.text.strip()

    async def _execute(self, head: str, phase: int, prompt: Prompt, sink: list[CallRecord] | None = None) -> Execution:
        """One executor: it sees the plan of this phase and continues `<execution_p.k>`."""
        continuation = head + f"<execution_{prompt.name}>\n"
        tries = self.settings.executor_retries
        for draw in range(1, tries + 1):
            async with self.executor_slots:
                try:
                    done, _ = await self._call(
                        "executor", continuation, EXECUTOR_STOPS, self.settings.executor, phase, prompt.name, draw,
                        sink=sink,
                    )
                    return Execution(prompt.name, done.text.strip())
                except LLMError as exc:
                    if exc.kind not in TRANSIENT_KINDS or draw == tries:
                        raise StepFailed(f"executor {prompt.name}", exc, draw) from None
        raise AssertionError("unreachable")

    async def _execute_all(self, head: str, phase: int, prompts: list[Prompt]) -> list[Execution]:
        """All executors of a phase at once, results in prompt order; one failing cancels the rest."""
        tasks = [asyncio.ensure_future(self._execute(head, phase, pr)) for pr in prompts]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def run(self) -> ProblemOutcome:
        s = self.settings
        traj = self.trajectory = Trajectory(self.problem.question)
        truncated = 0
        for p in range(1, s.max_phases + 1):
            body = traj.render_body()
            context = body + ("\n\n" if body else "")
            if p == s.max_phases:
                traj.final_answer = await self._final(context, p)
                return ProblemOutcome(traj, True, truncated)
            dispatch = StreamDispatch(self, context, p) if s.schedule == "stream" else None
            try:
                raw, cut = await self._plan(context, p, dispatch)
                truncated += cut
                out = normalize_plan(raw, p)
                if out.final_answer is None and not out.plan:
                    # nothing usable (EOS or </think> straight away): ask for the answer now
                    traj.final_answer = await self._final(context, p)
                    return ProblemOutcome(traj, True, truncated)
                if out.plan:
                    phase = Phase(p, out.plan)
                    if dispatch is not None:
                        phase.executions = await dispatch.collect(out.plan)
                    else:
                        head = context + phase.render_plan() + f"\n\n<Execution_{p}>\n"
                        phase.executions = await self._execute_all(head, p, phase.prompts)
                    traj.phases.append(phase)
            finally:
                if dispatch is not None:
                    await dispatch.close()
            if out.final_answer is not None:
                traj.final_answer = out.final_answer
                return ProblemOutcome(traj, False, truncated)
        raise AssertionError("unreachable: the last phase always answers")


@dataclass
class _Launched:
    """An executor started by the stream schedule, with the calls it made so far."""

    task: asyncio.Task
    records: list[CallRecord]


class StreamDispatch:
    """The stream schedule of one phase: start each executor as soon as its prompt is settled.

    `on_text` receives the planner's accumulated text after every streamed chunk (a retried
    stream starts again from ""). Executors are keyed by the normalised plan up to the end of
    their prompt, which is also what they see, so a restarted stream that writes the same prefix
    reuses the running executor instead of starting a duplicate.
    """

    def __init__(self, run: ProblemRun, context: str, phase: int) -> None:
        self.run = run
        self.context = context
        self.phase = phase
        self.launched: dict[str, _Launched] = {}
        self._text = ""
        self._dropped: list[asyncio.Task] = []

    def head(self, plan: str, prompt: Prompt) -> str:
        """What executor `prompt` continues (before its `<execution_p.k>\n`): the plan up to its prompt."""
        p = self.phase
        return self.context + f"<Plan_{p}>\n" + plan[: prompt.end] + f"\n\n<Execution_{p}>\n"

    def on_text(self, text: str) -> None:
        if text.startswith(self._text):
            fresh = text[len(self._text):]
            self._text = text
            if ">" not in fresh:  # every tag that can settle a prompt ends with ">"
                return
        else:  # the stream started over (a retried request)
            self._text = text
        plan, settled = settled_prompts(text, self.phase)
        latest = plan[: settled[-1].end] if settled else ""
        for key in [k for k in self.launched if not (latest.startswith(k) or k.startswith(latest))]:
            self._discard(key)  # the restarted stream wrote something else
        for prompt in settled:
            self._launch(plan, prompt)

    def redraw(self) -> None:
        """The plan is drawn again with another seed: nothing started for this draw is kept."""
        for key in list(self.launched):
            self._discard(key)
        self._text = ""

    async def collect(self, plan: str) -> list[Execution]:
        """Executions of the final plan's prompts in order, starting those not started yet."""
        prompts = Phase(self.phase, plan).prompts
        keys = [plan[: pr.end] for pr in prompts]
        for key in set(self.launched) - set(keys):
            self._discard(key)
        for prompt in prompts:
            self._launch(plan, prompt)
        tasks = [self.launched[key].task for key in keys]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            await self.close()
            raise

    def _launch(self, plan: str, prompt: Prompt) -> None:
        key = plan[: prompt.end]
        if key in self.launched:
            return
        records: list[CallRecord] = []
        task = asyncio.ensure_future(self.run._execute(self.head(plan, prompt), self.phase, prompt, records))
        self.launched[key] = _Launched(task, records)

    def _discard(self, key: str) -> None:
        item = self.launched.pop(key)
        item.task.cancel()
        for record in item.records:  # calls that already finished: their results are thrown away
            record.kept = False
        self._dropped.append(item.task)

    async def close(self) -> None:
        """Cancel what is still running and reap every task (their errors included)."""
        tasks = [item.task for item in self.launched.values()] + self._dropped
        self.launched.clear()
        self._dropped = []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---------------------------------------------------------------------------------------------
# Running many problems


def _call_dicts(calls: list[CallRecord]) -> list[dict]:
    return [asdict(c) for c in calls]


def _failure_fields(exc: BaseException) -> dict[str, Any]:
    kind = getattr(exc, "kind", None)
    return {"status": "error", "error": str(exc), "error_kind": kind, "retryable": kind in TRANSIENT_KINDS}


def _is_transient(exc: BaseException) -> bool:
    return getattr(exc, "kind", None) in TRANSIENT_KINDS


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


async def solve_problem(
    problem: Problem,
    task: TaskAdapter,
    fmt: PromptFormat,
    planner: LLMClient,
    executor: LLMClient,
    settings: LoopSettings,
    executor_slots: asyncio.Semaphore,
) -> dict[str, Any]:
    """Run the loop for one problem (with problem-level retries) and build its record."""
    runner = ProblemRun(problem, fmt, planner, executor, settings, executor_slots)
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
            if not _is_transient(exc) or attempt > settings.problem_retries:
                break
            log.warning("problem %s: %s; retrying the problem (%d/%d)", problem.id, exc, attempt, settings.problem_retries)
    traj = outcome.trajectory if outcome else runner.trajectory
    text = traj.render()
    predicted = traj.answer() if outcome else None
    record: dict[str, Any] = {
        "id": problem.id,
        "index": problem.index,
        "task": task.name,
        "question": problem.question,
        "gold": problem.gold,
        "predicted": predicted,
        "correct": task.grade(predicted, problem.gold) if outcome else None,
        "trajectory": text,
        "num_phases": len(traj.phases),
        "num_prompts": traj.prompt_count,
        "forced_final": outcome.forced_final if outcome else None,
        "truncated_plans": outcome.truncated_plans if outcome else None,
        "prompt_tokens": sum(c.prompt_tokens for c in runner.calls),
        "completion_tokens": sum(c.completion_tokens for c in runner.calls),
        "calls": _call_dicts(runner.calls),
        "attempts": runner.run_number,
        "start": started,
        "end": time.time(),
        "status": "ok",
        "error": None,
    }
    if failure is not None:
        record.update(_failure_fields(failure))
    return record


async def baseline_problem(
    problem: Problem,
    task: TaskAdapter,
    fmt: PromptFormat,
    client: LLMClient,
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
        seed=call_seed(seed, problem.id, "baseline"),
        extra=extra,
    )
    started = time.time()
    calls: list[CallRecord] = []
    done: Completion | None = None
    failure: LLMError | None = None
    for attempt in range(1, problem_retries + 2):
        t0 = time.time()
        try:
            done = await _request(client, endpoint, payload, params)
            calls.append(CallRecord("baseline", 0, None, done.prompt_tokens, done.completion_tokens, done.finish_reason,
                                    done.start, done.end, done.cached, 1, attempt))
            failure = None
            break
        except LLMError as exc:
            failure = exc
            calls.append(CallRecord("baseline", 0, None, 0, 0, None, t0, time.time(), False, 1, attempt, False,
                                    f"{exc.kind}: {exc}"))
            if exc.kind not in TRANSIENT_KINDS:
                break
    generation = done.text if done else ""
    from sprint.grading import last_boxed

    predicted = last_boxed(generation) if done else None
    record: dict[str, Any] = {
        "id": problem.id,
        "index": problem.index,
        "task": task.name,
        "question": problem.question,
        "gold": problem.gold,
        "predicted": predicted,
        "correct": task.grade(predicted, problem.gold) if done else None,
        "generation": generation,
        "finish_reason": done.finish_reason if done else None,
        "prompt_tokens": done.prompt_tokens if done else 0,
        "completion_tokens": done.completion_tokens if done else 0,
        "sequential_tokens": done.completion_tokens if done else 0,
        "calls": _call_dicts(calls),
        "attempts": len(calls),
        "start": started,
        "end": time.time(),
        "status": "ok",
        "error": None,
    }
    if failure is not None:
        record.update(_failure_fields(failure))
    return record


def _answered(record: dict) -> bool:
    """A problem that ended with a final answer (as sprint.metrics counts `answered`)."""
    return record.get("status") == "ok" and record.get("predicted") is not None


def accuracy_text(correct: int, answered: int, total: int) -> str:
    """`80.0% (24/30; 100.0% of answered)`: over all problems first (failed and unanswered ones
    count as wrong, the primary metric), the flattering over-answered figure only beside it."""
    if not total:
        return "n/a"
    of_answered = f"{correct / answered:.1%}" if answered else "n/a"
    return f"{correct / total:.1%} ({correct}/{total}; {of_answered} of answered)"


class Progress:
    """A tqdm bar whose postfix shows accuracy so far (resumed records included)."""

    def __init__(self, total: int, done: list[dict], enabled: bool) -> None:
        self.seen = 0
        self.correct = 0
        self.answered = 0
        self.errors = 0
        for record in done:
            self._count(record)
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=len(done), unit="problem", dynamic_ncols=True)
            self._postfix()

    def _count(self, record: dict) -> None:
        self.seen += 1
        self.correct += record.get("correct") is True
        self.answered += _answered(record)
        self.errors += record.get("status") != "ok"

    def _postfix(self) -> None:
        if self.bar is not None:
            acc = accuracy_text(self.correct, self.answered, self.seen) if self.seen else "-"
            self.bar.set_postfix_str(f"acc={acc}, errors={self.errors}", refresh=False)

    def update(self, record: dict) -> None:
        self._count(record)
        if self.bar is not None:
            self._postfix()
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _crash(problem: Problem, task: TaskAdapter, exc: BaseException, text: dict[str, Any]) -> dict[str, Any]:
    """The record of a problem whose solving raised something unexpected (a bug, a surprise in
    grading): retryable, so a fixed re-run redoes it; `text` gives the stage's text fields."""
    base = {
        "id": problem.id, "index": problem.index, "task": task.name, "question": problem.question,
        "gold": problem.gold, "predicted": None, "correct": None, **text,
        "prompt_tokens": 0, "completion_tokens": 0, "calls": [], "attempts": 0, "error_kind": None,
    }
    return crash_record(base, exc)


async def run_pool(
    problems: list[Problem],
    solve: Callable[[Problem], Any],
    run_dir: RunDir,
    workers: int,
    progress: bool = True,
    text_of: Callable[[dict], str] = lambda record: record["trajectory"],
    on_crash: Callable[[Problem, BaseException], dict[str, Any]] | None = None,
) -> None:
    """Solve the problems not yet in `run_dir` with at most `workers` in flight; append as they finish.

    An unexpected exception in one problem becomes the record `on_crash` builds and the others go
    on (as `sprint.stage.run_items` does); a UserError, or any exception without `on_crash`, stops the run.
    """
    todo = [p for p in problems if not run_dir.is_done(p.id)]
    done = [run_dir.done[p.id] for p in problems if run_dir.is_done(p.id)]
    bar = Progress(len(problems), done, progress)
    queue: asyncio.Queue[Problem] = asyncio.Queue()
    for p in todo:
        queue.put_nowait(p)

    async def worker() -> None:
        while True:
            try:
                problem = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            started = time.time()
            try:
                record = await solve(problem)
            except (UserError, asyncio.CancelledError):
                raise
            except Exception as exc:  # a bug or surprise in one problem must not sink the others
                if on_crash is None:
                    raise
                log.warning("problem %s crashed: %s: %s; recorded as crashed (retryable)", problem.id,
                            type(exc).__name__, exc)
                log.debug("traceback of the crash of problem %s", problem.id, exc_info=True)
                record = {**on_crash(problem, exc), "start": started, "end": time.time()}
            _write_text(run_dir.path / "trajectories" / f"{safe_id(problem.id)}.txt", text_of(record) + "\n")
            run_dir.append(record)
            bar.update(record)

    try:
        await asyncio.gather(*(worker() for _ in range(max(1, min(workers, len(todo) or 1)))))
    finally:
        bar.close()


def summarize(records: list[dict]) -> dict[str, Any]:
    """Headline counts of a run. `accuracy` is over all problems (failed and unanswered ones count
    as wrong, as in sprint.metrics); `accuracy_answered` only over those with a final answer."""
    ok = [r for r in records if r.get("status") == "ok"]
    correct = sum(1 for r in ok if r.get("correct") is True)
    answered = sum(1 for r in records if _answered(r))
    out: dict[str, Any] = {
        "problems": len(records),
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "correct": correct,
        "answered": answered,
        "accuracy": round(correct / len(records), 4) if records else None,
        "accuracy_answered": round(correct / answered, 4) if answered else None,
        "no_answer": sum(1 for r in ok if r.get("predicted") is None),
        "completion_tokens": sum(int(r.get("completion_tokens") or 0) for r in records),
    }
    if ok and "num_phases" in ok[0]:
        out["mean_phases"] = round(sum(r["num_phases"] for r in ok) / len(ok), 3)
        out["mean_prompts"] = round(sum(r["num_prompts"] for r in ok) / len(ok), 3)
        out["forced_final"] = sum(1 for r in ok if r.get("forced_final"))
    return out


# ---------------------------------------------------------------------------------------------
# Stage entry points


@contextlib.contextmanager
def _servers(targets: list[tuple[str, str, str | None]]) -> Iterator[None]:
    """Start vLLM for local URLs where nothing answers and a model path is known; stop it after."""
    from sprint.serve import ensure_server, is_local

    with contextlib.ExitStack() as stack:
        seen: set[tuple[str, str]] = set()
        for url, model, model_path in targets:
            if (url, model) in seen or not model_path or not is_local(url):
                continue
            seen.add((url, model))
            stack.enter_context(ensure_server(url, model, model_path))
        yield


@dataclass
class OrchestrationConfig:
    """Everything `python -m sprint orchestrate` takes; stored as the run's manifest config."""

    planner_model: str
    out_dir: str
    planner_server_url: str = DEFAULT_URL
    executor_model: str | None = None  # default: the planner model
    executor_server_url: str | None = None  # default: the planner URL
    data: str = "HuggingFaceH4/MATH-500"
    split: str | None = None  # default: the task's evaluation split
    subset: str | None = None
    range: str | None = None
    task: str = "math"
    planner_temperature: float = 0.6
    planner_top_p: float = 0.95
    planner_max_tokens: int = 1000
    executor_temperature: float = 0.6
    executor_top_p: float = 0.95
    max_tokens: int = 4096  # executor calls and the forced final answer
    max_phases: int = 12
    max_problem_workers: int = 5
    max_execution_workers: int = 5
    prompt_mode: str = "chat"
    api: str = "completions"
    tokenizer: str | None = None
    agent_prompt: str | None = None  # path; None = prompts/agent.txt
    seed: int | None = 0
    planner_length_retries: int = 2
    executor_retries: int = 3
    problem_retries: int = 1
    timeout: float = 600.0
    max_retries: int = 3
    cache_dir: str | None = None  # None: OUT_DIR/llm_cache (as the curation stages)
    use_cache: bool = True  # False: no response cache at all (--no-cache)
    model_path: str | None = None  # a local checkpoint: lets us start vLLM when nothing answers
    schedule: str = "barrier"  # barrier (reference code) | stream (executors start at their </prompt>)

    def __post_init__(self) -> None:
        self.executor_model = self.executor_model or self.planner_model
        self.executor_server_url = self.executor_server_url or self.planner_server_url
        if self.task not in TASK_NAMES:
            raise UserError(f"unknown task {self.task!r}; use one of {', '.join(TASK_NAMES)}")
        if self.max_problem_workers < 1 or self.max_execution_workers < 1:
            raise UserError("--max-problem-workers and --max-execution-workers must be at least 1")
        if self.schedule not in SCHEDULES:
            raise UserError(f"unknown schedule {self.schedule!r}; use {' or '.join(SCHEDULES)}")

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
        )

    def cache_path(self) -> Path | None:
        return resolve_cache_dir(Path(self.out_dir), self.cache_dir, self.use_cache)

    def identity(self) -> dict[str, Any]:
        return _run_config(self)


def _run_config(cfg: OrchestrationConfig | BaselineConfig) -> dict[str, Any]:
    """Config for RunDir (the manifest's `config`; its non-volatile keys are the run's identity).

    The model path is kept out (where a model was loaded from is not what it is). `cache_dir`
    holds the cache actually used (None: no cache); it is volatile in sprint.records, so a run
    resumed with another cache location, or none, is the same run.
    """
    config = asdict(cfg)
    config.pop("model_path")
    config.pop("use_cache")
    cache = cfg.cache_path()
    config["cache_dir"] = str(cache) if cache is not None else None
    config["agent_prompt_sha256"] = hashlib.sha256(load_agent_prompt(cfg.agent_prompt).encode()).hexdigest()[:16]
    return config


def problems_fingerprint(problems: list[Problem]) -> str:
    """A short hash of exactly what was asked and graded, for the manifest."""
    h = hashlib.sha256()
    for p in problems:
        h.update(json.dumps([p.id, p.question, p.gold], sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _tokenizer_for(tokenizer: str | None, model_path: str | None, model: str) -> str:
    return tokenizer or model_path or model


async def _orchestrate_async(
    cfg: OrchestrationConfig, problems: list[Problem], task: TaskAdapter, fmt: PromptFormat, run_dir: RunDir, progress: bool
) -> dict[str, Any]:
    settings = cfg.settings()
    cache = cfg.cache_path()
    planner_cfg = LLMConfig(cfg.planner_server_url, cfg.planner_model, max_concurrency=cfg.max_problem_workers,
                            timeout=cfg.timeout, max_retries=cfg.max_retries, cache_dir=cache)
    executor_cfg = LLMConfig(str(cfg.executor_server_url), str(cfg.executor_model),
                             max_concurrency=cfg.max_execution_workers, timeout=cfg.timeout,
                             max_retries=cfg.max_retries, cache_dir=cache)
    async with LLMClient(planner_cfg) as planner, LLMClient(executor_cfg) as executor:
        if any(not run_dir.is_done(p.id) for p in problems):
            await planner.check()
            await executor.check()
        slots = asyncio.Semaphore(cfg.max_execution_workers)

        def solve(problem: Problem) -> Any:
            return solve_problem(problem, task, fmt, planner, executor, settings, slots)

        def on_crash(problem: Problem, exc: BaseException) -> dict[str, Any]:
            text = {"trajectory": Trajectory(problem.question).render(), "num_phases": 0, "num_prompts": 0,
                    "forced_final": None, "truncated_plans": None}
            return _crash(problem, task, exc, text)

        await run_pool(problems, solve, run_dir, cfg.max_problem_workers, progress, on_crash=on_crash)
        planner_usage, executor_usage = planner.usage.as_dict(), executor.usage.as_dict()
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
    task = get_task(cfg.task, seed=cfg.seed or 0)
    problems = load_problems(task, cfg.data, cfg.split, cfg.subset, cfg.range)
    agent_prompt = load_agent_prompt(cfg.agent_prompt)
    tokenizer = _tokenizer_for(cfg.tokenizer, cfg.model_path, cfg.planner_model)
    fmt = build_prompt_format(cfg.prompt_mode, cfg.api, tokenizer, agent_prompt)
    run_dir = RunDir(Path(cfg.out_dir), "orchestrate", cfg.identity(), overwrite=overwrite, retry_failed=retry_failed)
    targets = [(cfg.planner_server_url, cfg.planner_model, cfg.model_path)]
    if cfg.executor_model == cfg.planner_model:
        targets.append((str(cfg.executor_server_url), str(cfg.executor_model), cfg.model_path))
    with _servers(targets):
        usage = asyncio.run(_orchestrate_async(cfg, problems, task, fmt, run_dir, progress))
    summary = summarize([run_dir.done[p.id] for p in problems if p.id in run_dir.done])
    run_dir.write_manifest(
        inputs={"data": cfg.data, "split": cfg.split or task.default_split, "subset": cfg.subset, "range": cfg.range,
                "items": len(problems), "fingerprint": problems_fingerprint(problems)},
        prompts={"agent": agent_prompt},
        usage=usage,
        extra={"summary": summary, "model_path": cfg.model_path, "tokenizer_used": tokenizer if fmt.template else None},
    )
    return summary


@dataclass
class BaselineConfig:
    """`python -m sprint baseline`: one generation per problem from a sequential model."""

    model: str
    out_dir: str
    server_url: str = DEFAULT_URL
    data: str = "HuggingFaceH4/MATH-500"
    split: str | None = None
    subset: str | None = None
    range: str | None = None
    task: str = "math"
    temperature: float = 0.6
    top_p: float = 0.95
    max_tokens: int = 16384
    max_problem_workers: int = 8
    prompt_mode: str = "chat"
    api: str = "completions"
    tokenizer: str | None = None
    agent_prompt: str | None = None
    think: bool = True
    seed: int | None = 0
    problem_retries: int = 1
    timeout: float = 1800.0
    max_retries: int = 3
    cache_dir: str | None = None  # None: OUT_DIR/llm_cache (as the curation stages)
    use_cache: bool = True  # False: no response cache at all (--no-cache)
    model_path: str | None = None

    def __post_init__(self) -> None:
        if self.task not in TASK_NAMES:
            raise UserError(f"unknown task {self.task!r}; use one of {', '.join(TASK_NAMES)}")
        if self.max_problem_workers < 1:
            raise UserError("--max-problem-workers must be at least 1")

    def cache_path(self) -> Path | None:
        return resolve_cache_dir(Path(self.out_dir), self.cache_dir, self.use_cache)

    def identity(self) -> dict[str, Any]:
        return _run_config(self)


def baseline(
    cfg: BaselineConfig, *, overwrite: bool = False, retry_failed: bool = True, progress: bool = True
) -> dict[str, Any]:
    """Evaluate a sequential model on the same problems and prompt; returns the summary."""
    task = get_task(cfg.task, seed=cfg.seed or 0)
    problems = load_problems(task, cfg.data, cfg.split, cfg.subset, cfg.range)
    agent_prompt = load_agent_prompt(cfg.agent_prompt)
    tokenizer = _tokenizer_for(cfg.tokenizer, cfg.model_path, cfg.model)
    fmt = build_prompt_format(cfg.prompt_mode, cfg.api, tokenizer, agent_prompt, think=cfg.think)
    sampling = RoleSampling(cfg.temperature, cfg.top_p, cfg.max_tokens)
    run_dir = RunDir(Path(cfg.out_dir), "baseline", cfg.identity(), overwrite=overwrite, retry_failed=retry_failed)

    async def main() -> dict[str, Any]:
        config = LLMConfig(cfg.server_url, cfg.model, max_concurrency=cfg.max_problem_workers, timeout=cfg.timeout,
                           max_retries=cfg.max_retries, cache_dir=cfg.cache_path())
        async with LLMClient(config) as client:
            if any(not run_dir.is_done(p.id) for p in problems):
                await client.check()

            def solve(problem: Problem) -> Any:
                return baseline_problem(problem, task, fmt, client, sampling, cfg.seed, cfg.problem_retries)

            def text_of(record: dict) -> str:
                return render_question(record["question"]) + "\n\n" + (THINK if fmt.think else "") + record["generation"]

            def on_crash(problem: Problem, exc: BaseException) -> dict[str, Any]:
                text = {"generation": "", "finish_reason": None, "sequential_tokens": 0}
                return _crash(problem, task, exc, text)

            await run_pool(problems, solve, run_dir, cfg.max_problem_workers, progress, text_of, on_crash)
            return client.usage.as_dict()

    with _servers([(cfg.server_url, cfg.model, cfg.model_path)]):
        usage = asyncio.run(main())
    summary = summarize([run_dir.done[p.id] for p in problems if p.id in run_dir.done])
    run_dir.write_manifest(
        inputs={"data": cfg.data, "split": cfg.split or task.default_split, "subset": cfg.subset, "range": cfg.range,
                "items": len(problems), "fingerprint": problems_fingerprint(problems)},
        prompts={"agent": agent_prompt},
        usage=usage,
        extra={"summary": summary, "model_path": cfg.model_path, "tokenizer_used": tokenizer if fmt.template else None},
    )
    return summary


# ---------------------------------------------------------------------------------------------
# CLI


def _optional_int(value: str) -> int | None:
    return None if value.lower() in ("none", "") else int(value)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="HuggingFaceH4/MATH-500", help="hub id, .jsonl/.json/.parquet file or stage folder")
    p.add_argument("--split", default=None, help="default: test (math, countdown), train (gpqa)")
    p.add_argument("--subset", default=None, help="hub config name, e.g. gpqa_diamond")
    p.add_argument("--range", default=None, help="START:END of the rows to run, e.g. 0:100")
    p.add_argument("--task", choices=TASK_NAMES, default="math")
    p.add_argument("--out-dir", required=True, help="run folder (records.jsonl, trajectories/, manifest.json)")
    p.add_argument("--prompt-mode", choices=PROMPT_MODES, default="chat",
                   help="chat: the model's chat template, as in training (default); raw: the authors' untemplated text")
    p.add_argument("--api", choices=APIS, default="completions",
                   help="completions (default) or chat: /v1/chat/completions continuing the assistant turn "
                        "(needs vLLM's continue_final_message; hosted APIs that cannot prefill will not continue it)")
    p.add_argument("--tokenizer", default=None, help="tokenizer for the chat template (default: --model-path, else the model name)")
    p.add_argument("--agent-prompt", default=None, help="agent prompt file (default prompts/agent.txt; 'none' for no agent prompt)")
    p.add_argument("--model-path", default=None, help="local checkpoint: start vLLM on the local URL when nothing answers")
    p.add_argument("--seed", type=_optional_int, default=0, help="base of the per-call seeds ('none': server's choice)")
    p.add_argument("--problem-retries", type=int, default=1, help="re-runs of a problem after a transient LLM failure")
    p.add_argument("--timeout", type=float, default=None, help="seconds per model call")
    p.add_argument("--max-retries", type=int, default=3, help="HTTP retries per call on transient errors")
    p.add_argument("--cache-dir", default=None,
                   help="on-disk response cache (default: OUT_DIR/llm_cache); calls answered before a crash "
                        "are not paid again on resume. Sampled answers are replayed: change --seed for new samples")
    p.add_argument("--no-cache", dest="use_cache", action="store_false", help="do not read or write the response cache")
    p.add_argument("--overwrite", action="store_true", help="replace a run folder holding a different configuration")
    p.add_argument("--no-retry-failed", dest="retry_failed", action="store_false", help="keep failed records on resume")
    p.add_argument("--no-progress", dest="progress", action="store_false")


def _print_summary(summary: dict[str, Any], out_dir: str) -> None:
    acc_text = accuracy_text(summary["correct"], summary["answered"], summary["problems"])
    print(f"{summary['problems']} problems ({summary['errors']} errors), accuracy {acc_text}; results in {out_dir}")


def _orchestrate_command(args: argparse.Namespace) -> int:
    cfg = OrchestrationConfig(
        planner_model=args.planner_model,
        out_dir=args.out_dir,
        planner_server_url=args.planner_url,
        executor_model=args.executor_model,
        executor_server_url=args.executor_url,
        data=args.data,
        split=args.split,
        subset=args.subset,
        range=args.range,
        task=args.task,
        planner_temperature=args.planner_temp,
        planner_top_p=args.planner_top_p,
        planner_max_tokens=args.planner_max_tokens,
        executor_temperature=args.executor_temp,
        executor_top_p=args.executor_top_p,
        max_tokens=args.max_tokens,
        max_phases=args.max_phases,
        max_problem_workers=args.max_problem_workers,
        max_execution_workers=args.max_execution_workers,
        prompt_mode=args.prompt_mode,
        api=args.api,
        tokenizer=args.tokenizer,
        agent_prompt=args.agent_prompt,
        seed=args.seed,
        planner_length_retries=args.planner_length_retries,
        executor_retries=args.executor_retries,
        problem_retries=args.problem_retries,
        timeout=args.timeout or 600.0,
        max_retries=args.max_retries,
        cache_dir=args.cache_dir,
        use_cache=args.use_cache,
        model_path=args.model_path,
        schedule=args.schedule,
    )
    summary = orchestrate(cfg, overwrite=args.overwrite, retry_failed=args.retry_failed, progress=args.progress)
    _print_summary(summary, cfg.out_dir)
    return 0


def _baseline_command(args: argparse.Namespace) -> int:
    cfg = BaselineConfig(
        model=args.model,
        out_dir=args.out_dir,
        server_url=args.server_url,
        data=args.data,
        split=args.split,
        subset=args.subset,
        range=args.range,
        task=args.task,
        temperature=args.temp,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        max_problem_workers=args.max_problem_workers,
        prompt_mode=args.prompt_mode,
        api=args.api,
        tokenizer=args.tokenizer,
        agent_prompt=args.agent_prompt,
        think=args.think,
        seed=args.seed,
        problem_retries=args.problem_retries,
        timeout=args.timeout or 1800.0,
        max_retries=args.max_retries,
        cache_dir=args.cache_dir,
        use_cache=args.use_cache,
        model_path=args.model_path,
    )
    summary = baseline(cfg, overwrite=args.overwrite, retry_failed=args.retry_failed, progress=args.progress)
    _print_summary(summary, cfg.out_dir)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "orchestrate",
        help="SPRINT inference: planner/executor phases on an OpenAI-compatible server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--planner-model", required=True, help="served model name of the planner")
    p.add_argument("--planner-url", "--planner-server-url", default=DEFAULT_URL)
    p.add_argument("--planner-temp", type=float, default=0.6)
    p.add_argument("--planner-top-p", type=float, default=0.95)
    p.add_argument("--planner-max-tokens", type=int, default=1000,
                   help="token limit of one plan; longer plans are redrawn (PLANNER_OUTPUT_TOKEN_LIMIT)")
    p.add_argument("--planner-length-retries", type=int, default=2, help="redraws of a plan cut at the limit")
    p.add_argument("--executor-model", default=None, help="default: the planner model")
    p.add_argument("--executor-url", "--executor-server-url", default=None, help="default: the planner URL")
    p.add_argument("--executor-temp", type=float, default=0.6)
    p.add_argument("--executor-top-p", type=float, default=0.95)
    p.add_argument("--executor-retries", type=int, default=3, help="tries of an executor call on transient failures")
    p.add_argument("--max-tokens", type=int, default=4096, help="token budget of each executor call and of the final answer")
    p.add_argument("--max-phases", type=int, default=12, help="phase at which the final answer is forced")
    p.add_argument("--max-problem-workers", type=int, default=5, help="problems in flight")
    p.add_argument("--max-execution-workers", type=int, default=5, help="executor calls in flight, over all problems")
    p.add_argument("--schedule", choices=SCHEDULES, default="barrier",
                   help="barrier: executors start when the plan is complete (the authors' code, default); "
                        "stream: each starts as soon as its </prompt_p.k> is written, seeing the plan up to there")
    _add_common(p)
    p.set_defaults(func=_orchestrate_command)

    b = subparsers.add_parser(
        "baseline",
        help="sequential baseline: one generation per problem with the same agent prompt",
        description="Evaluate a sequential reasoning model with the same prompt and output layout as `orchestrate`.",
    )
    b.add_argument("--model", required=True, help="served model name")
    b.add_argument("--server-url", default=DEFAULT_URL)
    b.add_argument("--temp", type=float, default=0.6)
    b.add_argument("--top-p", type=float, default=0.95)
    b.add_argument("--max-tokens", type=int, default=16384, help="token budget of the one generation")
    b.add_argument("--max-problem-workers", type=int, default=8, help="problems in flight")
    b.add_argument("--no-think", dest="think", action="store_false", help="do not pre-fill <think>\\n")
    _add_common(b)
    b.set_defaults(func=_baseline_command)
