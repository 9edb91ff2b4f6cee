"""SFT rows beside packing's main rows: executor views (`--executor-rows`) and the sequential form (`--sequential`).

Executor views. In a packed row `<execution_1.2>` always follows execution_1.1's text, but at
inference the executor of prompt 1.2 is sent the past phases, the plan, `<Execution_1>` and its own
opened `<execution_1.2>`, without its siblings (`sprint.inference.schedule`). A model trained only
on the packed rows has never seen that context, and a small one then writes execution 1.1 again.
An executor row trains exactly that view: its assistant turn is `<think>\\n` + the text the
orchestrator continues for executor p.k + the execution + `</execution_p.k>`. The view is built
with the trajectory-model functions the schedules use (`Trajectory.render_context`,
`open_executions`, `Phase.render_plan` / `Phase.streamed_view`, `open_execution`), so training and
inference cannot drift apart; tests/test_sft_rows.py runs the orchestrator against these rows.
Every executed prompt gets its row, also the first of a barrier phase, whose view the packed row
already holds verbatim: measured in the mini experiment, a small model trained without those rows
learns "a fresh view means prompt 2 or 3" and mixes up prompts 1.2 and 1.3 (it copies the wrong
prompt's numbers in 40 % of its executor rows after 785 steps); with them it reads the tag.
`--executor-rows distinct` trains each view the schedules send once: no view that the packed row holds
verbatim (the first prompt of a phase under barrier, and a lone prompt under both), and one row where
both schedules send the same view (a phase's last prompt). Under one token budget the rows of `both`
spend most of it on contexts that carry no loss, and half of them train a view already trained; `distinct`
passes over the plans and executions about 1.7 times as often (the arithmetic miniature's rows).

Only the execution is trained. The turn is two assistant messages, the context with `"loss": false`
and the execution + closing tag with `"loss": true`: ms-swift 4.6 (template backend `swift`) joins
consecutive assistant messages into one response with no separator (`_swift_prepare_inputs`) and
masks each part by its own flag (`LossScale._inner_call`), so the model sees the very text of one
message while the labels cover the execution and the end-of-turn token only. Training the context
too would teach the planner what it shows: a stream view cuts the plan after prompt p.k and goes on
with `<Execution_p>`, a planner stop string, so a planner would learn to end its plans early.
tests/test_sft_rows.py checks the labels with ms-swift's own encoder.

Sequential form. The RFT baseline (the paper's sequential model) is trained on the same kept traces
and split: user = the same user turn, assistant = `<think>\\n` + thought + `\\n</think>\\n\\n` +
the reference solution, which is what `sprint baseline` continues after its pre-filled `<think>\\n`
(it reads the last `\\boxed{}`, in the solution).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

from sprint.format.prompt_format import sft_user_content
from sprint.format.tags import THINK, THINK_END
from sprint.format.trajectory import (
    Phase,
    Prompt,
    Trajectory,
    open_execution,
    open_executions,
    render_execution,
)

# --executor-rows: which executor views become extra training rows (none: the released data only).
EXECUTOR_ROW_MODES = ("none", "barrier", "stream", "both", "distinct")
DEFAULT_EXECUTOR_ROWS = "none"
# The schedules' names (`sprint.inference.schedule.SCHEDULES`; curation may not import inference,
# tests/test_sft_rows.py checks that the two agree).
VIEW_SCHEDULES = ("barrier", "stream")
_MODE_SCHEDULES = {"none": (), "barrier": ("barrier",), "stream": ("stream",), "both": VIEW_SCHEDULES,
                   "distinct": VIEW_SCHEDULES}
EXEC_ID = "#exec_"  # id of an executor row: `<trace id>#exec_<p.k>@<schedule>`
SEQUENTIAL_PREFIX = "sequential_"  # sequential_train.jsonl / sequential_test.jsonl


def executor_schedules(mode: str) -> tuple[str, ...]:
    """The schedules whose executor view `--executor-rows MODE` trains."""
    if mode not in _MODE_SCHEDULES:
        raise ValueError(f"unknown executor-rows mode {mode!r}; use one of {', '.join(EXECUTOR_ROW_MODES)}")
    return _MODE_SCHEDULES[mode]


def plan_as_seen(phase: Phase, prompt: Prompt, schedule: str) -> str:
    """The plan block executor `prompt` is shown: barrier the whole plan, stream the plan up to its prompt."""
    if schedule == "barrier":
        return phase.render_plan()
    if schedule == "stream":
        return phase.streamed_view(prompt)
    raise ValueError(f"unknown schedule {schedule!r}; use one of {', '.join(VIEW_SCHEDULES)}")


def executor_head(traj: Trajectory, index: int, prompt: Prompt, schedule: str) -> str:
    """What the schedule hands executor `prompt` of `traj.phases[index]` (its `head`): the past
    phases, the plan as seen, the opened `<Execution_p>`."""
    phase = traj.phases[index]
    past = Trajectory(traj.question, traj.phases[:index]).render_context()
    return past + open_executions(plan_as_seen(phase, prompt, schedule), phase.number)


def executor_context(traj: Trajectory, index: int, prompt: Prompt, schedule: str) -> str:
    """The assistant text (after `<think>\\n`) the orchestrator continues for that executor: the
    head and its own opened `<execution_p.k>`."""
    return executor_head(traj, index, prompt, schedule) + open_execution(prompt.name)


def executor_id(item_id: str, prompt: str, schedule: str) -> str:
    return f"{item_id}{EXEC_ID}{prompt}@{schedule}"


def _row(user: str, assistant: str, row_id: str) -> dict[str, Any]:
    """One training row in the `messages` layout (as `packing.sft_example`)."""
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}], "id": row_id}


def executor_row(user: str, context: str, execution: str, row_id: str) -> dict[str, Any]:
    """An executor row: the user turn, then one assistant turn in two messages, the context the
    executor is sent (`<think>\\n` included; not trained) and what it writes (trained)."""
    return {"messages": [{"role": "user", "content": user},
                         {"role": "assistant", "content": context, "loss": False},
                         {"role": "assistant", "content": execution, "loss": True}], "id": row_id}


def assistant_text(row: dict[str, Any]) -> str:
    """The row's assistant turn as the model sees it: its assistant messages joined, as ms-swift joins them."""
    return "".join(m["content"] for m in row["messages"] if m["role"] == "assistant")


def executor_rows(user: str, item_id: str, traj: Trajectory, schedules: tuple[str, ...],
                  max_prompts_per_plan: int, main: str | None = None) -> list[dict[str, Any]]:
    """One row per executed prompt and schedule, in phase and prompt order; plans with more prompts
    than `max_prompts_per_plan` are skipped, as they are for the main rows. With `main` (the packed
    row's assistant text: `--executor-rows distinct`), each distinct view once and none that `main`
    already trains verbatim."""
    rows = []
    seen: set[str] = set()
    for index, phase in enumerate(traj.phases):
        prompts = phase.prompts
        if len(prompts) > max_prompts_per_plan:
            continue
        for prompt in prompts:
            execution = phase.execution(prompt.name)
            if execution is None:
                continue
            # render_execution opens with `open_execution`, the end of executor_context: the rest is trained
            opened, rendered = open_execution(prompt.name), render_execution(prompt.name, execution.text)
            assert rendered.startswith(opened)
            trained = rendered[len(opened):]
            for schedule in schedules:
                context = f"{THINK}\n" + executor_context(traj, index, prompt, schedule)
                if main is not None:
                    if context in seen or main.startswith(context + trained):
                        continue
                    seen.add(context)
                rows.append(executor_row(user, context, trained, executor_id(item_id, prompt.name, schedule)))
    return rows


def sequential_assistant_content(thought: str, solution: str) -> str:
    """What a sequential reasoning model emits: its thought inside `<think>`, then the solution."""
    return f"{THINK}\n{thought.strip()}\n{THINK_END}\n\n{solution.strip()}"


def sequential_example(user: str, item_id: str, thought: str, solution: str) -> dict[str, Any]:
    """The RFT row of one kept trace (same id and user turn as its SPRINT row)."""
    return _row(user, sequential_assistant_content(thought, solution), item_id)


@dataclass
class ExtraRows:
    """The extra rows of one `pack` run, written trace by trace to working files (`*.tmp`, cleared
    like packing's own) and remembered by trace id only, until the split is known."""

    folder: Path
    agent_prompt: str
    executor_mode: str  # --executor-rows (EXECUTOR_ROW_MODES)
    sequential: bool
    max_prompts_per_plan: int
    schedules: tuple[str, ...] = field(init=False)  # whose executor views the mode trains
    executor_ids: list[str] = field(default_factory=list)  # the trace of each line of executor_part
    sequential_ids: list[str] = field(default_factory=list)  # the trace of each line of sequential_part
    no_thought: list[str] = field(default_factory=list)  # kept traces without a thought: no sequential row
    _files: list[IO[str]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.schedules = executor_schedules(self.executor_mode)  # an unknown mode fails here, before any row

    @property
    def executor_part(self) -> Path:
        return self.folder / "pack-executor-rows.tmp"

    @property
    def sequential_part(self) -> Path:
        return self.folder / "pack-sequential.tmp"

    def __enter__(self) -> Self:
        self._files = [open(self.executor_part, "w", encoding="utf-8"), open(self.sequential_part, "w", encoding="utf-8")]
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self._files:
            f.close()

    def add(self, item_id: str, traj: Trajectory, thought: str | None, solution: str | None, main: str) -> None:
        """The extra rows of one kept trace (`main`: its packed row's assistant text)."""
        exec_f, seq_f = self._files
        user = sft_user_content(self.agent_prompt, traj.question)
        for row in executor_rows(user, item_id, traj, self.schedules, self.max_prompts_per_plan,
                                 main if self.executor_mode == "distinct" else None):
            exec_f.write(json.dumps(row, ensure_ascii=False) + "\n")
            self.executor_ids.append(item_id)
        if not self.sequential:
            return
        if not (thought or "").strip():
            self.no_thought.append(item_id)
            return
        seq_f.write(json.dumps(sequential_example(user, item_id, thought or "", solution or ""), ensure_ascii=False) + "\n")
        self.sequential_ids.append(item_id)

    def remove_parts(self) -> None:
        for part in (self.executor_part, self.sequential_part):
            part.unlink(missing_ok=True)

    def summary(self, n_executor: int, n_seq_train: int, n_seq_test: int) -> dict[str, Any]:
        """The summary's entries for the extra rows (none for the defaults, whose summary is unchanged)."""
        out: dict[str, Any] = {}
        if self.schedules:
            out["executor_rows"] = {"mode": self.executor_mode, "train": n_executor}
        if self.sequential:
            out["sequential"] = {"train": n_seq_train, "test": n_seq_test, "no_thought": len(self.no_thought)}
        return out


def format_extra_summary(summary: dict[str, Any]) -> list[str]:
    """The summary lines of the extra rows."""
    lines = []
    if "executor_rows" in summary:
        ex = summary["executor_rows"]
        lines.append(f"  executor rows ({ex['mode']}): {ex['train']} more train rows (test: main rows only)")
    if "sequential" in summary:
        seq = summary["sequential"]
        lines.append(f"  sequential (RFT) rows: train {seq['train']}, test {seq['test']}")
        if seq["no_thought"]:
            lines.append(f"  warning: {seq['no_thought']} kept traces have no thought, so no sequential row")
    return lines
