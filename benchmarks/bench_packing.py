"""How long `python -m sprint pack` takes on 6,000 synthetic stage-2 records (goal: under 30 s).

The records look like real ones: 15-40 components per trace, plan / prompt / execution /
comment texts of the lengths R1 traces on MATH give (a trace of roughly 20-35k characters, also
stored as `thought`, as stage 2 carries it), about a fifth of the executions short enough to be
merged, and DAGs that mix parallel branches with chains. No LLM is involved: components and DAGs
are already there. The CLI runs in a subprocess, so the time includes start-up and all writes.

    .venv/bin/python benchmarks/bench_packing.py [--n 6000] [--seed 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 30.0
WORDS = ("so the value of x is then we get that term divides the sum and checking each case gives "
         "modulo five square root of both sides equals factor the polynomial as a product of "
         "linear terms substituting back yields which matches the earlier result").split()


def sentence(rng: random.Random, n_chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(WORDS)
        if rng.random() < 0.08:
            w = f"${rng.randint(2, 999)}^{rng.randint(2, 9)} + {rng.randint(1, 99)}$"
        out.append(w)
        size += len(w) + 1
    return " ".join(out).capitalize() + "."


class Texts:
    """Random prose from a fixed pool of sentences, so generating 6,000 traces takes seconds."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.pool = [sentence(rng, rng.randint(40, 160)) for _ in range(3000)]

    def text(self, lo: int, hi: int) -> str:
        """Several sentences, some on their own lines, of lo..hi characters in all."""
        target = self.rng.randint(lo, hi)
        out: list[str] = []
        size = 0
        while size < target:
            s = self.rng.choice(self.pool)
            out.append(s + ("\n" if self.rng.random() < 0.3 else " "))
            size += len(s) + 1
        return "".join(out).strip()

    def sentence(self, lo: int, hi: int) -> str:
        return self.text(lo, hi) if hi > 160 else self.rng.choice(self.pool)[: self.rng.randint(lo, hi)].rstrip() + "."


def synthetic_record(i: int, rng: random.Random, t: Texts) -> dict:
    n = rng.randint(15, 40)
    components, dag, line = [], {}, 1
    for k in range(1, n + 1):
        plan_lines = rng.randint(1, 3)
        exec_span = rng.choice([None] * 2 + [0, 1, 2] + list(range(3, 14)) * 2)  # None: plan-only
        has_comment = rng.random() < 0.3
        plan = [line, line + plan_lines - 1]
        line += plan_lines
        execution = None
        if exec_span is not None:
            execution = [line, line + exec_span]
            line += exec_span + 1
        comment = [line, line] if has_comment else None
        line += 1 if has_comment else 0
        components.append({
            "number": k,
            "description": t.sentence(40, 80),
            "plan": plan,
            "prompt": t.text(80, 220) if execution else None,
            "execution": execution,
            "comment": comment,
            "plan_text": t.text(150, 450),
            "execution_text": t.text(100 + 60 * exec_span, 200 + 120 * exec_span) if execution else None,
            "comment_text": t.sentence(40, 140) if has_comment else None,
        })
        # a few roots, mostly 1-3 parents among the last few components
        if k == 1 or rng.random() < 0.2:
            dag[str(k)] = []
        else:
            window = list(range(max(1, k - 6), k))
            dag[str(k)] = sorted(rng.sample(window, min(len(window), rng.choice([1, 1, 2, 3]))))
    thought = "\n".join(filter(None, (t for c in components for t in (c["plan_text"], c["execution_text"], c["comment_text"]))))
    answer = rng.randint(1, 999)
    return {
        "id": f"synthetic_{i}",
        "question": f"Problem {i}: " + t.text(100, 400),
        "thought": thought,
        "solution": t.text(300, 1200) + f" Therefore, the answer is $\\boxed{{{answer}}}$.",
        "answer": str(answer),
        "components": components,
        "dag": dag,
        "status": "ok",
        "error": None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=6000, help="number of synthetic traces (default 6000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", default=None, help="write input and output here instead of a temporary folder")
    args = ap.parse_args()

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_packing_"))
    stage = root / "dag"
    out = root / "sft"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    stage.mkdir(parents=True)
    rng = random.Random(args.seed)
    texts = Texts(rng)
    t0 = time.perf_counter()
    with open(stage / "records.jsonl", "w", encoding="utf-8") as f:
        for i in range(args.n):
            f.write(json.dumps(synthetic_record(i, rng, texts), ensure_ascii=False) + "\n")
    gen_s = time.perf_counter() - t0
    size_mb = (stage / "records.jsonl").stat().st_size / 1e6
    print(f"generated {args.n} stage-2 records ({size_mb:.0f} MB) in {gen_s:.1f} s")

    cmd = [sys.executable, "-m", "sprint", "pack", "--input", str(stage), "--out-dir", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peak_mb = after.ru_maxrss / 1024
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr, sep="\n", file=sys.stderr)
        raise SystemExit(f"pack failed with code {proc.returncode}")
    print(proc.stdout.rstrip())
    summary = json.loads((out / "summary.json").read_text())
    sizes = {name: (out / name).stat().st_size / 1e6 for name in ("train.jsonl", "test.jsonl", "records.jsonl")}
    print("outputs: " + ", ".join(f"{k} {v:.0f} MB" for k, v in sizes.items()))
    print(f"python -m sprint pack: {wall:.1f} s wall for {args.n} traces ({args.n / wall:.0f} traces/s; "
          f"{summary['seconds']:.1f} s inside pack(); {cpu:.1f} s CPU; peak RSS {peak_mb:.0f} MB); "
          f"target < {TARGET_S:.0f} s: {'met' if wall < TARGET_S else 'MISSED'}")
    if wall > 1.5 * cpu:
        print(f"note: wall time is {wall / cpu:.1f}x the CPU time; the machine is busy with other work")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
