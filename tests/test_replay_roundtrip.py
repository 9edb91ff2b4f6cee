"""Round trip: trajectories written with the trajectory model, served by the replay server,
orchestrated again -> the same trajectory text and answers, in every prompt mode and schedule;
with injected faults every problem still ends ok or with a classified failure, and a resumed run
completes the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sprint.timing.faults import FaultPlan
from sprint.latency.model import LatencyModel
from sprint.llm.failures import ERROR_KINDS
from sprint.inference.orchestration import OrchestrationConfig, orchestrate
from sprint.timing.replay_server import DEFAULT_MODEL, replay_server
from sprint.format.trajectory import Execution, Phase, Trajectory, parse, render_prompt

REPO_ROOT = Path(__file__).resolve().parents[1]
# 20 ms per token, run 2000x faster than real time
LATENCY = LatencyModel.simple(s_per_token=0.020)
TIME_SCALE = 0.0005


def _phase(p: int, lead: str, prompts: list[tuple[str, str]], between: str = "", tail: str = "") -> Phase:
    """A phase whose k-th prompt is `prompts[k][0]` and whose k-th execution is `prompts[k][1]`."""
    parts = [lead]
    executions = []
    for k, (prompt, execution) in enumerate(prompts, 1):
        if between and k > 1:
            parts.append(between)
        parts.append(render_prompt(f"{p}.{k}", prompt))
        executions.append(Execution(f"{p}.{k}", execution))
    if tail:
        parts.append(tail)
    return Phase(p, "\n".join(parts), executions)


def _recordings() -> list[tuple[Trajectory, str]]:
    """Varied trajectories: many prompts, phases without prompts, long chains, answer only."""
    many = [(f"Evaluate term {k} of the sum, $k^2$ for $k = {k}$.", f"Term {k} is ${k * k}$.") for k in range(1, 9)]
    sums = Trajectory(
        "Compute $1^2 + 2^2 + \\dots + 8^2$.",
        [
            _phase(1, "Split the sum into its eight terms and evaluate each one on its own.", many),
            _phase(2, "Based on execution_1.1, execution_1.8:\nAdd them: 1 + 4 + 9 + 16 + 25 + 36 + 49 + 64 = 204.", []),
        ],
        "So the sum is $\\boxed{204}$.",
    )
    chain = Trajectory(
        "Let $f(x) = 2x + 1$. Find $f(f(f(1)))$.",
        [
            _phase(1, "Work from the inside out.", [("Compute $f(1)$.", "$f(1) = 3$.")]),
            _phase(2, "Based on execution_1.1:\nNothing to run; the next value needs $f(3)$.", []),
            _phase(3, "Now two checks at once.", [("Compute $f(3)$.", "$f(3) = 7$."), ("Check $f(3)$ by a table.", "Table: 3 -> 7.")],
                   between="-----\n\nIndependently:", tail="Then finish."),
            _phase(4, "Based on execution_3.1, execution_3.2:\nBoth give 7.", [("Compute $f(7)$.", "$f(7) = 15$.")]),
        ],
        "Hence $f(f(f(1))) = \\boxed{15}$.",
    )
    wide = Trajectory(
        "How many subsets of $\\{1,2,3\\}$ have an even sum?",
        [
            _phase(1, "Count by size.", [(f"Count the subsets of size {s} with an even sum.", f"Size {s}: {n}.") for s, n in
                                         ((0, 1), (1, 1), (2, 1), (3, 1))], between="Next size."),
            _phase(2, "Based on execution_1.1, execution_1.2, execution_1.3, execution_1.4:\nTotal 4.", []),
            _phase(3, "Double-check with a parity argument.", [("Argue by pairing subsets.", "Pairing by toggling 1 gives half of 8, so 4.")]),
        ],
        "The answer is $\\boxed{4}$.",
    )
    direct = Trajectory("What is $6 \\times 7$?", [], "Directly, $6 \\times 7 = \\boxed{42}$.")
    return [(sums, "204"), (chain, "15"), (wide, "4"), (direct, "42")]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Trajectory]]:
    """Trajectory files for the replay server, and the dataset the orchestrator reads."""
    root = tmp_path_factory.mktemp("roundtrip")
    folder = root / "trajectories"
    folder.mkdir()
    rows, by_id = [], {}
    for i, (traj, answer) in enumerate(_recordings()):
        text = traj.render()
        assert parse(text).render() == text  # canonical, as the orchestrator stores trajectories
        (folder / f"planner_trajectory_{i}.txt").write_text(text + "\n", encoding="utf-8")
        rows.append({"problem": traj.question, "answer": answer, "unique_id": f"rt{i}"})
        by_id[f"rt{i}"] = traj
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return folder, str(data), by_id


def _config(url: str, data: str, out: Path, **overrides: object) -> OrchestrationConfig:
    settings: dict = dict(
        planner_model=DEFAULT_MODEL, planner_server_url=url, out_dir=str(out), data=data, prompt_mode="raw",
        planner_max_tokens=2000, max_tokens=2000, max_problem_workers=4, max_execution_workers=8, max_retries=0,
        timeout=20.0,
    )
    settings.update(overrides)
    return OrchestrationConfig(**settings)  # type: ignore[arg-type]


def _records(cfg: OrchestrationConfig) -> dict[str, dict]:
    lines = (Path(cfg.out_dir) / "records.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}  # the last record of an id wins (resumed runs)


def _assert_identical(records: dict[str, dict], by_id: dict[str, Trajectory]) -> None:
    assert set(records) == set(by_id)
    for rid, traj in by_id.items():
        record = records[rid]
        assert record["status"] == "ok", record["error"]
        assert record["trajectory"] == traj.render()
        assert record["predicted"] == traj.answer() and record["correct"] is True
        assert record["forced_final"] is False and record["num_prompts"] == traj.prompt_count


MODES = [
    pytest.param({"schedule": "barrier"}, id="barrier-raw"),
    pytest.param({"schedule": "stream"}, id="stream-raw"),
    pytest.param({"schedule": "barrier", "prompt_mode": "chat", "tokenizer": "chat"}, id="barrier-chat-template"),
    pytest.param({"schedule": "stream", "prompt_mode": "chat", "api": "chat"}, id="stream-chat-api"),
]


@pytest.mark.parametrize("mode", MODES)
def test_replayed_run_reproduces_the_recordings(recorded, tmp_path: Path, shared_data: Path, mode: dict) -> None:
    folder, data, by_id = recorded
    overrides = dict(mode)
    if overrides.get("tokenizer") == "chat":
        overrides["tokenizer"] = str(shared_data / "tokenizers" / "deepseek-r1-distill-qwen-7b")
    with replay_server([folder], LATENCY, time_scale=TIME_SCALE, tokenizer="words") as srv:
        cfg = _config(srv.base_url, data, tmp_path / "run", **overrides)
        summary = orchestrate(cfg, progress=False)
        stats = srv.stats()
    _assert_identical(_records(cfg), by_id)
    assert summary["accuracy"] == 1.0 and summary["errors"] == 0
    executions = sum(t.prompt_count for t in by_id.values())
    assert stats.answered["executor"] == executions  # no executor ran twice, in either schedule
    assert stats.errors == {} and stats.requests == sum(stats.answered.values())


@pytest.mark.parametrize("schedule", ["barrier", "stream"])
def test_faults_end_in_ok_or_classified_failures_and_resume_completes(recorded, tmp_path: Path, schedule: str) -> None:
    folder, data, by_id = recorded
    faults = FaultPlan(rate_5xx=0.12, rate_timeout=0.1, timeout_delay=0.05, rate_truncated=0.12, rate_reset=0.04,
                       rate_empty=0.04, seed=7)
    with replay_server([folder], LATENCY, time_scale=TIME_SCALE, tokenizer="words", faults=faults) as srv:
        cfg = _config(srv.base_url, data, tmp_path / "run", schedule=schedule, executor_retries=2, problem_retries=1)
        summary = orchestrate(cfg, progress=False)
        first = _records(cfg)
        seen = srv.stats().faults
        assert sum(seen.values()) >= 3  # the plan really injected faults
        assert set(first) == set(by_id) and summary["problems"] == len(by_id)  # nothing lost
        for rid, record in first.items():
            if record["status"] == "ok":  # a fault never changes what is stored
                assert record["trajectory"] == by_id[rid].render() and record["correct"] is True
            else:
                assert record["error_kind"] in ERROR_KINDS and record["error"]
                assert record["retryable"] is True and record["correct"] is None
        failed_calls = [c for r in first.values() for c in r["calls"] if c["error"]]
        assert failed_calls and all(not c["kept"] for c in failed_calls)
        for record in first.values():
            _check_times(record)
        srv.config.faults = None  # the server recovers; re-running redoes only what failed
        orchestrate(cfg, progress=False)
    final = _records(cfg)
    _assert_identical(final, by_id)
    lines = (Path(cfg.out_dir) / "records.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(by_id)  # one record per problem, failures replaced
    for rid, record in first.items():
        if record["status"] == "ok":
            assert final[rid]["start"] == record["start"]  # kept, not redone


def test_a_server_that_always_fails_gives_classified_failures(recorded, tmp_path: Path) -> None:
    folder, data, by_id = recorded
    with replay_server([folder], LATENCY, time_scale=TIME_SCALE, tokenizer="words", faults=FaultPlan(rate_5xx=1.0)) as srv:
        cfg = _config(srv.base_url, data, tmp_path / "run", schedule="stream", problem_retries=1)
        summary = orchestrate(cfg, progress=False)
    records = _records(cfg)
    assert set(records) == set(by_id) and summary["errors"] == len(by_id)
    for record in records.values():
        assert (record["status"], record["error_kind"], record["retryable"]) == ("error", "server_error", True)
        assert "planner call of phase 1 failed" in record["error"] and "HTTP" not in record["trajectory"]
        assert [c["run"] for c in record["calls"]] == [1, 2]  # the problem was tried twice


def _check_times(record: dict) -> None:
    for call in record["calls"]:
        assert record["start"] - 0.01 <= call["start"] <= call["end"] <= record["end"] + 0.01
