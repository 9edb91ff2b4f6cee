"""How long does `evaluate` take on 500 realistic trajectories (token counts + grading + report)?

Builds, with the trajectory model, one SPRINT run folder and one sequential-baseline run folder over
the MATH-500 questions and answers: 2-7 phases, 0-4 prompts per phase, plans and executions of
tens to hundreds of tokens of real math prose (sliced from MATH-500 solutions), ~85% right
answers (a few written differently from the gold, so Math-Verify must decide), a few failures and
forced answers. Then runs `evaluate` on them and prints seconds.

    SPRINT_LOCAL_DATA=../shared/data .venv/bin/python benchmarks/bench_evaluate.py [--problems 500]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from sprint.data import resolve_local, safe_id
from sprint.records import RunDir
from sprint.trajectory import Execution, Phase, Trajectory, render_prompt


def _data_root() -> Path:
    root = os.environ.get("SPRINT_LOCAL_DATA") or str(Path(__file__).resolve().parents[2] / "shared" / "data")
    os.environ["SPRINT_LOCAL_DATA"] = root
    return Path(root)


def _rows() -> list[dict]:
    path = resolve_local("HuggingFaceH4/MATH-500") or _data_root() / "math500" / "test.jsonl"
    return [json.loads(line) for line in open(path, encoding="utf-8")]


class Prose:
    """Slices of real math text, about `words` words long."""

    def __init__(self, rows: list[dict], rng: random.Random) -> None:
        self.words = "\n\n".join(r["solution"] for r in rows).split(" ")  # keeps the line breaks
        self.rng = rng

    def __call__(self, words: int) -> str:
        start = self.rng.randrange(0, len(self.words) - words - 1)
        return " ".join(self.words[start:start + words])


def _answer(gold: str, rng: random.Random) -> tuple[str, bool]:
    r = rng.random()
    if r < 0.75:
        return gold, True
    if r < 0.85:  # right, written another way
        other = gold.replace("\\frac", "\\dfrac")
        return (f"{gold}.0" if gold.isdigit() else f" {other} "), True
    if gold.lstrip("-").isdigit():
        return str(int(gold) + rng.randint(1, 9)), False
    return f"{gold}+1", False


def sprint_trajectory(question: str, answer: str, prose: Prose, rng: random.Random) -> Trajectory:
    phases = []
    for p in range(1, rng.randint(2, 7) + 1):
        k = rng.choices([0, 1, 2, 3, 4], weights=[2, 4, 3, 2, 1])[0]
        parts, execs = [prose(rng.randint(20, 100))], []
        for j in range(1, k + 1):
            parts.append(render_prompt(f"{p}.{j}", prose(rng.randint(10, 40))))
            if rng.random() < 0.5:
                parts.append(prose(rng.randint(10, 60)))
            execs.append(Execution(f"{p}.{j}", prose(rng.randint(40, 300))))
        phases.append(Phase(p, "\n\n".join(parts), execs))
    final = f"{prose(rng.randint(5, 30))} Therefore, the answer is $\\boxed{{{answer}}}$."
    return Trajectory(question, phases, final)


def build(folder: Path, n: int, seed: int = 0) -> tuple[Path, Path]:
    rng = random.Random(seed)
    rows = _rows()
    prose = Prose(rows, rng)
    sprint_dir, base_dir = folder / "sprint", folder / "baseline"
    run = RunDir(sprint_dir, "orchestration", {"task": "math", "mode": "sprint"}, overwrite=True)
    base = RunDir(base_dir, "orchestration", {"task": "math", "mode": "baseline"}, overwrite=True)
    (sprint_dir / "trajectories").mkdir(exist_ok=True)
    for i in range(n):
        row = rows[i % len(rows)]
        pid = safe_id(row["unique_id"]) + ("" if i < len(rows) else f"_{i}")
        gold = row["answer"]
        answer, _ = _answer(gold, rng)
        traj = sprint_trajectory(row["problem"], answer, prose, rng)
        text = traj.render()
        status = "ok" if rng.random() > 0.01 else "server_error"
        (sprint_dir / "trajectories" / f"{pid}.txt").write_text(text)
        run.append({"id": pid, "question": row["problem"], "gold": gold, "predicted": answer, "trajectory": text,
                    "status": status, "forced_final": rng.random() < 0.03, "calls": [], "mode": "sprint"})
        answer, _ = _answer(gold, rng)
        generation = prose(rng.choice([rng.randint(200, 900), rng.randint(900, 2500), rng.randint(2500, 6000)])) + f"\n\nSo the answer is $\\boxed{{{answer}}}$."
        base.append({"id": pid, "question": row["problem"], "gold": gold, "predicted": answer, "generation": generation,
                     "completion_tokens": None, "status": "ok", "forced_final": False, "calls": [], "mode": "baseline"})
    return sprint_dir, base_dir


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the grading workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=500)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    _data_root()
    from sprint.evaluate import evaluate

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        sprint_dir, base_dir = build(Path(tmp), args.problems)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other work slows the wall time)")
        print(f"built {args.problems} SPRINT + {args.problems} baseline trajectories in {time.perf_counter() - t0:.1f} s")
        for label, kwargs in (("SPRINT only", {}), ("SPRINT + baseline + report", {"baseline": base_dir})):
            t0, c0 = time.perf_counter(), _cpu()
            ev = evaluate(sprint_dir, out_dir=Path(tmp) / "eval", workers=args.workers, **kwargs)
            wall, cpu = time.perf_counter() - t0, _cpu() - c0
            s = ev.metrics["runs"][0]["summary"]
            t = ev.metrics["timing"]
            print(f"{label}: {wall:.2f} s wall, {cpu:.2f} s CPU incl. workers (tokens {t['tokens_s']:.2f} s, grading {t['grading_s']:.2f} s); "
                  f"accuracy {s['accuracy']:.3f}, mean sequential {s['mean_sequential']:.0f}, "
                  f"mean total {s['mean_total']:.0f} tokens, mean phases {s['mean_phases']:.1f}")
        c = ev.metrics["comparisons"][0]
        print(f"reduction vs baseline {c['overall']['reduction']:.3f}; "
              + ", ".join(f"{b['bucket']}: n={b['problems']}" for b in c["buckets"]))


if __name__ == "__main__":
    main()
