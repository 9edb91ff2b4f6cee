"""scripts/compare_demo_runs.py: two demo folders, artefact by artefact, and it catches a difference."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from sprint.mini.artefacts import DATA_HALF

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "compare_demo_runs.py"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def demo_folder(root: Path, stage_order: list[int], clock: float = 0.0) -> Path:
    for name in DATA_HALF:  # init/model.safetensors is written again below, as weights
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"{name}\n", encoding="utf-8")
    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    for folder in ("init", "base-model", "sprint-model"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        save_file(weights, str(root / folder / "model.safetensors"))
    for stage in ("components", "dag"):  # completion order differs between runs; times too
        write_jsonl(root / stage / "records.jsonl", [{"id": f"t{i}", "index": i, "end": clock + i}
                                                     for i in stage_order])
    write_jsonl(root / "runs" / "sprint-stream" / "records.jsonl",
                [{"id": f"p{i}", "trajectory": f"text {i}", "start": clock + 0.5 * i} for i in range(3)])
    (root / "evaluation").mkdir(parents=True)
    (root / "evaluation" / "table2.json").write_text(json.dumps({"rows": [
        {"method": "SPRINT stream", "accuracy": {"value": 0.5}, "sequential_tokens": {"value": 10.0},
         "total_tokens": {"value": 20.0}, "seconds_per_problem": {"value": 0.1 + clock}}]}))
    return root


def run(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(a), str(b)], capture_output=True, text=True)


def test_two_runs_that_differ_only_in_order_and_time_are_the_same(tmp_path: Path) -> None:
    a = demo_folder(tmp_path / "a", [0, 1, 2])
    b = demo_folder(tmp_path / "b", [2, 0, 1], clock=7.0)
    done = run(a, b)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DIFFER" not in done.stdout and "same    sprint-model/model.safetensors (1 tensors)" in done.stdout


def test_a_changed_tensor_text_or_file_is_reported(tmp_path: Path) -> None:
    a = demo_folder(tmp_path / "a", [0, 1, 2])
    b = tmp_path / "b"
    shutil.copytree(a, b)
    save_file({"w": np.ones((2, 3), dtype=np.float32)}, str(b / "sprint-model" / "model.safetensors"))
    write_jsonl(b / "runs" / "sprint-stream" / "records.jsonl",
                [{"id": f"p{i}", "trajectory": "other" if i == 1 else f"text {i}"} for i in range(3)])
    (b / "sft" / "train.jsonl").write_text("reordered\n", encoding="utf-8")
    done = run(a, b)
    assert done.returncode == 1
    assert "DIFFER  sprint-model/model.safetensors (1 tensors, 1 differ)" in done.stdout
    assert "DIFFER  runs/sprint-stream (3 texts, 1 differ)" in done.stdout
    assert "DIFFER  sft/train.jsonl (bytes)" in done.stdout
    assert "same    base-model/model.safetensors" in done.stdout


def test_a_missing_artefact_is_named(tmp_path: Path) -> None:
    a = demo_folder(tmp_path / "a", [0, 1, 2])
    b = tmp_path / "b"
    shutil.copytree(a, b)
    (b / "evaluation" / "table2.json").unlink()
    done = run(a, b)
    assert done.returncode == 2 and "table2.json" in done.stderr
