"""How fast the CLI starts: `sprint --help`, `sprint pack --help` and a small `pack` run (goal: <= 0.3 s).

The CLI imports only the module of the chosen command, and the modules `pack` needs keep heavy
packages (datasets, openai, transformers) out of their imports, so these should cost little
more than the interpreter itself. Each command runs in a fresh process; the best of 5 wall
times is printed (the best, not the mean: it is the figure least disturbed by other load).

    .venv/bin/python benchmarks/bench_startup.py [--repeat 5] [--rows 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.3  # for the two help commands


def stage2_record(i: int) -> dict:
    """A small stage-2 record: two parallel executions after a plan, then a final plan."""
    def comp(n: int, plan: str, prompt: str | None, execution: str | None, rng: list[int] | None) -> dict:
        return {"number": n, "description": f"step {n}", "plan": [n, n], "prompt": prompt, "execution": rng,
                "comment": None, "plan_text": plan, "execution_text": execution, "comment_text": None}

    components = [
        comp(1, f"Problem {i}: split the sum into two parts.", "Add the first part.", "1 + 2 + 3 = 6, so the first part is 6.", [2, 6]),
        comp(2, "The second part is independent.", "Add the second part.", "4 + 5 = 9, so the second part is 9.", [7, 11]),
        comp(3, "Combine the two parts.", None, None, None),
    ]
    return {"id": f"row-{i}", "question": f"What is 1+2+3+4+5 (case {i})?", "solution": "The sum is \\boxed{15}.",
            "components": components, "dag": {"1": [], "2": [], "3": [1, 2]}, "status": "ok"}


def best_of(argv: list[str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
        best = min(best, elapsed)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="runs per command; the best is shown (default: 5)")
    parser.add_argument("--rows", type=int, default=20, help="stage-2 records of the small pack run (default: 20)")
    args = parser.parse_args()
    sprint = [sys.executable, "-m", "sprint"]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "stage2.jsonl"
        data.write_text("".join(json.dumps(stage2_record(i)) + "\n" for i in range(args.rows)))
        runs = [
            ("sprint --help", [*sprint, "--help"], TARGET_S),
            ("sprint pack --help", [*sprint, "pack", "--help"], TARGET_S),
            (f"sprint pack ({args.rows} rows)", [*sprint, "pack", "-i", str(data), "-o", str(Path(tmp) / "out"),
                                                 "--overwrite", "--parallelization-threshold", "1"], None),
        ]
        interpreter = best_of([sys.executable, "-c", "pass"], args.repeat)
        print(f"{'python -c pass':<28} {interpreter:6.3f} s  (the interpreter alone)")
        failed = False
        for name, argv, target in runs:
            seconds = best_of(argv, args.repeat)
            verdict = "" if target is None else ("  ok" if seconds <= target else f"  OVER the {target} s goal")
            failed |= target is not None and seconds > target
            print(f"{name:<28} {seconds:6.3f} s  (best of {args.repeat}){verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
