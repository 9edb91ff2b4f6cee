"""The arithmetic task (`sprint mini-data --task arithmetic`): problems whose subtasks form a different DAG
each time, traces worked column by column, the teacher's components and DAG, and the real stages 1-3
packing each trace into exactly its ideal packing (read back by `sprint.mini.fidelity`)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from sprint.core.data import iter_jsonl
from sprint.curation.trace_lines import split_lines
from sprint.format.trajectory import parse
from sprint.mini.arithmetic import (DrawConfig, Node, Shape, combine, draw_problem, make_trace, parse_expression,
                                    read_result, read_work, step_lines, work_lines)
from sprint.mini.fidelity import plan_figures, read_plan, read_run
from sprint.mini.figures import arithmetic_sections
from sprint.mini.generate import write_mini_data
from sprint.mini.ideal import ideal_trajectory
from sprint.mini.problems import MiniDataConfig
from sprint.tasks.registry import get_task
from tests.helpers import teacher_stages


def n(v: int) -> Node:
    return Node(v)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("arith") / "data"
    write_mini_data(MiniDataConfig(out=str(out), task="arithmetic", n_test=60, n_train=300, beyond=10, seed=3))
    return out


def test_same_options_same_bytes(data: Path, tmp_path: Path) -> None:
    write_mini_data(MiniDataConfig(out=str(tmp_path), task="arithmetic", n_test=60, n_train=300, beyond=10, seed=3))
    for name in ("train_traces.jsonl", "test.jsonl", "teacher.jsonl", "corpus.jsonl", "test_beyond.jsonl"):
        assert (tmp_path / name).read_bytes() == (data / name).read_bytes(), name


def test_columns_carry_and_borrow() -> None:
    assert step_lines(457, "+", 86) == ["4 5 7 + 0 8 6 , column by column from the right :", "7 + 6 + 0 = 1 3 .",
                                        "5 + 8 + 1 = 1 4 .", "4 + 0 + 1 = 5 .", "So 4 5 7 + 8 6 = 5 4 3 ."]
    assert step_lines(503, "-", 498)[1:] == ["1 3 - 8 - 0 = 5 .", "1 0 - 9 - 1 = 0 .", "5 - 4 - 1 = 0 .",
                                             "So 5 0 3 - 4 9 8 = 5 ."]
    assert step_lines(457, "*", 7)[1:] == ["7 * 7 + 0 = 4 9 .", "5 * 7 + 4 = 3 9 .", "4 * 7 + 3 = 3 1 .",
                                           "So 4 5 7 * 7 = 3 1 9 9 ."]
    three = work_lines(combine("+", (n(57), n(87), n(70))))
    assert three[0] == "5 7 + 8 7 + 7 0 , two at a time :" and three[-1] == "So 5 7 + 8 7 + 7 0 = 2 1 4 ."
    assert "1 4 4 + 0 7 0 , column by column from the right :" in three  # the running total, then the next term


def test_every_drawn_step_is_right() -> None:
    """Each column line's arithmetic and each result, for many drawn problems (not only the examples above)."""
    rng = random.Random(7)
    for _ in range(200):
        node = draw_problem(rng, DrawConfig())
        for line in make_trace(node).lines:
            if line.startswith("So ") and " = " in line and not line.startswith("So it is"):
                left, value = line[3:-2].split(" = ")
                assert parse_expression(left).value == int(value.replace(" ", "")), line
            elif line[0].isdigit() and line.endswith(" .") and " = " in line:
                left, value = line[:-2].split(" = ")
                terms = left.split(" ")
                x = int("".join(terms[:2]) if terms[1].isdigit() else terms[0])
                rest = terms[2:] if terms[1].isdigit() else terms[1:]
                total = x
                for op, y in zip(rest[::2], rest[1::2]):
                    total = total + int(y) if op == "+" else total - int(y) if op == "-" else total * int(y)
                assert total == int(value.replace(" ", "")), line


def test_the_tree_is_the_dag() -> None:
    """Independent subtasks share a round, a chain has one per round, and a one-digit operation is no subtask."""
    wide = parse_expression("( ( 1 2 + 3 4 ) + ( 5 6 + 7 8 ) ) - ( ( 1 1 + 2 2 ) + ( 3 3 + 4 4 ) )")
    assert Shape.of(wide).widths == (4, 2, 1)
    chain = parse_expression("( ( 1 2 + 3 4 ) * 3 ) - 1 5")
    assert Shape.of(chain).widths == (1, 1, 1)
    small = parse_expression("( 6 9 - 6 7 ) * ( 2 + 5 )")  # 69 - 67 = 2, then 2 * 7: one line in the plan
    assert Shape.of(small).widths == (1,)
    assert Shape.of(small).subtasks() == [["6 9 - 6 7"]]


def test_question_and_prompts_read_back() -> None:
    rng = random.Random(1)
    for _ in range(200):
        node = draw_problem(rng, DrawConfig())
        assert parse_expression(f"Work out {node.text()} .") == node
    assert read_work("Now 2 1 4 + 1 8 7 .") == ("+", (214, 187))
    assert read_work("Now 2 1 4 + .") is None and read_work("hello") is None
    assert read_result("x\nSo 2 1 4 + 1 8 7 = 4 0 1 .") == 401 and read_result("So it is 4 .") is None
    with pytest.raises(ValueError):
        parse_expression("1 2 + 3 4 - 5 6")  # mixed operations without brackets: never written


def test_held_out_problems_span_the_shapes(data: Path) -> None:
    rows = list(iter_jsonl(data / "test.jsonl"))
    train = {r["question"] for r in iter_jsonl(data / "train_traces.jsonl")}
    assert not train & {r["question"] for r in rows}
    shapes = Counter(tuple(r["widths"]) for r in rows)
    assert {len(s) for s in shapes} == {1, 2, 3}
    assert {max(s) for s in shapes} >= {1, 2, 3, 4}
    assert max(shapes.values()) <= 0.4 * len(rows)
    task = get_task("arithmetic-mini")
    for r in iter_jsonl(data / "train_traces.jsonl"):
        assert task.grade(task.extract(r["solution"]), r["answer"]), r["id"]
        assert split_lines(r["thought"]) == r["thought"].split("\n"), r["id"]
    beyond = list(iter_jsonl(data / "test_beyond.jsonl"))
    assert len(beyond) == 10
    assert all(len(r["widths"]) > 3 or max(r["widths"]) > 4 for r in beyond)


def test_grading_reads_spaced_digits() -> None:
    task = get_task("arithmetic-mini")
    assert task.grade(task.extract("The answer is \\boxed{ 7 2 3 } ."), "723")
    assert not task.grade(task.extract("\\boxed{ 7 2 4 }"), "723")
    assert not task.grade(task.extract("\\boxed{ 7²3 }"), "723")
    assert not task.grade(None, "723")


def test_a_share_of_traces_check_the_last_step_twice(data: Path) -> None:
    thoughts = [row["thought"] for row in iter_jsonl(data / "train_traces.jsonl")]
    twice = sum("let me check the last step once more" in t for t in thoughts)
    assert 0.15 < twice / len(thoughts) < 0.35


def test_stages_1_to_3_over_the_teacher_pack_the_ideal_plans(data: Path, tmp_path: Path) -> None:
    """The real stages against the real teacher server: every packed trajectory has exactly its problem's ideal
    packing (fidelity 1), every later prompt copies an earlier result, and the packing rules all occur:
    later phases with prompts, `Based on` lines, one-digit operations merged into their plan."""
    _, records = teacher_stages(data, 80, tmp_path, "--parallelization-threshold", "0")
    assert len(records) == 80 and all(r["status"] == "ok" for r in records)
    figures = plan_figures(read_run(tmp_path / "p"))
    assert figures.well_formed == figures.fidelity == figures.copies == 1.0 and figures.uses > 0
    texts = [r["trajectory"] for r in records]
    assert any("Based on execution_2." in t for t in texts)
    assert any(len(parse(t).phases) > 2 and parse(t).phases[1].prompts for t in texts)
    one_digit = re.compile(r"^[0-9] [+*-] [0-9] = [0-9]( [0-9])? \.$", re.M)
    merged = [t for t in texts if any(one_digit.search(ph.plan) for ph in parse(t).phases)]
    assert merged  # a one-digit operation's line (`3 + 4 = 7 .`) inside a plan


def test_fidelity_tells_a_wrong_plan_from_a_wrong_sum() -> None:
    question = "Work out ( 5 6 + 7 8 ) - ( 1 2 + 3 4 ) ."
    good = ("<Question>\n" + question + "\n</Question>\n\n<Plan_1>\nOkay .\n\n<prompt_1.1> Now 1 2 + 3 4 . </prompt_1.1>"
            "\n\n<prompt_1.2> Now 5 6 + 7 8 . </prompt_1.2>\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\n"
            "So 1 2 + 3 4 = 4 7 .\n</execution_1.1>\n\n<execution_1.2>\nSo 5 6 + 7 8 = 1 3 4 .\n</execution_1.2>\n"
            "</Execution_1>\n\n<Plan_2>\n<prompt_2.1> Now 1 3 4 - 4 7 . </prompt_2.1>\n</Plan_2>\n\n<Execution_2>\n"
            "<execution_2.1>\nSo 1 3 4 - 4 7 = 8 7 .\n</execution_2.1>\n</Execution_2>\n\n<Final_answer>\n"
            "\\boxed{ 8 7 }\n</Final_answer>")
    # 12 + 34 is 46, not 47: the executor's slip; the plan built on what it reported is still the ideal plan
    reading = read_plan({"id": "a", "question": question, "trajectory": good})
    assert reading and reading.matches and reading.widths == (2, 1) and (reading.uses, reading.copied) == (2, 2)
    miscopied = good.replace("Now 1 3 4 - 4 7", "Now 1 3 4 - 4 8")
    reading = read_plan({"id": "b", "question": question, "trajectory": miscopied})
    assert reading and not reading.matches and (reading.uses, reading.copied) == (2, 1)
    serial = good.replace("<prompt_1.2> Now 5 6 + 7 8 . </prompt_1.2>", "")
    reading = read_plan({"id": "c", "question": question, "trajectory": serial})
    assert reading and not reading.matches and reading.widths == (1, 1)
    broken = read_plan({"id": "d", "question": question, "trajectory": good.replace("</Plan_2>", "")})
    assert broken and not broken.formed and not broken.matches


def test_the_summary_reads_a_run_of_ideal_plans_as_ideal(data: Path, tmp_path: Path) -> None:
    """The miniature's own figures on a run whose trajectories are the ideal packings: every target on the
    plans holds, Figure 5's model columns equal the ideal column, and the PNG is drawn."""
    root = tmp_path / "mini"
    run = root / "runs" / "sprint-stream"
    run.mkdir(parents=True)
    (root / "evaluation").mkdir()
    problems = list(iter_jsonl(data / "test.jsonl"))
    records = [{"id": p["id"], "question": p["question"], "correct": True,
                "trajectory": ideal_trajectory(p["question"])[0].render()} for p in problems]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = arithmetic_sections(root)
    text = "\n".join(lines)
    for target in ("well-formed trajectories: 100.0%", "plan equals the ideal packing: 100.0%",
                   "later phases copy earlier results right"):
        assert any(line.startswith(f"- {target}") and line.endswith(": met)") for line in lines), target
    assert "answers: correct: 60" in text
    depth_rows = [line for line in lines if line.startswith("| 1 |") or line.startswith("| 2 |") or line.startswith("| 3 |")]
    assert depth_rows and all(row.split(" | ")[2] == row.split(" | ")[3].rstrip(" |") for row in depth_rows)
    assert (root / "evaluation" / "figure5.png").stat().st_size > 1000
