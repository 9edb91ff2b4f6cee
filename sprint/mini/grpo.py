"""Latency-aware GRPO in the mini experiment: its training problems and its curve.

`sprint mini-grpo-data` writes the problems GRPO trains on: training problems (never the held-out
ones), each with `reference_tokens`, the length of its sequential trace as the RFT model writes it
(thought, `</think>`, answer) in the shared tokenizer. That is the latency reward's reference
(`max(0, 1 - sequential/reference)` for a right answer, sprint.rl.rewards), read by `sprint grpo
--reference-column reference_tokens`.

`grpo_curve` reads ms-swift's `logging.jsonl` of the run (one line per step: the mean of each
reward function, the critical path among them with weight 0) and draws reward, accuracy and mean
critical path per step into one PNG (matplotlib's object API, no display).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from sprint.core.data import iter_jsonl
from sprint.core.errors import UserError
from sprint.core.files import write_jsonl
from sprint.core.options import add_options, config_from, option
from sprint.format.tokencount import load_counter

# ms-swift's log keys (`rewards/<class name>/mean`) for the curve, with their labels
CURVE = (("reward", "reward (weighted sum)"), ("rewards/SprintCorrect/mean", "accuracy (sampled rollouts)"),
         ("rewards/SprintCriticalPath/mean", "critical path (sequential tokens)"))


@dataclass(kw_only=True)
class MiniGRPODataConfig:
    """`sprint mini-grpo-data`: GRPO problems with their reference lengths."""

    traces: str = option(help="the training traces of `sprint mini-data` (train_traces.jsonl)", flags=("traces",))
    tokenizer: str = option(help="the tokenizer both models use (sprint mini-tokenizer)")
    out: str = option(help="the JSONL file to write", flags=("--out",))
    n: int = option(256, "problems to write (the first N traces; GRPO draws from them)")


def write_grpo_problems(cfg: MiniGRPODataConfig) -> int:
    path = Path(cfg.traces)
    if not path.is_file():
        raise UserError(f"no traces at {path}; run `sprint mini-data` first")
    if cfg.n < 1:
        raise UserError(f"--n must be at least 1, got {cfg.n}")
    traces = [row for _, row in zip(range(cfg.n), iter_jsonl(path))]
    counts = load_counter(cfg.tokenizer).count_many(
        [f"{t['thought']}\n</think>\n\n{t['solution']}" for t in traces])
    # every column but the trace itself: the question and what grades it (answer; nums and target for Countdown)
    rows = [{k: v for k, v in t.items() if k not in ("thought", "solution")} | {"reference_tokens": n}
            for t, n in zip(traces, counts)]
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    return write_jsonl(Path(cfg.out), rows)


def read_log(path: Path) -> list[dict]:
    """The per-step lines of ms-swift's logging.jsonl (those with a reward)."""
    if not path.is_file():
        raise UserError(f"no GRPO log at {path}")
    return [row for row in iter_jsonl(path) if "reward" in row]


def grpo_curve(log: Path, png: Path) -> list[dict]:
    """Draw the curve; returns the steps it drew."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = read_log(log)
    if not steps:
        raise UserError(f"{log} holds no logged GRPO step")
    x = list(range(1, len(steps) + 1))
    fig = Figure(figsize=(10, 3.2))
    FigureCanvasAgg(fig)
    for i, (key, label) in enumerate(CURVE):
        ax = fig.add_subplot(1, len(CURVE), i + 1)
        ax.plot(x, [s.get(key) for s in steps], marker=".", linewidth=1)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("GRPO step", fontsize=8)
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    return steps


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_options(parser, MiniGRPODataConfig)


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(MiniGRPODataConfig, args)
    n = write_grpo_problems(cfg)
    print(f"{n} GRPO problems with reference lengths -> {cfg.out}")
    return 0
