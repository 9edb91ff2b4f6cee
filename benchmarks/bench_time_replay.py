"""Measured seconds of SPRINT vs the sequential baseline on a real vLLM server (time-replay).

A handful of short synthetic SPRINT trajectories and their baselines (make_trajectories.py, the
authors' log layout; the shortest of a larger draw so the run fits a CPU) are replayed with
`python -m sprint time-replay`: every call with its recorded context and forced to its recorded
length, both schedules and the baseline. Printed: forced lengths honoured (n/n), seconds per
problem, speedups with bootstrap CIs, TTFT share, prefix-cache hits, and the latency model fitted
to the measured calls.

Without `--server`, the tiny random Qwen2 (scripts/make_tiny_model.py) is served by .venv-vllm on
this machine's CPU. There a decode step costs mostly per sequence: with the paper's sampling
(temperature 0.6, top-p 0.95), top-p sampling over the 152k-token vocabulary costs about 12 ms per
sequence per step (measured: 17 ms per step with 1 sequence decoding, 28 with 2, 51 with 4), so
parallel executors hardly finish sooner and the fitted batch_slowdown is about 0.6. Greedy steps cost about
5 ms whatever the batch (`--temperature 0` shows that case). On a GPU decoding is memory-bound
(about 7 ms per token from 1 to 10 sequences for a 7-8B model on an H100), which is where SPRINT's
parallel calls pay off: run scripts/time_on_gpus.sh there.

With neither `--server` nor .venv-vllm it measures nothing: it says so and exits 2, so that
`make bench` does not report a success it did not measure.

    SPRINT_LOCAL_DATA=../shared/data .venv/bin/python benchmarks/bench_time_replay.py [--n 4]
    ... [--server http://HOST:PORT/v1 --model NAME --tokenizer DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from make_trajectories import make_problems, write_problems

from sprint.core.errors import UserError
from sprint.timing.latency_fit import fit_latency, fit_text, samples_from_timing, timing_table
from sprint.llm.serve import default_python, free_port, local_vllm
from sprint.timing.time_replay import TimeReplayConfig, time_replay

REPO_ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = "tokenizers/deepseek-r1-distill-qwen-7b"


def data_root() -> Path:
    root = os.environ.get("SPRINT_LOCAL_DATA") or str(REPO_ROOT.parent / "shared" / "data")
    os.environ["SPRINT_LOCAL_DATA"] = root
    return Path(root)


def vllm_installed() -> bool:
    """Whether the local vLLM venv is there to serve the tiny model."""
    try:
        return default_python().exists()
    except UserError:  # no checkout venv and no variable naming one
        return False


@contextlib.contextmanager
def tiny_server(tmp: Path, tokenizer: str) -> Iterator[tuple[str, str]]:
    """The tiny random model on the local vLLM CPU build, prefix caching and cache-hit reports on."""
    model = tmp / "tiny-qwen2"
    subprocess.run([str(default_python()), str(REPO_ROOT / "scripts" / "make_tiny_model.py"), str(model),
                    "--tokenizer", tokenizer], check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    started = time.time()
    with local_vllm(model, "tiny-qwen2", free_port(), log_path=tmp / "vllm.log", timeout=900,
                    extra_args=("--enable-prefix-caching", "--enable-prompt-tokens-details")) as url:
        print(f"vLLM (CPU, tiny random Qwen2) ready in {time.time() - started:.0f} s")
        yield url, "tiny-qwen2"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4, help="problems (the shortest of 10 x n drawn; default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server", help="a running vLLM server's base URL (default: start the tiny model on CPU)")
    parser.add_argument("--model", help="served model name (with --server)")
    parser.add_argument("--tokenizer", help="tokenizer of the recorded model (default: the shared R1-distill one)")
    parser.add_argument("--concurrency", type=int, default=1, help="problems in flight (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.6,
                        help="sampling temperature of the replayed calls (default: the paper's %(default)s; 0 = greedy, "
                             "which on a CPU skips top-p sampling, the costliest part of a step)")
    args = parser.parse_args(argv)
    if not args.server and not vllm_installed():
        print("error: cannot measure: no vLLM venv (scripts/install_vllm.sh, or VLLM_PYTHON) and no --server URL "
              "--model NAME; nothing was timed", file=sys.stderr)
        return 2
    tokenizer = args.tokenizer or str(data_root() / TOKENIZER)
    drawn = make_problems(10 * args.n, args.seed)
    problems = sorted(drawn, key=lambda p: len(p.trajectory.render_body().split()))[: args.n]

    with tempfile.TemporaryDirectory(prefix="bench-time-replay-") as name:
        tmp = Path(name)
        runs = tmp / "logs"
        write_problems(runs, problems)
        print(f"{len(problems)} problems, {sum(len(p.trajectory.phases) for p in problems)} phases, "
              f"{sum(p.trajectory.prompt_count for p in problems)} prompts")
        server = contextlib.nullcontext((args.server, args.model)) if args.server else tiny_server(tmp, tokenizer)
        with server as (url, model):
            cfg = TimeReplayConfig(run=str(runs), server_url=url, model=model, baseline=str(runs),
                                   out_dir=str(tmp / "timing"), tokenizer=tokenizer, concurrency=args.concurrency,
                                   temperature=args.temperature, top_p=0.95 if args.temperature > 0 else 1.0,
                                   resamples=1000)
            started = time.time()
            timing = time_replay(cfg)
            print(f"measured in {time.time() - started:.0f} s\n")
        print(timing_table(timing))
        print()
        print(fit_text(fit_latency(samples_from_timing(timing))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
