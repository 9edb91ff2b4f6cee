"""The order in which `swift sft` reads the rows, when a recipe asks for sorted micro-batches.

Why: on a CPU every padded token costs as much as a real one. SPRINT's rows differ in length (a
plan, an execution; 130 to 410 tokens in the miniature), so a random batch of 16 padded to its
longest row is 1.86x its real tokens. Grouping the whole data set by length (ms-swift's
`group_by_length`) removes the padding but makes each batch all plans or all executions, and a
small model learned SPRINT badly from that (6.5 % held-out, README). Here each optimizer step's
batch is still drawn at random; only its rows are sorted by length, so that gradient accumulation
cuts it into micro-batches of like length (padding 1.1x at micro-batches of 4). The loss is
normalised over the whole batch's tokens (transformers' num_items_in_batch), so the step is the
one the unsorted batch would take. ms-swift's sampler has no such mode (transformers'
`batch_rebalance` does, but ms-swift replaces the sampler), so the order is written to a file that
ms-swift reads unshuffled.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from sprint.core.errors import UserError

ORDER_FILE = "train_order.jsonl"


def row_length(line: str) -> int:
    """Characters of a row's messages: a stand-in for its tokens, good enough to sort by."""
    return sum(len(str(m.get("content", ""))) for m in json.loads(line).get("messages", []))


def batch_order(lengths: list[int], batch_size: int, steps: int, seed: int) -> list[int]:
    """The rows (indexes into `lengths`) of steps batches of batch_size: each pass over the data a
    fresh permutation cut into batches (the remainder left out, as drop_last does), each batch sorted
    longest first."""
    per_pass = len(lengths) // batch_size
    if per_pass == 0:
        raise UserError(f"sorted micro-batches need at least one batch of {batch_size} rows; the data has {len(lengths)}")
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(math.ceil(steps / per_pass)):
        index = list(range(len(lengths)))
        rng.shuffle(index)
        for start in range(0, per_pass * batch_size, batch_size):
            order.extend(sorted(index[start:start + batch_size], key=lambda i: -lengths[i]))
    return order[: steps * batch_size]


def write_batch_order(train: str | Path, out: str | Path, batch_size: int, steps: int, seed: int) -> Path:
    """The rows of `train` (a .jsonl) in batch_order into `out`; returns `out`."""
    lines = [line + "\n" for line in Path(train).read_text(encoding="utf-8").splitlines() if line.strip()]
    lengths = []
    for number, line in enumerate(lines, 1):  # the data check parses the rows too, but --skip-check skips it
        try:
            lengths.append(row_length(line))
        except json.JSONDecodeError as exc:
            raise UserError(f"{train}, line {number}: not a JSON row ({exc.msg}); fix the data to sort its batches") from None
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(lines[i] for i in batch_order(lengths, batch_size, steps, seed)), encoding="utf-8")
    return out
