"""What `--priority` does to a loaded server: mean per-problem latency and makespan, with and without.

50 synthetic SPRINT problems (make_trajectories.py) are all started at once against one replay
server (`python -m sprint replay-server`) that serves at most 16 sequences at a time (`--capacity
16`; the rest wait in its queue, which honours vLLM's per-request `priority`). The same run is
made twice against the same server, without and with `orchestrate --priority` (planner calls
first, then the executors of the oldest problems), and printed side by side:

- mean per-problem latency: from the problem's start to the end of its last call, averaged;
- makespan / ideal: the whole run's wall time over its lower bound, the larger of the longest
  single problem's critical path (latency model, alone on the server) and the total service time
  of every call (prefill + decode, from the server's usage) spread over the 16 slots.

Without priority every problem's calls queue first come, first served, so all problems progress
together and finish near the end; with it the server finishes the oldest problems first, which
lowers the mean latency while the makespan stays about the same.

    SPRINT_LOCAL_DATA=../shared/data .venv/bin/python benchmarks/bench_priority.py [--n 50 --capacity 16]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench_orchestration import ServerSpec, calls_end, data_root, make_workload, ok_records, prompt_overhead, replay_process

from sprint.latency.simulate import critical_path
from sprint.inference.orchestration import OrchestrationConfig, orchestrate
from sprint.timing.replay_server import DEFAULT_MODEL
from sprint.timing.wire import Splitter


def run(url: str, data: str, out: Path, n: int, priority: bool) -> dict[str, dict]:
    cfg = OrchestrationConfig(
        planner_model=DEFAULT_MODEL, planner_server_url=url, out_dir=str(out), data=data, prompt_mode="raw",
        planner_max_tokens=8000, max_tokens=8000, max_problem_workers=n, max_execution_workers=8 * n,
        max_retries=0, timeout=600.0, priority=priority, use_cache=False,
    )
    orchestrate(cfg, progress=False, overwrite=True)
    return ok_records(out, "problem")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50, help="problems, all started at once (default: %(default)s)")
    parser.add_argument("--capacity", type=int, default=16, help="sequences the server serves at once (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ms-per-token", type=float, default=20.0)
    parser.add_argument("--time-scale", type=float, default=0.05, help="server delays x this (default: %(default)s)")
    parser.add_argument("--tokenizer", default="words", help="server tokenizer: words, or a tokenizer dir / hub id")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of each setting, in the order A B B A ... so drift hits both (default: %(default)s)")
    args = parser.parse_args(argv)
    data_root()
    spec = ServerSpec(args.ms_per_token, 0.0, args.capacity, args.time_scale, args.tokenizer)
    model = spec.latency()
    counter = Splitter(args.tokenizer).count

    with tempfile.TemporaryDirectory(prefix="bench-priority-") as tmp:
        work = make_workload(Path(tmp), args.n, args.seed)
        print(f"{len(work.trajectories)} problems started at once; server: {spec.describe()}")
        # the longest problem alone on the server (latency model, barrier schedule), in scaled seconds
        longest = max(critical_path(t, model, counter, "barrier",
                                    prompt_overhead_tokens=prompt_overhead(counter, t.question))
                      for t in work.trajectories.values()) * args.time_scale
        settings = [("without --priority", False), ("with --priority", True)]
        order = [settings[(i + i // 2) % 2] for i in range(2 * args.repeats)]  # A B B A A B ...
        measured: dict[str, list[tuple[float, float, float, float]]] = {label: [] for label, _ in settings}
        with replay_process(work.folder, spec) as url:
            for i, (label, priority) in enumerate(order):
                started = time.time()
                records = run(url, work.data, Path(tmp) / f"{i}", args.n, priority)
                wall = time.time() - started
                latencies = [calls_end(r) - r["start"] for r in records.values()]
                begin = min(r["start"] for r in records.values())
                makespan = max(calls_end(r) for r in records.values()) - begin
                service = sum(model.sequential_time(c["completion_tokens"], c["prompt_tokens"])
                              for r in records.values() for c in r["calls"] if c["kept"] and c["error"] is None)
                ideal = max(longest, service * args.time_scale / args.capacity)
                measured[label].append((statistics.mean(latencies), statistics.median(latencies), makespan, ideal))
                print(f"  {label:20s} ran in {wall:.1f} s: mean latency {measured[label][-1][0]:.2f} s, "
                      f"makespan {makespan:.2f} s")
        results = {label: tuple(statistics.mean(x[k] for x in runs) for k in range(4)) for label, runs in measured.items()}
        print(f"\n  means over {args.repeats} run(s) each; ideal = max(longest problem alone {longest:.2f} s, "
              "total service time / capacity)")
        print("                        mean latency   median latency   makespan   makespan/ideal")
        for label, (mean, median, makespan, ideal) in results.items():
            print(f"  {label:20s} {mean:9.2f} s     {median:9.2f} s   {makespan:7.2f} s   {makespan / ideal:8.3f}")
        (base, *_), (prio, *_) = results.values()
        print(f"\n  --priority changes the mean per-problem latency by {prio / base - 1:+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
