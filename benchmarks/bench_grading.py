"""How long grading 500 MATH-500 answers takes (the evaluation of one run's trajectories).

Grades every MATH-500 gold answer against (a) itself and (b) a lightly reformatted version as a
model might write it, in this process, from a worker thread, and through the process pool, and
prints seconds and items/s. (c) rewrites numbers as unreduced fractions, which the string
normaliser cannot match, to show the cost when most items need sympy. Also times counting the
tokens of the 500 reference solutions with the offline R1 tokenizer, the other half of
evaluating 500 trajectories.

    .venv/bin/python benchmarks/bench_grading.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sprint.tasks.registry import grade_many
from sprint.format.trajectory import load_tokenizer


def reformat(answer: str) -> str:
    """Another way to write the same answer: spacing, fraction and bracket styles, a sentence."""
    s = answer.replace(r"\dfrac", r"\frac").replace(r"\left", "").replace(r"\right", "")
    s = re.sub(
        r"^(\d+)\s*\\frac\{(\d+)\}\{(\d+)\}$",
        lambda m: f"{int(m[1]) * int(m[3]) + int(m[2])}/{m[3]}",
        s,
    )
    s = re.sub(r"\\frac\{(\d+)\}\{(\d+)\}", r"\1/\2", s)
    s = s.replace(r"\!", "").replace(r"^\circ", r"^{\circ}")
    s = re.sub(r"\s+", " ", s).replace(", ", ",")
    return f"The final answer is $\\boxed{{{s}}}$."


def unreduced(answer: str) -> str:
    """Whole numbers and plain fractions as unreduced fractions: only sympy can tell they match."""
    m = re.fullmatch(r"(-?)(\d+)", answer.strip())
    if m:
        return f"{m[1]}\\frac{{{2 * int(m[2])}}}{{2}}"
    m = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", answer.strip())
    if m:
        return f"{m[1]}\\frac{{{3 * int(m[2])}}}{{{3 * int(m[3])}}}"
    return answer


def timed(label: str, run: Callable[[], list[bool]]) -> None:
    started = time.perf_counter()
    results = run()
    seconds = time.perf_counter() - started
    print(
        f"{label:<48} {len(results):>4} items  {sum(results):>4} correct  "
        f"{seconds:7.3f} s  {len(results) / seconds:9.0f} items/s"
    )


def main() -> None:
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    default = Path(os.environ.get("SPRINT_LOCAL_DATA", shared))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=default, help="folder holding math500/test.jsonl"
    )
    args = parser.parse_args()

    with (args.data / "math500" / "test.jsonl").open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    golds = [r["answer"] for r in rows]
    reformatted = [reformat(g) for g in golds]
    print(f"MATH-500: {len(golds)} answers; {os.cpu_count()} CPUs")

    # the first call pays for importing sympy / Math-Verify, as a fresh evaluation run would
    timed(
        "(b) reformatted, first call (imports sympy)",
        lambda: grade_many("math", reformatted, golds),
    )
    timed("(a) gold vs itself", lambda: grade_many("math", golds, golds))
    timed("(b) reformatted, main thread", lambda: grade_many("math", reformatted, golds))
    with ThreadPoolExecutor(max_workers=1) as pool:
        timed(
            "(b) reformatted, from a worker thread",
            lambda: pool.submit(grade_many, "math", reformatted, golds).result(),
        )
    timed(
        "(b) reformatted, process pool (forced)",
        lambda: grade_many("math", reformatted, golds, workers=os.cpu_count(), min_pool_items=1),
    )
    hard = [unreduced(g) for g in golds]
    print(f"(c) rewrites {sum(h != g for h, g in zip(hard, golds))} of {len(golds)} answers")
    timed("(c) unreduced fractions, main thread", lambda: grade_many("math", hard, golds))
    with ThreadPoolExecutor(max_workers=1) as pool:
        timed(
            "(c) unreduced fractions, from a worker thread",
            lambda: pool.submit(grade_many, "math", hard, golds).result(),
        )
    timed(
        "(c) unreduced fractions, process pool (forced)",
        lambda: grade_many("math", hard, golds, workers=os.cpu_count(), min_pool_items=1),
    )

    tokenizer_file = args.data / "tokenizers" / "deepseek-r1-distill-qwen-7b" / "tokenizer.json"
    if tokenizer_file.exists():
        tokenizer = load_tokenizer(str(tokenizer_file))
        solutions = [r["solution"] for r in rows]
        started = time.perf_counter()
        counts = [len(e.ids) for e in tokenizer.encode_batch(solutions, add_special_tokens=False)]
        seconds = time.perf_counter() - started
        print(
            f"{'token counts of 500 solutions (R1 tokenizer)':<48} {len(counts):>4} items  "
            f"{sum(counts):>6} tok  {seconds:7.3f} s"
        )


if __name__ == "__main__":
    main()
