"""Several replicas per role on scripted servers: consistent hashing, failover and return, the
affinity header, vLLM's `priority` from orchestration, the replay server's priority queue, and the
prefix executor requests share with the planner's."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

import openai
import pytest
from tests.fake_server import FakeServer, Reply, ScriptedServer, prompt_words
from tests.test_replay import executor_prompt, sums, traj_dir  # noqa: F401  (traj_dir: a fixture)

from sprint.core.errors import UserError
from sprint.latency.model import LatencyModel
from sprint.core.items import RUN_STOP, RunStop
from sprint.llm.client import LLMConfig, Sampling
from sprint.llm.failures import LLMError
from sprint.inference.orchestration import OrchestrationConfig, call_priority, orchestrate
from sprint.timing.slots import PrioritySlots
from sprint.timing.replay_server import replay_server
from sprint.llm.replicas import HashRing, ReplicaPool, session_id, split_urls

MODEL = "test-model"
KEYS = [f"test/algebra/{i}.json" for i in range(1000)]
SAMPLING = Sampling(max_tokens=8)


def test_split_urls() -> None:
    assert split_urls(" http://a:1/v1/ , http://b:2/v1,,http://a:1/v1") == ["http://a:1/v1", "http://b:2/v1"]
    with pytest.raises(UserError, match="comma-separated"):
        split_urls(" , ")


def test_ring_is_stable_and_balanced() -> None:
    urls = [f"http://10.0.0.{i}:8000/v1" for i in range(1, 4)]
    ring, again, shuffled = HashRing(urls), HashRing(urls), HashRing(urls[::-1])
    owners = [ring.owner(k) for k in KEYS]
    assert owners == [again.owner(k) for k in KEYS] == [shuffled.owner(k) for k in KEYS]  # order of the list is moot
    for url in urls:
        assert 0.25 < owners.count(url) / len(KEYS) < 0.42
    order = ring.order(KEYS[0])
    assert sorted(order) == [0, 1, 2] and urls[order[0]] == owners[0]


def test_adding_a_replica_moves_few_problems_and_only_to_it() -> None:
    urls = [f"http://10.0.0.{i}:8000/v1" for i in range(1, 4)]
    before = HashRing(urls)
    after = HashRing(urls + ["http://10.0.0.9:8000/v1"])
    moved = [k for k in KEYS if before.owner(k) != after.owner(k)]
    assert 0.15 < len(moved) / len(KEYS) < 0.35  # ~1/4; a modulo hash would move ~3/4
    assert {after.owner(k) for k in moved} == {"http://10.0.0.9:8000/v1"}


def test_session_id_is_a_plain_header_value() -> None:
    assert session_id("test/algebra/1.json") == "test/algebra/1.json"
    odd = session_id("line\nbreak é")
    assert len(odd) == 32 and odd.isalnum()


def _server_of(servers: list[FakeServer], n_before: list[int]) -> list[int]:
    return [len(s.completion_requests) - n for s, n in zip(servers, n_before)]


def test_pool_keeps_each_key_on_its_owner_with_the_affinity_header(scripted_server: ScriptedServer) -> None:
    a = scripted_server(lambda r, e: "ok")
    b = scripted_server(lambda r, e: "ok")
    servers = {a.base_url: a, b.base_url: b}
    pool = ReplicaPool(LLMConfig(a.base_url, MODEL, max_retries=0), f"{a.base_url},{b.base_url}")
    keys = KEYS[:12]

    async def go() -> list[str | None]:
        async with pool:
            await pool.check()
            return [(await pool.complete("2+2=", SAMPLING, key=k)).server for k in keys for _ in range(3)]

    answered = asyncio.run(go())
    for i, key in enumerate(keys):
        assert set(answered[3 * i:3 * i + 3]) == {pool.ring.owner(key)}
    assert set(answered) == set(servers)  # both used
    for srv in servers.values():
        seen = [h["x-session-id"] for h, (e, _) in zip(srv.headers, srv.requests) if e != "models"]
        assert seen and all(pool.ring.owner(k) == srv.base_url for k in seen)
    assert pool.usage.calls == 36 and pool.stats()["failovers"] == 0


def test_affinity_header_name_is_configurable_and_can_be_off(scripted_server: ScriptedServer) -> None:
    srv = scripted_server(lambda r, e: "ok")
    async def go(header: str | None) -> None:
        async with ReplicaPool(LLMConfig(srv.base_url, MODEL), affinity_header=header) as pool:
            await pool.complete("x", SAMPLING, key="p-7")
    asyncio.run(go("X-Route-Key"))
    asyncio.run(go(None))
    assert srv.headers[0]["x-route-key"] == "p-7" and "x-session-id" not in srv.headers[0]
    assert "x-route-key" not in srv.headers[1] and "x-session-id" not in srv.headers[1]


def test_failed_replica_moves_its_problems_whole_and_gets_them_back() -> None:
    a, b = FakeServer(lambda r, e: "from a").start(), FakeServer(lambda r, e: "from b").start()
    b_port, b_url = b.port, b.base_url
    try:
        pool = ReplicaPool(LLMConfig(a.base_url, MODEL, max_retries=1, backoff=0.01),
                           [a.base_url, b_url], probe_interval=0.2)
        b_keys = [k for k in KEYS[:40] if pool.ring.owner(k) == b_url][:5]
        a_keys = [k for k in KEYS[:40] if pool.ring.owner(k) == a.base_url][:5]

        async def call(key: str) -> str:
            return (await pool.complete("q", SAMPLING, key=key)).text

        async def scenario() -> dict:
            nonlocal b
            await pool.check()
            assert {await call(k) for k in b_keys} == {"from b"}
            b.stop()  # B goes away: its problems move to A, every call still answered
            moved = [await call(k) for k in b_keys for _ in range(2)]
            kept = [await call(k) for k in a_keys]
            out = {"moved": moved, "kept": kept, "out": pool.stats()["replicas"][b_url]["in"]}
            b = FakeServer(lambda r, e: "from b again", port=b_port).start()  # B answers again
            await asyncio.sleep(0.3)
            await call(b_keys[0])  # a call on a moved key notices B is due for a health check
            for _ in range(50):
                if pool.route(b_keys[0]) == b_url:
                    break
                await asyncio.sleep(0.05)
            out["back"] = [await call(k) for k in b_keys]
            await pool.aclose()
            return out

        out = asyncio.run(scenario())
        assert out["moved"] == ["from a"] * 10 and out["kept"] == ["from a"] * 5
        assert out["out"] is False
        assert out["back"] == ["from b again"] * 5
        stats = pool.stats()
        assert stats["failovers"] >= 1 and stats["replicas"][b_url]["taken_out"] == 1
        assert stats["replicas"][b_url]["in"] is True
    finally:
        a.stop()
        b.stop()


def test_no_replica_answering_stops_the_run() -> None:
    with FakeServer(lambda r, e: "ok") as a, FakeServer(lambda r, e: "ok") as b:
        urls = [a.base_url, b.base_url]
        pool = ReplicaPool(LLMConfig(a.base_url, MODEL, max_retries=0), urls, probe_interval=0.05)

        async def go() -> tuple[RunStop, LLMError]:
            stop = RunStop()
            RUN_STOP.set(stop)
            await pool.check()
            a.stop()
            b.stop()
            with pytest.raises(LLMError) as err:
                await pool.complete("q", SAMPLING, key="k")
            await pool.aclose()
            return stop, err.value

        stop, error = asyncio.run(go())
        assert error.kind == "connection" and error.stopped
        assert stop.reason and "no replica answers" in stop.reason

    async def breaker_off() -> tuple[RunStop, LLMError]:
        stop = RunStop()
        RUN_STOP.set(stop)
        pool = ReplicaPool(LLMConfig(urls[0], MODEL, max_retries=0, max_connection_failures=0), urls)
        with pytest.raises(LLMError) as err:
            await pool.complete("q", SAMPLING, key="k")
        await pool.aclose()
        return stop, err.value

    stop, error = asyncio.run(breaker_off())  # max_connection_failures 0: a failure, but the run goes on
    assert error.kind == "connection" and not error.stopped and stop.reason is None


def test_start_with_one_replica_down_and_none_up(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    from tests.fake_server import dead_url
    a = scripted_server(lambda r, e: "ok")
    dead = dead_url()
    pool = ReplicaPool(LLMConfig(a.base_url, MODEL), [dead, a.base_url])

    async def go() -> list[str | None]:
        async with pool:
            await pool.check()
            return [(await pool.complete("q", SAMPLING, key=k)).server for k in KEYS[:10]]

    assert set(asyncio.run(go())) == {a.base_url}
    assert pool.stats()["replicas"][dead]["in"] is False and pool.failovers == 0

    async def none_up() -> None:
        async with ReplicaPool(LLMConfig(dead, MODEL), [dead, dead_url()]) as pool:
            await pool.check()

    with pytest.raises(UserError, match="no server answers"):
        asyncio.run(none_up())


# --- orchestration over replicas ----------------------------------------------------------------

PLAN = ("<Plan_1>\nSplit.\n<prompt_1.1> first part </prompt_1.1>\n<prompt_1.2> second part </prompt_1.2>\n"
        "</Plan_1>")


def planner_or_executor(request: dict, endpoint: str) -> str:
    prompt = request["prompt"]
    if prompt.endswith("<Final_answer>\n"):
        return "\\boxed{3}"
    if re.search(r"<execution_\d+\.\d+>\n$", prompt):
        return "part done"
    return PLAN


def _data(tmp_path: Path, n: int, ids: list[int] | None = None) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in (ids if ids is not None else range(n))))
    return path


def _both(ring: HashRing) -> list[int]:
    """Eight problem ids, four owned by each of the ring's two replicas: the servers' ports are the OS's, so
    which replica owns `q3` varies from run to run, and eight ids taken blindly all land on one now and then."""
    ids = [[i for i in range(200) if ring.owner(f"q{i}") == url][:4] for url in ring.nodes]
    assert all(len(mine) == 4 for mine in ids)
    return sorted(ids[0] + ids[1])


def _config(tmp_path: Path, urls: str, **kw) -> OrchestrationConfig:
    base = dict(data=kw.pop("data", None) or str(_data(tmp_path, 8)), task="math", out_dir=str(tmp_path / "run"), prompt_mode="raw",
                planner_model=MODEL, planner_server_url=urls, max_tokens=16, max_phases=2, max_problem_workers=3,
                max_execution_workers=4, max_retries=1, use_cache=False, seed=0)
    base.update(kw)
    return OrchestrationConfig(**base)


def _completions(srv: FakeServer) -> list[tuple[dict, dict]]:
    return [(body, h) for (e, body), h in zip(srv.requests, srv.headers) if e != "models"]


def test_orchestration_each_problem_on_one_replica_with_priority(tmp_path: Path,
                                                                 scripted_server: ScriptedServer) -> None:
    a = scripted_server(planner_or_executor)
    b = scripted_server(planner_or_executor)
    ring = HashRing([a.base_url, b.base_url])
    cfg = _config(tmp_path, f"{a.base_url},{b.base_url}", priority=True, data=str(_data(tmp_path, 8, _both(ring))))
    summary = orchestrate(cfg, progress=False)
    assert summary["ok"] == 8
    ranks: dict[str, set[int]] = {}
    for srv in (a, b):
        for body, headers in _completions(srv):
            problem = headers["x-session-id"]
            assert ring.owner(problem) == srv.base_url  # every call of a problem on its owner
            ranks.setdefault(problem, set()).add(body["priority"])
    assert len(ranks) == 8 and all(len(_completions(s)) for s in (a, b))
    # planner 0, executors 1 + r, one rank r per problem, ranks 0..7 in start order
    for values in ranks.values():
        assert len(values) == 2 and call_priority(0, "planner") in values
    assert sorted(max(v) for v in ranks.values()) == [call_priority(r, "executor") for r in range(8)]
    records = [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    for record in records:
        assert {c["server"] for c in record["calls"]} == {ring.owner(record["id"])}
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["prefix_cache"] == {}  # the scripted server reports no cached_tokens
    assert manifest["usage"]["planner"]["routing"]["failovers"] == 0


def test_no_priority_field_without_the_flag(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    srv = scripted_server(planner_or_executor)
    orchestrate(_config(tmp_path, srv.base_url), progress=False)
    assert all("priority" not in body for body, _ in _completions(srv))
    assert all(h["x-session-id"].startswith("q") for _, h in _completions(srv))


def test_orchestration_survives_a_replica_dying_mid_run(tmp_path: Path) -> None:
    lock = threading.Lock()
    calls = {"n": 0}
    with FakeServer(planner_or_executor) as a:
        b = FakeServer(planner_or_executor).start()

        ring = HashRing([a.base_url, b.base_url])
        on_b = [i for i in range(200) if ring.owner(f"q{i}") == b.base_url][:4]
        on_a = [i for i in range(200) if ring.owner(f"q{i}") == a.base_url][:4]
        ids = [i for pair in zip(on_b, on_a) for i in pair]  # B's problems first, then alternating

        def dying(request: dict, endpoint: str) -> str | Reply:
            """B answers its first call (the first problem's planner), then dies: the second call's
            connection is cut and B stops listening, so every later call fails to connect."""
            with lock:
                calls["n"] += 1
                n = calls["n"]
            if n == 1:
                return planner_or_executor(request, endpoint)
            if n == 2:
                threading.Thread(target=b.stop).start()
            return Reply(reset=True)

        b.handler = dying
        try:
            cfg = _config(tmp_path, f"{a.base_url},{b.base_url}", max_problem_workers=2,
                          data=str(_data(tmp_path, 8, ids)))
            summary = orchestrate(cfg, progress=False)
        finally:
            b.stop()
        records = [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
        assert summary["ok"] == 8 and len(records) == 8 and len({r["id"] for r in records}) == 8
        servers = {r["id"]: {c["server"] for c in r["calls"]} for r in records}
        touched = [i for i in on_b if b.base_url in servers[f"q{i}"]]
        assert len(touched) == 1  # the problem whose planner B answered (the first of B's, in practice)
        assert servers[f"q{touched[0]}"] == {a.base_url, b.base_url}  # the rest of its calls moved to A
        assert all(servers[f"q{i}"] == {a.base_url} for i in on_b + on_a if i not in touched)


def test_executor_requests_share_the_planner_prefix(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    """Barrier: siblings are identical up to <execution_1.k>, and the planner's prompt is a prefix of theirs."""
    srv = scripted_server(planner_or_executor)
    orchestrate(_config(tmp_path, srv.base_url, max_execution_workers=1), progress=False)
    prompts = [body["prompt"] for body, h in _completions(srv) if h["x-session-id"] == "q0"]
    planner_prompt, first, second = prompts[0], prompts[1], prompts[2]
    head = first[: first.rindex("<execution_1.1>")]
    assert second[: second.rindex("<execution_1.2>")] == head
    assert first.startswith(planner_prompt) and second.startswith(planner_prompt)
    assert head.startswith(planner_prompt + "<Plan_1>")


# --- the replay server's priority queue -----------------------------------------------------------

def test_priority_slots_admit_lowest_value_first_then_arrival() -> None:
    async def go() -> list[str]:
        slots = PrioritySlots(1)
        order: list[str] = []
        await slots.acquire()  # hold the only slot

        async def wait(name: str, priority: int) -> None:
            async with slots.slot(priority):
                order.append(name)
                await asyncio.sleep(0.01)

        tasks = []
        for name, priority in [("low", 9), ("mid", 4), ("first-high", 1), ("second-high", 1)]:
            tasks.append(asyncio.ensure_future(wait(name, priority)))
            await asyncio.sleep(0.001)
        cancelled = asyncio.ensure_future(wait("gone", 0))
        await asyncio.sleep(0.001)
        cancelled.cancel()  # a client that left while queued holds nothing
        slots.release()
        await asyncio.gather(*tasks)
        assert slots.free == 1
        return order

    assert asyncio.run(go()) == ["first-high", "second-high", "mid", "low"]


def test_call_priority_planners_first_then_oldest_problems() -> None:
    assert call_priority(7, "planner") == call_priority(0, "planner") < call_priority(0, "executor")
    assert call_priority(0, "executor") < call_priority(1, "executor") < call_priority(9, "executor")


# --- cached_tokens: from the server's usage to the records, the manifest and the report ------------

def _with_cached_tokens(request: dict, endpoint: str) -> Reply:
    """vLLM's completion body with usage.prompt_tokens_details (as --enable-prompt-tokens-details sends)."""
    text = planner_or_executor(request, endpoint).replace("\n</Plan_1>", "")  # vLLM stops before the stop string
    prompt = prompt_words(request, endpoint)
    usage = {"prompt_tokens": prompt, "completion_tokens": len(text.split()), "total_tokens": prompt + len(text.split()),
             "prompt_tokens_details": {"cached_tokens": prompt // 4 if "<execution_" not in text else prompt // 2}}
    return Reply(body={"id": "x", "object": "text_completion", "created": 0, "model": MODEL, "usage": usage,
                       "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]})


def test_cached_tokens_reach_records_manifest_and_report(tmp_path: Path, shared_data: Path,
                                                         scripted_server: ScriptedServer) -> None:
    from sprint.evaluation.evaluate import evaluate

    tok = shared_data / "tokenizers" / "deepseek-r1-distill-qwen-7b"
    srv = scripted_server(_with_cached_tokens)
    orchestrate(_config(tmp_path, srv.base_url), progress=False)
    records = [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    calls = [c for r in records for c in r["calls"]]
    assert calls and all(c["cached_tokens"] == c["prompt_tokens"] // 4 for c in calls if c["role"] == "planner")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    for role in ("planner", "executor"):
        mine = [c for c in calls if c["role"] == role]
        expect = sum(c["cached_tokens"] for c in mine) / sum(c["prompt_tokens"] for c in mine)
        assert manifest["prefix_cache"][role]["hit_ratio"] == round(expect, 4)
        assert manifest["prefix_cache"][role]["calls"] == len(mine)
    ev = evaluate(tmp_path / "run", planner_tokenizer=str(tok), out_dir=tmp_path / "eval", resamples=0, workers=1,
                  plots=False)
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "## Prefix cache" in report
    ratio = manifest["prefix_cache"]["executor"]["hit_ratio"]
    assert f"| executor | {manifest['prefix_cache']['executor']['calls']} |" in report and f"{ratio:.1%}" in report
    assert ev.metrics["runs"][0]["prefix_cache"] == manifest["prefix_cache"]


def test_replay_server_queue_honours_priority(traj_dir: Path) -> None:  # noqa: F811  (the fixture)
    t = sums()
    prompt = executor_prompt(t, 1, "1.1")
    slow = LatencyModel.simple(ttft_base_s=0.0, ttft_per_prompt_token_s=0.0, s_per_token=0.02, batch_slowdown=0.0,
                        capacity=1)

    async def go(url: str) -> None:
        client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=30)

        def ask(priority: int | None) -> asyncio.Future:
            extra = {"priority": priority} if priority is not None else None
            return asyncio.ensure_future(client.completions.create(
                model="sprint-replay", prompt=prompt, stop=["</execution_1.1>"], max_tokens=100, extra_body=extra))

        first = ask(None)  # takes the only slot
        await asyncio.sleep(0.05)
        late = [ask(5), ask(1)]
        await asyncio.sleep(0.02)
        late.append(ask(1))
        await asyncio.gather(first, *late)
        with pytest.raises(openai.BadRequestError, match="priority must be an integer"):
            await client.completions.create(model="sprint-replay", prompt=prompt, max_tokens=5,
                                            extra_body={"priority": "high"})
        await client.close()

    with replay_server([traj_dir], slow, tokenizer="words") as srv:
        asyncio.run(go(srv.base_url))
        calls = sorted(srv.stats().calls, key=lambda c: c.admitted)
    assert [c.priority for c in calls] == [0, 1, 1, 5]  # the later priority-1 request still passed the 5
    assert calls[1].arrival < calls[2].arrival  # equal priorities: first come, first served


def test_baseline_keeps_each_problem_on_its_replica(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    from sprint.inference.baseline import BaselineConfig, baseline

    a = scripted_server(lambda r, e: "so \\boxed{2}")
    b = scripted_server(lambda r, e: "so \\boxed{2}")
    ring = HashRing([a.base_url, b.base_url])
    cfg = BaselineConfig(model=MODEL, server_url=f"{a.base_url},{b.base_url}", data=str(_data(tmp_path, 8, _both(ring))),
                         out_dir=str(tmp_path / "base"), prompt_mode="raw", max_tokens=16, use_cache=False)
    assert baseline(cfg, progress=False)["ok"] == 8
    for srv in (a, b):
        assert all(ring.owner(h["x-session-id"]) == srv.base_url for _, h in _completions(srv))
    records = [json.loads(x) for x in (tmp_path / "base" / "records.jsonl").read_text().splitlines()]
    assert {r["calls"][0]["server"] for r in records} == {a.base_url, b.base_url}
    assert all(r["calls"][0]["server"] == ring.owner(r["id"]) for r in records)
