"""scripts/base_accuracy.py: greedy accuracy of a sequential mini model on held-out arithmetic problems, run on real
problems with the project's tokenizer and a random-init mini model (with a torch Python)."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from sprint.core.data import iter_jsonl
from sprint.mini.arithmetic import PHRASES
from tests.helpers import tiny_arithmetic

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "base_accuracy.py"


@pytest.mark.swift
@pytest.mark.slow
def test_every_problem_is_generated_and_counted_by_its_rounds(tmp_path: Path) -> None:
    python = tiny_arithmetic(tmp_path, n_test=7, n_train=60, phrases=PHRASES)
    done = subprocess.run([str(python), str(SCRIPT), str(tmp_path / "init"), str(tmp_path / "tok"),
                           str(tmp_path / "data" / "test.jsonl"), "--n", "6", "--batch", "4", "--max-new-tokens", "8"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rounds = Counter(p["rounds"] for p in list(iter_jsonl(tmp_path / "data" / "test.jsonl"))[:6])
    line = done.stdout.strip().splitlines()[-1]
    # eight tokens from random weights box no answer: none right, every problem counted under its rounds
    assert line.startswith(f"{tmp_path / 'init'}: 0/6 right"), line
    assert dict((int(r), int(n)) for r, n in re.findall(r"(\d) rounds? 0/(\d)", line)) == dict(rounds), line
    # the generator's own solutions are graded right, and another problem's answer wrong
    traces = list(iter_jsonl(tmp_path / "data" / "train_traces.jsonl"))[:2]
    check = ("import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('b', sys.argv[1]); "
             "b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b); t = json.loads(sys.argv[2]); "
             "print([b.graded(t[i]['solution'], t[j]['answer']) for i, j in ((0, 0), (1, 1), (0, 1))])")
    done = subprocess.run([str(python), "-c", check, str(SCRIPT), json.dumps(traces)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[True,", "True,", "False]"], done.stdout
