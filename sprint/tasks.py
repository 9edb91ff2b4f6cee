"""Task adapters: turn a data row into the question the model sees and the gold answer it is graded on.

Orchestration and the sequential baseline share these, so both see exactly the same question text
for a problem. Adapters never grade themselves beyond calling `sprint.grading.grade`, the one
place that knows how answers compare.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

from sprint.data import Item, load_items
from sprint.errors import UserError

TASK_NAMES = ("math", "gpqa", "countdown")
LETTERS = "ABCD"
GPQA_INCORRECT = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


@dataclass(frozen=True)
class Problem:
    """One evaluation problem: a stable id, the question text, the gold answer (None if unknown)."""

    id: str
    index: int
    question: str
    gold: Any


@dataclass(frozen=True)
class TaskAdapter:
    """Base adapter (MATH-style): the question column as is, gold = `answer` or the solution's last box."""

    name: str = "math"
    default_split: str = "test"
    id_column: str | None = None  # None: data.py's usual id columns, else the row index
    required: tuple[str, ...] = ("question",)  # columns load_items must find

    def question(self, item: Item) -> str:
        return item.question.strip()

    def gold(self, item: Item) -> Any:
        if item.answer not in (None, ""):
            return str(item.answer).strip()
        if item.solution:
            from sprint.grading import last_boxed

            return last_boxed(item.solution)
        return None

    def problem(self, item: Item) -> Problem:
        return Problem(id=item.id, index=item.index, question=self.question(item), gold=self.gold(item))

    def grade(self, pred: str | None, gold: Any) -> bool | None:
        """Correctness of `pred`; None when the item has no gold answer to compare with."""
        if gold is None:
            return None
        from sprint.grading import grade

        return grade(self.name, pred, gold)


def _item_seed(seed: int, key: str) -> int:
    """A per-item seed that depends only on the run seed and the item's key, never on order."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big")


@dataclass(frozen=True)
class GPQATask(TaskAdapter):
    """GPQA(-Diamond): four options shuffled under a fixed per-item seed, labelled (A)-(D); gold = letter."""

    name: str = "gpqa"
    default_split: str = "train"  # Idavidrein/gpqa ships everything as train
    id_column: str | None = "Record ID"
    seed: int = 0

    def _options(self, item: Item) -> tuple[list[str], int]:
        row = item.row
        missing = [c for c in ("Correct Answer", *GPQA_INCORRECT) if row.get(c) in (None, "")]
        if missing:
            raise UserError(
                f"GPQA row {item.id} lacks column(s) {', '.join(missing)}; pass GPQA data with "
                "'Question', 'Correct Answer' and 'Incorrect Answer 1..3'"
            )
        options = [str(row["Correct Answer"]).strip()] + [str(row[c]).strip() for c in GPQA_INCORRECT]
        order = list(range(4))
        random.Random(_item_seed(self.seed, str(row.get("Record ID") or item.id))).shuffle(order)
        return [options[i] for i in order], order.index(0)

    def question(self, item: Item) -> str:
        options, _ = self._options(item)
        lines = [item.question.strip(), ""]
        lines += [f"({letter}) {text}" for letter, text in zip(LETTERS, options)]
        lines += ["", "Answer with the letter of the correct option inside \\boxed{}, e.g. \\boxed{A}."]
        return "\n".join(lines)

    def gold(self, item: Item) -> Any:
        _, correct = self._options(item)
        return LETTERS[correct]


@dataclass(frozen=True)
class CountdownTask(TaskAdapter):
    """Countdown: reach `target` from `nums` with + - * / using each number once; gold = {nums, target}."""

    name: str = "countdown"
    default_split: str = "test"
    id_column: str | None = "index"
    required: tuple[str, ...] = ()  # the question is built from `nums` and `target`

    @staticmethod
    def _numbers(item: Item) -> tuple[list[int], int]:
        row = item.row
        if "nums" not in row or "target" not in row:
            raise UserError(
                f"Countdown row {item.id} has no 'nums'/'target' columns (columns: {', '.join(sorted(row))}); "
                "pass Countdown data such as Jiayi-Pan/Countdown-Tasks-3to4"
            )
        try:
            return [int(n) for n in row["nums"]], int(row["target"])
        except (TypeError, ValueError):
            raise UserError(f"Countdown row {item.id}: 'nums' must be a list of integers and 'target' an integer") from None

    def question(self, item: Item) -> str:
        nums, target = self._numbers(item)
        listed = ", ".join(str(n) for n in nums)
        return (
            f"Using the numbers {listed}, write an arithmetic expression whose value is {target}. "
            "Each number must be used exactly once; you may use +, -, \\times and \\div and parentheses. "
            "Give the expression (without the result) inside \\boxed{}, e.g. \\boxed{(1 + 2) \\times 3}."
        )

    def gold(self, item: Item) -> Any:
        nums, target = self._numbers(item)
        return {"nums": nums, "target": target}


def get_task(name: str, seed: int = 0) -> TaskAdapter:
    """The adapter for `--task NAME`."""
    if name == "math":
        return TaskAdapter()
    if name == "gpqa":
        return GPQATask(seed=seed)
    if name == "countdown":
        return CountdownTask()
    raise UserError(f"unknown task {name!r}; use one of {', '.join(TASK_NAMES)}")


def load_problems(
    task: TaskAdapter,
    source: str,
    split: str | None = None,
    subset: str | None = None,
    range_spec: str | None = None,
) -> list[Problem]:
    """Load, slice and adapt a dataset; `split=None` means the task's usual evaluation split."""
    items = load_items(
        source,
        split=split or task.default_split,
        subset=subset,
        range_spec=range_spec,
        id_col=task.id_column,
        require=task.required,
    )
    return [task.problem(item) for item in items]
