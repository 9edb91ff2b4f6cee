"""Reliability: injected faults, run manifests and the --overwrite guard, stage by stage.

- Every fault kind of `sprint.timing.faults.FaultPlan` is produced by both test servers (the scripted
  fake server and the replay server) and classified by the client.
- Orchestration over 30 problems with 10% server errors, 5% timeouts and 10% garbage answers:
  every problem ends ok or with a classified failure, the counts are printed, nothing is lost,
  and a clean re-run redoes exactly the transient failures.
- Curation under a mix of all faults: every item gets one record with a known status.
- Each stage's manifest holds what reproducing the run needs; each stage refuses to mix outputs
  of another configuration into its folder unless --overwrite is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.fake_server import FakeServer, Reply, ScriptedServer
from tests.test_components import by_question, good_answer, load_traces, write_jsonl

from sprint.inference import run as inference
from sprint.timing import faults
from sprint.cli import main as cli_main
from sprint.curation.components import FAILURE_KINDS, separate_components
from sprint.curation.dag import create_dag
from sprint.timing.faults import FaultPlan
from sprint.llm.client import LLMClient, LLMConfig, Sampling
from sprint.llm.failures import ERROR_KINDS, LLMError
from sprint.inference.baseline import BaselineConfig, baseline
from sprint.inference.orchestration import OrchestrationConfig, orchestrate

MODEL = "test-model"
REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# Every fault kind, from both servers


def expected_kinds(fault: str) -> set[str] | None:
    """The error kinds a fault may surface as (None: it answers, with garbage)."""
    return {
        faults.SERVER_ERROR: {"server_error"},
        faults.RATE_LIMIT: {"rate_limit"},
        faults.TIMEOUT: {"timeout"},
        faults.RESET: {"connection"},
        faults.TRUNCATED: {"connection", "server_error"},  # half a body: a dropped connection or unreadable JSON
        faults.EMPTY: {"empty"},
        faults.GARBAGE: None,
    }[fault]


def call_once(base_url: str, model: str, prompt: str, stream: bool) -> tuple[str | None, str | None]:
    """(text, error kind) of one completion with no retries."""
    config = LLMConfig(base_url=base_url, model=model, timeout=0.5, max_retries=0)

    async def go() -> tuple[str | None, str | None]:
        async with LLMClient(config) as client:
            try:
                done = await client.complete(prompt, Sampling(max_tokens=50), on_text=(lambda _: None) if stream else None)
                return done.text, None
            except LLMError as exc:
                assert str(exc), "an error without a message"
                return None, exc.kind

    return asyncio.run(go())


def test_fault_names_are_all_covered() -> None:
    assert set(faults.FAULTS) == {faults.SERVER_ERROR, faults.RATE_LIMIT, faults.TIMEOUT, faults.RESET,
                                  faults.TRUNCATED, faults.EMPTY, faults.GARBAGE}
    for fault in faults.FAULTS:
        kinds = expected_kinds(fault)
        assert kinds is None or kinds <= ERROR_KINDS


def plan_for(fault: str) -> FaultPlan:
    field = {faults.SERVER_ERROR: "rate_5xx", faults.RATE_LIMIT: "rate_429"}.get(fault, f"rate_{fault}")
    return FaultPlan(**{field: 1.0}, timeout_delay=2.0, retry_after=0.01, seed=7)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("fault", faults.FAULTS)
def test_fake_server_produces_every_fault_and_the_client_classifies_it(fault: str, stream: bool,
                                                                       scripted_server: ScriptedServer) -> None:
    plan = plan_for(fault)
    srv = scripted_server(lambda body, endpoint: "a perfectly good answer", faults=plan)
    text, kind = call_once(srv.base_url, MODEL, "Say something.", stream)
    assert srv.faults_seen == [fault]
    if expected_kinds(fault) is None:
        assert text == plan.garbage(0) and kind is None
    else:
        assert text is None and kind in expected_kinds(fault)


@pytest.mark.parametrize("fault", faults.FAULTS)
def test_replay_server_produces_every_fault_and_the_client_classifies_it(fault: str, tmp_path: Path) -> None:
    from tests.test_replay import FAST, MODEL as REPLAY_MODEL, planner_prompt, sums

    from sprint.timing.replay_server import replay_server

    traj = sums()
    (tmp_path / "t.txt").write_text(traj.render() + "\n", encoding="utf-8")
    plan = plan_for(fault)
    with replay_server([tmp_path], FAST, tokenizer="words", faults=plan, model=REPLAY_MODEL) as srv:
        text, kind = call_once(srv.base_url, REPLAY_MODEL, planner_prompt(traj, 1), stream=False)
        assert srv.stats().faults == {fault: 1}
    if expected_kinds(fault) is None:
        assert text == plan.garbage(0, words=40)[: len(text)] and text and kind is None
    else:
        assert text is None and kind in expected_kinds(fault)


# ---------------------------------------------------------------------------------------------
# Orchestration over 30 problems with faults

N = 30


def problems_file(tmp_path: Path, n: int = N) -> str:
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i), "unique_id": f"test/sums/{i}.json"} for i in range(n)]
    return str(write_jsonl(tmp_path / "problems.jsonl", rows))


def solver(body: dict, endpoint: str) -> str:
    """A deterministic two-phase solver keyed on the prompt (planner, executors, forced answer)."""
    prompt = body["prompt"]
    i = int(re.search(r"<Question>\nWhat is (\d+)", prompt).group(1))
    if prompt.endswith("<Final_answer>\n"):
        return f"So \\boxed{{{2 * i}}}.\n</Final_answer>"
    m = re.search(r"<execution_(\d+\.\d+)>\n$", prompt)
    if m:
        return f"{i} + {i} = {2 * i}.\n</execution_{m.group(1)}>"
    if "<Plan_1>" not in prompt:
        return f"<Plan_1>\nTwo ways.\n<prompt_1.1> Add {i} and {i}. </prompt_1.1>\n<prompt_1.2> Double {i}. </prompt_1.2>\n</Plan_1>"
    return f"<Final_answer>\nBoth say {2 * i}: \\boxed{{{2 * i}}}.\n</Final_answer>"


def orchestration_config(url: str, tmp_path: Path, data: str, **overrides: Any) -> OrchestrationConfig:
    settings: dict[str, Any] = dict(
        planner_model=MODEL, planner_server_url=url, out_dir=str(tmp_path / "run"), data=data, prompt_mode="raw",
        planner_max_tokens=200, max_tokens=100, max_phases=4, max_problem_workers=6, max_execution_workers=8,
        timeout=0.4, max_retries=1, executor_retries=2, problem_retries=1,
    )
    settings.update(overrides)
    return OrchestrationConfig(**settings)


def read_records(folder: Path) -> list[dict]:
    data = (folder / "records.jsonl").read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.splitlines()]


@pytest.mark.slow
def test_orchestration_of_30_problems_under_faults_loses_nothing(tmp_path: Path, capsys,
                                                                 scripted_server: ScriptedServer) -> None:
    data = problems_file(tmp_path)
    plan = FaultPlan(rate_5xx=0.10, rate_timeout=0.05, rate_garbage=0.10, timeout_delay=1.0, seed=11)
    out = tmp_path / "run"

    def command(url: str) -> list[str]:
        # no HTTP retries and no problem retries, so planner faults end problems as classified
        # failures; executors get a second try
        return ["orchestrate", "--planner-model", MODEL, "--planner-url", url, "--data", data, "--out-dir", str(out),
                "--prompt-mode", "raw", "--planner-max-tokens", "200", "--max-tokens", "100", "--max-phases", "4",
                "--max-problem-workers", "6", "--max-execution-workers", "8", "--timeout", "0.4", "--max-retries", "0",
                "--executor-retries", "2", "--problem-retries", "0", "--no-progress"]

    srv = scripted_server(solver, faults=plan)
    assert cli_main(command(srv.base_url)) == 3  # finished, with failed problems (README "Exit codes")
    seen = Counter(f or "none" for f in srv.faults_seen)
    captured = capsys.readouterr()
    printed = captured.out
    assert srv.errors == []
    records = read_records(out)
    by_status = Counter(r["status"] for r in records)
    by_kind = Counter(r.get("error_kind") for r in records if r["status"] != "ok")
    with capsys.disabled():
        print(f"\n30 problems under faults: requests by fault {dict(seen)}; records by status {dict(by_status)}; "
              f"failures by kind {dict(by_kind)}; correct {sum(bool(r['correct']) for r in records)}; "
              f"the CLI printed: {printed.strip()!r}")
    assert f"{N} problems ({by_status['error']} errors)" in printed  # the counts reach the user
    assert f"{by_status['error']} problems failed (" in captured.err and "retry them with: sprint orchestrate " in captured.err
    assert seen["5xx"] > 0 and seen["timeout"] > 0 and seen["garbage"] > 0
    assert by_status["ok"] > 0 and by_status["error"] > 0  # both outcomes happen at these rates

    # nothing lost: one complete record per problem, each ok or a classified failure, and a trajectory file each
    assert sorted(r["id"] for r in records) == sorted(f"test_sums_{i}" for i in range(N))
    for r in records:
        assert r["status"] in {"ok", "error"}, r
        if r["status"] == "error":
            assert r["error_kind"] in ERROR_KINDS and r["error"] and "\n" not in r["error"], r
            assert r["retryable"] is (r["error_kind"] in {"timeout", "server_error", "rate_limit", "connection", "empty"})
        else:
            assert r["error"] is None and r["trajectory"].startswith("<Question>")
        assert (out / "trajectories" / f"{r['id']}.txt").read_text() == r["trajectory"] + "\n"
    manifest = json.loads((out / "manifest.json").read_text())
    summary = manifest["summary"]
    assert summary["problems"] == N and summary["ok"] == by_status["ok"] and summary["errors"] == N - by_status["ok"]
    assert manifest["counts"] == dict(by_status)
    failed_attempts = Counter(manifest["usage"]["planner"]["errors"]) + Counter(manifest["usage"]["executor"]["errors"])
    assert set(failed_attempts) <= {"server_error", "timeout"} and sum(failed_attempts.values()) >= by_status["error"]

    # a clean re-run redoes the transient failures only; ok records stay as they were
    ok_before = {r["id"]: r for r in records if r["status"] == "ok"}
    retry_ids = {r["id"] for r in records if r.get("retryable")}
    clean = scripted_server(solver)
    assert cli_main(command(clean.base_url)) == 0
    asked = {re.search(r"<Question>\nWhat is (\d+)", b["prompt"]).group(1) for _, b in clean.completion_requests}
    assert asked == {i.rsplit("_", 1)[1] for i in retry_ids}
    final = read_records(out)
    assert len(final) == N and len({r["id"] for r in final}) == N
    for r in final:
        if r["id"] in ok_before:
            assert r == ok_before[r["id"]]
        elif r["id"] in retry_ids:
            assert r["status"] == "ok" and r["correct"] is True
    # garbage that lands in an ok problem's final answer makes it wrong, so accuracy is read off the records
    correct = sum(bool(r["correct"]) for r in final)
    assert f"{N} problems (0 errors), accuracy {100 * correct / N:.1f}% ({correct}/{N}" in capsys.readouterr().out


@pytest.mark.slow
def test_baseline_under_faults_records_every_problem(tmp_path: Path, monkeypatch,
                                                     scripted_server: ScriptedServer) -> None:
    # a short back-off, so the HTTP retries of the faults take milliseconds, not seconds
    monkeypatch.setattr(inference, "LLMConfig", functools.partial(LLMConfig, backoff=0.01))
    data = problems_file(tmp_path, 20)
    plan = FaultPlan(rate_5xx=0.15, rate_429=0.1, rate_timeout=0.05, rate_reset=0.05, rate_empty=0.05, seed=5,
                     timeout_delay=1.0, retry_after=0.01)
    srv = scripted_server(lambda body, endpoint: "It is \\boxed{4}.", faults=plan)
    cfg = BaselineConfig(model=MODEL, server_url=srv.base_url, out_dir=str(tmp_path / "base"), data=data,
                         prompt_mode="raw", max_tokens=50, timeout=0.4, max_retries=1, max_problem_workers=5)
    summary = baseline(cfg, progress=False)
    records = read_records(Path(cfg.out_dir))
    assert sorted(r["id"] for r in records) == sorted(f"test_sums_{i}" for i in range(20))
    assert all(r["status"] == "ok" or r["error_kind"] in ERROR_KINDS for r in records)
    assert summary["problems"] == 20
    print(f"baseline under faults: {summary}")


# ---------------------------------------------------------------------------------------------
# Curation under a mix of every fault

STAGE1_STATUSES = {"ok", *FAILURE_KINDS} | {f"llm_{k}" for k in ERROR_KINDS}


def curation_rows(copies: int = 6) -> list[dict]:
    return [{**t, "id": f"{t['id']}-{i}", "question": f"{t['question']} (copy {i})"} for i in range(copies) for t in load_traces()]


@pytest.mark.slow
def test_curation_under_every_fault_gives_each_item_a_known_status(tmp_path: Path,
                                                                   scripted_server: ScriptedServer) -> None:
    rows = curation_rows()
    inp = write_jsonl(tmp_path / "traces.jsonl", rows)
    plan = FaultPlan(rate_5xx=0.07, rate_429=0.07, rate_timeout=0.05, rate_reset=0.07, rate_truncated=0.07,
                     rate_empty=0.07, rate_garbage=0.1, retry_after=0.01, timeout_delay=1.0, seed=3)
    settings = dict(model=MODEL, num_workers=6, timeout=0.4, max_retries=1, progress=False)
    srv = scripted_server(by_question(rows, good_answer), faults=plan)
    first = separate_components(str(inp), tmp_path / "c", server_url=srv.base_url, **settings)
    seen = Counter(f or "none" for f in srv.faults_seen)
    print(f"components under faults: requests by fault {dict(seen)}; records {first.counts}")
    assert srv.errors == [] and sum(first.counts.values()) == len(rows)
    assert set(first.counts) <= STAGE1_STATUSES and "crashed" not in first.counts
    assert sum(n for fault, n in seen.items() if fault != "none") > 0

    records = {r["id"]: r for r in read_records(tmp_path / "c")}
    for r in records.values():
        assert r["status"] == "ok" or (r["error"] and "\n" not in r["error"]), r
    clean = scripted_server(by_question(rows, good_answer))
    second = separate_components(str(inp), tmp_path / "c", server_url=clean.base_url, **settings)
    dag = create_dag(str(tmp_path / "c"), tmp_path / "d", server_url=clean.base_url, **settings)
    transient = {i for i, r in records.items() if r["retryable"]}
    final = {r["id"]: r for r in read_records(tmp_path / "c")}
    assert len(final) == len(rows)
    assert all(final[i]["status"] == "ok" for i in transient)
    assert all(final[i] == records[i] for i in records if i not in transient)  # kept as they were
    assert second.processed == len(transient)
    assert sum(dag.counts.values()) == second.counts.get("ok", 0)


# ---------------------------------------------------------------------------------------------
# Manifests

MANIFEST_KEYS = {"stage", "sprint_version", "git_commit", "packages", "config", "identity", "config_hash", "inputs",
                 "prompt_hashes", "counts", "usage", "started", "updated"}


def assert_manifest(folder: Path, stage: str, n: int, *, model: str | None, url: str | None, prompts: set[str]) -> dict:
    manifest = json.loads((folder / "manifest.json").read_text())
    assert MANIFEST_KEYS <= set(manifest), MANIFEST_KEYS - set(manifest)
    assert manifest["stage"] == stage
    assert manifest["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}", manifest["git_commit"])
    for package in ("sprint", "openai", "datasets", "transformers", "tokenizers", "math-verify"):
        assert package in manifest["packages"], package
    assert manifest["packages"]["sprint"] == manifest["sprint_version"]
    assert set(manifest["prompt_hashes"]) == prompts and all(re.fullmatch(r"[0-9a-f]{16}", h) for h in manifest["prompt_hashes"].values())
    assert re.fullmatch(r"[0-9a-f]{16}", str(manifest["inputs"].get("fingerprint"))), manifest["inputs"]
    assert sum(manifest["counts"].values()) == n
    text = json.dumps(manifest["config"])
    if model:
        assert model in text
    if url:
        assert url in text
    assert not re.search(r"api_?key|secret|token\"?\s*:\s*\"sk-", text, re.I)
    return manifest


@pytest.mark.slow
def test_every_stage_writes_a_full_manifest(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    rows = load_traces()
    inp = write_jsonl(tmp_path / "traces.jsonl", rows)
    paid = "gpt-4o"  # a paid model name: the manifest carries an estimated cost
    settings = dict(model=paid, num_workers=4, progress=False)

    def answer(body: dict, endpoint: str) -> str:
        if "prompt" in body:
            return solver(body, endpoint)
        return by_question(rows, good_answer if "<Line 1>" in body["messages"][-1]["content"] else (lambda r: r["scripted_dag"]))(body, endpoint)

    srv = scripted_server(answer, models=[paid, MODEL])
    url = srv.base_url
    separate_components(str(inp), tmp_path / "c", server_url=url, **settings)
    create_dag(str(tmp_path / "c"), tmp_path / "d", server_url=url, **settings)
    assert cli_main(["pack", "-i", str(tmp_path / "d"), "-o", str(tmp_path / "p"), "--parallelization-threshold", "0"]) == 0
    data = problems_file(tmp_path, 3)
    orchestrate(orchestration_config(url, tmp_path, data, out_dir=str(tmp_path / "o")), progress=False)
    baseline(BaselineConfig(model=MODEL, server_url=url, out_dir=str(tmp_path / "b"), data=data, prompt_mode="raw",
                            max_tokens=50), progress=False)

    n = len(rows)
    for folder, stage, prompt in (("c", "components", "component_separation"), ("d", "dag", "dag_creation")):
        m = assert_manifest(tmp_path / folder, stage, n, model=paid, url=url, prompts={prompt})
        assert m["config"]["model"] == paid and m["config"]["server_url"] == url
        assert m["usage"]["prompt_tokens"] > 0 and m["usage"]["completion_tokens"] > 0
        assert m["usage"]["estimated_cost_usd"] > 0
        assert m["usage"]["this_run"]["calls"] >= 1
    m = assert_manifest(tmp_path / "p", "pack", n, model=None, url=None, prompts={"agent"})
    assert m["summary"]["input"] == n
    for folder, stage in (("o", "orchestrate"), ("b", "baseline")):
        m = assert_manifest(tmp_path / folder, stage, 3, model=MODEL, url=url, prompts={"agent"})
        assert m["usage"]["completion_tokens"] > 0 and "estimated_cost_usd" not in m["usage"]  # a local model costs nothing
    print(json.dumps(json.loads((tmp_path / "c" / "manifest.json").read_text()), indent=1)[:1500])


def test_evaluate_writes_a_manifest(tmp_path: Path) -> None:
    from tests.helpers import tokenizer_dir
    from tests.test_resume_all import sprint_run

    from sprint.evaluation.evaluate import evaluate

    tokenizer = tokenizer_dir()
    sprint_run(tmp_path / "run", 5)
    evaluate(tmp_path / "run", planner_tokenizer=str(tokenizer), out_dir=tmp_path / "ev", plots=False, resamples=0)
    manifest = json.loads((tmp_path / "ev" / "manifest.json").read_text())
    assert {"sprint_version", "git_commit", "packages", "config", "inputs"} <= set(manifest)


# ---------------------------------------------------------------------------------------------
# The --overwrite guard, per stage, through the CLI


def guard_case(tmp_path: Path, url: str, stage: str) -> tuple[list[str], list[str]]:
    """(a command, the same command with another configuration) writing to the same folder."""
    rows = load_traces()
    traces = write_jsonl(tmp_path / "traces.jsonl", rows)
    out = str(tmp_path / stage)
    llm = ["--model", MODEL, "--server-url", url, "--no-progress"]
    if stage == "components":
        cmd = ["components", "-i", str(traces), "-o", out, *llm]
        return cmd, [*cmd, "--temperature", "0.5"]
    if stage == "dag":
        assert cli_main(["components", "-i", str(traces), "-o", str(tmp_path / "c"), *llm]) == 0
        cmd = ["dag", "-i", str(tmp_path / "c"), "-o", out, *llm]
        return cmd, [*cmd, "--max-tokens", "1000"]
    if stage == "pack":
        (tmp_path / "d").mkdir()
        example = json.loads((REPO / "tests" / "data" / "packing_example.json").read_text())
        write_jsonl(tmp_path / "d" / "records.jsonl", [example])
        cmd = ["pack", "-i", str(tmp_path / "d"), "-o", out]
        return cmd, [*cmd, "--max-phases", "5"]
    data = problems_file(tmp_path, 2)
    if stage == "orchestrate":
        cmd = ["orchestrate", "--planner-model", MODEL, "--planner-url", url, "--data", data, "--out-dir", out,
               "--prompt-mode", "raw", "--no-progress"]
        return cmd, [*cmd, "--planner-temp", "0.9"]
    cmd = ["baseline", "--model", MODEL, "--server-url", url, "--data", data, "--out-dir", out, "--prompt-mode", "raw",
           "--no-progress", "--max-tokens", "50"]
    return cmd, [*cmd, "--seed", "5"]


@pytest.mark.parametrize("stage", ["components", "dag", "pack", "orchestrate", "baseline"])
def test_stage_refuses_another_configuration_without_overwrite(tmp_path: Path, stage: str, capsys,
                                                               scripted_server: ScriptedServer) -> None:
    rows = load_traces()

    def answer(body: dict, endpoint: str) -> str:
        if "prompt" in body:
            return solver(body, endpoint) if "What is" in body["prompt"] else "\\boxed{1}"
        content = body["messages"][-1]["content"]
        return by_question(rows, good_answer if "<Line 1>" in content else (lambda r: r["scripted_dag"]))(body, endpoint)

    srv = scripted_server(answer)
    first, other = guard_case(tmp_path, srv.base_url, stage)
    assert cli_main(first) == 0
    records = (tmp_path / stage / "records.jsonl").read_bytes()
    capsys.readouterr()
    assert cli_main(other) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "--overwrite" in err and "different configuration" in err
    assert (tmp_path / stage / "records.jsonl").read_bytes() == records  # untouched
    assert cli_main(first) == 0  # the same configuration resumes
    assert cli_main([*other, "--overwrite"]) == 0
    manifest = json.loads((tmp_path / stage / "manifest.json").read_text())
    changed = {"components": ("temperature", 0.5), "dag": ("max_tokens", 1000), "pack": ("max_phases", 5),
               "orchestrate": ("planner_temperature", 0.9), "baseline": ("seed", 5)}[stage]
    assert manifest["config"][changed[0]] == changed[1]
    lines = (tmp_path / stage / "records.jsonl").read_text().splitlines()
    assert len(lines) == len(records.splitlines()) == sum(manifest["counts"].values())  # replaced, not mixed


def test_a_folder_of_another_stage_is_refused(tmp_path: Path, capsys, scripted_server: ScriptedServer) -> None:
    rows = load_traces()
    traces = write_jsonl(tmp_path / "traces.jsonl", rows)
    srv = scripted_server(by_question(rows, good_answer))
    llm = ["--model", MODEL, "--server-url", srv.base_url, "--no-progress"]
    assert cli_main(["components", "-i", str(traces), "-o", str(tmp_path / "c"), *llm]) == 0
    capsys.readouterr()
    assert cli_main(["dag", "-i", str(tmp_path / "c"), "-o", str(tmp_path / "c"), *llm]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "'components' run" in err and "--overwrite" in err


# ---------------------------------------------------------------------------------------------
# The circuit breaker: a server that stops answering ends the run in seconds (exit 4), the rerun
# completes everything


def test_the_breaker_trips_after_n_connection_failures_in_a_row_and_an_answer_resets_it(
    scripted_server: ScriptedServer
) -> None:
    import openai

    from sprint.core.items import RUN_STOP, RunStop

    async def main() -> tuple[str | None, list[bool]]:
        client = LLMClient(LLMConfig(base_url="http://127.0.0.1:9/v1", model=MODEL, max_retries=0,
                                     max_connection_failures=3))
        stop = RunStop()
        RUN_STOP.set(stop)
        refused = []
        for _ in range(4):
            with pytest.raises(LLMError) as info:
                await client.complete("x", Sampling(max_tokens=4))
            assert info.value.kind == "connection"
            refused.append(info.value.stopped)
        await client.aclose()
        return stop.reason, refused

    reason, refused = asyncio.run(main())
    assert refused == [False, False, False, True]  # the 4th call is refused without an attempt
    assert reason == "server at http://127.0.0.1:9/v1 stopped answering after 3 connection failures in a row"
    srv = scripted_server(lambda body, endpoint: "ok")  # an answer in between resets the count
    client = LLMClient(LLMConfig(base_url=srv.base_url, model=MODEL, max_retries=0, max_connection_failures=2))
    failures = iter([True, False, True, False, True])

    async def flaky(*args: Any, **kw: Any) -> Any:
        if next(failures):
            # a stand-in request: the error reads only its headers (openai 1.x to 3.x)
            raise openai.APIConnectionError(request=SimpleNamespace(headers={}))  # type: ignore[arg-type]
        return await real(*args, **kw)

    real = client._attempt
    client._attempt = flaky  # type: ignore[method-assign]

    async def calls() -> list[str | None]:
        kinds = []
        for _ in range(5):
            try:
                await client.complete("x", Sampling(max_tokens=4))
                kinds.append(None)
            except LLMError as exc:
                kinds.append(exc.kind)
        await client.aclose()
        return kinds

    assert asyncio.run(calls()) == ["connection", None, "connection", None, "connection"]
    assert client.stopped is None


def test_components_against_a_server_that_dies_stop_in_seconds_and_the_rerun_completes(
    tmp_path: Path, capsys, scripted_server: ScriptedServer
) -> None:
    import time

    rows = curation_rows(4)
    inp = write_jsonl(tmp_path / "traces.jsonl", rows)
    out = tmp_path / "c"
    answered = 0

    srv = FakeServer()

    def handler(body: dict, endpoint: str) -> Any:
        nonlocal answered
        answered += 1
        if answered >= 4:  # the server goes away after three answers: connections drop, then are refused
            if answered == 4:
                import threading
                threading.Thread(target=srv.stop, daemon=True).start()
            return Reply(reset=True)
        return by_question(rows, good_answer)(body, endpoint)

    srv.handler = handler
    with srv:
        cmd = ["components", "-i", str(inp), "-o", str(out), "--model", MODEL, "--server-url", srv.base_url,
               "--num-workers", "2", "--no-progress", "--no-cache", "--max-connection-failures", "6"]
        started = time.monotonic()
        assert cli_main(cmd) == 4
        elapsed = time.monotonic() - started
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and re.fullmatch(
        rf"error: server at {re.escape(srv.base_url)} stopped answering after 6 connection failures in a row, "
        r"\d+ items not done; rerun the same command to continue", err[0]), err
    assert elapsed < 15, f"the run took {elapsed:.1f}s to notice the dead server"
    records = read_records(out)
    assert len({r["id"] for r in records}) == len(records) < len(rows)
    assert all(r["status"] == "ok" or (r["status"] == "llm_connection" and r["retryable"]) for r in records)
    back = scripted_server(by_question(rows, good_answer))
    assert cli_main([a if a != srv.base_url else back.base_url for a in cmd]) == 0
    final = read_records(out)
    assert sorted(r["id"] for r in final) == sorted(r["id"] for r in rows) and all(r["status"] == "ok" for r in final)
    print(f"components noticed the dead server in {elapsed:.1f}s")


def replay_recordings(folder: Path, n: int) -> str:
    """`n` recorded SPRINT trajectories (two parallel executions each) for the replay server, and their dataset."""
    from sprint.format.trajectory import Execution, Phase, Trajectory, render_prompt

    folder.mkdir()
    rows = []
    for i in range(n):
        plan = "\n".join(["Two ways.", render_prompt("1.1", f"Add {i} and {i}."), render_prompt("1.2", f"Double {i}.")])
        traj = Trajectory(f"What is {i} + {i}?", [Phase(1, plan, [Execution("1.1", f"{i} + {i} = {2 * i}."),
                                                                Execution("1.2", f"2 * {i} = {2 * i}.")])],
                          f"Both say \\boxed{{{2 * i}}}.")
        (folder / f"planner_trajectory_{i}.txt").write_text(traj.render() + "\n", encoding="utf-8")
        rows.append({"problem": traj.question, "answer": str(2 * i), "unique_id": f"r{i}"})
    return str(write_jsonl(folder.parent / "replay_data.jsonl", rows))


@pytest.mark.slow
def test_a_replay_server_killed_mid_run_ends_the_run_in_seconds_and_the_same_command_completes_it(tmp_path: Path) -> None:
    """The case: the server dies 1/4 into a 30-problem run. Before: every remaining problem was
    retried for a minute of warnings, then exit 0. Now: exit 4 within seconds with one line, each
    problem recorded at most once (failed ones retryable, attempts as made), and the same command,
    once the server is back, finishes the run."""
    import signal
    import subprocess
    import sys
    import time

    from tests.test_resume_all import cli_env, complete_lines

    from sprint.timing.replay_server import DEFAULT_MODEL
    from sprint.llm.serve import free_port

    n = 30
    data = replay_recordings(tmp_path / "recorded", n)
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    server_cmd = [sys.executable, "-m", "sprint", "replay-server", str(tmp_path / "recorded"), "--port", str(port),
                  "--tokenizer", "words", "--ms-per-token", "40", "--ttft-base", "0.05"]
    out = tmp_path / "run"
    command = [sys.executable, "-m", "sprint", "orchestrate", "--planner-model", DEFAULT_MODEL, "--planner-url", url,
               "--data", data, "--out-dir", str(out), "--prompt-mode", "raw", "--max-problem-workers", "4",
               "--no-progress"]

    def start_server(log: Path) -> subprocess.Popen:
        proc = subprocess.Popen(server_cmd, cwd=REPO, env=cli_env(), stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + 60
        while "replay server at" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        return proc

    server = start_server(tmp_path / "server1.log")
    try:
        run = subprocess.Popen(command, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
        deadline = time.monotonic() + 120
        while len(complete_lines(out / "records.jsonl")) < n // 4:
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.02)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        killed = time.monotonic()
        stdout, stderr = run.communicate(timeout=120)
        took = time.monotonic() - killed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
    assert run.returncode == 4, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert re.fullmatch(rf"error: server at {re.escape(url)} stopped answering after 10 connection failures in a "
                        r"row, \d+ problems not done; rerun the same command to continue", errors[0]), errors
    assert took < 20, f"the run went on for {took:.1f}s after the server died"
    records = read_records(out)
    assert len({r["id"] for r in records}) == len(records) < n
    failed = [r for r in records if r["status"] != "ok"]
    for r in failed:
        assert r["retryable"] and r["error_kind"] == "connection", r
        # attempts as made: the breaker trips before any call has used up its retries, and a problem is
        # not re-run once it has (that re-run would fail at once and count as a second attempt)
        assert r["attempts"] == 1 and {c["run"] for c in r["calls"]} == {1}, r
    print(f"server killed after {n - len(failed) - (n - len(records))} ok records: the run ended {took:.1f}s later "
          f"with {len(failed)} retryable failures and {n - len(records)} problems not started")

    server = start_server(tmp_path / "server2.log")  # the server is back on the same address
    try:
        again = subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert again.returncode == 0, again.stderr[-3000:]
    final = read_records(out)
    assert sorted(r["id"] for r in final) == sorted(f"r{i}" for i in range(n))
    assert all(r["status"] == "ok" and r["correct"] for r in final)
