"""Orchestration and baseline against the scripted fake server: exact requests, normalisation,
retries, failures, the forced final phase, concurrency, resumption, the CLI and the shell scripts."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sprint.core.errors import UserError
from sprint import cli
from sprint.inference.baseline import BaselineConfig, baseline
from sprint.inference.orchestration import OrchestrationConfig, orchestrate
from sprint.format.prompt_format import PromptFormat, build_prompt_format
from sprint.evaluation.runs import RawProblem
from sprint.evaluation.table2 import latency_seconds, problem_seconds
from sprint.format.trajectory import parse
from tests.fake_server import FakeServer, Reply, ScriptedServer, dead_url

REPO_ROOT = Path(__file__).resolve().parents[1]
AGENT = "Solve it in phases."
HEAD = "Solve it in phases.\n\n<Question>\nWhat is 2+3?\n</Question>\n\n<think>\n"


# ---- helpers ------------------------------------------------------------------------------------


def _data(tmp_path: Path, questions: list[str], answers: list[str] | None = None) -> str:
    answers = answers or ["5"] * len(questions)
    path = tmp_path / "data.jsonl"
    rows = [{"problem": q, "answer": a, "unique_id": f"test/demo/{i}.json"} for i, (q, a) in enumerate(zip(questions, answers))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _agent_file(tmp_path: Path) -> str:
    path = tmp_path / "agent.txt"
    path.write_text(AGENT + "\n")
    return str(path)


def _one_phase_answer(prompt: str, prompts: int) -> str:
    """A scripted model: a plan of `prompts` prompts, "ok" for each executor, then the final answer."""
    if _is_executor(prompt):
        return "ok"
    if "<Plan_1>" in prompt:
        return "<Final_answer>\n\\boxed{5}\n</Final_answer>"
    listed = " ".join(f"<prompt_1.{k}> {'abc'[k - 1]} </prompt_1.{k}>" for k in range(1, prompts + 1))
    return f"<Plan_1>\n{listed}\n</Plan_1>"


def _config(srv: FakeServer, tmp_path: Path, data: str, **overrides: object) -> OrchestrationConfig:
    settings: dict = dict(
        planner_model="test-model",
        planner_server_url=srv.base_url,
        out_dir=str(tmp_path / "run"),
        data=data,
        prompt_mode="raw",
        agent_prompt=_agent_file(tmp_path),
        planner_max_tokens=200,
        max_tokens=100,
        max_retries=0,
        timeout=20.0,
    )
    settings.update(overrides)
    return OrchestrationConfig(**settings)  # type: ignore[arg-type]


def _records(out_dir: str | Path) -> list[dict]:
    return [json.loads(line) for line in (Path(out_dir) / "records.jsonl").read_text().splitlines()]


def _prompts(srv: FakeServer) -> list[str]:
    return [body["prompt"] for endpoint, body in srv.completion_requests]


def _is_executor(prompt: str) -> re.Match | None:
    return re.search(r"<execution_(\d+\.\d+)>\n$", prompt)


# ---- the exact requests of a two-phase problem --------------------------------------------------

PLAN_1 = (
    "Add them.\n<prompt_1.1> Compute 2+3. </prompt_1.1>\nAlso check.\n<prompt_1.2> Check by counting. </prompt_1.2>"
)
# What the model would write; the server cuts it at the first stop string (`</Plan_`).
PLAN_1_RAW = "<Plan_1>\n" + PLAN_1 + "\n</Plan_1>\n\n<Execution_1>\nI should not be here"
PLAN_2_RAW = "<Plan_2>\nBased on execution_1.1, execution_1.2:\nBoth agree.\n</Plan_2>\n\n<Execution_2>"
FINAL_RAW = "<Final_answer>\nThe answer is \\boxed{5}.\n</Final_answer>\nextra"

# Worked out by hand from the format in DESIGN.md.
PLANNER_1 = HEAD
EXECUTOR_1_HEAD = HEAD + "<Plan_1>\n" + PLAN_1 + "\n</Plan_1>\n\n<Execution_1>\n"
EXECUTOR_11 = EXECUTOR_1_HEAD + "<execution_1.1>\n"
EXECUTOR_12 = EXECUTOR_1_HEAD + "<execution_1.2>\n"
PHASE_1 = (
    "<Plan_1>\n" + PLAN_1 + "\n</Plan_1>\n\n"
    "<Execution_1>\n<execution_1.1>\n2+3 = 5.\n</execution_1.1>\n\n"
    "<execution_1.2>\nCounting gives 5.\n</execution_1.2>\n</Execution_1>"
)
PLANNER_2 = HEAD + PHASE_1 + "\n\n"
PHASE_2 = (
    "<Plan_2>\nBased on execution_1.1, execution_1.2:\nBoth agree.\n</Plan_2>\n\n"
    "<Execution_2>\nNo prompt to execute.\n</Execution_2>"
)
PLANNER_3 = HEAD + PHASE_1 + "\n\n" + PHASE_2 + "\n\n"

SCRIPT = {
    PLANNER_1: PLAN_1_RAW,
    EXECUTOR_11: "2+3 = 5.\n</execution_1.1>\n\n<execution_1.2>",
    EXECUTOR_12: "  Counting gives 5.  \n</execution_1.2>",
    PLANNER_2: PLAN_2_RAW,
    PLANNER_3: FINAL_RAW,
}


def _by_prompt(script: dict[str, str]) -> Callable[[dict, str], str | Reply]:
    def handler(body: dict, endpoint: str) -> str | Reply:
        return script[body["prompt"]]  # a KeyError (unexpected prompt) becomes HTTP 500 + srv.errors

    return handler


def test_two_phase_problem_sends_exactly_the_hand_built_requests(tmp_path: Path,
                                                                 scripted_server: ScriptedServer) -> None:
    srv = scripted_server(_by_prompt(SCRIPT))
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"]), max_phases=12)
    summary = orchestrate(cfg, progress=False)
    assert srv.errors == []
    prompts = _prompts(srv)
    assert sorted(prompts) == sorted([PLANNER_1, EXECUTOR_11, EXECUTOR_12, PLANNER_2, PLANNER_3])
    assert prompts[0] == PLANNER_1 and prompts[-2:] == [PLANNER_2, PLANNER_3]  # phases in order
    for endpoint, body in srv.completion_requests:
        assert endpoint == "completions" and body["model"] == "test-model"
        assert 1 <= len(body["stop"]) <= 4
        if _is_executor(body["prompt"]):
            assert body["max_tokens"] == 100 and "</execution_" in body["stop"]
        else:
            assert body["max_tokens"] == 200 and {"</Plan_", "</Final_answer>"} <= set(body["stop"])

    [record] = _records(cfg.out_dir)
    expected = "<Question>\nWhat is 2+3?\n</Question>\n\n" + PHASE_1 + "\n\n" + PHASE_2 + (
        "\n\n<Final_answer>\nThe answer is \\boxed{5}.\n</Final_answer>"
    )
    assert record["trajectory"] == expected
    assert parse(record["trajectory"]).render() == expected  # well formed for the trajectory model
    assert (Path(cfg.out_dir) / "trajectories" / "test_demo_0.txt").read_text() == expected + "\n"
    assert record["id"] == "test_demo_0" and record["status"] == "ok" and record["error"] is None
    assert (record["predicted"], record["gold"], record["correct"]) == ("5", "5", True)
    assert (record["num_phases"], record["num_prompts"], record["forced_final"]) == (2, 2, False)
    roles = [(c["role"], c["phase"], c["prompt"]) for c in record["calls"]]
    assert sorted(roles, key=str) == sorted(
        [("planner", 1, None), ("executor", 1, "1.1"), ("executor", 1, "1.2"), ("planner", 2, None), ("planner", 3, None)],
        key=str,
    )
    for call in record["calls"]:
        assert call["completion_tokens"] > 0 and call["prompt_tokens"] > 0 and call["end"] >= call["start"]
        assert call["finish_reason"] == "stop" and call["cached"] is False
    assert record["completion_tokens"] == sum(c["completion_tokens"] for c in record["calls"])
    assert summary["accuracy"] == 1.0 and summary["problems"] == 1

    manifest = json.loads((Path(cfg.out_dir) / "manifest.json").read_text())
    assert manifest["stage"] == "orchestrate"
    assert manifest["config"]["planner_model"] == "test-model"
    assert manifest["config"]["planner_server_url"] == srv.base_url
    assert manifest["config"]["executor_model"] == "test-model"
    assert manifest["config"]["executor_server_url"] == srv.base_url
    assert manifest["usage"]["planner"]["calls"] == 3 and manifest["usage"]["executor"]["calls"] == 2
    assert manifest["usage"]["completion_tokens"] == record["completion_tokens"]
    assert manifest["summary"]["accuracy"] == 1.0


def test_sloppy_planner_tags_are_normalised_before_executors_see_them(tmp_path: Path,
                                                                      scripted_server: ScriptedServer) -> None:
    seen_executor: list[str] = []

    def handler(body: dict, endpoint: str) -> str:
        prompt = body["prompt"]
        if _is_executor(prompt):
            seen_executor.append(prompt)
            return f"result {_is_executor(prompt).group(1)}"
        if "<Plan_1>" not in prompt:
            # unnumbered prompts, one never closed, one wrongly numbered, a wrongly numbered plan tag
            return "<Plan_1>\nFirst idea.\n<prompt> Do A.\n\n<prompt_7.3> Do B. </prompt_7.3>\nDone.\n</Plan_7>"
        # a final answer written inside the plan of phase 2, without a closing plan tag
        return "<Plan_2>\nSo it is 4.\n<Final_answer>\nThus \\boxed{4}.\n</Final_answer>"

    srv = scripted_server(handler)
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"], ["4"]))
    orchestrate(cfg, progress=False)
    clean_plan = "First idea.\n<prompt_1.1> Do A. </prompt_1.1>\n\n<prompt_1.2> Do B. </prompt_1.2>\nDone."
    head = HEAD + "<Plan_1>\n" + clean_plan + "\n</Plan_1>\n\n<Execution_1>\n"
    assert sorted(seen_executor) == [head + "<execution_1.1>\n", head + "<execution_1.2>\n"]
    [record] = _records(cfg.out_dir)
    assert record["trajectory"] == (
        "<Question>\nWhat is 2+3?\n</Question>\n\n<Plan_1>\n" + clean_plan + "\n</Plan_1>\n\n"
        "<Execution_1>\n<execution_1.1>\nresult 1.1\n</execution_1.1>\n\n"
        "<execution_1.2>\nresult 1.2\n</execution_1.2>\n</Execution_1>\n\n"
        "<Plan_2>\nSo it is 4.\n</Plan_2>\n\n<Execution_2>\nNo prompt to execute.\n</Execution_2>\n\n"
        "<Final_answer>\nThus \\boxed{4}.\n</Final_answer>"
    )
    assert (record["predicted"], record["correct"], record["forced_final"]) == ("4", True, False)
    assert (record["num_phases"], record["num_prompts"]) == (2, 2)


def test_forced_final_answer_at_max_phases(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    def handler(body: dict, endpoint: str) -> str:
        prompt = body["prompt"]
        if prompt.endswith("<Final_answer>\n"):
            return "It must be \\boxed{7}\n</Final_answer>\n</think>"
        return "<Plan_1>\nThink more, no prompts.\n</Plan_1>"  # never answers by itself

    srv = scripted_server(handler)
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"], ["7"]), max_phases=2)
    orchestrate(cfg, progress=False)
    prompts = _prompts(srv)
    assert prompts == [
        HEAD,
        HEAD + "<Plan_1>\nThink more, no prompts.\n</Plan_1>\n\n<Execution_1>\nNo prompt to execute.\n</Execution_1>"
        "\n\n<Final_answer>\n",
    ]
    final_request = srv.completion_requests[-1][1]
    assert "</Final_answer>" in final_request["stop"] and final_request["max_tokens"] == 100
    [record] = _records(cfg.out_dir)
    assert record["forced_final"] is True and record["num_phases"] == 1 and record["num_prompts"] == 0
    assert record["trajectory"].endswith("<Final_answer>\nIt must be \\boxed{7}\n</Final_answer>")
    assert (record["predicted"], record["correct"]) == ("7", True)


def test_planner_that_writes_nothing_is_asked_for_the_answer_at_once(tmp_path: Path,
                                                                     scripted_server: ScriptedServer) -> None:
    def handler(body: dict, endpoint: str) -> str:
        return "\\boxed{5}" if body["prompt"].endswith("<Final_answer>\n") else "   \n</think>"

    srv = scripted_server(handler)
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"]))
    orchestrate(cfg, progress=False)
    assert _prompts(srv) == [HEAD, HEAD + "<Final_answer>\n"]
    [record] = _records(cfg.out_dir)
    assert record["forced_final"] is True and record["num_phases"] == 0 and record["correct"] is True


# ---- retries and failures -----------------------------------------------------------------------

LONG_PLAN = "<Plan_1>\nStart. <prompt_1.1> " + "word " * 40 + "</prompt_1.1>\n</Plan_1>"


def test_over_long_plan_is_redrawn_with_a_new_seed(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    draws: list[dict] = []

    def handler(body: dict, endpoint: str) -> str:
        prompt = body["prompt"]
        if prompt == HEAD:
            draws.append(body)
            return LONG_PLAN if len(draws) <= 2 else "<Plan_1>\nShort plan.\n</Plan_1>"
        return "<Final_answer>\n\\boxed{5}\n</Final_answer>"

    srv = scripted_server(handler)
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"]), planner_max_tokens=20, planner_length_retries=2)
    orchestrate(cfg, progress=False)
    assert len(draws) == 3
    assert len({d["seed"] for d in draws}) == 3  # a redraw, not the same request again
    [record] = _records(cfg.out_dir)
    planner_1 = [c for c in record["calls"] if c["role"] == "planner" and c["phase"] == 1]
    assert [(c["finish_reason"], c["kept"], c["draw"]) for c in planner_1] == [
        ("length", False, 1), ("length", False, 2), ("stop", True, 3)
    ]
    assert planner_1[0]["completion_tokens"] == 20
    assert "<Plan_1>\nShort plan.\n</Plan_1>" in record["trajectory"] and "word" not in record["trajectory"]
    assert record["truncated_plans"] == 0 and record["num_prompts"] == 0


def test_plan_still_too_long_after_retries_is_kept_truncated(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    def handler(body: dict, endpoint: str) -> str:
        prompt = body["prompt"]
        if prompt == HEAD:
            return LONG_PLAN
        if _is_executor(prompt):
            return "done"
        return "<Final_answer>\n\\boxed{5}\n</Final_answer>"

    srv = scripted_server(handler)
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"]), planner_max_tokens=8, planner_length_retries=1)
    orchestrate(cfg, progress=False)
    assert _prompts(srv).count(HEAD) == 2
    [record] = _records(cfg.out_dir)
    assert record["status"] == "ok" and record["truncated_plans"] == 1
    # the cut plan (8 "tokens": <Plan_1>, Start., <prompt_1.1> and 5 words) has its open prompt closed
    plan = parse(record["trajectory"]).phases[0]
    assert plan.plan == "Start. <prompt_1.1> word word word word word </prompt_1.1>"
    assert [e.text for e in plan.executions] == ["done"]


def test_no_redraw_at_temperature_zero(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    srv = scripted_server(lambda body, endpoint: LONG_PLAN if body["prompt"] == HEAD else "\\boxed{5}")
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"]), planner_max_tokens=8, planner_temperature=0.0)
    orchestrate(cfg, progress=False)
    assert _prompts(srv).count(HEAD) == 1  # a redraw at temperature 0 would be identical


def _fail_executors(times: int) -> tuple[Callable[[dict, str], str | Reply], list[int]]:
    failures = [0]
    lock = threading.Lock()

    def handler(body: dict, endpoint: str) -> str | Reply:
        prompt = body["prompt"]
        if _is_executor(prompt) and "What is 2+3?" in prompt:
            with lock:
                if failures[0] < times:
                    failures[0] += 1
                    return Reply(status=500, error="executor exploded")
            return "five"
        if "<Plan_1>" in prompt:
            return "<Final_answer>\n\\boxed{5}\n</Final_answer>"
        return "<Plan_1>\nCompute. <prompt_1.1> Add. </prompt_1.1>\n</Plan_1>"

    return handler, failures


def test_executor_failing_three_times_is_recorded_not_a_crash(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    handler, failures = _fail_executors(times=10**6)
    srv = scripted_server(handler)
    data = _data(tmp_path, ["What is 2+3?", "What is 1+4?"])
    cfg = _config(srv, tmp_path, data, executor_retries=3, problem_retries=0)
    summary = orchestrate(cfg, progress=False)
    assert failures[0] == 3  # three tries, each one HTTP request (max_retries=0)
    records = {r["id"]: r for r in _records(cfg.out_dir)}
    bad, good = records["test_demo_0"], records["test_demo_1"]
    assert bad["status"] == "error" and bad["retryable"] is True and bad["error_kind"] == "server_error"
    assert "executor 1.1 failed 3 times" in bad["error"] and "executor exploded" in bad["error"]
    assert bad["correct"] is None and bad["predicted"] is None
    failed_calls = [c for c in bad["calls"] if c["role"] == "executor"]
    assert [(c["draw"], c["error"] is not None) for c in failed_calls] == [(1, True), (2, True), (3, True)]
    assert good["status"] == "ok" and good["correct"] is True  # the other problem was not disturbed
    assert summary["errors"] == 1 and summary["ok"] == 1
    assert (Path(cfg.out_dir) / "trajectories" / "test_demo_0.txt").exists()

    # A re-run redoes only the retryable failure.
    handler2, _ = _fail_executors(times=0)
    srv2 = scripted_server(handler2)
    cfg2 = _config(srv2, tmp_path, data, executor_retries=3, problem_retries=0)
    orchestrate(cfg2, progress=False)
    assert {body["prompt"].split("<Question>\n")[1].split("\n")[0] for _, body in srv2.completion_requests} == {"What is 2+3?"}
    records = _records(cfg.out_dir)
    assert len(records) == 2 and all(r["status"] == "ok" for r in records)


def test_problem_is_retried_after_its_executor_gives_up(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    handler, failures = _fail_executors(times=3)
    srv = scripted_server(handler)
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"]), executor_retries=3, problem_retries=1)
    orchestrate(cfg, progress=False)
    [record] = _records(cfg.out_dir)
    assert record["status"] == "ok" and record["attempts"] == 2 and record["correct"] is True
    assert [c["run"] for c in record["calls"] if c["error"]] == [1, 1, 1]
    assert "<execution_1.1>\nfive\n</execution_1.1>" in record["trajectory"]


# ---- concurrency --------------------------------------------------------------------------------


def test_executors_of_one_phase_overlap_in_time(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    def handler(body: dict, endpoint: str) -> str | Reply:
        prompt = body["prompt"]
        if _is_executor(prompt):
            return Reply(text="ok", delay=0.4)
        if "<Plan_1>" in prompt:
            return "<Final_answer>\n\\boxed{5}\n</Final_answer>"
        return "<Plan_1>\n<prompt_1.1> a </prompt_1.1>\n<prompt_1.2> b </prompt_1.2>\n<prompt_1.3> c </prompt_1.3>\n</Plan_1>"

    srv = scripted_server(handler)
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"]), max_execution_workers=3)
    orchestrate(cfg, progress=False)
    [record] = _records(cfg.out_dir)
    spans = [(c["start"], c["end"]) for c in record["calls"] if c["role"] == "executor"]
    assert len(spans) == 3
    assert max(s for s, _ in spans) < min(e for _, e in spans)  # all three were running at once
    assert max(e for _, e in spans) - min(s for s, _ in spans) < 3 * 0.4  # faster than one after another


def test_problems_and_executors_run_concurrently_up_to_their_limits(tmp_path: Path,
                                                                    scripted_server: ScriptedServer) -> None:
    lock = threading.Lock()
    active_questions: dict[str, int] = {}
    state = {"executors": 0, "max_executors": 0, "max_problems": 0}

    def handler(body: dict, endpoint: str) -> str:
        prompt = body["prompt"]
        question = prompt.split("<Question>\n")[1].split("\n</Question>")[0]
        executor = bool(_is_executor(prompt))
        with lock:
            active_questions[question] = active_questions.get(question, 0) + 1
            state["max_problems"] = max(state["max_problems"], sum(1 for v in active_questions.values() if v))
            if executor:
                state["executors"] += 1
                state["max_executors"] = max(state["max_executors"], state["executors"])
        time.sleep(0.15)
        with lock:
            active_questions[question] -= 1
            state["executors"] -= executor
        return _one_phase_answer(prompt, 3)

    questions = [f"What is {i}+{5 - i}?" for i in range(5)]
    srv = scripted_server(handler)
    cfg = _config(srv, tmp_path, _data(tmp_path, questions), max_problem_workers=2, max_execution_workers=4)
    orchestrate(cfg, progress=False)
    assert state["max_problems"] == 2  # two problems in flight, never more
    assert state["max_executors"] == 4  # executors of both problems share the limit of 4
    assert len(_records(cfg.out_dir)) == 5


def test_timed_problems_run_one_at_a_time_before_the_rest_share_the_server(tmp_path: Path,
                                                                          scripted_server: ScriptedServer) -> None:
    """--timed-problems 2 with 3 problems in flight: the first two problems (dataset order) run alone,
    then the other four go three at a time; Table 2's seconds read the two that ran alone."""
    lock = threading.Lock()
    active: dict[str, int] = {}
    company: dict[str, int] = {}  # question -> most problems in flight while one of its calls ran

    def handler(body: dict, endpoint: str) -> str:
        prompt = body["prompt"]
        question = prompt.split("<Question>\n")[1].split("\n</Question>")[0]
        with lock:
            active[question] = active.get(question, 0) + 1
            for q in active:
                if active[q]:
                    company[q] = max(company.get(q, 0), sum(1 for v in active.values() if v))
        time.sleep(0.05)
        with lock:
            active[question] -= 1
        return _one_phase_answer(prompt, 2)

    questions = [f"What is {i}+{5 - i}?" for i in range(6)]
    srv = scripted_server(handler)
    cfg = _config(srv, tmp_path, _data(tmp_path, questions), max_problem_workers=3, timed_problems=2)
    orchestrate(cfg, progress=False)
    assert [company[q] for q in questions[:2]] == [1, 1]
    assert max(company[q] for q in questions[2:]) == 3
    problems = [RawProblem(id=r["id"], text=r["trajectory"], calls=r["calls"]) for r in _records(cfg.out_dir)]
    alone = latency_seconds(problems)
    spans = {r["index"]: problem_seconds(r["calls"]) for r in _records(cfg.out_dir)}
    assert sorted(alone) == sorted([spans[0], spans[1]])


# ---- prompt formats -----------------------------------------------------------------------------


def test_chat_mode_renders_the_template_once_without_doubling_think_or_bos(
    tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPRINT_LOCAL_DATA", str(shared_data))
    fmt = build_prompt_format("chat", "completions", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", AGENT)
    endpoint, prompt, extra = fmt.request("What is 2+3?", "<Plan_1>\nx")
    # R1-Distill's template: BOS, <｜User｜>, <｜Assistant｜><think>\n; the server adds BOS itself.
    user = "Solve it in phases.\n\n<Question>\nWhat is 2+3?\n</Question>\n\n"
    assert (endpoint, extra) == ("completions", ())
    assert prompt == "<｜User｜>" + user + "<｜Assistant｜><think>\n<Plan_1>\nx"

    qwen = build_prompt_format("chat", "completions", str(shared_data / "tokenizers" / "qwen2.5-7b-instruct"), AGENT)
    _, prompt, _ = qwen.request("What is 2+3?", "")
    assert prompt.startswith("<|im_start|>system\n") and prompt.count("<think>") == 1
    assert prompt.endswith("<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n<think>\n")


def test_chat_api_continues_the_assistant_message(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    def handler(body: dict, endpoint: str) -> str:
        assistant = body["messages"][-1]["content"]
        return "\\boxed{5}\n</Final_answer>" if assistant.endswith("<Final_answer>\n") else "<Plan_1>\nHmm.\n</Plan_1>"

    srv = scripted_server(handler)
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"]), prompt_mode="chat", api="chat", max_phases=2)
    orchestrate(cfg, progress=False)
    first, last = srv.completion_requests[0], srv.completion_requests[-1]
    assert first[0] == "chat" and last[0] == "chat"
    user = {"role": "user", "content": "Solve it in phases.\n\n<Question>\nWhat is 2+3?\n</Question>\n\n"}
    assert first[1]["messages"] == [user, {"role": "assistant", "content": "<think>\n"}]
    assert first[1]["continue_final_message"] is True and first[1]["add_generation_prompt"] is False
    assert last[1]["messages"][1]["content"].endswith("</Execution_1>\n\n<Final_answer>\n")
    [record] = _records(cfg.out_dir)
    assert record["correct"] is True and record["forced_final"] is True


def test_raw_mode_with_the_chat_api_is_refused() -> None:

    with pytest.raises(UserError, match="prompt-mode chat"):
        PromptFormat(agent_prompt=AGENT, mode="raw", api="chat")


# ---- resumption, baseline, CLI, shell scripts ---------------------------------------------------


def test_finished_problems_are_skipped_on_rerun(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    srv = scripted_server(_by_prompt(SCRIPT))
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"]))
    orchestrate(cfg, progress=False)
    n = len(srv.completion_requests)
    orchestrate(cfg, progress=False)
    assert len(srv.completion_requests) == n
    assert len(_records(cfg.out_dir)) == 1


def test_a_rerun_on_changed_problems_is_refused(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    """Held-out problems regenerated under the same ids: the old records are not taken for the new
    questions' answers; the re-run stops before any call."""
    srv = scripted_server(_by_prompt(SCRIPT))
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"]))
    orchestrate(cfg, progress=False)
    n = len(srv.completion_requests)
    cfg.data = _data(tmp_path, ["What is 2+4?"])  # the same id, another question
    with pytest.raises(UserError, match="the data changed since that run"):
        orchestrate(cfg, progress=False)
    assert len(srv.completion_requests) == n and len(_records(cfg.out_dir)) == 1


def test_baseline_makes_one_generation_per_problem(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    generation = "Let me add: 2+3 = 5.\n</think>\nThe answer is \\boxed{5}."
    srv = scripted_server(lambda body, endpoint: generation)
    cfg = BaselineConfig(
        model="test-model", server_url=srv.base_url, out_dir=str(tmp_path / "base"),
        data=_data(tmp_path, ["What is 2+3?", "What is 9-4?"]), prompt_mode="raw",
        agent_prompt=_agent_file(tmp_path), max_tokens=300, max_retries=0,
    )
    summary = baseline(cfg, progress=False)
    assert sorted(_prompts(srv)) == sorted([HEAD, HEAD.replace("2+3", "9-4")])
    for _, body in srv.completion_requests:
        assert body["max_tokens"] == 300 and not body.get("stop")
    records = _records(cfg.out_dir)
    assert len(records) == 2
    for r in records:
        assert r["generation"] == generation and r["predicted"] == "5" and r["correct"] is True
        assert r["sequential_tokens"] == r["completion_tokens"] == len(generation.split())
        assert r["calls"][0]["role"] == "baseline"
    text = (Path(cfg.out_dir) / "trajectories" / "test_demo_0.txt").read_text()
    assert text == "<Question>\nWhat is 2+3?\n</Question>\n\n<think>\n" + generation + "\n"
    assert summary["accuracy"] == 1.0
    assert json.loads((Path(cfg.out_dir) / "manifest.json").read_text())["stage"] == "baseline"


def test_cli_orchestrate_runs_and_bad_server_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with FakeServer(_by_prompt(SCRIPT)) as srv:  # stopped after the block: the next command finds no server
        code = cli.main([
            "orchestrate", "--planner-model", "test-model", "--planner-url", srv.base_url,
            "--data", _data(tmp_path, ["What is 2+3?"]), "--out-dir", str(tmp_path / "cli"),
            "--prompt-mode", "raw", "--agent-prompt", _agent_file(tmp_path), "--no-progress",
            "--planner-max-tokens", "200", "--max-tokens", "100",
        ])
    assert code == 0
    assert "accuracy 100.0%" in capsys.readouterr().out
    code = cli.main([
        "orchestrate", "--planner-model", "nope", "--planner-url", srv.base_url,
        "--data", _data(tmp_path, ["What is 2+3?"]), "--out-dir", str(tmp_path / "cli2"),
        "--prompt-mode", "raw", "--no-progress",
    ])
    assert code == 2
    assert "no server answers" in capsys.readouterr().err


def _run_script(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON": sys.executable, **env}
    command = ["bash", str(REPO_ROOT / script), *args]
    return subprocess.run(command, env=full, capture_output=True, text=True, timeout=120)


def test_shell_scripts_drive_the_cli(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    data = _data(tmp_path, ["What is 2+3?"])
    agent = _agent_file(tmp_path)
    srv = scripted_server(_by_prompt(SCRIPT))
    result = _run_script("run_agent_orchestration.sh", {
        "PLANNER_MODEL": "test-model", "PLANNER_SERVER_URL": srv.base_url, "TEST_DATA": data,
        "OUT_DIR": str(tmp_path / "orch"), "PROMPT_MODE": "raw", "PLANNER_OUTPUT_TOKEN_LIMIT": "200",
        "MAX_TOKENS": "100", "MAX_PHASES": "5", "SPLIT": "test", "CACHE_DIR": str(tmp_path / "orch-cache"),
    }, "--agent-prompt", agent, "--no-progress")
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(list((tmp_path / "orch-cache").glob("*/*.json"))) == len(SCRIPT)  # CACHE_DIR reached the CLI
    assert not (tmp_path / "orch" / "llm_cache").exists()
    orch = json.loads((tmp_path / "orch" / "manifest.json").read_text())
    assert orch["config"]["max_phases"] == 5 and orch["config"]["planner_max_tokens"] == 200
    assert _records(tmp_path / "orch")[0]["correct"] is True

    srv = scripted_server(lambda body, endpoint: "so \\boxed{5}")
    result = _run_script("run_baseline_evaluation.sh", {
        "MODEL": "test-model", "SERVER_URL": srv.base_url, "TEST_DATA": data, "OUT_DIR": str(tmp_path / "base"),
        "PROMPT_MODE": "raw", "MAX_TOKENS": "64",
    }, "--no-progress")
    assert result.returncode == 0, result.stderr[-2000:]
    assert srv.completion_requests[0][1]["max_tokens"] == 64
    assert _records(tmp_path / "base")[0]["correct"] is True
    assert list((tmp_path / "base" / "llm_cache").glob("*/*.json"))  # empty CACHE_DIR: the default cache


def test_model_path_starts_vllm_only_when_nothing_answers_locally(tmp_path: Path,
                                                                  scripted_server: ScriptedServer) -> None:
    data = _data(tmp_path, ["What is 2+3?"])
    # A server already answers: it is reused, and the manifest says which checkpoint was named.
    srv = scripted_server(_by_prompt(SCRIPT))
    cfg = _config(srv, tmp_path, data, model_path=str(tmp_path))
    orchestrate(cfg, progress=False)
    manifest = json.loads((Path(cfg.out_dir) / "manifest.json").read_text())
    assert manifest["model_path"] == str(tmp_path)
    # Nothing answers on this machine: ensure_server tries to start vLLM from the (empty) folder.
    cfg = OrchestrationConfig(planner_model="m", planner_server_url=dead_url(), out_dir=str(tmp_path / "r2"),
                              data=data, prompt_mode="raw", model_path=str(tmp_path))
    with pytest.raises(UserError, match="no config.json"):
        orchestrate(cfg, progress=False)


@pytest.mark.parametrize("script", ["run_agent_orchestration.sh", "run_baseline_evaluation.sh"])
def test_vllm_args_reach_the_server_the_script_starts(tmp_path: Path, script: str) -> None:
    """VLLM_ARGS is passed whole to the vLLM a run starts from MODEL_PATH. The "vLLM Python" here writes
    its arguments down and exits, so the run stops with the server's log, as with a real vLLM that fails."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    argv_file = tmp_path / "argv.txt"
    python = tmp_path / "vllm-python"
    python.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > {argv_file}\nexit 3\n')
    python.chmod(0o755)
    url, name = ("PLANNER_SERVER_URL", "PLANNER_MODEL") if script.startswith("run_agent") else ("SERVER_URL", "MODEL")
    result = _run_script(script, {
        name: "m", url: dead_url(), "MODEL_PATH": str(model), "VLLM_PYTHON": str(python),
        "VLLM_ARGS": "--enforce-eager --max-num-seqs 4", "TEST_DATA": _data(tmp_path, ["What is 2+3?"]),
        "OUT_DIR": str(tmp_path / "run"), "PROMPT_MODE": "raw",
    }, "--no-progress")
    assert result.returncode != 0
    argv = argv_file.read_text().split()
    assert argv[-3:] == ["--enforce-eager", "--max-num-seqs", "4"], argv
    assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"] and argv[argv.index("--model") + 1] == str(model)


# ---- crash guard, response cache, summary line --------------------------------------------------


def _solver(body: dict, endpoint: str) -> str:
    """Planner: one prompt, then the answer 5; executors: a line of work; baseline (max_tokens 90): the answer."""
    prompt = body["prompt"]
    if body["max_tokens"] == 90:
        return "2+3 = 5.\n</think>\nSo \\boxed{5}."
    if _is_executor(prompt):
        return "2+3 = 5."
    if prompt.endswith("<Final_answer>\n") or "<Plan_1>" in prompt:
        return "<Final_answer>\n\\boxed{5}\n</Final_answer>"
    return "<Plan_1>\nAdd. <prompt_1.1> Add them. </prompt_1.1>\n</Plan_1>"


def _stage_argv(stage: str, url: str, data: str, out: Path, agent: str) -> list[str]:
    common = ["--data", data, "--out-dir", str(out), "--prompt-mode", "raw", "--agent-prompt", agent,
              "--no-progress", "--max-retries", "0"]
    if stage == "orchestrate":
        return ["orchestrate", "--planner-model", "test-model", "--planner-url", url, "--planner-max-tokens", "200",
                "--max-tokens", "100", *common]
    return ["baseline", "--model", "test-model", "--server-url", url, "--max-tokens", "90", *common]


@pytest.mark.parametrize("stage", ["orchestrate", "baseline"])
def test_a_problem_that_crashes_is_recorded_and_the_others_finish(
    tmp_path: Path, stage: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture, scripted_server: ScriptedServer,
) -> None:
    from sprint.inference import baseline as baseline_module
    from sprint.inference import orchestration

    stage_module = orchestration if stage == "orchestrate" else baseline_module  # where the stage takes its seeds
    real_seed = stage_module.call_seed

    def seed_with_a_bug(seed: int | None, *parts: object) -> int | None:
        if parts[0] == "test_demo_1":  # every call of this one problem, in both stages
            raise ZeroDivisionError("division by zero in problem 1")
        return real_seed(seed, *parts)

    monkeypatch.setattr(stage_module, "call_seed", seed_with_a_bug)
    data = _data(tmp_path, ["What is 2+3?", "What is 1+4?", "What is 0+5?"])
    out = tmp_path / stage
    argv = _stage_argv(stage, "{url}", data, out, _agent_file(tmp_path))
    caplog.set_level(logging.DEBUG, logger="sprint.core.items")  # the one worker pool logs crashes
    srv = scripted_server(_solver)
    code = cli.main([a.replace("{url}", srv.base_url) for a in argv])
    assert code == 3 and srv.errors == []  # finished, with a failed (crashed) problem: exit 3
    records = {r["id"]: r for r in _records(out)}
    assert set(records) == {"test_demo_0", "test_demo_1", "test_demo_2"}
    crashed = records.pop("test_demo_1")
    assert crashed["status"] == "crashed" and crashed["retryable"] is True
    assert crashed["error"] == "ZeroDivisionError: division by zero in problem 1"  # readable, no traceback
    assert crashed["correct"] is None and crashed["predicted"] is None and crashed["question"] == "What is 1+4?"
    assert all(r["status"] == "ok" and r["correct"] is True for r in records.values())
    assert (out / "trajectories" / "test_demo_1.txt").read_text().startswith("<Question>\nWhat is 1+4?\n</Question>")
    # the traceback goes to the debug log, the one-line reason to the warning
    crash_logs = [r for r in caplog.records if "test_demo_1" in r.getMessage()]
    assert any(r.levelno == logging.WARNING and "ZeroDivisionError" in r.getMessage() for r in crash_logs)
    assert any(r.levelno == logging.DEBUG and r.exc_info for r in crash_logs)
    assert "3 problems (1 errors), accuracy 66.7% (2/3; 100.0% of answered)" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"ok": 2, "crashed": 1}
    assert (manifest["summary"]["accuracy"], manifest["summary"]["accuracy_answered"]) == (0.6667, 1.0)

    # fixed: the re-run redoes the crashed problem only
    monkeypatch.setattr(stage_module, "call_seed", real_seed)
    srv = scripted_server(_solver)
    assert cli.main([a.replace("{url}", srv.base_url) for a in argv]) == 0
    asked = {body["prompt"].split("<Question>\n")[1].split("\n")[0] for _, body in srv.completion_requests}
    assert asked == {"What is 1+4?"}
    assert all(r["status"] == "ok" for r in _records(out)) and len(_records(out)) == 3

    # a UserError is not a crash of one problem: it stops the run
    def refuse(seed: int | None, *parts: object) -> int | None:
        raise UserError("the server refuses; fix it")

    monkeypatch.setattr(stage_module, "call_seed", refuse)
    srv = scripted_server(_solver)
    fresh = _stage_argv(stage, srv.base_url, data, tmp_path / "o2", _agent_file(tmp_path))
    assert cli.main(fresh) == 2
    assert "the server refuses" in capsys.readouterr().err
    assert not (tmp_path / "o2" / "records.jsonl").exists()


@pytest.mark.parametrize("stage", ["orchestrate", "baseline"])
def test_response_cache_defaults_to_the_run_folder_and_its_location_is_not_identity(
    tmp_path: Path, stage: str, capsys: pytest.CaptureFixture, scripted_server: ScriptedServer
) -> None:
    data = _data(tmp_path, ["What is 2+3?", "What is 1+4?"])
    out = tmp_path / stage
    argv = _stage_argv(stage, "{url}", data, out, _agent_file(tmp_path))
    srv = scripted_server(_solver)
    run = [a.replace("{url}", srv.base_url) for a in argv]
    assert cli.main(run) == 0
    first = len(srv.completion_requests)
    default_cache = out / "llm_cache"
    assert len(list(default_cache.glob("*/*.json"))) == first  # every answer was stored
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["cache_dir"] == str(default_cache) and "use_cache" not in manifest["config"]
    ok_records = _records(out)

    # lose the records (a crash before they were written): the default cache answers everything again
    (out / "records.jsonl").write_bytes(b"")
    assert cli.main(run) == 0
    assert len(srv.completion_requests) == first

    # another cache location, or none, is the same run: no --overwrite needed, nothing redone
    other = tmp_path / "elsewhere"
    assert cli.main([*run, "--cache-dir", str(other)]) == 0
    assert cli.main([*run, "--no-cache"]) == 0
    assert len(srv.completion_requests) == first and not other.exists()

    # with --no-cache every call goes to the server and nothing is stored
    (out / "records.jsonl").write_bytes(b"")
    shutil.rmtree(default_cache)
    assert cli.main([*run, "--no-cache"]) == 0
    assert len(srv.completion_requests) == 2 * first and not default_cache.exists()
    assert json.loads((out / "manifest.json").read_text())["config"]["cache_dir"] is None
    assert "problems (0 errors), accuracy 100.0% (2/2; 100.0% of answered)" in capsys.readouterr().out
    strip = lambda r: {k: v for k, v in r.items() if k not in {"start", "end", "calls"}}  # noqa: E731
    assert sorted(map(json.dumps, map(strip, _records(out)))) == sorted(map(json.dumps, map(strip, ok_records)))


def test_a_trajectory_that_outgrows_the_context_ends_unanswered_not_failed(tmp_path: Path,
                                                                          scripted_server: ScriptedServer) -> None:
    """vLLM refuses a prompt longer than --max-model-len with HTTP 400: for a planner whose trajectory grew that
    long it is the model's failure (graded wrong, as a generation cut at its limit), not the run's."""
    def handler(body: dict, endpoint: str) -> str | Reply:
        prompt = body["prompt"]
        if "<Plan_2>" in prompt or prompt.endswith("<Execution_1>\nNo prompt to execute.\n</Execution_1>\n\n"):
            return Reply(status=400, error="This model's maximum context length is 1536 tokens. However, your prompt "
                                           "contains at least 1537 input tokens")
        return "<Plan_1>\nThink more, no prompts.\n</Plan_1>"

    srv = scripted_server(handler)
    cfg = _config(srv, tmp_path, _data(tmp_path, ["What is 2+3?"], ["5"]))
    summary = orchestrate(cfg, progress=False)
    assert summary["errors"] == 0 and summary["no_answer"] == summary["context_full"] == 1
    [record] = _records(cfg.out_dir)
    assert record["status"] == "ok" and record["context_full"] is True
    assert (record["predicted"], record["correct"], record["num_phases"]) == (None, False, 1)
    assert [c["error"].split(":")[0] for c in record["calls"] if c.get("error")] == ["context_length"]
