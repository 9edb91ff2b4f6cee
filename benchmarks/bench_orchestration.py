"""How close does the orchestrator come to SPRINT's critical path, in each schedule?

Replays synthetic SPRINT trajectories (benchmarks/make_trajectories.py: 1-11 phases, 0-8 prompts
per phase, hundreds to thousands of tokens) through `python -m sprint replay-server`, started as
its own process, and runs `orchestrate` against it. All figures are ratios measured in this run,
so they do not depend on the time scale; the scale only makes the run short.

1. `--in-flight` problems at a time (default 8; `--in-flight 1` runs them one by one), each still
   alone in the model: no capacity limit, no batching slowdown (the critical path ignores both).
   Orchestration wall-clock / critical-path bound, for `--schedule barrier` and `stream`, and
   stream / barrier. The wall-clock of a problem runs from its start to the end of its last
   model call (grading and writing the record come after). The bound is
   `sprint.latency.simulate.critical_path` with the server's latency model and token counts.
2. All problems at once against a server serving at most `--capacity` sequences:
   makespan / ideal, where ideal = max(total work / capacity, longest critical path) and the work
   of a call is the time it holds a slot (prefill + decode, from the critical-path timeline).

    SPRINT_LOCAL_DATA=../shared/data .venv/bin/python benchmarks/bench_orchestration.py [--n 50]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from make_trajectories import make_problems, write_problems

from sprint.latency.model import LatencyModel
from sprint.latency.simulate import critical_path_timeline
from sprint.inference.orchestration import OrchestrationConfig, orchestrate
from sprint.format.prompt_format import PromptFormat, load_agent_prompt
from sprint.timing.replay_server import DEFAULT_MODEL, DEFAULT_TOKENIZER
from sprint.timing.wire import Splitter
from sprint.llm.serve import free_port
from sprint.format.trajectory import Trajectory, parse, render_question

REPO_ROOT = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    root = os.environ.get("SPRINT_LOCAL_DATA") or str(REPO_ROOT.parent / "shared" / "data")
    os.environ["SPRINT_LOCAL_DATA"] = root
    return Path(root)


# ---------------------------------------------------------------------------------------------
# Shared with bench_replay_speedup.py


@dataclass
class Workload:
    """Recorded problems on disk: trajectories and baselines for the server, a dataset for us."""

    folder: Path  # what the replay server serves
    data: str  # jsonl with problem / answer / unique_id, read by orchestrate and baseline
    trajectories: dict[str, Trajectory]  # by problem id
    baselines: dict[str, str]  # sequential output after the question, by problem id


def make_workload(out: Path, n: int, seed: int) -> Workload:
    problems = make_problems(n, seed)
    folder = out / "recorded"
    write_problems(folder, problems)
    rows = []
    with (folder / "gold.csv").open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            rows.append({"problem": row["question"], "answer": row["answer"], "unique_id": row["id"]})
    data = out / "problems.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    trajectories = {
        pr.id: parse((folder / f"planner_trajectory_{pr.id}.txt").read_text(encoding="utf-8")) for pr in problems
    }
    return Workload(folder, str(data), trajectories, {pr.id: pr.baseline for pr in problems})


@dataclass
class ServerSpec:
    ms_per_token: float = 20.0
    batch_slowdown: float = 0.0
    capacity: int | None = None
    time_scale: float = 0.01
    tokenizer: str = DEFAULT_TOKENIZER

    def latency(self) -> LatencyModel:
        return LatencyModel.simple(s_per_token=self.ms_per_token / 1000, batch_slowdown=self.batch_slowdown,
                                   capacity=self.capacity)

    def describe(self) -> str:
        m = self.latency()
        cap = f"capacity {self.capacity}" if self.capacity else "no capacity limit"
        return (f"{self.ms_per_token:g} ms/token, prefill {m.prefill_base_s * 1000:g} ms + {m.prefill_per_token_s * 1e3:g} "
                f"ms/prompt token, batch slowdown {self.batch_slowdown:g}, {cap}; time scale {self.time_scale:g}")


@contextlib.contextmanager
def replay_process(folder: Path, spec: ServerSpec) -> Iterator[str]:
    """`python -m sprint replay-server` in its own process (its own core); yields the base URL."""
    port = free_port()
    m = spec.latency()
    command = [sys.executable, "-m", "sprint", "replay-server", str(folder), "--port", str(port),
               "--ms-per-token", str(spec.ms_per_token), "--batch-slowdown", str(spec.batch_slowdown),
               "--ttft-base", str(m.prefill_base_s), "--ttft-per-token", str(m.prefill_per_token_s * 1000),
               "--ms-per-context-token", str(m.step_per_context_s * 1000),
               "--time-scale", str(spec.time_scale), "--tokenizer", spec.tokenizer]
    if spec.capacity:
        command += ["--capacity", str(spec.capacity)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if "replay server at" not in line:
            proc.kill()
            raise SystemExit(f"the replay server did not start: {line}{proc.stderr.read() if proc.stderr else ''}")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def server_stats(url: str) -> dict:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/replay/stats", timeout=10) as response:
        return json.load(response)


def run_orchestrate(url: str, data: str, out: Path, schedule: str, workers: int, exec_workers: int) -> dict[str, dict]:
    """Records by problem id; fails loudly when a problem did not finish."""
    cfg = OrchestrationConfig(
        planner_model=DEFAULT_MODEL, planner_server_url=url, out_dir=str(out), data=data, prompt_mode="raw",
        schedule=schedule, planner_max_tokens=8000, max_tokens=8000, max_problem_workers=workers,
        max_execution_workers=exec_workers, max_retries=0, timeout=600.0,
    )
    orchestrate(cfg, progress=False, overwrite=True)
    return ok_records(out, "problem")


def ok_records(out: Path, what: str) -> dict[str, dict]:
    """The run's records by id; a failed one stops the benchmark (its figures would be wrong)."""
    records = {}
    for line in (out / "records.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["status"] != "ok":
            raise SystemExit(f"{what} {record['id']} failed: {record['error']}")
        records[record["id"]] = record
    return records


def prompt_overhead(counter, question: str) -> int:
    """Tokens of the raw-mode head (agent prompt) beyond the question block and `<think>`."""
    head = PromptFormat(load_agent_prompt()).head(question)
    return max(0, counter(head) - counter(render_question(question)) - counter("<think>"))


def calls_end(record: dict) -> float:
    return max(c["end"] for c in record["calls"])


def idle_time(record: dict) -> float:
    """Seconds between the problem's start and its last call's end with no model call in flight:
    the orchestrator's own time on the critical path (building requests, parsing, bookkeeping)."""
    busy, cursor = 0.0, record["start"]
    for call in sorted(record["calls"], key=lambda c: c["start"]):
        start, end = max(call["start"], cursor), call["end"]
        if end > start:
            busy += end - start
            cursor = end
    return calls_end(record) - record["start"] - busy


def fmt_ratio(values: list[float]) -> str:
    qs = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
    return f"median {statistics.median(values):.4f}, p90 {qs[8]:.4f}, max {max(values):.4f}"


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50, help="problems (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ms-per-token", type=float, default=20.0)
    parser.add_argument("--time-scale", type=float, default=0.2, help="server delays x this (default: %(default)s)")
    parser.add_argument("--capacity", type=int, default=16, help="sequences served at once in part 2 (default: %(default)s)")
    parser.add_argument("--tokenizer", default="words", help="server tokenizer: words, or a tokenizer dir / hub id (default: %(default)s)")
    parser.add_argument("--in-flight", type=int, default=8,
                        help="part 1: problems run at once, each still alone in the model (default: %(default)s)")
    parser.add_argument("--skip-capacity", action="store_true", help="only part 1")
    args = parser.parse_args(argv)
    data_root()
    spec = ServerSpec(args.ms_per_token, 0.0, None, args.time_scale, args.tokenizer)
    counter = Splitter(args.tokenizer).count
    model = spec.latency()

    with tempfile.TemporaryDirectory(prefix="bench-orch-") as tmp:
        work = make_workload(Path(tmp), args.n, args.seed)
        phases = [len(t.phases) for t in work.trajectories.values()]
        prompts = [len(ph.prompts) for t in work.trajectories.values() for ph in t.phases]
        lengths = [counter(t.render_body()) for t in work.trajectories.values()]
        print(f"{len(work.trajectories)} synthetic trajectories: {min(phases)}-{max(phases)} phases, "
              f"{min(prompts)}-{max(prompts)} prompts per phase, {min(lengths)}-{max(lengths)} tokens "
              f"(median {int(statistics.median(lengths))}), {sum(t.prompt_count for t in work.trajectories.values())} prompts")
        overhead = {pid: prompt_overhead(counter, t.question) for pid, t in work.trajectories.items()}
        timelines = {
            schedule: {pid: critical_path_timeline(t, model, counter, schedule, overhead[pid])
                       for pid, t in work.trajectories.items()}
            for schedule in ("barrier", "stream")
        }

        at_once = "one problem at a time" if args.in_flight == 1 else f"{args.in_flight} problems in flight"
        print(f"\n1. {at_once}; server: {spec.describe()}")
        walls: dict[str, float] = {}
        for schedule in ("barrier", "stream"):
            with replay_process(work.folder, spec) as url:
                started, cpu = time.time(), time.process_time()
                records = run_orchestrate(url, work.data, Path(tmp) / f"seq-{schedule}", schedule, args.in_flight, 4096)
                elapsed, cpu = time.time() - started, time.process_time() - cpu
                lateness = server_stats(url)["max_lateness_s"]
            wall = {pid: calls_end(r) - r["start"] for pid, r in records.items()}
            bound = {pid: timelines[schedule][pid].total * spec.time_scale for pid in records}
            calls = sum(len(r["calls"]) for r in records.values())
            total_wall, total_bound = sum(wall.values()), sum(bound.values())
            walls[schedule] = total_wall
            ratios = [wall[pid] / bound[pid] for pid in records]
            idle = sum(idle_time(r) for r in records.values())
            same = sum(r["trajectory"] == work.trajectories[pid].render() for pid, r in records.items())
            print(f"  {schedule:8s} wall-clock / critical path = {total_wall / total_bound:.4f}  "
                  f"(sum {total_wall:.2f} s / {total_bound:.2f} s over {calls} calls; per problem {fmt_ratio(ratios)}); "
                  f"{same}/{len(records)} trajectories identical to the recordings")
            print(f"           excess {total_wall - total_bound:+.2f} s: {idle:.2f} s with no call in flight (orchestrator), "
                  f"{total_wall - total_bound - idle:+.2f} s inside calls (HTTP client, server, latency-model rounding); "
                  f"run {elapsed:.1f} s, orchestrator CPU {cpu / elapsed:.0%} of a core, server max lateness {lateness * 1000:.1f} ms")
            print(f"           the same per-call costs against real-time model delays (time scale 1): "
                  f"{1 + (total_wall - total_bound) * spec.time_scale / total_bound:.4f}")
        bound_gain = sum(t.total for t in timelines["stream"].values()) / sum(t.total for t in timelines["barrier"].values())
        print(f"  stream / barrier wall-clock = {walls['stream'] / walls['barrier']:.4f} "
              f"(critical paths: {bound_gain:.4f})")

        if not args.skip_capacity:
            cap = ServerSpec(args.ms_per_token, 0.0, args.capacity, args.time_scale, args.tokenizer)
            print(f"\n2. all {len(work.trajectories)} problems at once; server: {cap.describe()}")
            print("   ideal = max(total slot time / capacity, longest critical path)")
            makespans: dict[str, float] = {}
            for schedule in ("barrier", "stream"):
                lines = timelines[schedule].values()
                work_s = sum(c.end - c.start for t in lines for c in t.calls) * cap.time_scale
                longest = max(t.total for t in lines) * cap.time_scale
                ideal = max(work_s / args.capacity, longest)
                with replay_process(work.folder, cap) as url:
                    started, cpu = time.time(), time.process_time()
                    records = run_orchestrate(url, work.data, Path(tmp) / f"cap-{schedule}", schedule,
                                              len(work.trajectories), 4096)
                    load = (time.process_time() - cpu) / (time.time() - started)
                    stats = server_stats(url)
                makespan = max(calls_end(r) for r in records.values()) - min(r["start"] for r in records.values())
                makespans[schedule] = makespan
                print(f"  {schedule:8s} makespan / ideal = {makespan / ideal:.4f} (makespan {makespan:.2f} s, ideal "
                      f"{ideal:.2f} s = max({work_s:.2f} s / {args.capacity}, {longest:.2f} s); "
                      f"server max running {stats['max_running']}, orchestrator CPU {load:.0%} of a core)")
            print(f"  stream / barrier makespan = {makespans['stream'] / makespans['barrier']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
