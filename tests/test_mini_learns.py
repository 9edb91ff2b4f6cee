"""The mini experiment, CI-sized: a SPRINT model learned from random weights on this CPU (issue 23).

`scripts/mini_demo.sh` (the main job) with a smaller task: numbers 1..4 (569 problems), 50 held out,
SPRINT only (RFT=0), the stream schedule, fewer steps. Every stage runs for real: the generator,
the stand-in teacher over HTTP, stages 1-2, pack, the project's tokenizer, `swift sft`, vLLM,
`orchestrate`, `evaluate`, `view`. What is asserted is what the model learned on held-out problems,
not that commands exit 0:

- well-formed trajectories (strict parse, with a final answer) for >= 90 % of held-out problems;
- >= 80 % of those with a phase of >= 2 prompts, and in >= 80 % of the problems >= 2 executor
  calls of one phase actually ran at the same time (their measured start/end overlap).

Accuracy is not asserted here, and why: in the 5 minutes CI allows, the model trains for about
280 steps (3 minutes), which teaches it the SPRINT format and the parallel plan but not yet the
search. Measured on this machine: 2 % of the 50 held-out problems right, below the 15 % a
well-formed random candidate expression scores (`chance_accuracy`); numbers 1..3 instead
(192 problems) gave 1 of 40. Accuracy, against RFT, is what `make demo` measures (README, "The
experiment in miniature"); the chance level printed here is the floor it is read against.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from sprint.core.data import iter_jsonl
from sprint.llm.serve import default_python, free_port
from sprint.mini.countdown import OPS, apply, branches
from sprint.mini.summary import behaviour
from sprint.training.finetune import default_swift_bin, swift_python

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.vllm, pytest.mark.swift, pytest.mark.slow]

HIGH, N_TEST = 4, 50


def chance_accuracy(problems: list[dict]) -> float:
    """Mean share of candidate expressions (pair first, then the number left, any two operations)
    that reach each problem's target: what a well-formed random answer scores."""
    shares = []
    for p in problems:
        candidates = [apply(apply(x, o1, y)[0], o2, rest)[0] == p["target"]
                      for (x, y), rest in branches(tuple(p["nums"])) for o1, o2 in itertools.product(OPS, OPS)]
        shares.append(sum(candidates) / len(candidates))
    return sum(shares) / len(shares)


def overlapping_executors(record: dict) -> bool:
    """Some phase ran >= 2 executor calls at the same time (measured start/end, not the plan's shape)."""
    calls = [c for c in record["calls"] if c["role"] == "executor" and c.get("kept", True)]
    for phase in {c["phase"] for c in calls}:
        spans = sorted((c["start"], c["end"]) for c in calls if c["phase"] == phase)
        if any(b[0] < a[1] for a, b in itertools.pairwise(spans)):
            return True
    return False


@pytest.fixture(scope="module")
def mini_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not default_python().exists():
        pytest.skip("vLLM venv missing; run scripts/install_vllm.sh")
    if not default_swift_bin().exists() or not swift_python(default_swift_bin()).exists():
        pytest.skip("ms-swift venv missing; run scripts/install_swift.sh")
    out = tmp_path_factory.mktemp("mini") / "run"
    env = {**os.environ, "DEMO_DIR": str(out), "HIGH": str(HIGH), "N_TEST": str(N_TEST), "MAX_STEPS": "190",
           "RFT": "0", "SCHEDULES": "stream", "PROBLEM_WORKERS": "8", "WARMUP": "4", "PORT": str(free_port())}
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "scripts" / "mini_demo.sh")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    print(f"mini demo (CI size) took {time.monotonic() - started:.0f} s")
    if done.returncode != 0:
        pytest.fail(f"scripts/mini_demo.sh failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    print(done.stdout[-3000:])
    return out


def test_a_sprint_model_trained_from_scratch_writes_parallel_plans_and_runs_them_in_parallel(mini_run: Path) -> None:
    run = mini_run / "runs" / "sprint-stream"
    records = list(iter_jsonl(run / "records.jsonl"))
    assert len(records) == N_TEST
    learned = behaviour(run)
    assert learned["well_formed"] >= 0.9, learned
    assert learned["parallel"] >= 0.8, learned
    overlapped = sum(overlapping_executors(r) for r in records) / len(records)
    assert overlapped >= 0.8, overlapped
    chance = chance_accuracy(list(iter_jsonl(mini_run / "data" / "test.jsonl")))
    accuracy = sum(bool(r["correct"]) for r in records) / len(records)
    print(f"well-formed {learned['well_formed']:.0%}, parallel {learned['parallel']:.0%}, "
          f"executors overlapping {overlapped:.0%}, accuracy {accuracy:.0%} (chance {chance:.0%})")
    assert 0.1 < chance < 0.2  # the floor `make demo` reads its accuracies against
    # the table the main job ends with, for scripts: one row, every column a number
    table = json.loads((mini_run / "evaluation" / "table2.json").read_text())
    [row] = table["rows"]
    assert row["method"] == "SPRINT stream" and row["accuracy"]["value"] == pytest.approx(accuracy)
    assert (mini_run / "view" / "index.html").is_file()
    # the tokenizer and checkpoint stay where the README says
    assert (mini_run / "tokenizer" / "tokenizer.json").is_file() and (mini_run / "sprint-model" / "config.json").is_file()
