"""scripts/head_copy.py: teacher-forced accuracy of the copied fields of arithmetic execution heads, read on
real arithmetic rows with the project's tokenizer and a random-init mini model (run with a torch Python)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from sprint.core.data import iter_jsonl
from sprint.curation.sft_rows import executor_rows, sequential_example
from sprint.format.prompt_format import sft_user_content
from sprint.mini.arithmetic import PHRASES
from sprint.mini.ideal import ideal_trajectory
from tests.helpers import tiny_arithmetic

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "head_copy.py"


@pytest.mark.swift
@pytest.mark.slow
@pytest.mark.parametrize("phrases", ["", PHRASES], ids=["three-tokens", "one-token"])
def test_every_head_is_read_and_the_loop_trains(tmp_path: Path, phrases: str) -> None:
    """Every head is found whether its equation's right part is three tokens (`* 3 = 1`) or one."""
    python = tiny_arithmetic(tmp_path, n_test=4, n_train=120, phrases=phrases)
    traces = list(iter_jsonl(tmp_path / "data" / "train_traces.jsonl"))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(sequential_example(sft_user_content("", t["question"]), t["id"], t["thought"],
                                                          t["solution"])) + "\n" for t in traces[:20]))
    heads = sum(t["thought"].count(", try each digit :") for t in traces[:20])
    reads = sum(t["thought"].count(", where ") for t in traces[:20])
    done = subprocess.run([str(python), str(SCRIPT), str(tmp_path / "init"), str(tmp_path / "tok"), str(rows)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["heads"] == heads and 0 < reads < heads  # one of each, both kinds of head present
    fused = {"equation number", "equation reads"} if phrases else set()  # the whole fused token, beside its fields
    assert set(figures) == {"heads", "tokens", "op", "k number", "k reads", "rhs number", "rhs name", "lookup", *fused}
    assert all(0 <= v <= 1 for k, v in figures.items() if k != "heads")
    # executor-view rows: the execution is the answer, its head the first token, read by its place in the round
    views = [row for t in traces[:20] for row in executor_rows(sft_user_content("", t["question"]), t["id"],
                                                               ideal_trajectory(t["question"])[0], ("stream",), 8)]
    executor_file = tmp_path / "executor.jsonl"
    executor_file.write_text("".join(json.dumps(row) + "\n" for row in [*views, *iter_jsonl(rows)]))
    done = subprocess.run([str(python), str(SCRIPT), str(tmp_path / "init"), str(tmp_path / "tok"), str(executor_file),
                           "--executor-rows", str(len(views) + 5)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["heads"] == len(views) == heads  # every execution's head, none of the sequential rows'
    assert "op @ round 1, first" in figures and "op @ later rounds, first" in figures
    done = subprocess.run([str(python), str(SCRIPT), str(tmp_path / "init"), str(tmp_path / "tok"), str(rows),
                           "--train", str(rows), "--steps", "2", "--every", "1", "--threads", "1"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [s["step"] for s in steps] == [1, 2] and all(math.isfinite(s["loss"]) and s["loss"] > 0 for s in steps)
