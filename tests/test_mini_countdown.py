"""The mini experiment's task generator (`sprint mini-data`): deterministic problems and traces whose
structure the stand-in teacher states, packed by the real stages into the intended trajectories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sprint.core.data import iter_jsonl
from sprint.curation.trace_lines import split_lines
from sprint.format.trajectory import parse
from sprint.mini.countdown import all_problems, make_trace, teacher_answer
from sprint.mini.generate import write_mini_data
from sprint.mini.problems import MiniDataConfig
from sprint.tasks.registry import get_task, load_problems
from tests.helpers import teacher_stages


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mini") / "data"
    write_mini_data(MiniDataConfig(out=str(out), task="countdown", n_test=50, seed=3))
    return out


def test_same_options_same_bytes(data: Path, tmp_path: Path) -> None:
    write_mini_data(MiniDataConfig(out=str(tmp_path), task="countdown", n_test=50, seed=3))
    for name in ("train_traces.jsonl", "test.jsonl", "teacher.jsonl", "corpus.jsonl"):
        assert (tmp_path / name).read_bytes() == (data / name).read_bytes(), name


def test_held_out_problems_are_never_trained_on(data: Path) -> None:
    train = {(tuple(r["nums"]), r["target"]) for r in iter_jsonl(data / "train_traces.jsonl")}
    test = [(tuple(r["nums"]), r["target"]) for r in iter_jsonl(data / "test.jsonl")]
    assert len(test) == len(set(test)) == 50
    assert not train & set(test)
    assert len(train) + len(test) == len(all_problems(1, 6))  # every other solvable problem is trained on


def test_every_trace_is_right_and_its_lines_are_stage_1s(data: Path) -> None:
    task = get_task("countdown-mini")
    rows = list(iter_jsonl(data / "train_traces.jsonl"))
    for row in rows:
        gold = {"nums": row["nums"], "target": row["target"]}
        assert task.grade(task.extract(row["solution"]), gold), row["id"]
        assert split_lines(row["thought"]) == row["thought"].split("\n"), row["id"]
    problems = load_problems(task, str(data / "test.jsonl"))
    assert [p.question for p in problems][:1] == [json.loads((data / "test.jsonl").read_text().splitlines()[0])["question"]]


def test_a_trace_reads_as_a_planned_search() -> None:
    trace = make_trace((2, 3, 4), 20)
    assert trace.lines[0] == "Okay , I need 20 from 2 3 4 , so let me try each pair first ."
    assert trace.lines[1:4] == ["Keep 4 for last and try 2 and 3 first .", "Then 4 is left , and I need 20 .",
                                "2 + 3 = 5 , with 4 for 20 : 9 1 20 !"]
    assert trace.expr == "( 2 + 3 ) * 4" and trace.winner == 0
    assert trace.solution == "The answer is \\boxed{ ( 2 + 3 ) * 4 } ."
    # every pair is tried (the plan said so), each in six lines: a failed pair says so
    assert [e - s + 1 for s, e in trace.branch_spans] == [6, 6, 6]
    assert trace.lines[-1] == "Let me check ( 2 + 3 ) * 4 = 20 , it is correct ."
    failed = make_trace((1, 1, 5), 10)
    assert any(line.startswith("None of these is 10") for line in failed.lines)


def test_an_answer_writes_the_larger_operand_first() -> None:
    """One rule for every operation, as a difference is written (no rare form for the planner to miscopy)."""
    assert make_trace((1, 1, 6), 8).expr == "6 + ( 1 + 1 )"
    assert make_trace((1, 1, 6), 5).expr == "6 - ( 1 * 1 )"
    assert make_trace((2, 3, 4), 1).expr == "( 2 + 3 ) - 4"


def test_teacher_answer_covers_the_structure() -> None:
    trace = make_trace((5, 1, 2), 8)  # the first pair reaches it: ( 5 + 1 ) + 2
    answer = teacher_answer(trace)
    comps = answer["components"]
    assert [c["execution"] for c in comps] == ["not found", "3-7", "9-13", "15-19", "not found"]
    assert comps[1]["prompt"] == trace.lines[1] and comps[4]["plan"] == f"{len(trace.lines)}-{len(trace.lines)}"
    assert answer["dag"] == {"1": [], "2": [1], "3": [1], "4": [1], "5": [2 + trace.winner]}
    twice = make_trace((5, 1, 2), 8, recheck=True)
    assert twice.lines[-3:] == ["Let me check ( 5 + 1 ) + 2 = 8 , it is correct .", "Wait , let me make sure once more .",
                                "5 + 1 = 6 , and 6 + 2 = 8 , so it is right ."]
    assert teacher_answer(twice)["components"][4]["plan"] == f"20-{len(twice.lines)}"  # the check holds both


def test_a_share_of_traces_check_twice(data: Path) -> None:
    thoughts = [row["thought"] for row in iter_jsonl(data / "train_traces.jsonl")]
    twice = sum("let me make sure once more" in t for t in thoughts)
    assert 0.2 < twice / len(thoughts) < 0.3  # the default share, 0.25, drawn per trace


def test_stages_1_to_3_over_the_teacher_pack_three_parallel_pairs(data: Path, tmp_path: Path) -> None:
    """The real stages against the real teacher server: every trace packs into two phases, the three
    pairs as parallel prompts of phase 1, the check in phase 2 based on the pair that worked (both
    checks, in a trace that checks twice)."""
    rows, records = teacher_stages(data, 12, tmp_path)
    twice = {row["id"] for row in rows if "once more" in row["thought"]}
    assert 0 < len(twice) < 12  # seed 3's first 12 hold both kinds
    by_id = {r["id"]: r for r in rows}
    assert len(records) == 12 and all(r["status"] == "ok" for r in records)
    for rec in records:
        traj = parse(rec["trajectory"])
        assert [len(ph.prompts) for ph in traj.phases] == [3, 0]
        trace = make_trace(tuple(by_id[rec["id"]]["nums"]), by_id[rec["id"]]["target"])
        assert traj.phases[1].plan.startswith(f"Based on execution_1.{trace.winner + 1}:")
        assert traj.phases[1].plan.endswith("so it is right .") == (rec["id"] in twice)
        assert [traj.phases[0].execution(f"1.{k}").text.split("\n")[0] for k in (1, 2, 3)] == [
            trace.lines[s] for s, _ in trace.branch_spans]  # each execution starts after its instruction line
        assert trace.expr in (traj.final_answer or "")
        assert set(rec["warnings"]) <= {"no_plan", "uncovered_lines"}
