"""Task adapters and the task registry: how a data row becomes a question, and how an answer is graded.

Orchestration, the sequential baseline and the evaluation all go through an adapter, so they see
the same question text, extract the answer the same way and grade it with the same rule. The
registry (`TASKS`: name -> factory(seed)) is the only list of task names; adding a task is one
adapter class plus one `register_task` call (see HACKING.md, "Adding a task"). The answer
comparisons themselves (Math-Verify, GPQA letters, the Countdown checker) live in `sprint.tasks.grading`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sprint.core.data import Item, load_items
from sprint.core.errors import UserError
from sprint.tasks.grading import (
    DEFAULT_TIMEOUT_S,
    MIN_ITEMS_FOR_POOL,
    check_countdown,
    countdown_gold,
    grade_gpqa,
    grade_math,
    grade_math_many,
    last_boxed,
)

LETTERS = "ABCD"
GPQA_INCORRECT = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
ANSWER_COLUMNS = ("answer", "gold", "gold_answer", "target_answer")  # gold columns of a `--gold` CSV


@dataclass(frozen=True)
class Problem:
    """One evaluation problem: a stable id, the question text, the gold answer (None if unknown)."""

    id: str
    index: int
    question: str
    gold: Any


def require_gold(task: str, gold: Any) -> None:
    """A problem that is graded must have a gold answer; a missing one is the user's data, not a wrong answer."""
    if gold is None or (isinstance(gold, str) and not gold.strip()):
        raise UserError(f"a {task} problem has no gold answer; pass gold answers for every problem graded")


@dataclass(frozen=True)
class TaskAdapter:
    """A task: row -> question + gold, text -> answer, answer + gold -> correct.

    The defaults suit a free-form task: the question column as is, gold = the `answer` column or the
    solution's last box, the answer = the last `\\boxed{}`, graded by exact (stripped) string match.
    Subclasses override what differs; `compare` is the one rule most of them change.
    """

    name: str = "task"
    default_split: str = "test"
    id_column: str | None = None  # None: data.py's usual id columns, else the row index
    required: tuple[str, ...] = ("question",)  # columns load_items must find

    def question(self, item: Item) -> str:
        return item.question.strip()

    def gold(self, item: Item) -> Any:
        if item.answer not in (None, ""):
            return str(item.answer).strip()
        if item.solution:
            return last_boxed(item.solution)
        return None

    def problem(self, item: Item) -> Problem:
        return Problem(id=item.id, index=item.index, question=self.question(item), gold=self.gold(item))

    def extract(self, text: str | None) -> str | None:
        """The answer a model output gives: its last `\\boxed{}` (as the paper's evaluation reads it)."""
        answer = last_boxed(text) if text else None
        return answer if answer and answer.strip() else None

    def compare(self, pred: str | None, gold: Any) -> bool:
        """Is `pred` right? `gold` is known to be present."""
        return pred is not None and pred.strip() == str(gold).strip()

    def grade(self, pred: str | None, gold: Any) -> bool | None:
        """Correctness of `pred`; None when the item has no gold answer to compare with."""
        if gold is None:
            return None
        require_gold(self.name, gold)
        return self.compare(pred, gold)

    def grade_many(self, preds: Sequence[str | None], golds: Sequence[Any], workers: int | None = None) -> list[bool]:
        """Grade a batch in which every item must have a gold answer (`workers`: for graders that use processes)."""
        self.check_batch(preds, golds)
        return [bool(self.compare(p, g)) for p, g in zip(preds, golds)]

    def check_batch(self, preds: Sequence[Any], golds: Sequence[Any]) -> None:
        if len(preds) != len(golds):
            raise UserError(f"{len(preds)} predictions but {len(golds)} gold answers; pass one gold per prediction")
        for gold in golds:
            require_gold(self.name, gold)

    def csv_gold(self, row: Mapping[str, str]) -> Any:
        """The gold answer of one row of a `--gold` CSV (None when the row has none).

        LookupError: the file lacks the columns this task needs; ValueError: this row's value is unusable.
        """
        col = next((c for c in ANSWER_COLUMNS if c in row), None)
        if col is None:
            raise LookupError(f"no answer column (columns: {', '.join(map(str, row))}); name it `answer`")
        value = row.get(col)
        return None if value in (None, "") else value


@dataclass(frozen=True)
class MathTask(TaskAdapter):
    """MATH-style: gold = `answer` or the solution's last box; graded by normalisation + Math-Verify."""

    name: str = "math"

    def compare(self, pred: str | None, gold: Any) -> bool:
        return grade_math(pred, str(gold))

    def grade_many(
        self,
        preds: Sequence[str | None],
        golds: Sequence[Any],
        workers: int | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        min_pool_items: int = MIN_ITEMS_FOR_POOL,
    ) -> list[bool]:
        """Sympy work for a large batch runs in worker processes (see `grading.grade_math_many`)."""
        self.check_batch(preds, golds)
        return grade_math_many(preds, [str(g) for g in golds], workers, timeout_s=timeout_s,
                               min_pool_items=min_pool_items)


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

    def compare(self, pred: str | None, gold: Any) -> bool:
        return grade_gpqa(pred, str(gold))


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

    def compare(self, pred: str | None, gold: Any) -> bool:
        nums, target = countdown_gold(gold)
        return check_countdown(pred, nums, target)

    def csv_gold(self, row: Mapping[str, str]) -> Any:
        """`nums` (a JSON list) and `target` columns, else an answer column holding the gold as usual."""
        if "nums" in row and "target" in row:
            try:
                return {"nums": [int(n) for n in json.loads(row["nums"])], "target": int(row["target"])}
            except (ValueError, TypeError):
                raise ValueError("nums must be a JSON list of integers, target an integer") from None
        try:
            return super().csv_gold(row)
        except LookupError as exc:
            raise LookupError(f"{exc} (or give nums,target for countdown)") from None


@dataclass(frozen=True)
class MiniCountdownTask(CountdownTask):
    """The mini experiment's Countdown (`sprint mini-data`): the question as the generator wrote it,
    in the word-level text its small tokenizer knows; graded by the same exact checker."""

    name: str = "countdown-mini"
    id_column: str | None = None  # the generator's `id`
    required: tuple[str, ...] = ("question",)

    def question(self, item: Item) -> str:
        return item.question.strip()


@dataclass(frozen=True)
class MiniArithmeticTask(TaskAdapter):
    """The mini experiment's arithmetic (`sprint mini-data --task arithmetic`): the question as the generator
    wrote it, gold = the digits asked for by name (`answer`: `C is 8 and D is 2`); an answer is right when its
    box holds those words, whatever its spacing."""

    name: str = "arithmetic-mini"
    id_column: str | None = None  # the generator's `id`

    def compare(self, pred: str | None, gold: Any) -> bool:
        return pred is not None and pred.split() == str(gold).split()


# --------------------------------------------------------------------------- the registry

TaskFactory = Callable[[int], TaskAdapter]

# name -> factory(seed). Registration happens at import time (or in a test); read-only afterwards.
TASKS: dict[str, TaskFactory] = {
    "math": lambda seed: MathTask(),
    "gpqa": lambda seed: GPQATask(seed=seed),
    "countdown": lambda seed: CountdownTask(),
    "countdown-mini": lambda seed: MiniCountdownTask(),
    "arithmetic-mini": lambda seed: MiniArithmeticTask(),
}


def register_task(name: str, factory: TaskFactory) -> None:
    """Make `--task NAME` (and `get_task(NAME)`) use `factory(seed)`; a second call replaces the first."""
    TASKS[name] = factory


def task_names() -> tuple[str, ...]:
    """The registered task names, read at call time (so a task registered by a test is listed)."""
    return tuple(TASKS)


class TaskChoices(Sequence[str]):
    """The registered names as a live sequence, for a config field's `choices`: the field is made
    at import time, the parser later, and a task registered in between must be accepted."""

    def __getitem__(self, index: Any) -> Any:
        return task_names()[index]

    def __len__(self) -> int:
        return len(TASKS)


def get_task(name: str, seed: int = 0) -> TaskAdapter:
    """The adapter for `--task NAME`."""
    factory = TASKS.get(name)
    if factory is None:
        raise UserError(f"unknown task {name!r}; use one of {', '.join(task_names())}")
    return factory(seed)


def grade(task: str, pred: str | None, gold: Any) -> bool:
    """Grade one prediction for a registered task; a missing gold answer is a user error."""
    adapter = get_task(task)
    require_gold(task, gold)
    return bool(adapter.grade(pred, gold))


def grade_many(task: str, preds: Sequence[str | None], golds: Sequence[Any], workers: int | None = None,
               **options: Any) -> list[bool]:
    """Grade a batch for a registered task (`options`: the adapter's own, e.g. MATH's `timeout_s`)."""
    return get_task(task).grade_many(preds, golds, workers, **options)


def load_problems(
    task: TaskAdapter,
    source: str,
    split: str | None = None,
    subset: str | None = None,
    range_spec: str | None = None,
    flag: str | None = None,
) -> list[Problem]:
    """Load, slice and adapt a dataset; `split=None` means the task's usual evaluation split.

    `flag`: the option (and script variable) `source` came from, named when it does not exist."""
    items = load_items(
        source,
        split=split or task.default_split,
        subset=subset,
        range_spec=range_spec,
        id_col=task.id_column,
        require=task.required,
        flag=flag,
    )
    return [task.problem(item) for item in items]
