"""The real vllm-router in front of two real vLLM CPU servers (tiny model), all started by
`sprint serve --replicas 2` (the fixture `router_replicas`, started once per test run): every call of a problem on one
replica, both replicas used, prefix-cache hits, and a replica SIGKILLed mid-run with every problem
still ok, none lost or written twice, and an honest exit code.

The planner is the scripted server: a random-weight model never writes a plan, so it would never
call an executor. The scripted planner writes a two-prompt plan and every executor call (the calls
whose prefix sharing matters) goes through the router to the real servers. The router names no
worker in its answers, so which replica served a problem is read from the replicas' own request
counters (/metrics), between problems run one at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from sprint.inference.orchestration import OrchestrationConfig, orchestrate
from sprint.llm.replicas import AFFINITY_HEADER, session_id
from sprint.llm.router import engine_counters, list_workers, server_root
from sprint.tasks.registry import Problem, get_task, load_problems
from tests.fake_server import FakeServer
from tests.serve_helpers import ServeProcess

REPO = Path(__file__).resolve().parents[1]
PLAN = ("<Plan_1>\nSplit it.\n<prompt_1.1> Work out the first part. </prompt_1.1>\n"
        "<prompt_1.2> Work out the second part. </prompt_1.2>\n</Plan_1>")
FINAL = "<Final_answer>\n"


def requests_served(workers: list[str]) -> dict[str, int]:
    counts = {}
    for worker in workers:
        counters = engine_counters(worker)
        assert counters is not None, f"{worker} does not answer /metrics"
        counts[worker] = int(counters.get("requests", 0))
    return counts


def settle(workers: list[str], before: dict[str, int], expected: int, timeout: float = 60.0) -> dict[str, int]:
    """Per-worker requests since `before`, once they add up to `expected` (a counter may lag the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        now = requests_served(workers)
        delta = {w: now[w] - before[w] for w in workers}
        if sum(delta.values()) >= expected or time.monotonic() >= deadline:
            return delta
        time.sleep(0.1)


def owner(router: str, workers: list[str], model: str, key: str) -> str:
    """The worker the router sends `key`'s calls to: one tiny request with the affinity header, then the counters."""
    before = requests_served(workers)
    body = json.dumps({"model": model, "prompt": "probe", "max_tokens": 1}).encode()
    request = urllib.request.Request(router + "/completions", body, {"Content-Type": "application/json",
                                                                     AFFINITY_HEADER: session_id(key)})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
    delta = settle(workers, before, 1)
    (worker,) = [w for w, n in delta.items() if n == 1]
    return worker


def window(problems: list[Problem], owners: dict[str, str], start: int, size: int = 4) -> list[Problem]:
    """`size` consecutive problems from `start` on whose owners include both workers."""
    for s in range(start, len(problems) - size + 1):
        if len({owners[p.id] for p in problems[s:s + size]}) == 2:
            return problems[s:s + size]
    pytest.fail("no window of problems on both replicas")


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


@pytest.mark.vllm
def test_router_affinity_prefix_cache_and_failover(router_replicas: ServeProcess, tiny_model_dir: Path,
                                                   shared_data: Path, tmp_path: Path) -> None:
    os.environ.setdefault("SPRINT_LOCAL_DATA", str(shared_data))
    router = router_replicas.url
    model = "tiny-qwen2"
    workers = list_workers(router)
    assert workers and len(workers) == 2
    problems = load_problems(get_task("math"), "HuggingFaceH4/MATH-500", "test", None, "0:24")
    owners = {p.id: owner(router, workers, model, p.id) for p in problems}
    first = window(problems, owners, 0)
    rows = f"{first[0].index}:{first[-1].index + 1}"

    # 1. One problem at a time; the scripted planner reads the replicas' counters at each final answer.
    served: dict[str, dict[str, int]] = {}
    last = [requests_served(workers)]

    def planner(request: dict, endpoint: str) -> str:
        prompt = request["prompt"]
        if not prompt.endswith(FINAL):
            return PLAN
        (problem,) = [p for p in first if p.question in prompt]
        served[problem.id] = settle(workers, last[0], 2)  # its two executor calls
        last[0] = requests_served(workers)
        return "\\boxed{1}"

    out = tmp_path / "affinity"
    with FakeServer(planner, models=[model]) as plan_srv:
        summary = orchestrate(OrchestrationConfig(
            data="HuggingFaceH4/MATH-500", split="test", range=rows, out_dir=str(out), prompt_mode="chat",
            tokenizer=str(tiny_model_dir), planner_model=model, planner_server_url=plan_srv.base_url,
            executor_server_url=router, max_tokens=8, planner_max_tokens=64, max_phases=2, max_problem_workers=1,
            max_execution_workers=1, max_retries=2, timeout=120, use_cache=False), progress=False)
    assert summary["ok"] == 4
    for problem in first:  # every executor call of a problem on its owner, none elsewhere
        assert served[problem.id] == {w: (2 if w == owners[problem.id] else 0) for w in workers}, problem.id
    assert {owners[p.id] for p in first} == set(workers)  # both replicas used
    for record in records(out):
        executors = [c for c in record["calls"] if c["role"] == "executor" and c["error"] is None]
        assert len(executors) == 2 and all(c["cached_tokens"] is not None for c in executors)
        # siblings share all but their last lines: the second finds the prefix cached (less vLLM CPU's
        # partly filled last KV block of 128 tokens)
        second = executors[1]
        assert second["prompt_tokens"] - 8 - 128 <= second["cached_tokens"] < second["prompt_tokens"], second
    manifest = json.loads((out / "manifest.json").read_text())
    per_worker = manifest["routers"][router]["workers"]
    assert {w: per_worker[w]["requests"] for w in workers} == \
        {w: sum(served[p.id][w] for p in first) for w in workers}
    assert 0.4 < manifest["prefix_cache"]["executor"]["hit_ratio"] <= 1.0
    print("\nprefix cache:", manifest["prefix_cache"], "routers:", manifest["routers"])

    # 2. The script against the router URL, one problem at a time; replica 2 SIGKILLed once the first
    #    record is written, while later problems it owned are still to come.
    name = next(n for n, u in router_replicas.urls.items() if n.startswith("replica") and server_root(u) == workers[1])
    later = window(problems, owners, first[-1].index + 1)
    if not any(owners[p.id] == workers[1] for p in later[1:]):
        later = window(problems, owners, later[0].index + 1)
    assert any(owners[p.id] == workers[1] for p in later[1:]), "no later problem on the replica to kill"
    out = tmp_path / "failover"
    with FakeServer(lambda request, endpoint: "\\boxed{1}" if request["prompt"].endswith(FINAL) else PLAN,
                    models=[model]) as plan_srv:
        env = {**os.environ, "PLANNER_MODEL": model, "PLANNER_SERVER_URL": plan_srv.base_url,
               "EXECUTOR_SERVER_URL": router, "RANGE": f"{later[0].index}:{later[-1].index + 1}",
               "TOKENIZER": str(tiny_model_dir), "MAX_TOKENS": "8", "PLANNER_OUTPUT_TOKEN_LIMIT": "64",
               "MAX_PHASES": "2", "MAX_PROBLEM_WORKERS": "1", "MAX_EXECUTION_WORKERS": "1", "MAX_RETRIES": "8",
               "TIMEOUT": "120", "OUT_DIR": str(out)}
        run = subprocess.Popen([str(REPO / "run_agent_orchestration.sh"), "--no-cache", "--no-progress"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log: list[str] = []
        reader = threading.Thread(target=lambda: log.extend(run.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 600
        while not ((out / "records.jsonl").is_file() and (out / "records.jsonl").read_text().strip()):
            assert run.poll() is None and time.monotonic() < deadline, "".join(log)
            time.sleep(0.05)
        router_replicas.kill_replica(int(name.split()[1]))
        code = run.wait(600)
        reader.join(10)
    assert code == 0, "".join(log)  # every problem ok: the run says so
    done = records(out)
    assert len(done) == 4 and len({r["id"] for r in done}) == 4  # none lost, none written twice
    assert all(r["status"] == "ok" for r in done), [r["error"] for r in done]
    routed = json.loads((out / "manifest.json").read_text())["routers"][router]["workers"]
    assert routed[workers[1]] == {"answers": False} and routed[workers[0]]["requests"] > 0
