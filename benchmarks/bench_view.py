"""How long does `sprint view` take on 500 trajectories + 500 baselines, and how big is the site?

Writes 500 synthetic SPRINT trajectories and their sequential baselines in the SPRINT authors'
log layout (benchmarks/make_trajectories.py: 1-11 phases, 0-8 prompts per phase, hundreds to
thousands of tokens each) and builds the viewer on them with the R1-distill tokenizer. That
layout records no call times, so every problem also gets two timelines modelled from token
counts (barrier and stream): the slowest path through the viewer. The evaluation (grading, token
counts, bootstrap CIs, plots) is part of the time. Targets: at most 10 s and 30 MB.

    SPRINT_LOCAL_DATA=../shared/data .venv/bin/python benchmarks/bench_view.py [--n 500]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from make_trajectories import make_problems, write_problems

from sprint.core.data import resolve_local
from sprint.viewer.site import DEFAULT_TOKENIZER, ViewConfig, build

MAX_SECONDS = 10.0
MAX_MB = 30.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=500, help="problems (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bootstrap", type=int, default=ViewConfig.bootstrap, help="bootstrap resamples")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPRINT_LOCAL_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    tokenizer = str(resolve_local(DEFAULT_TOKENIZER) or DEFAULT_TOKENIZER)
    with tempfile.TemporaryDirectory(prefix="bench-view-") as tmp:
        logs = Path(tmp) / "logs"
        write_problems(logs, make_problems(args.n, args.seed))
        chars = sum(f.stat().st_size for f in logs.glob("*.txt"))
        print(f"{args.n} trajectories + {args.n} baselines in the authors' layout ({chars / 1e6:.1f} MB of text)")
        started, cpu, own = time.perf_counter(), os.times(), time.process_time()
        result = build(ViewConfig(runs=[str(logs)], gold=str(logs / "gold.csv"), planner_tokenizer=tokenizer,
                                  out=str(Path(tmp) / "site"), bootstrap=args.bootstrap))
        seconds, own = time.perf_counter() - started, time.process_time() - own
        used = os.times()
        cpu_s = (used.user - cpu.user) + (used.system - cpu.system) + (used.children_user - cpu.children_user) \
            + (used.children_system - cpu.children_system)
        mb = result.bytes / 1e6
        print(f"view: {result.pages} problem pages in {seconds:.2f} s (target <= {MAX_SECONDS:g} s); "
              f"site {mb:.1f} MB (target <= {MAX_MB:g} MB)")
        print(f"  steps (s): {', '.join(f'{k} {v:.2f}' for k, v in result.steps.items())}")
        print(f"  CPU: {own:.1f} s in this process (all its threads), {cpu_s:.1f} s with the grading workers; "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (other work slows the wall clock)")
        timing = json.loads((Path(tmp) / "site" / "evaluation" / "metrics.json").read_text()).get("timing", {})
        print(f"  inside the evaluation (s): {', '.join(f'{k} {v:.2f}' for k, v in timing.items())}")
        largest = max((Path(tmp) / "site" / "problems").glob("*.html"), key=lambda p: p.stat().st_size)
        print(f"largest page: {largest.name}, {largest.stat().st_size / 1e3:.0f} kB")
    return 0 if seconds <= MAX_SECONDS and mb <= MAX_MB else 1


if __name__ == "__main__":
    raise SystemExit(main())
