"""`sprint gpu-probe`: measure this machine's step costs (`sprint.latency.probe`) into a latency file.

The probe needs PyTorch, which the pipeline's own venv does not hold: this command runs it here when
this Python has torch, else with a Python that has (`--python`, else .venv-swift's, .venv-vllm's or
.venv-rl's), as `python -m sprint.latency.probe` from the folder holding this package. On a machine
with PyTorch alone, run that line from a checkout's root yourself. The file it writes is read by
`sprint evaluate --latency FILE`, `sprint view --latency FILE` and `sprint replay-server --latency-from FILE`.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sprint.core.errors import UserError
from sprint.core.options import add_options, config_from, option
from sprint.core.resources import RL_ENV, SWIFT_ENV, VLLM_ENV
from sprint.latency.model import load_latency_model
from sprint.latency.shapes import SHAPES

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder `sprint/` is in: `-m sprint.latency.probe` runs from it


@dataclass
class ProbeConfig:
    """The flags of `sprint gpu-probe` (the probe's own, passed on)."""

    out: str = option("latency.json", "the latency file to write")
    shape: str = option("r1-distill-qwen-7b", "the decoder's shape: r1-distill-qwen-7b, tiny, or a model folder "
                        "with config.json (random weights of that shape)")
    device: str | None = option(None, "cuda, cuda:N or cpu (default: cuda when there is one)")
    attention: str = option("matmul", "decode attention: two batched matmuls reading K and V once, or "
                            "scaled_dot_product_attention", choices=("matmul", "sdpa"))
    graphs: bool = option(True, "time eager decode steps even under CUDA", flags=("--no-graphs",))
    batch_sizes: str | None = option(None, "sequences decoding together, comma-separated (default: 1,2,3,4,6,8,12,16 "
                                     "on CUDA, 1,2,4 on CPU)")
    contexts: str | None = option(None, "contexts in tokens, comma-separated (default: 512,2048,4096,8192,16384 "
                                  "on CUDA, 32,128 on CPU)")
    prefill: str | None = option(None, "prefill cells as cached:new, comma-separated (default: 11 cells on CUDA, "
                                 "3 on CPU)")
    time_cap: float = option(600.0, "seconds after which the probe starts no new cell (what it measured is kept)")
    python: str | None = option(None, "a Python with torch (default: this one if it has torch, else .venv-swift's, "
                                ".venv-vllm's or .venv-rl's)")


def probe_argv(cfg: ProbeConfig, out: Path) -> list[str]:
    """The probe's own command line for these settings."""
    argv = ["--out", str(out), "--shape", cfg.shape, "--attention", cfg.attention, "--time-cap", str(cfg.time_cap)]
    for flag, value in (("--device", cfg.device), ("--batch-sizes", cfg.batch_sizes), ("--contexts", cfg.contexts),
                        ("--prefill", cfg.prefill)):
        if value:
            argv += [flag, value]
    return argv + ([] if cfg.graphs else ["--no-graphs"])


def torch_python(given: str | None) -> str | None:
    """The Python to run the probe with; None: this one (it has torch)."""
    if given:
        return given
    if importlib.util.find_spec("torch") is not None:
        return None
    for venv in (SWIFT_ENV, VLLM_ENV, RL_ENV):
        path = venv.path()
        if path is not None and (path / "bin" / "python").exists():
            return str(path / "bin" / "python")
    raise UserError("no Python with torch found (this one has none, nor .venv-swift, .venv-vllm or .venv-rl); "
                    "pass --python PATH, or run `python -m sprint.latency.probe` where torch is")


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(ProbeConfig, args)
    if not Path(cfg.shape).exists() and cfg.shape not in SHAPES:
        raise UserError(f"--shape {cfg.shape} is neither a named shape ({', '.join(SHAPES)}) nor a model folder")
    out = Path(cfg.out).resolve()
    argv = probe_argv(cfg, out)
    python = torch_python(cfg.python)
    if python is None:
        from sprint.latency import probe  # torch is here

        probe.main(argv)
    else:
        done = subprocess.run([python, "-m", "sprint.latency.probe", *argv], cwd=PACKAGE_ROOT)
        if done.returncode != 0:
            raise UserError(f"the probe failed with {python} (exit {done.returncode}); see its output above")
    model = load_latency_model(out)
    print(f"modelled GPU: {model.describe()}")
    print(f"use it with `sprint evaluate … --latency {out}` or `sprint replay-server … --latency-from {out}`")
    return 0


def register(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    add_options(p, ProbeConfig)
