"""When a phase's executors start: the barrier and stream schedules, side by side.

Both are dispatchers of one phase with the same interface, so the per-problem loop never asks
which schedule it runs:
- `on_text`: the planner call's streaming callback (None: the call is not streamed);
- `redraw()`: the plan is drawn again (a plan cut at its token limit), nothing started is kept;
- `collect(plan)`: the executions of the final plan's prompts, in order;
- `close()`: cancel and reap whatever still runs (always called, also after a failure).

barrier (the authors' reference code): the executors start when the plan is complete, and each
sees the whole plan `<Plan_p>…</Plan_p>`.
stream (the paper's text): executor p.k starts as soon as its prompt is settled in the planner's
text so far (`sprint.format.trajectory.settled_prompts`). It sees the past phases + the normalised
plan up to and including its own `</prompt_p.k>`, closed as a plan (`Phase.streamed_view`), +
`\\n\\n<Execution_p>\\n`: none of the later prompts. Every executor of the phase gets this context, also one
started only when the plan ends (a prompt cut by the token limit, a cache hit), so the requests
depend on the final plan only, never on timing. A restarted planner stream (the client retried a
dropped stream) keeps the executors whose plan prefix the new text repeats and cancels the others
once it diverges.

`SCHEDULES` is the one registry of schedule names; `make_dispatch` builds one phase's dispatcher.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from sprint.core.calls import CallRecord
from sprint.core.errors import UserError
from sprint.format.trajectory import Execution, Phase, Prompt, open_executions, settled_prompts

# (head, phase, prompt, sink) -> the execution; `sink` collects the call records it makes.
ExecuteFn = Callable[[str, int, Prompt, "list[CallRecord] | None"], Awaitable[Execution]]

class Dispatch(Protocol):
    """One phase's executor dispatcher (the interface both schedules share)."""

    on_text: Callable[[str], None] | None

    def redraw(self) -> None: ...

    async def collect(self, plan: str) -> list[Execution]: ...

    async def close(self) -> None: ...


async def _gather_or_cancel(tasks: list[asyncio.Future]) -> list[Execution]:
    """Results in order; when one fails, the others are cancelled and reaped before it is raised."""
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class BarrierDispatch:
    """barrier: all executors of the phase start at once when the plan is complete."""

    on_text: Callable[[str], None] | None = None  # the planner call is not streamed

    def __init__(self, execute: ExecuteFn, context: str, phase: int) -> None:
        self.execute = execute
        self.context = context
        self.phase = phase

    def redraw(self) -> None:
        """Nothing started before the plan was complete: nothing to drop."""

    async def collect(self, plan: str) -> list[Execution]:
        p = self.phase
        phase = Phase(p, plan)
        head = self.context + open_executions(phase.render_plan(), p)
        tasks = [asyncio.ensure_future(self.execute(head, p, pr, None)) for pr in phase.prompts]
        return await _gather_or_cancel(tasks)

    async def close(self) -> None:
        """`collect` reaps its own executors."""


@dataclass
class _Launched:
    """An executor started by the stream schedule, with the calls it made so far."""

    task: asyncio.Task
    records: list[CallRecord]  # the calls it made so far


class StreamDispatch:
    """stream: start each executor as soon as its prompt is settled in the streamed plan.

    `on_text` receives the planner's accumulated text after every streamed chunk (a retried
    stream starts again from ""). Executors are keyed by the normalised plan up to the end of
    their prompt, which is also what they see, so a restarted stream that writes the same prefix
    reuses the running executor instead of starting a duplicate.
    """

    def __init__(self, execute: ExecuteFn, context: str, phase: int) -> None:
        self.execute = execute
        self.context = context
        self.phase = phase
        self.launched: dict[str, _Launched] = {}
        self._text = ""
        self._dropped: list[asyncio.Task] = []

    def head(self, plan: str, prompt: Prompt) -> str:
        """What executor `prompt` continues (before its `<execution_p.k>\n`): the plan up to its prompt, closed."""
        return self.context + open_executions(Phase(self.phase, plan).streamed_view(prompt), self.phase)

    def on_text(self, text: str) -> None:  # type: ignore[override]
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
        task = asyncio.ensure_future(self.execute(self.head(plan, prompt), self.phase, prompt, records))
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


# The registry: schedule name -> dispatcher class. The first one is the default.
SCHEDULES: dict[str, Callable[[ExecuteFn, str, int], Dispatch]] = {
    "barrier": BarrierDispatch,
    "stream": StreamDispatch,
}


def schedule_names() -> tuple[str, ...]:
    return tuple(SCHEDULES)


def check_schedule(name: str) -> str:
    """`name` if it is a known schedule, else a UserError naming the known ones."""
    if name not in SCHEDULES:
        raise UserError(f"unknown schedule {name!r}; use {' or '.join(SCHEDULES)}")
    return name


def make_dispatch(schedule: str, execute: ExecuteFn, context: str, phase: int) -> Dispatch:
    """The dispatcher of one phase under `schedule`; `execute` runs one executor call chain."""
    return SCHEDULES[check_schedule(schedule)](execute, context, phase)
