"""What test modules share besides fixtures (import as `tests.helpers`): where the shared data lives,
the skip when it is missing, and the one run-folder writer.

These are plain functions, not only fixtures, because some tests need a path at import time (skipif
conditions) or inside helpers that are not fixtures; conftest.py wraps them as fixtures.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = "tokenizers/deepseek-r1-distill-qwen-7b"  # the R1-distill tokenizer, under the shared data
# Every skip for a missing ../shared starts with this, so conftest's summary can count them.
SHARED_MISSING = "shared data missing"


def shared_data_dir() -> Path:
    """SPRINT_LOCAL_DATA, else ../shared/data beside the repo (read-only; never copy from it), made
    absolute: tests hand it to subprocesses that run in other folders."""
    return Path(os.environ.get("SPRINT_LOCAL_DATA") or REPO_ROOT.parent / "shared" / "data").resolve()


def shared_missing(path: Path) -> str:
    """The skip reason for a missing shared file: a fresh clone without ../shared skips, never fails."""
    return f"{SHARED_MISSING}: {path} not found; set SPRINT_LOCAL_DATA to the shared data folder"


def shared_path(relative: str | Path = "") -> Path:
    """`relative` under the shared data folder; skips the calling test when it is not there."""
    path = shared_data_dir() / relative
    if not path.exists():
        pytest.skip(shared_missing(path))
    return path


def shared_example(name: str) -> Path:
    """A file of ../shared/examples (the data folder's sibling); skips the calling test when absent."""
    path = shared_data_dir().parent / "examples" / name
    if not path.is_file():
        pytest.skip(shared_missing(path))
    return path


def tokenizer_dir() -> Path:
    """The shared R1-distill tokenizer folder; skips the calling test when its tokenizer.json is missing."""
    return shared_path(f"{TOKENIZER}/tokenizer.json").parent


def write_run(folder: Path, records: list[dict], *, files: dict[str, str] | None = None, tail: str = "",
              stage: str = "orchestrate", config: dict | None = None) -> Path:
    """A run folder as orchestration (or the baseline) writes it, for tests of what reads one:
    records.jsonl (`tail` appended raw, e.g. a torn last line), manifest.json (`config` defaults to
    the math task) and trajectories/<id>.txt for each of `files`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    manifest_config = {"task": "math"} if config is None else config
    (folder / "manifest.json").write_text(json.dumps({"stage": stage, "config": manifest_config}))
    if files:
        (folder / "trajectories").mkdir(exist_ok=True)
        for pid, text in files.items():
            (folder / "trajectories" / f"{pid}.txt").write_text(text)
    return folder
