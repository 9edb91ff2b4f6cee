"""Orchestration and the baseline end to end on a real vLLM server (tiny random model), through
the shell scripts: every problem gets a record, token counts come from the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 48


def _run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(
        ["bash", str(REPO_ROOT / script), "--no-progress"], env=full, capture_output=True, text=True, timeout=600
    )


def _records(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "records.jsonl").read_text().splitlines()]


def _common(vllm_server, shared_data: Path) -> dict[str, str]:
    return {
        "SPRINT_LOCAL_DATA": str(shared_data),
        "TEST_DATA": "HuggingFaceH4/MATH-500",
        "SPLIT": "test",
        "RANGE": "0:3",
        "MAX_TOKENS": str(MAX_TOKENS),
        "MAX_PROBLEM_WORKERS": "3",
        "PROMPT_MODE": "chat",
        "TOKENIZER": str(vllm_server.model_dir),
    }


@pytest.mark.vllm
def test_orchestration_on_three_math500_problems(vllm_server, shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "orchestration"
    env = _common(vllm_server, shared_data) | {
        "PLANNER_MODEL": vllm_server.served_model_name,
        "PLANNER_SERVER_URL": vllm_server.base_url,
        "PLANNER_OUTPUT_TOKEN_LIMIT": str(MAX_TOKENS),
        "PLANNER_LENGTH_RETRIES": "1",
        "MAX_PHASES": "2",
        "MAX_EXECUTION_WORKERS": "3",
        "OUT_DIR": str(out),
    }
    result = _run("run_agent_orchestration.sh", env)
    assert result.returncode == 0, result.stderr[-3000:]
    records = _records(out)
    assert len(records) == 3 and len({r["id"] for r in records}) == 3
    for r in records:
        assert r["status"] == "ok", r["error"]
        # gibberish never answers by itself within 2 phases: the answer is forced (or it stopped early)
        assert r["forced_final"] is True or r["trajectory"].count("<Final_answer>") == 1
        assert r["trajectory"].startswith("<Question>\n") and "<Final_answer>" in r["trajectory"]
        assert r["calls"] and all(c["error"] is None for c in r["calls"])
        for call in r["calls"]:
            assert 0 < call["completion_tokens"] <= MAX_TOKENS
            assert call["prompt_tokens"] > 100  # the agent prompt and the question were sent
        assert (out / "trajectories" / f"{r['id']}.txt").read_bytes().decode() == r["trajectory"] + "\n"
        assert r["correct"] in (True, False)
    manifest = json.loads((out / "manifest.json").read_text())
    usage = manifest["usage"]
    assert usage["completion_tokens"] == sum(r["completion_tokens"] for r in records) > 0
    assert manifest["config"]["planner_server_url"] == vllm_server.base_url
    assert manifest["summary"]["problems"] == 3
    print("\norchestration records:", json.dumps(records[0], indent=1)[:3000])
    print("summary:", manifest["summary"], "usage:", {k: usage[k] for k in ("prompt_tokens", "completion_tokens")})

    # Re-running the same command resumes: nothing left to do, no duplicate records.
    again = _run("run_agent_orchestration.sh", env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(_records(out)) == 3


@pytest.mark.vllm
def test_baseline_on_three_math500_problems(vllm_server, shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "baseline"
    env = _common(vllm_server, shared_data) | {
        "MODEL": vllm_server.served_model_name,
        "SERVER_URL": vllm_server.base_url,
        "OUT_DIR": str(out),
    }
    result = _run("run_baseline_evaluation.sh", env)
    assert result.returncode == 0, result.stderr[-3000:]
    records = _records(out)
    assert len(records) == 3
    for r in records:
        assert r["status"] == "ok", r["error"]
        assert 0 < r["completion_tokens"] <= MAX_TOKENS
        assert r["sequential_tokens"] == r["completion_tokens"]
        assert r["finish_reason"] in ("length", "stop")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["usage"]["completion_tokens"] == sum(r["completion_tokens"] for r in records)
    print("\nbaseline summary:", manifest["summary"], [r["completion_tokens"] for r in records])
