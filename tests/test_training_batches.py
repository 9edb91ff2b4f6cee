"""The training order of a recipe with sorted micro-batches (sprint/training/batches.py).

Each batch must still be a random draw (a pass is a permutation, cut into batches), only sorted
inside by length, so that ms-swift's gradient accumulation cuts it into micro-batches of like
length. ms-swift itself reading this order is in tests/test_finetune.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sprint.core.errors import UserError
from sprint.training.batches import batch_order, row_length, write_batch_order


def ordered(lines: list[str], batch_size: int, steps: int, seed: int) -> list[str]:
    """The rows themselves in batch_order."""
    return [lines[i] for i in batch_order([row_length(line) for line in lines], batch_size, steps, seed)]


def rows(n: int) -> list[str]:
    """Rows of lengths 1..n (in characters) in a shuffled-looking order, each a distinct line."""
    return [json.dumps({"messages": [{"role": "user", "content": "q" * (1 + (7 * i) % n)},
                                     {"role": "assistant", "content": ""}]}) + "\n" for i in range(n)]


def test_batches_are_random_draws_sorted_inside():
    lines = rows(20)
    order = ordered(lines, batch_size=4, steps=12, seed=0)
    assert len(order) == 12 * 4
    batches = [order[i:i + 4] for i in range(0, len(order), 4)]
    for batch in batches:
        lengths = [row_length(line) for line in batch]
        assert lengths == sorted(lengths, reverse=True)
    # 5 batches a pass: passes are permutations (no row twice within one), different from each other
    first, second = order[:20], order[20:40]
    assert sorted(first) == sorted(lines) and sorted(second) == sorted(lines)
    assert {frozenset(b) for b in batches[:5]} != {frozenset(b) for b in batches[5:10]}
    # not simply the data grouped by length: a batch mixes short and long rows
    assert any(row_length(b[0]) - row_length(b[-1]) > 10 for b in batches)


def test_the_remainder_of_a_pass_is_left_out_and_the_order_is_seeded():
    lines = rows(10)  # two batches of 4 a pass, 2 rows left out
    order = ordered(lines, batch_size=4, steps=3, seed=1)
    assert len(order) == 12 and len(set(order[:8])) == 8
    assert order == ordered(lines, batch_size=4, steps=3, seed=1)
    assert order != ordered(lines, batch_size=4, steps=3, seed=2)


def test_too_few_rows_for_a_batch_is_a_user_error(tmp_path: Path):
    with pytest.raises(UserError, match="at least one batch of 16"):
        ordered(rows(5), batch_size=16, steps=1, seed=0)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(rows(8)).rstrip("\n"))  # no newline at the end
    out = write_batch_order(train, tmp_path / "run" / "order.jsonl", batch_size=4, steps=2, seed=0)
    assert sorted(out.read_text().splitlines()) == sorted(line.strip() for line in rows(8))
    train.write_text("".join(rows(8)) + "{not json\n")
    with pytest.raises(UserError, match="line 9: not a JSON row"):
        write_batch_order(train, tmp_path / "run" / "order.jsonl", batch_size=4, steps=2, seed=0)
