"""How long `python -m sprint pack` takes, and how much memory, on 6,000 synthetic stage-2 records and on
ten times that (goals: under 15 s at 6,000; peak RSS under 400 MB at both sizes, and when packing again
into a folder already written: the input is streamed, the old outputs are never read).

The records look like real ones: 15-40 components per trace, plan / prompt / execution /
comment texts of the lengths R1 traces on MATH give (a trace of roughly 20-35k characters, also
stored as `thought`, as stage 2 carries it), about a fifth of the executions short enough to be
merged, and DAGs that mix parallel branches with chains. No LLM is involved: components and DAGs
are already there. The CLI runs in a subprocess, so the time includes start-up and all writes.

    .venv/bin/python benchmarks/bench_packing.py [--n 6000] [--repeat 10] [--seed 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 15.0  # at 6,000 traces
TARGET_RSS_MB = 400  # at any size: packing streams its input and outputs
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


def _measure(stage: Path, out: Path) -> tuple[float, float, float, str]:
    """Run pack in a child and read that child's own rusage (os.wait4), so each size has its own peak RSS."""
    cmd = [sys.executable, "-m", "sprint", "pack", "--input", str(stage), "--out-dir", str(out)]
    log = out.parent / f"{out.name}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text()
    if proc.returncode != 0:
        print(text, file=sys.stderr)
        raise SystemExit(f"pack failed with code {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=6000, help="number of synthetic traces (default 6000)")
    ap.add_argument("--repeat", type=int, default=10,
                    help="also pack the input repeated this many times (new ids), to show memory stays flat "
                         "(default 10: 60,000 traces; 1: skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", default=None, help="write input and output here instead of a temporary folder")
    args = ap.parse_args()

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_packing_"))
    stage = root / "dag"
    shutil.rmtree(root / "dag", ignore_errors=True)
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
    inputs = [(args.n, stage)]
    if args.repeat > 1:
        big = root / "dag_x{}".format(args.repeat)
        shutil.rmtree(big, ignore_errors=True)
        big.mkdir()
        with open(big / "records.jsonl", "w", encoding="utf-8") as out_f:
            for k in range(args.repeat):
                with open(stage / "records.jsonl", encoding="utf-8") as in_f:
                    for line in in_f:
                        out_f.write(line.replace('"id": "synthetic_', f'"id": "r{k}_synthetic_', 1))
        print(f"repeated it {args.repeat} times with new ids: {args.n * args.repeat} records "
              f"({(big / 'records.jsonl').stat().st_size / 1e6:.0f} MB)")
        inputs.append((args.n * args.repeat, big))

    for n, folder in inputs:
        out = root / f"sft_{n}"
        shutil.rmtree(out, ignore_errors=True)
        wall, cpu, peak_mb, text = _measure(folder, out)
        summary = json.loads((out / "summary.json").read_text())
        sizes = {name: (out / name).stat().st_size / 1e6 for name in ("train.jsonl", "test.jsonl", "records.jsonl")}
        print(text.rstrip())
        print("outputs: " + ", ".join(f"{k} {v:.0f} MB" for k, v in sizes.items()))
        print(f"pack {n} traces: {wall:.1f} s wall ({n / wall:.0f} traces/s; {summary['seconds']:.1f} s inside pack(); "
              f"{cpu:.1f} s CPU); peak RSS {peak_mb:.0f} MB (target <= {TARGET_RSS_MB} MB)"
              + (f"; target < {TARGET_S:.0f} s at {args.n}: {'met' if wall < TARGET_S else 'MISSED'}" if n == args.n else ""))
        if wall > 1.5 * cpu:
            print(f"note: wall time is {wall / cpu:.1f}x the CPU time; the machine is busy with other work")
        wall, cpu, peak_mb, _ = _measure(folder, out)  # again, into the folder it just wrote (a re-run)
        print(f"pack {n} traces again into that folder: {wall:.1f} s wall; peak RSS {peak_mb:.0f} MB "
              f"(target <= {TARGET_RSS_MB} MB)")
        shutil.rmtree(out, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
