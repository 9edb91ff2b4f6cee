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
from sprint.mini.arithmetic import (DrawConfig, Node, Shape, column_lines, combine, draw_problem, make_trace,
                                    parse_problem, read_prompt, read_result, read_step, subtasks, work_lines)
from sprint.mini.fidelity import plan_figures, read_plan, read_run
from sprint.mini.figures import arithmetic_sections
from sprint.mini.generate import write_mini_data
from sprint.mini.ideal import ideal_trajectory
from sprint.mini.problems import MiniDataConfig
from sprint.tasks.registry import get_task
from tests.helpers import teacher_stages


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
    assert column_lines(457, "+", 86) == ["7 + 6 + 0 = 1 3 .", "5 + 8 + 1 = 1 4 .", "4 + 0 + 1 = 5 ."]
    assert column_lines(503, "-", 498) == ["1 3 - 8 - 0 = 5 .", "1 0 - 9 - 1 = 0 .", "5 - 4 - 1 = 0 ."]
    assert column_lines(457, "*", 7) == ["7 * 7 + 0 = 4 9 .", "5 * 7 + 4 = 3 9 .", "4 * 7 + 3 = 3 1 ."]
    three = work_lines("A", "5 7 + 8 7 + 7 0", combine("+", (Node(57), Node(87), Node(70))))
    assert three[0] == "A = 5 7 + 8 7 + 7 0 , two at a time :" and three[-1] == "So A is 2 1 4 ."
    assert "1 4 4 + 0 7 0 , column by column from the right :" in three  # the running total, then the next term
    assert "So 1 4 4 + 7 0 = 2 1 4 ." in three
    later = work_lines("B", "A - 8 6", combine("-", (Node(214, "+", (Node(57), Node(157))), Node(86))), ("A",))
    assert later[0] == "B = A - 8 6 , where A is 2 1 4 , so B = 2 1 4 - 0 8 6 , column by column from the right :"
    assert later[-1] == "So B is 1 2 8 ."


def _value(expr: str) -> int:
    terms = expr.split(" ")
    numbers, ops, current = [], [], []
    for t in terms:
        if t in "+-*":
            numbers.append(int("".join(current)))
            ops.append(t)
            current = []
        else:
            current.append(t)
    numbers.append(int("".join(current)))
    total = numbers[0]
    for op, y in zip(ops, numbers[1:]):
        total = total + y if op == "+" else total - y if op == "-" else total * y
    return total


def test_every_drawn_step_is_right() -> None:
    """Each column line's arithmetic, each step and each named result, for many drawn problems."""
    rng = random.Random(7)
    for _ in range(200):
        problem = draw_problem(rng, DrawConfig())
        values = {problem.name(n): n.value for n in problem.order}
        for line in make_trace(problem).lines:
            if re.fullmatch(r"(So|That is all :) [A-Z] is [0-9 ]+ \.", line):
                name, value = line.removeprefix("That is all : ").removeprefix("So ")[:-2].split(" is ")
                assert values[name] == int(value.replace(" ", "")), line
            elif line.startswith("So "):
                left, value = line[3:-2].split(" = ")
                assert _value(left) == int(value.replace(" ", "")), line
            elif line[0].isdigit() and line.endswith(" .") and " = " in line:
                left, value = line[:-2].split(" = ")
                terms = left.split(" ")
                x = int("".join(terms[:2]) if terms[1].isdigit() else terms[0])
                rest = terms[2:] if terms[1].isdigit() else terms[1:]
                total = x
                for op, y in zip(rest[::2], rest[1::2]):
                    total = total + int(y) if op == "+" else total - int(y) if op == "-" else total * int(y)
                assert total == int(value.replace(" ", "")), line


def _question(*definitions: str) -> str:
    return "\n".join(definitions)


def test_the_definitions_are_the_dag() -> None:
    """Independent subtasks share a round, a chain has one per round, and a one-digit definition is no subtask."""
    wide = parse_problem(_question("Work out G .", "A = 1 2 + 3 4 .", "B = 5 6 + 7 8 .", "C = A + B .", "D = 1 1 + 2 2 .",
                                   "E = 3 3 + 4 4 .", "F = D + E .", "G = C - F ."))
    assert Shape.of(wide).widths == (4, 2, 1) and subtasks(wide) == [["A", "B", "D", "E"], ["C", "F"], ["G"]]
    chain = parse_problem(_question("Work out B .", "A = C * 3 .", "B = A - 1 5 .", "C = 1 2 + 3 4 ."))
    assert Shape.of(chain).widths == (1, 1, 1) and subtasks(chain) == [["C"], ["A"], ["B"]]
    small = parse_problem(_question("Work out A .", "A = B * C .", "B = 6 9 + 6 7 .", "C = 2 + 5 ."))
    assert Shape.of(small).widths == (1, 1) and small.root.value == 136 * 7
    trace = make_trace(small)
    assert trace.lines[:3] == ["First , what needs only numbers : B .", "C = 2 + 5 , so C is 7 .", "Now B ."]
    assert "A = B * C , where B is 1 3 6 and C is 7 , so A = 1 3 6 * 7 , column by column from the right :" in trace.lines


def test_question_and_prompts_read_back() -> None:
    rng = random.Random(1)
    for _ in range(200):
        problem = draw_problem(rng, DrawConfig())
        again = parse_problem(problem.question)
        assert again.question == problem.question and again.root == problem.root
    assert read_prompt("Now B .") == "B" and read_prompt("Now 2 1 4 .") is None and read_prompt("hello") is None
    assert read_result("x\nSo 2 1 4 + 1 8 7 = 4 0 1 .\nSo B is 4 0 1 .") == ("B", 401)
    assert read_result("So 2 1 4 + 1 8 7 = 4 0 1 .") is None
    assert read_step("B = A - 8 6 , where A is 2 1 4 , so B = 2 1 4 - 0 8 6 , column by column from the right :\n4 - 6") == ("-", (214, 86))
    assert read_step("A = 5 7 + 8 7 + 7 0 , two at a time :") == ("+", (57, 87, 70))
    assert read_step("5 7 + 8 7 , column by column from the right :") is None
    for bad in ("Work out A .\nA = 1 2 + 3 4 - 5 6 .", "Work out B .\nA = 1 2 + 3 4 .", "Work out A .\nA = A + 1 2 .",
                "1 2 + 3 4"):
        with pytest.raises(ValueError):
            parse_problem(bad)


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
    one_digit = re.compile(r"^([A-Z]) = [0-9] [+*-] [0-9] , so \1 is [0-9] \.$", re.M)
    merged = [t for t in texts if any(one_digit.search(ph.plan) for ph in parse(t).phases)]
    assert merged  # a one-digit definition's line (`D = 3 + 4 , so D is 7 .`) inside a plan


def test_fidelity_tells_a_wrong_plan_from_a_wrong_sum() -> None:
    question = _question("Work out C .", "A = 5 6 + 7 8 .", "B = 1 2 + 3 4 .", "C = A - B .")
    good = ("<Question>\n" + question + "\n</Question>\n\n<Plan_1>\nFirst .\n\n<prompt_1.1> Now B . </prompt_1.1>"
            "\n\n<prompt_1.2> Now A . </prompt_1.2>\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\n"
            "B = 1 2 + 3 4 , column by column from the right :\nSo B is 4 7 .\n</execution_1.1>\n\n<execution_1.2>\n"
            "A = 5 6 + 7 8 , column by column from the right :\nSo A is 1 3 4 .\n</execution_1.2>\n</Execution_1>\n\n"
            "<Plan_2>\n<prompt_2.1> Now C . </prompt_2.1>\n</Plan_2>\n\n<Execution_2>\n<execution_2.1>\n"
            "C = A - B , where A is 1 3 4 and B is 4 7 , so C = 1 3 4 - 0 4 7 , column by column from the right :\nSo C is 8 7 .\n</execution_2.1>\n"
            "</Execution_2>\n\n<Final_answer>\n\\boxed{ 8 7 }\n</Final_answer>")
    # 12 + 34 is 46, not 47: the executor's slip; the plan, and the copy of what it reported, are still right
    reading = read_plan({"id": "a", "question": question, "trajectory": good})
    assert reading and reading.matches and reading.widths == (2, 1) and (reading.uses, reading.copied) == (2, 2)
    assert reading.miscomputed == 1 and not reading.answer_differs
    miscopied = good.replace("1 3 4 - 0 4 7", "1 3 4 - 0 4 8")
    reading = read_plan({"id": "b", "question": question, "trajectory": miscopied})
    assert reading and reading.matches and (reading.uses, reading.copied) == (2, 1)
    serial = good.replace("<prompt_1.2> Now A . </prompt_1.2>", "")
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
