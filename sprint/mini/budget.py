"""Equal token budgets for the mini experiment's two models (`sprint mini-steps`).

The paper's comparison trains SPRINT and RFT on the same traces with the same recipe. The two
training files hold the same problems but not the same number of tokens per row: a packed row is
longer than its trace (tags, prompts), an executor-view row shorter, and there are several rows per
problem. Equal steps would give the two models different amounts of text; equal tokens is the fair
budget. This prints the steps that give a training file the token budget of `--steps` steps on the
reference file (same batch size), counting each row as the trainer sees it: its chat-template
rendering, with the tokenizer both models use.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sprint.core.data import iter_jsonl
from sprint.core.errors import UserError
from sprint.core.options import add_options, config_from, option
from sprint.format.prompt_format import load_chat_template
from sprint.format.tokencount import load_counter


@dataclass(kw_only=True)
class MiniStepsConfig:
    """`sprint mini-steps`: the steps that give a training file the reference file's token budget."""

    train: str = option(help="training file (messages rows) to find the steps for", flags=("train",))
    reference: str = option(help="training file the budget is measured on")
    steps: int = option(help="steps on the reference file (the budget: steps x its mean row)")
    tokenizer: str = option(help="tokenizer folder (with its chat template) both models use")


def row_text(row: dict, render: Callable[[str], str]) -> str:
    """A row as the trainer reads it: the user turn through the chat template, then the assistant
    messages joined (ms-swift joins consecutive assistant messages with no separator)."""
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise UserError("a training row has no messages list")
    user = "".join(m.get("content", "") for m in messages if m.get("role") == "user")
    assistant = "".join(m.get("content", "") for m in messages if m.get("role") == "assistant")
    return render(user) + assistant


def mean_row_tokens(path: str, tokenizer: str) -> float:
    if not Path(path).is_file():
        raise UserError(f"no training file at {path}")
    render = load_chat_template(tokenizer)
    texts = [row_text(row, render) for row in iter_jsonl(Path(path))]
    if not texts:
        raise UserError(f"{path} holds no rows")
    counts = load_counter(tokenizer).count_many(texts)
    return sum(counts) / len(counts)


def equal_token_steps(train: str, reference: str, steps: int, tokenizer: str) -> tuple[int, float, float]:
    """(steps for `train`, mean tokens of a `train` row, mean tokens of a `reference` row)."""
    if steps < 1:
        raise UserError(f"--steps must be at least 1, got {steps}")
    ours, theirs = mean_row_tokens(train, tokenizer), mean_row_tokens(reference, tokenizer)
    return max(1, round(steps * theirs / ours)), ours, theirs


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_options(parser, MiniStepsConfig)


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(MiniStepsConfig, args)
    steps, ours, theirs = equal_token_steps(cfg.train, cfg.reference, cfg.steps, cfg.tokenizer)
    print(steps)
    print(f"{cfg.train}: {ours:.1f} tokens a row; {cfg.reference}: {theirs:.1f}; {cfg.steps} steps there = {steps} here",
          file=sys.stderr)
    return 0
