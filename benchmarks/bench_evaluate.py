"""How long does `sprint evaluate` take on 500 + 500 real-length trajectories, from process start?

Builds the realistic corpus (`real_corpus.py`: MATH-500 prose at R1 trace lengths, ~3 M tokens for
500 SPRINT + 500 sequential trajectories), then runs `python -m sprint evaluate SPRINT --baseline
BASE` as a fresh process several times (report and plots included) and prints the wall times, the
best, and the load average (other work on the machine slows the wall time; the best run is the
one least disturbed). Target: <= 4 s on 2 cores.

Then checks the counts: every problem's sequential and total tokens in metrics.json must equal
the plain path (`count_tokens` with `token_counter`, i.e. `tokenizers`, text by text).

    SPRINT_LOCAL_DATA=../shared/data .venv/bin/python benchmarks/bench_evaluate.py [--problems 500] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from real_corpus import build_runs, data_root

from sprint.format.trajectory import count_tokens, parse, token_counter

TARGET_S = 4.0


def _evaluate_once(sprint_dir: Path, base_dir: Path, out: Path, tokenizer: str, env: dict) -> tuple[float, float, dict]:
    cmd = [sys.executable, "-m", "sprint", "evaluate", str(sprint_dir), "--baseline", str(base_dir),
           "--out", str(out), "--planner-tokenizer", tokenizer]
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    metrics_file = out / "metrics.json"
    if not metrics_file.is_file():  # exit 1 only says some problems failed; no metrics is a real error
        raise SystemExit(f"evaluate failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, cpu, json.loads(metrics_file.read_text(encoding="utf-8"))


def _check_counts(metrics: dict, sprint_dir: Path, base_dir: Path, tokenizer: str) -> tuple[int, list[str], float]:
    """Compare metrics.json with the plain path, problem by problem; returns (checked, mismatches, seconds)."""
    t0 = time.perf_counter()
    plain = token_counter(tokenizer)
    bad: list[str] = []
    checked = 0
    for entry, folder, mode in ((metrics["runs"][0], sprint_dir, "sprint"), (metrics["baselines"][0], base_dir, "baseline")):
        texts = {}
        for line in open(folder / "records.jsonl", encoding="utf-8"):
            rec = json.loads(line)
            texts[rec["id"]] = rec.get("trajectory") if mode == "sprint" else rec.get("generation")
        for row in entry["problems"]:
            text = texts.get(row["id"])
            if text is None:
                continue
            if mode == "sprint":
                tc = count_tokens(parse(text, strict=False), plain)
                want = {"sequential": tc.sequential, "total": tc.total}
            else:
                n = plain(text)
                want = {"sequential": n, "total": n}
            got = {k: row.get(k) for k in want}
            checked += 1
            if got != want:
                bad.append(f"{mode} {row['id']}: evaluate {got} != plain {want}")
    return checked, bad, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=500, help="SPRINT and baseline trajectories each (the target is for 500)")
    ap.add_argument("--repeat", type=int, default=5, help="fresh evaluate processes to time")
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with the plain counting path")
    args = ap.parse_args()
    root = data_root()
    tokenizer = str(root / "tokenizers" / "deepseek-r1-distill-qwen-7b")
    env = {**os.environ, "SPRINT_LOCAL_DATA": str(root)}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        sprint_dir, base_dir, stats = build_runs(Path(tmp), args.problems)
        print(f"built {args.problems} SPRINT + {args.problems} baseline trajectories of real math prose "
              f"({(stats.sprint_chars + stats.baseline_chars) / 1e6:.1f} M characters) in {time.perf_counter() - t0:.1f} s")
        walls = []
        for i in range(args.repeat):
            load = os.getloadavg()[0]
            wall, cpu, metrics = _evaluate_once(sprint_dir, base_dir, Path(tmp) / f"eval{i}", tokenizer, env)
            walls.append(wall)
            t = metrics["timing"]
            print(f"run {i + 1}: {wall:.2f} s wall from process start, {cpu:.2f} s CPU with the grading process "
                  f"(load average {load:.1f} on {os.cpu_count()} CPUs; inside: tokens {t['tokens_s']:.2f} s, "
                  f"grading {t['grading_s']:.2f} s)")
        s, b = metrics["runs"][0]["summary"], metrics["baselines"][0]["summary"]
        tokens = sum((r.get("total") or 0) for r in metrics["runs"][0]["problems"]) + \
            sum((r.get("total") or 0) for r in metrics["baselines"][0]["problems"])
        print(f"corpus: {tokens / 1e6:.2f} M tokens; SPRINT accuracy {s['accuracy']:.3f}, mean sequential "
              f"{s['mean_sequential']:.0f}, mean total {s['mean_total']:.0f}; baseline mean {b['mean_sequential']:.0f}")
        best = min(walls)
        print(f"evaluate {args.problems} + {args.problems} with report and plots: best {best:.2f} s, median {sorted(walls)[len(walls) // 2]:.2f} s "
              f"wall ({'within' if best <= TARGET_S else 'OVER'} the {TARGET_S:.0f} s target)")
        if not args.no_check:
            checked, bad, secs = _check_counts(metrics, sprint_dir, base_dir, tokenizer)
            print(f"counts equal to the plain path (tokenizers, text by text, {secs:.1f} s): "
                  f"{checked - len(bad)}/{checked}")
            for line in bad[:5]:
                print("  MISMATCH", line)
            if bad:
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
