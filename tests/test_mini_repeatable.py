"""One seed, one result: the main job's data half gives the same files on every run.

`scripts/mini_demo.sh` with UNTIL=data (the arithmetic task, 500 training traces) runs three times into three
folders. The stand-in teacher answers after random waits (TEACHER_JITTER), so stages 1-2, with the
demo's 8 workers, append their records in another order each run; the third run is killed (its whole
process group, SIGKILL) in the middle of stage 1 and resumed with REUSE=1. Everything made after
stages 1-2 must be byte-identical in all three: the SFT rows, the sequential rows, the tokenizer and
the initial weights; a stage or a reader that followed the order answers came back in fails here.
Then `swift sft` trains a few steps from the same init on two runs' rows, and every tensor of the two
checkpoints must be equal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from sprint.core.data import iter_jsonl
from sprint.mini.artefacts import DATA_HALF
from sprint.training.finetune import default_swift_bin, swift_python

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.swift, pytest.mark.slow]

N_TRAIN, N_TEST = 500, 50
JITTER = "0.05"  # seconds; 8 workers over 500 traces: stage 1 takes about 2 s, so a kill can land inside it
KILL_AFTER = 100  # stage-1 records written before the third run is killed
STEPS = 4  # swift sft steps from the init for the weights' comparison


def demo_env(out: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "DEMO_DIR": str(out), "TASK": "arithmetic", "N_TRAIN": str(N_TRAIN), "N_TEST": str(N_TEST),
            "UNTIL": "data",
            "TEACHER_JITTER": JITTER, **extra}


def data_half(out: Path, **extra: str) -> None:
    done = subprocess.run(["bash", "scripts/mini_demo.sh"], cwd=REPO, env=demo_env(out, **extra),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mini_demo.sh UNTIL=data failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def killed_then_resumed(out: Path) -> int:
    """The data half killed once stage 1 has KILL_AFTER records, then run again with REUSE=1; returns
    how many stage-1 records the killed run had left."""
    records = out / "components" / "records.jsonl"
    proc = subprocess.Popen(["bash", "scripts/mini_demo.sh"], cwd=REPO, env=demo_env(out), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while lines(records) < KILL_AFTER and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the script, the teacher and the stage: nothing gets to tidy up
    proc.wait()
    left = lines(records)
    data_half(out, REUSE="1")
    return left


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    if not default_swift_bin().exists() or not swift_python(default_swift_bin()).exists():
        pytest.skip("ms-swift venv missing (the initial weights need its torch); run scripts/install_swift.sh")
    root = tmp_path_factory.mktemp("repeatable")
    runs = [root / "a", root / "b", root / "c"]
    started = time.monotonic()
    data_half(runs[0])
    data_half(runs[1])
    left = killed_then_resumed(runs[2])
    total = sum(1 for _ in iter_jsonl(runs[0] / "data" / "train_traces.jsonl"))
    print(f"three data halves in {time.monotonic() - started:.0f} s; the third killed with {left} of {total} "
          "stage-1 records written")
    assert KILL_AFTER <= left < total, "the kill did not land inside stage 1"
    return runs


def completion_order(run: Path, stage: str) -> list[int]:
    return [r["index"] for r in iter_jsonl(run / stage / "records.jsonl")]


def test_the_data_half_is_byte_identical_whatever_order_the_teacher_answers_in(three_runs: list[Path]) -> None:
    a, b, c = three_runs
    # the premise: the stages' own files did come back in other orders (else this test proves nothing)
    orders = [completion_order(run, "components") for run in three_runs]
    assert orders[0] != sorted(orders[0]) or orders[1] != sorted(orders[1])
    assert len({tuple(o) for o in orders}) > 1
    for run in three_runs:  # one record per trace, the resumed run included
        assert sorted(completion_order(run, "components")) == sorted(completion_order(a, "components"))
    for name in DATA_HALF:
        first = (a / name).read_bytes()
        assert first, name
        for other in (b, c):
            assert (other / name).read_bytes() == first, f"{name} differs between {a.name} and {other.name}"


def test_a_few_training_steps_give_equal_weights(three_runs: list[Path]) -> None:
    """`swift sft` (the demo's recipe, its sorted micro-batches) from the same init on two runs' rows:
    every tensor of the two checkpoints equal, so a run's model is a function of its seed."""
    checkpoints = []
    for run in three_runs[:2]:
        env = {**os.environ, "MODEL": str(run / "init"), "TRAIN_DATA": str(run / "sft" / "train.jsonl"), "VAL_DATA": "",
               "OUTPUT_DIR": str(run / "train"), "CONFIG": "configs/finetune_mini.yaml", "TUNER": "full",
               "NPROC_PER_NODE": "1", "MAX_STEPS": str(STEPS), "SAVE_STEPS": str(STEPS),
               "TOKENIZER": str(run / "tokenizer")}
        done = subprocess.run(["bash", "run_finetune.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"run_finetune.sh failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        checkpoints.append(load_file(str(run / "train" / f"checkpoint-{STEPS}" / "model.safetensors")))
    first, second = checkpoints
    init = load_file(str(three_runs[0] / "init" / "model.safetensors"))
    assert first.keys() == second.keys()
    assert any((first[k] != init[k]).any() for k in first), "training moved no weight"
    unequal = [k for k in first if not (first[k] == second[k]).all()]
    assert not unequal, f"{len(unequal)} of {len(first)} tensors differ, e.g. {unequal[0]}"
    orders = [(run / "train" / "train_order.jsonl").read_bytes() for run in three_runs[:2]]
    assert orders[0] == orders[1]
    print(json.dumps({"tensors": len(first), "steps": STEPS}))
