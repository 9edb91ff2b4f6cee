"""Barrier and stream schedules against the scripted server: when executors start (from the
recorded call times), what they see, well-formed trajectories, and restarted / redrawn plan streams."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from sprint.core.errors import UserError
from sprint.inference.orchestration import OrchestrationConfig, orchestrate
from sprint.format.trajectory import parse, settled_prompts
from tests.fake_server import FakeServer, Reply, ScriptedServer

AGENT = "Solve it in phases."
QUESTION = "What is 2+3?"
HEAD = f"{AGENT}\n\n<Question>\n{QUESTION}\n</Question>\n\n<think>\n"

# Plan text between and after the prompts, so a streaming executor has something to overlap with.
PLAN_1 = (
    "We add the numbers in two ways.\n<prompt_1.1> Compute 2+3 directly. </prompt_1.1>\n"
    "Then check it another way, by counting up from two in steps of one.\n"
    "<prompt_1.2> Count up from 2 three times. </prompt_1.2>\n"
    "Both results should agree, and if they do we can state the answer with confidence here."
)
PLAN_1_RAW = "<Plan_1>\n" + PLAN_1 + "\n</Plan_1>\n\n<Execution_1>\nnot mine"
FINAL_RAW = "<Final_answer>\nThe answer is \\boxed{5}.\n</Final_answer>"
EXECUTIONS = {"1.1": "2+3 = 5.", "1.2": "2, 3, 4, 5: it is 5."}


def _is_executor(prompt: str) -> re.Match | None:
    return re.search(r"<execution_(\d+\.\d+)>\n$", prompt)


def _data(tmp_path: Path, n: int = 1) -> str:
    path = tmp_path / "data.jsonl"
    rows = [{"problem": QUESTION if i == 0 else f"What is 2+3? (copy {i})", "answer": "5", "unique_id": f"p{i}"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _config(srv: FakeServer, tmp_path: Path, schedule: str, **overrides: object) -> OrchestrationConfig:
    agent = tmp_path / "agent.txt"
    agent.write_text(AGENT + "\n")
    settings: dict = dict(
        planner_model="test-model", planner_server_url=srv.base_url, out_dir=str(tmp_path / f"run-{schedule}"),
        data=_data(tmp_path), prompt_mode="raw", agent_prompt=str(agent), planner_max_tokens=200, max_tokens=100,
        max_retries=0, timeout=20.0, schedule=schedule,
    )
    settings.update(overrides)
    return OrchestrationConfig(**settings)  # type: ignore[arg-type]


def _record(cfg: OrchestrationConfig) -> dict:
    [line] = (Path(cfg.out_dir) / "records.jsonl").read_text().splitlines()
    return json.loads(line)


def _handler(plans: list[str | Reply]) -> tuple:
    """Phase-1 plans in order (the last one repeats), fixed executions, then the answer."""
    executor_prompts: list[str] = []
    planner_calls = [0]
    lock = threading.Lock()

    def handler(body: dict, endpoint: str) -> str | Reply:
        prompt = body["prompt"]
        m = _is_executor(prompt)
        if m:
            with lock:
                executor_prompts.append(prompt)
            return EXECUTIONS.get(m.group(1), f"result {m.group(1)}")
        if prompt == HEAD:
            with lock:
                planner_calls[0] += 1
                return plans[min(planner_calls[0], len(plans)) - 1]
        return FINAL_RAW

    return handler, executor_prompts, planner_calls


def _well_formed(text: str) -> None:
    traj = parse(text, strict=True)
    assert traj.render() == text
    for phase in traj.phases:
        names = [e.name for e in phase.executions]
        assert names == [p.name for p in phase.prompts]  # one execution per prompt, in order, no duplicates


# ---- settled prompts --------------------------------------------------------------------------


def test_settled_prompts_count_only_prompts_more_text_cannot_change():
    text = "<Plan_1>\nA.\n<prompt_1.1> do x </prompt_1.1>\nB.\n<prompt_1.2> do y"
    plan, settled = settled_prompts(text, 1)
    assert [p.name for p in settled] == ["1.1"]  # 1.2 is open (normalize_plan would close it at the end)
    assert plan.endswith("<prompt_1.2> do y </prompt_1.2>")
    for cut in range(len(text)):  # a half-written closing tag never settles a prompt
        _, settled = settled_prompts(text[:cut], 1)
        assert len(settled) <= 1 and (not settled or cut >= text.index("</prompt_1.1>") + len("</prompt_1.1>"))
    # an unclosed prompt ended by a blank line is settled only when the next prompt opens
    loose = "<Plan_1>\n<prompt> do x\n\nmore plan"
    assert settled_prompts(loose, 1)[1] == []
    plan, settled = settled_prompts(loose + " <prompt> do y", 1)
    assert [(p.name, p.text) for p in settled] == [("1.1", "do x")]
    # a final answer or an execution block ends the plan: everything before it is settled
    assert [p.name for p in settled_prompts("<prompt> a <Final_answer>\n\\boxed{1}", 2)[1]] == ["2.1"]
    assert [p.name for p in settled_prompts("<prompt> a </prompt> <prompt> b <Execution_2>", 2)[1]] == ["2.1", "2.2"]
    # settled prompts and the text before them are exactly those of the final plan
    final, prompts = settled_prompts(PLAN_1_RAW, 1)
    for cut in range(0, len(PLAN_1_RAW), 7):
        partial, early = settled_prompts(PLAN_1_RAW[:cut], 1)
        for p in early:
            assert partial[: p.end] == final[: p.end] and p in prompts


def test_unknown_schedule_is_a_user_error(tmp_path: Path, scripted_server: ScriptedServer):
    srv = scripted_server()
    with pytest.raises(UserError, match="schedule"):
        _config(srv, tmp_path, "eager")


# ---- when executors start ---------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["barrier", "stream"])
def test_executor_start_times_and_contexts(tmp_path: Path, schedule: str, scripted_server: ScriptedServer):
    handler, executor_prompts, _ = _handler([PLAN_1_RAW])
    srv = scripted_server(handler, chunk_delay=0.01)
    cfg = _config(srv, tmp_path, schedule)
    orchestrate(cfg, progress=False)
    assert srv.errors == []
    record = _record(cfg)
    assert record["status"] == "ok" and record["correct"] is True
    _well_formed(record["trajectory"])
    calls = {(c["role"], c["phase"], c["prompt"]): c for c in record["calls"]}
    planner = calls[("planner", 1, None)]
    first, second = calls[("executor", 1, "1.1")], calls[("executor", 1, "1.2")]
    head = HEAD + "<Plan_1>\n"
    if schedule == "barrier":
        assert first["start"] >= planner["end"] and second["start"] >= planner["end"]
        expected = {head + PLAN_1 + "\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\n",
                    head + PLAN_1 + "\n</Plan_1>\n\n<Execution_1>\n<execution_1.2>\n"}
    else:
        # 1.1 starts while the planner is still writing, and before 1.2 was written
        assert planner["end"] - planner["start"] > 0.3  # ~50 streamed words at 10 ms each
        assert first["start"] < planner["end"] - 0.15
        assert first["start"] < second["start"] < planner["end"]
        ends = [PLAN_1.index(tag) + len(tag) for tag in ("</prompt_1.1>", "</prompt_1.2>")]
        # each sees the plan as far as its own prompt, closed: 1.1 never sees prompt 1.2
        expected = {head + PLAN_1[:end].strip() + f"\n</Plan_1>\n\n<Execution_1>\n<execution_1.{k}>\n"
                    for k, end in enumerate(ends, 1)}
    assert set(executor_prompts) == expected and len(executor_prompts) == 2


def test_both_schedules_store_the_same_trajectory(tmp_path: Path, scripted_server: ScriptedServer):
    texts = {}
    for schedule in ("barrier", "stream"):
        handler, _, _ = _handler([PLAN_1_RAW])
        srv = scripted_server(handler, chunk_delay=0.002)
        cfg = _config(srv, tmp_path, schedule)
        orchestrate(cfg, progress=False)
        texts[schedule] = _record(cfg)["trajectory"]
    assert texts["barrier"] == texts["stream"]
    assert "<execution_1.2>\n2, 3, 4, 5: it is 5.\n</execution_1.2>" in texts["stream"]


# ---- restarted and redrawn plan streams -------------------------------------------------------


def test_dropped_plan_stream_is_retried_without_duplicate_executions(tmp_path: Path, scripted_server: ScriptedServer):
    # the first stream is cut after prompt 1.1 was written: its executor starts, then the retried
    # stream writes the same plan again and the running executor is reused, not started twice
    cut = PLAN_1_RAW.index("Then check")
    handler, executor_prompts, planner_calls = _handler([Reply(text=PLAN_1_RAW, drop_stream_after=cut), PLAN_1_RAW])
    srv = scripted_server(handler, chunk_delay=0.005)
    cfg = _config(srv, tmp_path, "stream", max_retries=2)
    orchestrate(cfg, progress=False)
    record = _record(cfg)
    assert record["status"] == "ok" and planner_calls[0] == 2
    _well_formed(record["trajectory"])
    assert sorted(re.search(r"<execution_(\S+)>\n$", p).group(1) for p in executor_prompts) == ["1.1", "1.2"]
    executors = [c for c in record["calls"] if c["role"] == "executor"]
    assert sorted(c["prompt"] for c in executors) == ["1.1", "1.2"] and all(c["kept"] for c in executors)


def test_restarted_stream_that_writes_another_plan_discards_stale_executors(tmp_path: Path,
                                                                            scripted_server: ScriptedServer):
    other = PLAN_1_RAW.replace("Compute 2+3 directly.", "Add 3 to 2.")
    cut = PLAN_1_RAW.index("Then check")
    handler, executor_prompts, _ = _handler([Reply(text=PLAN_1_RAW, drop_stream_after=cut), other])
    srv = scripted_server(handler, chunk_delay=0.005)
    cfg = _config(srv, tmp_path, "stream", max_retries=2)
    orchestrate(cfg, progress=False)
    record = _record(cfg)
    assert record["status"] == "ok"
    _well_formed(record["trajectory"])
    traj = parse(record["trajectory"])
    assert "Add 3 to 2." in traj.phases[0].plan and "Compute 2+3 directly." not in traj.phases[0].plan
    assert [e.name for e in traj.phases[0].executions] == ["1.1", "1.2"]
    stale = [p for p in executor_prompts if "Compute 2+3 directly." in p]
    assert len(stale) == 1  # started from the first stream ...
    first = [c for c in record["calls"] if c["role"] == "executor" and c["prompt"] == "1.1"]
    assert len(first) == 2 and sorted(c["kept"] for c in first) == [False, True]  # ... and thrown away


def test_redrawn_long_plan_cancels_its_executors(tmp_path: Path, scripted_server: ScriptedServer):
    slow_plan = PLAN_1_RAW.replace("Compute 2+3 directly.", "Slow work.")
    plans: list[str | Reply] = [Reply(text=slow_plan, finish_reason="length"), PLAN_1_RAW]
    handler, executor_prompts, planner_calls = _handler(plans)

    def slow(body: dict, endpoint: str) -> str | Reply:
        answer = handler(body, endpoint)
        if "Slow work." in body["prompt"] and _is_executor(body["prompt"]):
            return Reply(text=str(answer), delay=2.0)  # still running when the plan is redrawn
        return answer

    srv = scripted_server(slow, chunk_delay=0.002)
    cfg = _config(srv, tmp_path, "stream", planner_length_retries=1)
    orchestrate(cfg, progress=False)
    record = _record(cfg)
    assert record["status"] == "ok" and planner_calls[0] == 2
    _well_formed(record["trajectory"])
    assert "Slow work." not in record["trajectory"]
    cancelled = [c for c in record["calls"] if c["role"] == "executor" and c["error"] == "cancelled"]
    assert cancelled and all(not c["kept"] for c in cancelled)
    assert record["end"] - record["start"] < 1.5  # nobody waited for the cancelled executor


# ---- a real server ------------------------------------------------------------------------------


@pytest.mark.vllm
def test_stream_schedule_on_real_vllm(vllm_server, shared_data: Path, tmp_path: Path):
    """The streamed planner path against vLLM (tiny random model): every call has server usage."""
    cfg = OrchestrationConfig(
        planner_model=vllm_server.served_model_name, planner_server_url=vllm_server.base_url,
        out_dir=str(tmp_path / "run"), data=_data(tmp_path, 2), prompt_mode="chat", tokenizer=str(vllm_server.model_dir),
        planner_max_tokens=48, max_tokens=48, max_phases=2, planner_length_retries=1, schedule="stream", timeout=300.0,
    )
    summary = orchestrate(cfg, progress=False)
    records = [json.loads(line) for line in (Path(cfg.out_dir) / "records.jsonl").read_text().splitlines()]
    assert summary["problems"] == 2 and len(records) == 2
    for record in records:
        assert record["status"] == "ok", record["error"]
        _well_formed(record["trajectory"])
        planner = [c for c in record["calls"] if c["role"] == "planner"]
        assert planner and all(0 < c["completion_tokens"] <= 48 and c["prompt_tokens"] > 50 for c in planner)
