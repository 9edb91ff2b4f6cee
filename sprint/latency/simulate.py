"""One problem alone on a GPU: its calls' prefills and decode steps under `LatencyModel`, and the
modelled seconds of a SPRINT trajectory (barrier or stream) or of a sequential generation.

Why a simulation and not a sum: with the KV cache in the model a step's cost depends on which
sequences decode at that moment and on their contexts, so a phase's executors slow each other
(and, under the stream schedule, the planner still writing its plan) by how long their contexts
are. `OneGpu` steps them together: all sequences decoding take one step at a time, each step
priced by their number and summed contexts; a sequence whose prefill ends mid-step joins at the
next step, as in vLLM's continuous batching; a prefill delays only its own call.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from sprint.core.calls import BASELINE, EXECUTOR, FINAL, PLANNER, CallRecord
from sprint.format import tags
from sprint.format.tokencount import batch_counts
from sprint.format.trajectory import Counter, Trajectory, render_question
from sprint.latency.model import LatencyModel

SCHEDULES = ("barrier", "stream")
_EPS = 1e-12
_LINE = re.compile(r"[^\n]*\n|[^\n]+")  # lines with their break; they join back to the text


@dataclass
class Decoding:
    """A call decoding on the GPU: `tokens` to generate from a KV cache of `context` tokens, from `ready`
    (its prefill done). `marks`: (tokens generated, what happens then), e.g. a streamed prompt's end."""

    call: CallRecord
    tokens: int
    context: int
    ready: float
    marks: list[tuple[int, Callable[[float], None]]] = field(default_factory=list)
    on_end: Callable[[float], None] | None = None
    done: int = 0


class OneGpu:
    """Decode steps of one problem's sequences on a GPU of its own (see the module docstring)."""

    def __init__(self, model: LatencyModel, now: float = 0.0) -> None:
        self.model, self.now = model, now
        self.waiting: list[Decoding] = []
        self.decoding: list[Decoding] = []

    def submit(self, seq: Decoding) -> None:
        seq.marks.sort(key=lambda m: m[0])
        self.waiting.append(seq)

    def _cost(self, m: int, n: int, contexts: int) -> float:
        """Seconds of m steps of n sequences whose contexts sum to `contexts` at the first (each step adds n)."""
        model = self.model
        return m * model.step(n, contexts) + model.step_per_context_s * n * m * (m - 1) / 2

    def _steps_until(self, delta: float, n: int, contexts: int) -> float:
        """The fewest steps (≥ 1) whose cost reaches `delta`; inf when steps cost nothing."""
        a, c = self.model.step(n, contexts), self.model.step_per_context_s * n
        if a <= 0 and c <= 0:
            return math.inf
        if c <= 0:
            m = max(1, math.ceil(delta / a - 1e-9))
        else:
            b = a - c / 2
            m = max(1, math.ceil((-b + math.sqrt(b * b + 2 * c * delta)) / c))
        while m > 1 and self._cost(m - 1, n, contexts) >= delta - _EPS:
            m -= 1
        while self._cost(m, n, contexts) < delta - _EPS:
            m += 1
        return m

    def _fire(self, seq: Decoding, at: float) -> None:
        while seq.marks and seq.marks[0][0] <= seq.done:
            seq.marks.pop(0)[1](at)

    def _finish(self, seq: Decoding, at: float) -> None:
        seq.call.end = at
        if seq.on_end is not None:
            seq.on_end(at)

    def _admit(self) -> None:
        for seq in sorted((s for s in self.waiting if s.ready <= self.now + _EPS), key=lambda s: s.ready):
            self.waiting.remove(seq)
            self._fire(seq, seq.ready)
            if seq.tokens <= 0:
                self._finish(seq, seq.ready)
            else:
                self.decoding.append(seq)

    def run(self) -> float:
        """Step until every sequence (and every one they start) is done; returns the time then."""
        while self.waiting or self.decoding:
            if not self.decoding:
                self.now = max(self.now, min(s.ready for s in self.waiting))
            self._admit()
            if not self.decoding:
                continue
            n = len(self.decoding)
            contexts = sum(s.context + s.done for s in self.decoding)
            m: float = min(s.tokens - s.done for s in self.decoding)
            for s in self.decoding:
                if s.marks:
                    m = min(m, s.marks[0][0] - s.done)
            if self.waiting:
                m = min(m, self._steps_until(min(s.ready for s in self.waiting) - self.now, n, contexts))
            steps = int(m)
            for s in self.decoding:
                if s.done == 0:
                    s.call.first_token = self.now + self._cost(1, n, contexts)
            self.now += self._cost(steps, n, contexts)
            for s in list(self.decoding):
                s.done += steps
                self._fire(s, self.now)
                if s.done >= s.tokens:
                    self.decoding.remove(s)
                    self._finish(s, self.now)
        return self.now


@dataclass
class PathTiming:
    """A modelled timeline: its calls in seconds from the start of the problem."""

    schedule: str
    total: float
    phase_ends: list[float] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)


def critical_path_timeline(
    traj: Trajectory,
    model: LatencyModel,
    counter: Counter,
    schedule: str = "barrier",
    prompt_overhead_tokens: int = 0,
    stop_tags: bool = True,
    overhead_cached: bool = False,
) -> PathTiming:
    """The timeline of one SPRINT trajectory alone on the GPU: every call with its start and end.

    Token counts are additive (a prompt counts as the sum of its parts), which is exact for a word
    counter and within a few tokens for a BPE tokenizer. Prompts, as the orchestrator builds them
    (chat-template tokens go into `prompt_overhead_tokens` with the agent prompt; `overhead_cached`:
    the server has them in its prefix cache already, as it has a prompt every problem shares):

    - planner of phase p: overhead + `<Question>…</Question>` + `<think>` + phases 1..p-1 + `<Plan_p>`;
      it decodes the plan (prompt tags included) and, when `stop_tags`, the `</Plan_p>` that stops it;
    - executor p.k: the planner's prompt + the plan it sees (barrier: the whole `…</Plan_p>`, from the
      plan's end; stream: the plan up to its own `</prompt_p.k>`, from the step the planner wrote it)
      + `<Execution_p>` + `<execution_p.k>`; it decodes the execution (+ `</execution_p.k>`), beside
      the phase's other executors (and, streamed, the planner);
    - final answer: the planner's prompt after the last phase + `<Final_answer>`, decoded alone.

    Each call prefills only what this problem has not computed yet: an executor its opening tags (the
    plan is in the planner's cache), the next planner the phase's closing tags and its executions
    (computed in the executors' own sequences, under another prefix). The next phase starts when
    every call of this one is done. Other problems and the server's capacity are left out: this is
    one problem alone on the GPU; the replay server measures the rest.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    timing = PathTiming(schedule, 0.0)
    context = prompt_overhead_tokens + counter(render_question(traj.question)) + counter(tags.THINK)
    cached = prompt_overhead_tokens if overhead_cached else 0  # tokens of `context` the server has computed
    now = 0.0
    for phase in traj.phases:
        p = phase.number
        planner_prompt = context + counter(tags.plan_open(p))
        plan_tokens = counter(phase.plan)
        close_plan = counter(tags.plan_close(p))
        plan_generated = plan_tokens + (close_plan if stop_tags else 0)
        gpu = OneGpu(model, now)
        planner_call = CallRecord(PLANNER, p, None, planner_prompt, plan_generated, start=now,
                                  cached_tokens=min(cached, planner_prompt))
        planner = Decoding(planner_call, plan_generated, planner_prompt,
                            now + _prefill(model, planner_prompt, cached))
        timing.calls.append(planner_call)
        launches: list[Callable[[float], None]] = []
        for prompt in phase.prompts:
            execution = phase.execution(prompt.name)
            generated = (counter(execution.text) if execution else 0) + (
                counter(tags.execution_close(prompt.name)) if stop_tags else 0)
            seen = counter(phase.plan[: prompt.end]) if schedule == "stream" else plan_tokens + close_plan
            opening = counter(tags.executions_open(p)) + counter(tags.execution_open(prompt.name))
            call = CallRecord(EXECUTOR, p, prompt.name, planner_prompt + seen + opening, generated,
                              cached_tokens=planner_prompt + min(seen, plan_generated))
            timing.calls.append(call)
            launch = _launcher(gpu, model, call, generated)
            if schedule == "stream":
                planner.marks.append((min(seen, plan_generated), launch))
            else:
                launches.append(launch)
        if launches:
            planner.on_end = _together(launches)
        gpu.submit(planner)
        now = gpu.run()
        timing.phase_ends.append(now)
        cached = planner_prompt + plan_generated
        context += counter(phase.render())
    if traj.final_answer is not None:
        final_prompt = context + counter(tags.FINAL)
        generated = counter(traj.final_answer) + (counter(tags.FINAL_END) if stop_tags else 0)
        phase_no = (traj.phases[-1].number if traj.phases else 0) + 1  # the answer comes after the last phase
        call = CallRecord(PLANNER, phase_no, FINAL, final_prompt, generated, start=now,
                          cached_tokens=min(cached, final_prompt))
        gpu = OneGpu(model, now)
        gpu.submit(Decoding(call, generated, final_prompt, now + _prefill(model, final_prompt, cached)))
        now = gpu.run()
        timing.calls.append(call)
    timing.total = now
    return timing


def _prefill(model: LatencyModel, prompt: int, cached: int) -> float:
    cached = min(cached, prompt)
    return model.prefill(prompt - cached, cached)


def _launcher(gpu: OneGpu, model: LatencyModel, call: CallRecord, generated: int) -> Callable[[float], None]:
    """Start `call` at a moment only the simulation knows (a plan's end, a streamed prompt's end)."""

    def launch(at: float) -> None:
        call.start = at
        gpu.submit(Decoding(call, generated, call.prompt_tokens,
                             at + _prefill(model, call.prompt_tokens, call.cached_tokens or 0)))

    return launch


def _together(launches: list[Callable[[float], None]]) -> Callable[[float], None]:
    """Start every executor of a barrier phase when its plan ends, in prompt order."""

    def start_all(at: float) -> None:
        for launch in launches:
            launch(at)

    return start_all


def critical_path(traj: Trajectory, model: LatencyModel, counter: Counter, schedule: str = "barrier",
                  **options: Any) -> float:
    """Lowest wall-clock seconds for one problem under `schedule`, with the GPU to itself.

    barrier: a phase's executors start when its plan is complete. stream: executor p.k starts as
    soon as the planner has written its `</prompt_p.k>`. Either way the next phase starts when the
    plan is finished and all executions are done. `options` are those of `critical_path_timeline`.
    """
    return critical_path_timeline(traj, model, counter, schedule, **options).total


def sequential_timeline(model: LatencyModel, output_tokens: int, prompt_tokens: int,
                        cached_tokens: int = 0) -> PathTiming:
    """A sequential model's one generation alone on the GPU (the baseline's modelled seconds)."""
    cached = min(cached_tokens, prompt_tokens)
    seconds = model.sequential_time(output_tokens, prompt_tokens, cached)
    call = CallRecord(BASELINE, 0, None, prompt_tokens, output_tokens, start=0.0, end=seconds, cached_tokens=cached)
    if output_tokens > 0:
        call.first_token = model.prefill(prompt_tokens - cached, cached) + model.step(1, prompt_tokens)
    return PathTiming("sequential", seconds, [seconds], [call])


def line_counts(tokenizer: str, texts: list[str]) -> dict[str, int]:
    """Token counts of `texts`, each the sum of its lines' (with their breaks), every distinct line encoded once.

    The timeline asks for the same lines many times (a plan, each prompt's prefix of it, the phase
    as the next call's context), so counting lines is a fraction of the cost of whole texts. That is
    the latency model's own additivity, exact unless a line starts with a space or a non-ASCII
    character that BPE would merge with the break before it (totals within 0.03% on
    benchmarks/make_trajectories.py's trajectories).
    """
    lines = {t: _LINE.findall(t) for t in set(texts)}
    table = batch_counts(tokenizer, list({line for parts in lines.values() for line in parts}))
    return {t: sum(table[line] for line in parts) for t, parts in lines.items()}


def modelled_timelines(trajs: list[Trajectory], tokenizer: str, model: LatencyModel,
                       extra_texts: tuple[str, ...] = (), **options: Any) -> tuple[list[dict[str, PathTiming]], dict[str, int]]:
    """Per trajectory, {schedule: its timeline} under `model` (`options`: those of `critical_path_timeline`),
    and the token counts used, `extra_texts` counted with them (e.g. a baseline's prompt parts)."""
    texts: list[str] = list(extra_texts)

    def note(text: str) -> int:
        texts.append(text)
        return 0

    for traj in trajs:
        for schedule in SCHEDULES:
            critical_path_timeline(traj, model, note, schedule, **options)
    counts = line_counts(tokenizer, texts)
    return [{s: critical_path_timeline(t, model, counts.__getitem__, s, **options) for s in SCHEDULES}
            for t in trajs], counts
