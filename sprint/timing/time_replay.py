"""Seconds on a real engine: forced-length replay of recorded runs, SPRINT vs the sequential baseline.

What an inference engine does for a call depends only on the prompt's tokens (prefill, prefix-cache
hits) and on how many tokens it generates, not on what the weights say. So a recorded run can be
timed on any model of the same shape, random weights included: every call the orchestrator made
is sent again with the recorded context as its prompt (token ids from the model's tokenizer, the
same ids the engine saw) and its output forced to the recorded length (`min_tokens` =
`max_tokens` = n, `ignore_eos`). Per problem, the calls follow the orchestrator's order:

- the planner of each phase (draws redrawn for length first, as they happened), then its
  executors in parallel — barrier: when the plan is complete; stream: each as soon as the
  planner's streamed output reaches the token offset at which its `</prompt_p.k>` closed;
- the forced final answer, when the run forced one; the baseline is one call per problem.

Contexts are rebuilt exactly as the orchestrator built them (`sprint.format.prompt_format` + the
trajectory model), for the schedule being timed. Lengths are the engine's own counts from the
records' `calls`; runs without them (the authors' log layout) get lengths counted from the text.
Each measured run uses its own `cache_salt`, so a schedule never reuses the prefix cache another
one filled. Known gap: the generated tokens are gibberish, so the cache blocks of a planner's own
output never match its executors' prompts as they would in the real run; executors prefill their
plan again (a few ms per call on a GPU, reported as the cache hit ratio).

    python -m sprint time-replay RUN --server URL --model NAME [--baseline RUN] [--schedule both]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import openai

from sprint.evaluation import metrics as M
from sprint.core.calls import BASELINE as BASELINE_ROLE
from sprint.core.calls import EXECUTOR, FINAL, PLANNER, CallRecord
from sprint.core.errors import EXIT_ITEMS_FAILED, UserError
from sprint.timing.latency_fit import BASELINE, summarize_timing, timing_report, timing_table
from sprint.core.options import add_options, check_range, config_from, optional_int, option
from sprint.format.prompt_format import FINAL_OPEN, PROMPT_MODES, PromptFormat, build_prompt_format, load_agent_prompt
from sprint.core.files import atomic_write
from sprint.evaluation.runs import LoadedRun, RawProblem, load_run
from sprint.inference.schedule import schedule_names
from sprint.format import tags
from sprint.format.trajectory import (
    Counter, Phase, Trajectory, TrajectoryError, load_tokenizer, open_execution, open_executions, parse, token_counter,
)

log = logging.getLogger(__name__)

BOTH = "both"
WARMUP_TOKENS = 16


# ---------------------------------------------------------------------------------------------
# The call plan: which calls, with which contexts and forced lengths


@dataclass
class PlannedCall:
    """One model call to replay: the call as recorded (its role, phase, prompt, draw, and its length,
    `completion_tokens`, which the replay forces), the exact context the orchestrator sent, and when
    it may start."""

    call: CallRecord
    context: str
    release: int | None = None  # stream: start when the planner has streamed this many tokens
    ids: list[int] | None = field(default=None, repr=False)  # the context's token ids, while it is timed

    @property
    def tokens(self) -> int:
        """The forced output length."""
        return self.call.completion_tokens


def _planned(role: str, phase: int, prompt: str | None, context: str, tokens: int, release: int | None = None,
             draw: int = 1) -> PlannedCall:
    return PlannedCall(CallRecord(role, phase, prompt, completion_tokens=tokens, draw=draw), context, release)


@dataclass
class Step:
    """One phase: planner draws in order (the kept one last), then its executors."""

    planner: list[PlannedCall]
    executors: list[PlannedCall] = field(default_factory=list)


@dataclass
class ProblemPlan:
    id: str
    method: str  # a schedule name, or "baseline"
    steps: list[Step]
    lengths: str  # "recorded" (the engine's counts) | "counted" (tokenizer counts of the text)

    @property
    def calls(self) -> list[PlannedCall]:
        return [c for s in self.steps for c in (*s.planner, *s.executors)]

    @property
    def output_tokens(self) -> int:
        return sum(c.tokens for c in self.calls)


def _context(traj: Trajectory, p: int) -> str:
    """What the orchestrator continues at phase p: the phases before it, rendered, then a blank line."""
    return Trajectory(traj.question, traj.phases[: p - 1]).render_context()


def executor_context(traj: Trajectory, p: int, name: str, schedule: str) -> str:
    """Executor p.k's continuation (after the head): barrier sees the whole plan, stream the plan up
    to its own `</prompt_p.k>` (sprint.inference.schedule's BarrierDispatch / StreamDispatch)."""
    phase = traj.phases[p - 1]
    prompt = next(pr for pr in phase.prompts if pr.name == name)
    plan = phase.streamed_view(prompt) if schedule == "stream" else phase.render_plan()
    return _context(traj, p) + open_executions(plan, p) + open_execution(name)


def release_offset(phase: Phase, name: str, counter: Counter) -> int:
    """Planner tokens written when prompt `name` closed: `<Plan_p>\\n` + the plan up to its `</prompt_p.k>`."""
    prompt = next(pr for pr in phase.prompts if pr.name == name)
    return counter(phase.streamed_plan(prompt))


def _used_calls(calls: list[dict]) -> list[CallRecord]:
    """The calls of the problem's last attempt that shaped the trajectory, plus planner draws redrawn
    for length (real work the problem waited for). Failed, cancelled and thrown-away calls are left out."""
    rows = [CallRecord.from_dict(c) for c in calls if isinstance(c, dict) and isinstance(c.get("completion_tokens"), int)]
    if not rows:
        return []
    last = max(c.run for c in rows)
    used = []
    for c in rows:
        if c.run != last or c.error:
            continue
        redrawn = c.role == PLANNER and c.finish_reason == "length" and not c.prompt
        if c.kept or redrawn:
            used.append(c)
    return used


def sprint_plan(pid: str, traj: Trajectory, head: str, schedule: str, counter: Counter,
                calls: list[dict] | None = None, forced_final: bool = False) -> ProblemPlan:
    """The calls of one SPRINT problem under `schedule`, lengths from `calls` when recorded."""
    used = _used_calls(calls or [])
    if used:
        steps = _steps_from_calls(pid, traj, head, schedule, counter, used)
        return ProblemPlan(pid, schedule, steps, "recorded")
    return ProblemPlan(pid, schedule, _steps_from_text(traj, head, schedule, counter, forced_final), "counted")


def _steps_from_calls(pid: str, traj: Trajectory, head: str, schedule: str, counter: Counter,
                      used: list[CallRecord]) -> list[Step]:
    by_phase: dict[int, list[CallRecord]] = {}
    for c in used:
        by_phase.setdefault(c.phase, []).append(c)
    steps = []
    for p in sorted(by_phase):
        rows = by_phase[p]
        planners = sorted((c for c in rows if c.role == PLANNER and not c.prompt), key=lambda c: c.draw)
        step = Step([PlannedCall(c, head + _context(traj, p)) for c in planners])
        executors = [c for c in rows if c.role == EXECUTOR]
        if executors:
            if p > len(traj.phases) or not planners:
                raise UserError(f"problem {pid}: executor calls of phase {p} have no matching plan in the "
                                "trajectory; is records.jsonl from another run than its trajectories?")
            phase = traj.phases[p - 1]
            names = {pr.name for pr in phase.prompts}
            for c in sorted(executors, key=lambda c: [int(x) for x in str(c.prompt).split(".") if x.isdigit()]):
                name = str(c.prompt)
                if name not in names:
                    raise UserError(f"problem {pid}: executor {name} is not a prompt of phase {p}'s plan")
                release = None
                if schedule == "stream":
                    release = min(release_offset(phase, name, counter), step.planner[-1].tokens)
                step.executors.append(PlannedCall(c, head + executor_context(traj, p, name, schedule), release))
        if step.planner:
            steps.append(step)
        for c in rows:
            if c.is_final:
                steps.append(Step([PlannedCall(c, head + _context(traj, p) + FINAL_OPEN)]))
    return steps


def _steps_from_text(traj: Trajectory, head: str, schedule: str, counter: Counter, forced_final: bool) -> list[Step]:
    """Lengths counted from the text (the authors' logs): the planner writes `<Plan_p>…</Plan_p>`,
    an executor its text and closing tag, the answer `<Final_answer>…</Final_answer>`."""
    steps = []
    for phase in traj.phases:
        p = phase.number
        planner = _planned(PLANNER, p, None, head + _context(traj, p), counter(phase.render_plan()))
        step = Step([planner])
        for pr in phase.prompts:
            ex = phase.execution(pr.name)
            n = counter((ex.text if ex else "") + "\n" + tags.execution_close(pr.name))
            release = min(release_offset(phase, pr.name, counter), planner.tokens) if schedule == "stream" else None
            step.executors.append(_planned(EXECUTOR, p, pr.name, head + executor_context(traj, p, pr.name, schedule),
                                           n, release))
        steps.append(step)
    if traj.final_answer is not None:
        p = len(traj.phases) + 1
        answer = traj.final_answer.strip() + "\n" + tags.FINAL_END
        if forced_final:
            steps.append(Step([_planned(PLANNER, p, FINAL, head + _context(traj, p) + FINAL_OPEN, counter(answer))]))
        else:
            steps.append(Step([_planned(PLANNER, p, None, head + _context(traj, p), counter(FINAL_OPEN + answer))]))
    return steps


def baseline_plan(pid: str, head: str, tokens: int, lengths: str) -> ProblemPlan:
    return ProblemPlan(pid, BASELINE, [Step([_planned(BASELINE_ROLE, 0, None, head, tokens)])], lengths)


# ---------------------------------------------------------------------------------------------
# Loading recorded runs


@dataclass
class Recorded:
    """A run on disk, ready to plan: its problems (trajectories or generations, recorded calls) and format."""

    run: LoadedRun
    fmt: PromptFormat


def run_format(run: LoadedRun, prompt_mode: str | None, agent_prompt: str | None, tokenizer: str | None) -> PromptFormat:
    """The prompt format the run was made with: its manifest's settings unless overridden; raw for the
    authors' logs (their inference sent agent prompt + question + `<think>\\n` without a template)."""
    config = run.manifest.get("config") or {}
    mode = prompt_mode or config.get("prompt_mode") or "raw"
    api = "completions"  # a chat-API run rendered the same template on the server
    path = agent_prompt if agent_prompt is not None else config.get("agent_prompt")
    text = load_agent_prompt(path)
    recorded = config.get("agent_prompt_sha256")
    if recorded and hashlib.sha256(text.encode()).hexdigest()[:16] != recorded:
        log.warning("%s: the agent prompt differs from the one the run used (sha256 %s); pass --agent-prompt",
                    run.label, recorded)
    template_tokenizer = (tokenizer or run.manifest.get("tokenizer_used") or config.get("tokenizer")
                          or config.get("model_path") or config.get("planner_model") or config.get("model"))
    return build_prompt_format(mode, api, template_tokenizer, text, think=bool(config.get("think", True)))


def load_recorded(path: str, mode: str, cfg: TimeReplayConfig) -> Recorded:
    runs = [r for r in load_run(path) if r.mode == mode]
    if not runs:
        raise UserError(f"{path} holds no {mode} run; pass a {'SPRINT' if mode == 'sprint' else 'baseline'} run folder")
    run = runs[0]
    return Recorded(run, run_format(run, cfg.prompt_mode, cfg.agent_prompt, cfg.tokenizer))


def _usable(problems: list[RawProblem]) -> list[RawProblem]:
    return [p for p in problems if p.status == "ok" and p.text]


def plans_for(sprint: Recorded, schedule: str, counter: Counter, limit: int | None) -> list[ProblemPlan]:
    plans = []
    for prob in _usable(sprint.run.problems)[:limit]:
        try:
            traj = parse(prob.text or "", strict=True)
        except TrajectoryError as exc:
            log.warning("skipping %s: malformed trajectory (%s)", prob.id, exc)
            continue
        head = sprint.fmt.request(traj.question, "")[1]
        plans.append(sprint_plan(prob.id, traj, head, schedule, counter, prob.calls, prob.forced_final))
    return plans


def baseline_plans(base: Recorded, questions: dict[str, str], counter: Counter, ids: set[str] | None) -> list[ProblemPlan]:
    plans = []
    for prob in _usable(base.run.problems):
        if ids is not None and prob.id not in ids:
            continue
        question = prob.question or questions.get(prob.id)
        if not question:
            log.warning("skipping baseline %s: its question is unknown (no record, no SPRINT run of that id)", prob.id)
            continue
        used = [c for c in _used_calls(prob.calls) if c.role == BASELINE_ROLE]
        if used:
            tokens, lengths = used[-1].completion_tokens, "recorded"
        elif prob.reported_tokens is not None:
            tokens, lengths = prob.reported_tokens, "recorded"
        else:
            tokens, lengths = counter(prob.text or ""), "counted"
        plans.append(baseline_plan(prob.id, base.fmt.request(question, "")[1], max(1, tokens), lengths))
    return plans


# ---------------------------------------------------------------------------------------------
# Measuring on the engine


@dataclass
class Measured:
    """One replayed call: what was asked (the planned call, its forced length) and what the engine did
    (its call record, times in seconds from the start of its measured run: one clock per run)."""

    planned: PlannedCall
    call: CallRecord


class Engine:
    """Streams forced-length completions (token-id prompts) from one /v1/completions endpoint."""

    def __init__(self, base_url: str, model: str, tokenizer: Any, timeout: float, temperature: float, top_p: float) -> None:
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=timeout)
        self.model = model
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.origin = time.perf_counter()

    def ids(self, text: str) -> list[int]:
        """Token ids as the engine's own tokenizer makes them from the text (special tokens added: BOS)."""
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    async def call(self, planned: PlannedCall, salt: str, on_tokens: Callable[[int], None] | None = None) -> Measured:
        ids = planned.ids if planned.ids is not None else self.ids(planned.context)
        n = planned.tokens
        asked = replace(planned.call, prompt_tokens=len(ids), completion_tokens=0, finish_reason=None, cached=False,
                        kept=True, error=None, cached_tokens=None, server=str(self.client.base_url))
        start = time.perf_counter() - self.origin
        first = None
        tokens = 0
        usage = None
        finish = None
        try:
            stream = await self.client.completions.create(
                model=self.model, prompt=ids, max_tokens=n, temperature=self.temperature, top_p=self.top_p,
                stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True},
                extra_body={"min_tokens": n, "ignore_eos": True, "cache_salt": salt},
            )
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage
                if not chunk.choices:
                    continue
                finish = chunk.choices[0].finish_reason or finish
                got = chunk.usage.completion_tokens if chunk.usage is not None else tokens + (1 if chunk.choices[0].text else 0)
                if got > tokens:
                    tokens = got
                    if first is None:
                        first = time.perf_counter() - self.origin
                    if on_tokens is not None:
                        on_tokens(tokens)
        except Exception as exc:  # timing goes on; the call is reported as failed
            failed = replace(asked, completion_tokens=tokens, start=start, first_token=first,
                             end=time.perf_counter() - self.origin, kept=False,
                             error=f"{type(exc).__name__}: {str(exc)[:200]}")
            return Measured(planned, failed)
        end = time.perf_counter() - self.origin
        details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        done = replace(asked, prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or len(ids)),
                       completion_tokens=int(getattr(usage, "completion_tokens", 0) or tokens), finish_reason=finish,
                       start=start, first_token=first, end=end, cached_tokens=cached)
        return Measured(planned, done)

    async def check(self) -> None:
        """Fail at once, in one line, when the server is unreachable or does not serve the model."""
        try:
            served = [m.id async for m in self.client.models.list()]
        except Exception as exc:
            raise UserError(f"cannot reach {self.client.base_url} ({type(exc).__name__}); start vLLM there "
                            "(scripts/time_on_gpus.sh does) or pass --server URL") from None
        if self.model not in served:
            raise UserError(f"{self.client.base_url} serves {', '.join(served) or 'no model'}, not {self.model!r}; pass --model")

    async def aclose(self) -> None:
        await self.client.close()


async def replay_problem(engine: Engine, plan: ProblemPlan, salt: str) -> list[Measured]:
    """Issue one problem's calls in the orchestrator's order; returns them as measured."""
    out: list[Measured] = []
    for step in plan.steps:
        for draw in step.planner[:-1]:
            out.append(await engine.call(draw, salt))
        planner = step.planner[-1]
        if not step.executors:
            out.append(await engine.call(planner, salt))
            continue
        gates = [asyncio.Event() for _ in step.executors]

        def on_tokens(n: int) -> None:
            for gate, ex in zip(gates, step.executors):
                if ex.release is not None and n >= ex.release:
                    gate.set()

        async def execute(gate: asyncio.Event, ex: PlannedCall) -> Measured:
            await gate.wait()
            return await engine.call(ex, salt)

        tasks = [asyncio.ensure_future(execute(g, ex)) for g, ex in zip(gates, step.executors)]
        try:
            streamed = any(ex.release is not None for ex in step.executors)
            out.append(await engine.call(planner, salt, on_tokens if streamed else None))
            for gate in gates:  # barrier: now; stream: any prompt not reached (a short draw)
                gate.set()
            out.extend(await asyncio.gather(*tasks))
        finally:
            for t in tasks:
                t.cancel()
    return out


@dataclass
class ProblemTiming:
    id: str
    start: float
    end: float
    calls: list[Measured]
    output_tokens: int
    lengths: str

    @property
    def seconds(self) -> float:
        return self.end - self.start


async def measure(engine: Engine, plans: list[ProblemPlan], concurrency: int, salt: str) -> list[ProblemTiming]:
    """All problems of one method, `concurrency` at a time, in plan order."""
    slots = asyncio.Semaphore(concurrency)

    async def one(plan: ProblemPlan) -> ProblemTiming:
        async with slots:
            for call in plan.calls:  # tokenized before the clock starts; the server's own tokenizing
                call.ids = engine.ids(call.context)  # of a text prompt (ms) is the one cost not timed
            start = time.perf_counter() - engine.origin
            try:
                calls = await replay_problem(engine, plan, salt)
            finally:
                for call in plan.calls:
                    call.ids = None
            return ProblemTiming(plan.id, start, time.perf_counter() - engine.origin, calls, plan.output_tokens, plan.lengths)

    return list(await asyncio.gather(*(one(p) for p in plans)))


async def warm_up(engine: Engine, calls: int, salt: str) -> None:
    """A few untimed calls first: the engine compiles kernels and captures graphs on its first requests."""
    for i in range(calls):
        await engine.call(_planned("warmup", 0, None, f"warm up {i} " * 8, WARMUP_TOKENS), f"{salt}-warmup")


# ---------------------------------------------------------------------------------------------
# Config and command


@dataclass
class TimeReplayConfig:
    """`python -m sprint time-replay`: what to time, where, and how."""

    run: str = option(help="recorded SPRINT run (run folder or the authors' log folder)", cli=False)
    server_url: str = option(help="OpenAI-compatible base URL of a vLLM server (prefix caching on)", flags=("--server",),
                             var="SERVER_URL")
    model: str = option(help="served model name: any model with the recorded model's shape (random weights do)",
                        var="MODEL")
    baseline: str | None = option(None, "recorded sequential baseline run, timed one call per problem", var="BASELINE")
    schedule: str = option(BOTH, "SPRINT schedule(s) to time", choices=(*schedule_names(), BOTH), var="SCHEDULE")
    concurrency: int = option(1, "problems in flight at once (1: each problem has the engine to itself, the "
                                 "per-problem latency the paper estimates)", var="CONCURRENCY")
    out_dir: str = option("time_replay", "output folder (timing.json, report.md)", flags=("--out",), var="OUT_DIR")
    tokenizer: str | None = option(None, "tokenizer of the recorded model, for token ids and the chat template "
                                         "(default: the run's manifest, else --model)", var="TOKENIZER")
    prompt_mode: str | None = option(None, "how the run built its prompts (default: its manifest; raw for the "
                                           "authors' logs)", choices=PROMPT_MODES)
    agent_prompt: str | None = option(None, "agent prompt file the run used (default: its manifest's, else "
                                            "prompts/agent.txt)")
    limit: int | None = option(None, "time only the first N problems (default: all)", type=optional_int, var="LIMIT")
    temperature: float = option(0.6, "sampling temperature (the paper's; sampling costs a little per token)")
    top_p: float = option(0.95, "nucleus sampling (the paper's)")
    timeout: float = option(1800.0, "seconds per call (a baseline generation can be long)")
    warmup: int = option(3, "untimed calls before measuring (kernel compilation, graph capture)")
    resamples: int = option(M.DEFAULT_RESAMPLES, "bootstrap resamples for the confidence intervals")

    def __post_init__(self) -> None:
        check_range(TimeReplayConfig, "concurrency", self.concurrency, 1)
        check_range(TimeReplayConfig, "warmup", self.warmup, 0)
        if self.limit is not None:
            check_range(TimeReplayConfig, "limit", self.limit, 1)

    @property
    def schedules(self) -> list[str]:
        return list(schedule_names()) if self.schedule == BOTH else [self.schedule]


def _measured_dict(m: Measured, origin: float, problem: str) -> dict[str, Any]:
    """A call as the records' `calls` hold it (`CallRecord`), times from `origin`, with what only a
    measurement has: the first token, the forced length; `from_calls` draws it like a recorded one."""
    call = m.call.shifted(origin)
    first = None if call.first_token is None else round(call.first_token, 6)
    call = replace(call, start=round(call.start, 6), end=round(call.end, 6), first_token=first)
    ttft = m.call.ttft
    return {**call.as_dict(), "first_token": first, "ttft": None if ttft is None else round(ttft, 6),
            "forced_tokens": m.planned.tokens, "problem": problem}


def _method_json(label: str, timings: list[ProblemTiming]) -> dict[str, Any]:
    """Per problem: its seconds and its calls, times from the problem's start (the viewer's `calls`)."""
    origin = min((t.start for t in timings), default=0.0)
    return {
        "method": label,
        "problems": [{
            "id": t.id, "seconds": round(t.seconds, 6), "start": round(t.start - origin, 6),
            "output_tokens": t.output_tokens, "lengths": t.lengths,
            "calls": [_measured_dict(c, t.start, t.id) for c in t.calls],
        } for t in timings],
        "run_calls": [_measured_dict(c, origin, t.id) for t in timings for c in t.calls],  # one clock, for fit-latency
    }


def time_replay(cfg: TimeReplayConfig) -> dict[str, Any]:
    """Measure the run (each schedule) and the baseline on the server; write timing.json + report.md."""
    sprint = load_recorded(cfg.run, "sprint", cfg)
    tokenizer_name = cfg.tokenizer or sprint.run.manifest.get("tokenizer_used") or cfg.model
    tokenizer = load_tokenizer(str(tokenizer_name))
    counter = token_counter(str(tokenizer_name))
    by_method = {s: plans_for(sprint, s, counter, cfg.limit) for s in cfg.schedules}
    first = next(iter(by_method.values()))
    if not first:
        raise UserError(f"{cfg.run} has no finished SPRINT problem to time")
    if cfg.baseline:
        base = load_recorded(cfg.baseline, "baseline", cfg)
        questions = {p.id: p.question or parse(p.text or "", strict=False).question for p in _usable(sprint.run.problems)}
        by_method[BASELINE] = baseline_plans(base, questions, counter, {p.id for p in first})
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = f"{int(time.time())}"

    async def main() -> dict[str, list[ProblemTiming]]:
        engine = Engine(cfg.server_url, cfg.model, tokenizer, cfg.timeout, cfg.temperature, cfg.top_p)
        try:
            await engine.check()
            await warm_up(engine, cfg.warmup, stamp)
            results = {}
            for method, plans in by_method.items():
                log.info("timing %s: %d problems, %d calls", method, len(plans), sum(len(p.calls) for p in plans))
                results[method] = await measure(engine, plans, cfg.concurrency, f"{stamp}-{method}")
            return results
        finally:
            await engine.aclose()

    results = asyncio.run(main())
    methods = {m: _method_json(m, t) for m, t in results.items()}
    timing = {
        "config": asdict(cfg),
        "server": cfg.server_url, "model": cfg.model, "tokenizer": str(tokenizer_name),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "methods": methods,
    }
    timing["summary"] = summarize_timing(timing, resamples=cfg.resamples)
    atomic_write(out / "timing.json", json.dumps(timing, indent=1) + "\n")
    atomic_write(out / "report.md", timing_report(timing))
    return timing


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(TimeReplayConfig, args)
    timing = time_replay(cfg)
    print(timing_table(timing))
    print(f"wrote {Path(cfg.out_dir) / 'timing.json'} and report.md")
    s = timing["summary"]
    if s["forced_ok"] != s["calls"]:
        print(f"warning: only {s['forced_ok']}/{s['calls']} calls generated their recorded length; the server must "
              "honour min_tokens and ignore_eos (vLLM does) for the seconds to mean anything", file=sys.stderr)
        return EXIT_ITEMS_FAILED
    return 0


def register(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.add_argument("run", metavar="RUN", help="recorded SPRINT run (run folder or the authors' log folder)")
    add_options(p, TimeReplayConfig)
