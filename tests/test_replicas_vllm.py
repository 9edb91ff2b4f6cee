"""Two real vLLM servers (CPU, tiny model) as executor replicas: per-problem affinity, prefix-cache
hits measured from vLLM's own usage, failover when one is killed mid-run, and `priority` accepted.

The planner is the scripted server: a random-weight model never writes a plan, so it would never
call an executor; the scripted planner writes a two-prompt plan, and every executor call (the
calls whose prefix sharing matters) goes to the real servers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from tests.fake_server import ScriptedServer
from tests.helpers import EAGER

from sprint.llm.client import LLMClient, LLMConfig, Sampling
from sprint.inference.orchestration import OrchestrationConfig, orchestrate
from sprint.llm.replicas import HashRing
from sprint.llm.serve import free_port, start_vllm
from sprint.tasks.registry import get_task, load_problems

PLAN = ("<Plan_1>\nSplit it.\n<prompt_1.1> Work out the first part. </prompt_1.1>\n"
        "<prompt_1.2> Work out the second part. </prompt_1.2>\n</Plan_1>")


def planner(request: dict, endpoint: str) -> str:
    """Phase 1: a plan of two prompts; phase 2 is the forced final answer (MAX_PHASES 2)."""
    return "\\boxed{1}" if request["prompt"].endswith("<Final_answer>\n") else PLAN


@pytest.fixture(scope="module")
def second_vllm(vllm_python: Path, vllm_server, tmp_path_factory: pytest.TempPathFactory):
    """Replica B: the tiny model again, with the priority scheduler (A is the server shared by this test run, the `vllm_server` fixture)."""
    log_path = tmp_path_factory.mktemp("vllm-b") / "server.log"
    server = start_vllm(vllm_server.model_dir, vllm_server.served_model_name, free_port(), python=vllm_python,
                        log_path=log_path, extra_args=("--enable-prefix-caching", "--enable-prompt-tokens-details",
                                                       "--scheduling-policy", "priority", *EAGER))
    try:
        server.wait_ready(600)
        yield server
    finally:
        server.stop()


def _window(urls: list[str], owner_b: str, shared_data: Path) -> tuple[str, list[str]]:
    """Four consecutive MATH-500 rows: the first owned by B, and both replicas owning some of the rest."""
    os.environ.setdefault("SPRINT_LOCAL_DATA", str(shared_data))
    problems = load_problems(get_task("math"), "HuggingFaceH4/MATH-500", "test", None, "0:60")
    ring = HashRing(urls)
    owners = [ring.owner(p.id) for p in problems]
    for s in range(len(problems) - 4):
        rest = owners[s + 1:s + 4]
        if owners[s] == owner_b and owner_b in rest and len(set(rest)) == 2:
            return f"{s}:{s + 4}", owners[s:s + 4]
    pytest.fail("no window of four rows with both owners; the hash ring is badly unbalanced")


def _config(out: Path, planner_url: str, urls: list[str], model: str, tokenizer: Path, rows: str,
            workers: int) -> OrchestrationConfig:
    return OrchestrationConfig(
        data="HuggingFaceH4/MATH-500", split="test", range=rows, out_dir=str(out), prompt_mode="chat",
        tokenizer=str(tokenizer), planner_model=model, planner_server_url=planner_url,
        executor_server_url=",".join(urls), max_tokens=8, planner_max_tokens=64, max_phases=2,
        max_problem_workers=workers, max_execution_workers=1, max_retries=1, timeout=120, use_cache=False,
    )


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


@pytest.mark.vllm
def test_two_vllm_replicas_affinity_prefix_cache_failover(vllm_server, second_vllm, shared_data: Path,
                                                          tmp_path: Path, scripted_server: ScriptedServer) -> None:
    a, b = vllm_server.base_url, second_vllm.base_url
    model = vllm_server.served_model_name
    rows, owners = _window([a, b], b, shared_data)

    # vLLM's priority scheduler accepts a request's `priority` (replica B runs it).
    async def with_priority() -> int:
        async with LLMClient(LLMConfig(b, model, timeout=120)) as client:
            done = await client.complete("Hello there", Sampling(max_tokens=4), body={"priority": 3})
            return done.completion_tokens
    assert asyncio.run(with_priority()) > 0

    plan_srv = scripted_server(planner, models=[model])
    # 1. Both replicas up: each problem's executor calls on its owner, both used, prefix-cache hits.
    out = tmp_path / "both"
    summary = orchestrate(_config(out, plan_srv.base_url, [a, b], model, vllm_server.model_dir, rows, 2),
                          progress=False)
    assert summary["ok"] == 4
    records = _records(out)
    used = set()
    for record, owner in zip(sorted(records, key=lambda r: r["index"]), owners):
        executors = [c for c in record["calls"] if c["role"] == "executor" and c["error"] is None]
        assert len(executors) == 2
        assert {c["server"] for c in executors} == {owner}
        used.add(owner)
        for call in executors:
            assert call["cached_tokens"] is not None
        # siblings are identical up to <execution_1.k>: the second finds all but the last few tokens
        # cached, less the partly filled last KV block (vLLM's CPU backend uses blocks of 128)
        second = executors[1]
        assert second["prompt_tokens"] - 8 - 128 <= second["cached_tokens"] < second["prompt_tokens"], second
    assert used == {a, b}
    manifest = json.loads((out / "manifest.json").read_text())
    hits = manifest["prefix_cache"]["executor"]
    assert hits["calls"] == 8 and 0.4 < hits["hit_ratio"] <= 1.0, hits
    assert manifest["usage"]["executor"]["routing"]["replicas"][b]["answered"] > 0
    print("\nprefix cache:", manifest["prefix_cache"], "owners:", owners)

    # 2. Replica B killed after the first problem (one problem at a time): the rest still end ok.
    out = tmp_path / "failover"
    done: list[dict] = []

    def run() -> None:
        done.append(orchestrate(_config(out, plan_srv.base_url, [a, b], model, vllm_server.model_dir, rows, 1),
                                progress=False))

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 300
    while not ((out / "records.jsonl").is_file() and (out / "records.jsonl").read_text().strip()):
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.05)
    os.killpg(second_vllm.process.pid, signal.SIGKILL)
    thread.join(600)
    records = _records(out)
    assert len(records) == 4 and len({r["id"] for r in records}) == 4
    assert all(r["status"] == "ok" for r in records), [r["error"] for r in records]
    by_index = sorted(records, key=lambda r: r["index"])
    first_servers = {c["server"] for c in by_index[0]["calls"] if c["role"] == "executor" and c["error"] is None}
    assert first_servers == {b}
    later_b = [r for r, o in zip(by_index[1:], owners[1:]) if o == b]
    assert later_b
    for record in later_b:  # B's later problems moved whole to A
        servers = {c["server"] for c in record["calls"] if c["role"] == "executor" and c["error"] is None}
        assert servers == {a}
    routing = json.loads((out / "manifest.json").read_text())["usage"]["executor"]["routing"]
    assert routing["failovers"] >= 1 and routing["replicas"][b]["in"] is False
