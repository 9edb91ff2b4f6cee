"""The bundled demo sample: its response cache is current and answers stages 1-2 offline.

`make demo-sample` runs component separation and DAG creation on examples/demo/traces.jsonl from the
shipped cache (no capable model runs on CI). These tests fail when someone edits a prompt, the
line splitter or a stage default without rebuilding the cache, and check that the sample still
shows what packing does: most traces kept with real parallelism, one dropped with its reason.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sprint.curation.components import separate_components, split_lines
from sprint.curation.dag import create_dag
from sprint.curation.packing import DEFAULT_THRESHOLD, pack
from sprint.llm.serve import free_port
from sprint.format.trajectory import parse as parse_trajectory

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO = REPO_ROOT / "examples" / "demo"
TRACES = DEMO / "traces.jsonl"
ANSWERS = DEMO / "answers.jsonl"
SHIPPED_CACHE = DEMO / "llm_cache"
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build_demo_cache.py"
ENTRY = re.compile(r"[0-9a-f]{2}/[0-9a-f]{64}\.json")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def cache_entries(folder: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every cache entry under `folder`."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*.json"))
        if ENTRY.fullmatch(p.relative_to(folder).as_posix())
    }


# --- the sample itself --------------------------------------------------------------------


def test_traces_and_answers_line_up() -> None:
    traces = read_jsonl(TRACES)
    answers = read_jsonl(ANSWERS)
    assert len(traces) == 8
    assert [t["id"] for t in traces] == [a["id"] for a in answers]
    for t in traces:
        assert {"id", "problem", "thought", "solution", "answer"} <= t.keys()
        assert 25 <= len(split_lines(t["thought"])) <= 70, t["id"]
        boxed = re.findall(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}", t["solution"])
        assert boxed and boxed[-1] == t["answer"], t["id"]


# --- (a) the shipped cache is what the build script produces now ---------------------------


def test_shipped_cache_is_up_to_date(tmp_path: Path) -> None:
    built = tmp_path / "cache"
    result = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), "--cache-dir", str(built)],
        capture_output=True, text=True, cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    fresh, shipped = cache_entries(built), cache_entries(SHIPPED_CACHE)
    assert len(fresh) == 2 * len(read_jsonl(TRACES))  # one stage-1 and one stage-2 request per trace
    hint = "examples/demo/llm_cache is stale: run `python scripts/build_demo_cache.py` and commit the result"
    assert sorted(fresh) == sorted(shipped), hint
    assert [k for k in fresh if fresh[k] != shipped[k]] == [], hint


def test_build_is_idempotent_and_prunes_stale_entries(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(SHIPPED_CACHE, cache)
    (cache / "ab").mkdir(exist_ok=True)
    stale = cache / "ab" / ("ab" + "0" * 62 + ".json")
    stale.write_text("{}")
    result = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), "--cache-dir", str(cache)], capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stderr
    assert not stale.exists()
    assert cache_entries(cache) == cache_entries(SHIPPED_CACHE)
    check = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), "--check", "--cache-dir", str(cache)], capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert check.returncode == 0, check.stdout + check.stderr


# --- (b) + (c) stages 1-2 answered from the cache alone, then packed -----------------------


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Stages 1-3 on the sample, against a port nobody listens on: every answer must come from the cache."""
    root = tmp_path_factory.mktemp("demo")
    cache = root / "llm_cache"
    shutil.copytree(SHIPPED_CACHE, cache)
    before = cache_entries(cache)
    llm = dict(
        model="gpt-4o",
        server_url=f"http://127.0.0.1:{free_port()}/v1",
        cache_dir=cache,
        check_server=False,
        max_retries=0,
        timeout=5.0,
        progress=False,
    )
    stage1 = separate_components(str(TRACES), root / "components", **llm)
    stage2 = create_dag(str(root / "components"), root / "dag", **llm)
    summary = pack(str(root / "dag"), root / "pack")
    return {
        "stage1": stage1, "stage2": stage2, "summary": summary, "pack": root / "pack",
        "cache_before": before, "cache_after": cache_entries(cache),
    }


@pytest.mark.parametrize("stage", ["stage1", "stage2"])
def test_stages_answer_every_trace_from_the_cache(demo_run: dict, stage: str) -> None:
    outcome = demo_run[stage]
    n = len(read_jsonl(TRACES))
    records = outcome.run.records()
    assert len(records) == n
    assert [(r["id"], r["status"], r["error"]) for r in records if r["status"] != "ok"] == []
    used = outcome.usage["this_run"]
    assert used["calls"] == n and used["cache_hits"] == n and used["failures"] == 0
    assert demo_run["cache_after"] == demo_run["cache_before"]  # nothing was missed and written back


def test_stage_records_hold_components_and_dags(demo_run: dict) -> None:
    for r in demo_run["stage2"].run.records():
        assert len(r["components"]) >= 5 and r["uncovered_lines"] == []
        assert set(r["dag"]) == {str(i) for i in range(1, len(r["components"]) + 1)}


def test_packing_keeps_the_parallel_traces_and_drops_the_sequential_one(demo_run: dict) -> None:
    summary = demo_run["summary"]
    records = read_jsonl(demo_run["pack"] / "records.jsonl")
    kept = [r for r in records if r["status"] == "ok"]
    dropped = [r for r in records if r["status"] != "ok"]
    assert summary["kept"] == len(kept) >= 6
    assert dropped and all(r["reason"] == "low_parallelization" for r in dropped)
    assert summary["dropped"] == {"low_parallelization": len(dropped)}
    assert all(r["ratio"] < DEFAULT_THRESHOLD for r in dropped)
    assert all(r["ratio"] >= DEFAULT_THRESHOLD for r in kept)
    assert sum(1 for r in kept if r["phases"] >= 3) >= 2


def test_packing_writes_sft_files_in_the_messages_layout(demo_run: dict) -> None:
    train = read_jsonl(demo_run["pack"] / "train.jsonl")
    test = read_jsonl(demo_run["pack"] / "test.jsonl")
    assert train and test
    assert len(train) + len(test) == demo_run["summary"]["kept"]
    for row in train + test:
        user, assistant = row["messages"]
        assert user["role"] == "user" and "<Question>" in user["content"]
        assert assistant["role"] == "assistant"
        content = assistant["content"]
        assert content.startswith("<think>\n") and content.endswith("\n</think>")
        traj = parse_trajectory(content)  # strict: balanced tags, phases numbered 1..n
        assert traj.phases and any(p.executions for p in traj.phases)
        for phase in traj.phases:
            assert [p.name for p in phase.prompts] == [e.name for e in phase.executions]
        assert "\\boxed{" in (traj.final_answer or "")
