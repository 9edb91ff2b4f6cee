"""Grading beside the counting: Math-Verify in a process started first, else in a thread.

Grading is sympy (pure Python): in a thread of the evaluating process it would take the GIL from the
token counting and the figures, so a large batch goes to one spawned process, started before the
other work so that its start-up (Python, sympy, Math-Verify's parser) overlaps it too.
`sprint.evaluation.evaluate` starts a `GradingProcess` and hands its other work to `grade_while`.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import re
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, TypeVar

from sprint.tasks.grading import grade_math
from sprint.tasks.registry import TaskAdapter

T = TypeVar("T")

# Below this many problems the grading process costs more (a second of CPU to start) than it saves.
GRADING_PROCESS_MIN = 200


class GradingProcess:
    """One spawned process that grades a batch (sympy is pure Python: in a thread it would take
    the GIL from the counting and the figures). Started before the work it overlaps."""

    def __init__(self) -> None:
        self.pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        # Math-Verify's import and its LaTeX parser's first parse, before the batch arrives (a function
        # of sprint.tasks.grading, so the process imports nothing else)
        self.pool.submit(grade_math, "\\frac{1}{2}", "0.5")

    @classmethod
    def start(cls, problems: int, workers: int | None) -> GradingProcess | None:
        """A grading process when the batch is large enough and processes are allowed (`--workers 0`: none)."""
        if problems < GRADING_PROCESS_MIN or workers == 0 or (os.cpu_count() or 1) < 2 or not _spawn_safe():
            return None
        try:
            return cls()
        except OSError:  # no processes on this system: grade in a thread
            return None

    def submit(self, task: TaskAdapter, preds: list[str | None], golds: list[Any], workers: int | None) -> Future | None:
        """The batch's grades as a future, or None when the task cannot travel to the process
        (a task class defined where the process cannot import it)."""
        try:
            pickle.dumps(task)
        except Exception:  # noqa: BLE001 - grade in this process instead
            return None
        return self.pool.submit(task.grade_many, preds, golds, workers)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in list((getattr(self.pool, "_processes", None) or {}).values()):
            proc.terminate()  # idle now, or an abandoned batch (an error elsewhere): do not let it grade on
            proc.join(timeout=1)


_MAIN_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.M)


def _spawn_safe() -> bool:
    """Can a spawned process start without re-running this program? A spawned child imports the
    main script again; `python -m pkg`, the console script and interactive sessions are safe, a
    script without an `if __name__ == "__main__":` guard is not (it would evaluate again), so
    such a caller grades in a thread instead."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name.endswith("__main__"):
        return True
    path = getattr(main, "__file__", None)
    if path is None:
        return True
    try:
        return bool(_MAIN_GUARD.search(Path(path).read_text(encoding="utf-8", errors="replace")))
    except OSError:
        return False


def timed_grade(task: TaskAdapter, preds: list[str | None], golds: list[Any],
                workers: int | None) -> tuple[list[bool], float]:
    """Grades in this process, and the seconds they took (a thread's grading_s)."""
    t = time.perf_counter()
    return task.grade_many(preds, golds, workers), time.perf_counter() - t


def grade_while(task: TaskAdapter, preds: list[str | None], golds: list[Any], workers: int | None,
                grader: GradingProcess | None, work: Callable[[], T]) -> tuple[list[bool], float, T]:
    """The grades of a batch, the seconds they took, and what `work` returned, run meanwhile.

    Grading runs in `grader`'s process when there is one (and the task can travel there), else in a
    thread; a grading process that died (killed, out of memory) is replaced by grading here.
    The seconds run from submission to grades (the process was started earlier).
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="grading") as threads:
        grading = grader.submit(task, preds, golds, workers) if grader is not None else None
        in_thread = grading is None
        if in_thread:
            grading = threads.submit(timed_grade, task, preds, golds, workers)
        t0 = time.perf_counter()
        done = work()
        try:
            found = grading.result()
            grades, seconds = found if in_thread else (found, time.perf_counter() - t0)
        except BrokenProcessPool:
            grades, seconds = timed_grade(task, preds, golds, workers)
    return grades, seconds, done
