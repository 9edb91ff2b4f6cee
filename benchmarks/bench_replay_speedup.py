"""SPRINT's wall-clock speedup over a sequential model, measured by replay and set against the latency model.

The same synthetic problems as bench_orchestration.py (make_trajectories.py: a SPRINT trajectory
and a sequential baseline output per problem) are replayed through `python -m sprint
replay-server`: the sequential baseline with `python -m sprint baseline` (one generation per
problem, model `sprint-replay-baseline`), SPRINT with `orchestrate` in both schedules. The paper
measures sequential tokens; here each problem is also timed, so prefill of the growing context in
every planner/executor call, waiting for the slowest executor and the orchestration overheads all
count. Printed, overall and by baseline length, for each schedule:

- wall-clock speedup: baseline wall-clock / SPRINT wall-clock (sums over problems), each run
  from the problem's start to the end of its last model call; in brackets, what the latency
  model alone predicts (sequential time / critical path).

No token reduction is printed: the generator sets each baseline's length itself (the SPRINT
trajectory's total words x U(0.8, 1.2)), so a baseline / SPRINT token ratio would only echo that
choice. The speedups inherit it too; what this benchmark measures is how close the replayed
wall-clock comes to the latency model's prediction for the same problems. Token reductions of real
runs come from `sprint evaluate`.

By default problems run 8 at a time with no batching slowdown, so each is timed as if alone on
the GPU; `--batch-slowdown 0.01 --in-flight 1` adds the slowdown a phase's parallel executors cause
each other (slower: problems then run one at a time).

    SPRINT_LOCAL_DATA=../shared/data .venv/bin/python benchmarks/bench_replay_speedup.py [--n 50]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench_orchestration import (
    ServerSpec,
    Workload,
    calls_end,
    data_root,
    make_workload,
    ok_records,
    prompt_overhead,
    replay_process,
    run_orchestrate,
)

from sprint.latency.model import LatencyModel
from sprint.latency.simulate import critical_path
from sprint.inference.baseline import BaselineConfig, baseline
from sprint.timing.replay_server import DEFAULT_BASELINE_MODEL
from sprint.timing.wire import Splitter
from sprint.inference.schedule import SCHEDULES


def run_baseline(url: str, work: Workload, out: Path, workers: int) -> dict[str, dict]:
    cfg = BaselineConfig(model=DEFAULT_BASELINE_MODEL, out_dir=str(out), server_url=url, data=work.data,
                         prompt_mode="raw", max_tokens=100_000, max_problem_workers=workers, max_retries=0,
                         timeout=3600.0, temperature=0.0)
    baseline(cfg, progress=False, overwrite=True)
    return ok_records(out, "baseline of")


def buckets(lengths: dict[str, int]) -> list[tuple[str, list[str]]]:
    """All problems, then three length buckets of the baseline output (by tertile)."""
    ranked = sorted(lengths, key=lengths.get)
    third = len(ranked) // 3
    parts = [ranked[:third], ranked[third: 2 * third], ranked[2 * third:]]
    out = [("all", ranked)]
    for part in parts:
        if part:
            out.append((f"baseline {lengths[part[0]]}-{lengths[part[-1]]}", part))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50, help="problems (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ms-per-token", type=float, default=20.0)
    parser.add_argument("--batch-slowdown", type=float, default=0.0)
    parser.add_argument("--time-scale", type=float, default=0.2, help="server delays x this (default: %(default)s)")
    parser.add_argument("--in-flight", type=int, default=8, help="problems run at once (default: %(default)s)")
    parser.add_argument("--tokenizer", default="words", help="server tokenizer: words, or a tokenizer dir / hub id")
    args = parser.parse_args(argv)
    data_root()
    spec = ServerSpec(args.ms_per_token, args.batch_slowdown, None, args.time_scale, args.tokenizer)
    counter = Splitter(args.tokenizer).count
    model: LatencyModel = spec.latency()

    with tempfile.TemporaryDirectory(prefix="bench-speedup-") as tmp:
        work = make_workload(Path(tmp), args.n, args.seed)
        print(f"{len(work.trajectories)} problems; server: {spec.describe()}; {args.in_flight} problems in flight")
        walls: dict[str, dict[str, float]] = {}
        with replay_process(work.folder, spec) as url:
            started, cpu = time.time(), time.process_time()
            records = run_baseline(url, work, Path(tmp) / "baseline", args.in_flight)
            print(f"  sequential baseline replayed in {time.time() - started:.1f} s "
                  f"(client CPU {(time.process_time() - cpu) / (time.time() - started):.0%} of a core)")
            walls["baseline"] = {pid: calls_end(r) - r["start"] for pid, r in records.items()}
            base_tokens = {pid: int(r["sequential_tokens"]) for pid, r in records.items()}
            mismatched = 0
            for schedule in SCHEDULES:
                started, cpu = time.time(), time.process_time()
                runs = run_orchestrate(url, work.data, Path(tmp) / schedule, schedule, args.in_flight, 4096)
                print(f"  SPRINT ({schedule}) replayed in {time.time() - started:.1f} s "
                      f"(orchestrator CPU {(time.process_time() - cpu) / (time.time() - started):.0%} of a core)")
                walls[schedule] = {pid: calls_end(r) - r["start"] for pid, r in runs.items()}
                mismatched += sum(r["trajectory"] != work.trajectories[pid].render() for pid, r in runs.items())
        if mismatched:
            print(f"  WARNING: {mismatched} replayed trajectories differ from their recordings")

        seq_model = {pid: model.sequential_time(base_tokens[pid], counter(t.question)) for pid, t in work.trajectories.items()}
        bound = {s: {pid: critical_path(t, model, counter, s,
                                    prompt_overhead_tokens=prompt_overhead(counter, t.question))
                     for pid, t in work.trajectories.items()} for s in SCHEDULES}

        unit = "whitespace words" if args.tokenizer == "words" else f"{args.tokenizer} tokens"
        print(f"\n  baseline length in {unit}; speedup = baseline wall-clock / SPRINT wall-clock")
        print("\n  problems                  n   wall speedup barrier       wall speedup stream")
        print("                                measured  (latency model)  measured  (latency model)")
        for label, ids in buckets(base_tokens):
            cells = []
            for schedule in SCHEDULES:
                measured = sum(walls["baseline"][i] for i in ids) / sum(walls[schedule][i] for i in ids)
                predicted = sum(seq_model[i] for i in ids) / sum(bound[schedule][i] for i in ids)
                cells.append(f"{measured:6.3f}x  ({predicted:6.3f}x)     ")
            print(f"  {label:24s} {len(ids):3d}   {cells[0]}  {cells[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
