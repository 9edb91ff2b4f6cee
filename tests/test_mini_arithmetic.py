"""The arithmetic task (`sprint mini-data --task arithmetic`): problems whose subtasks form a different DAG
each time, traces that try every digit, the teacher's components and DAG, and the real stages 1-3
packing each trace into exactly its ideal packing (read back by `sprint.mini.fidelity`)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sprint.core.data import iter_jsonl
from sprint.curation.trace_lines import split_lines
from sprint.format.trajectory import parse
from sprint.mini.arithmetic import (DrawConfig, Shape, Step, apply, copy_places, draw_problem, make_trace, parse_problem,
                                    prompt_equation, read_prompt, read_result, read_step, subtasks, work_lines)
from sprint.mini.fidelity import plan_figures, read_plan, read_run
from sprint.mini.figures import arithmetic_sections
from sprint.mini.generate import write_mini_data
from sprint.mini.ideal import ideal_trajectory
from sprint.mini.problems import MiniDataConfig
from sprint.mini.searches import ORDER
from sprint.mini.summary import print_summary
from sprint.tasks.registry import get_task
from tests.helpers import teacher_stages


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("arith") / "data"
    write_mini_data(MiniDataConfig(out=str(out), task="arithmetic", n_test=60, n_train=300, beyond=10, seed=3))
    return out


def test_problems_beyond_training_change_no_training_problem(data: Path, tmp_path: Path) -> None:
    write_mini_data(MiniDataConfig(out=str(tmp_path), task="arithmetic", n_test=60, n_train=300, beyond=0, seed=3))
    for name in ("train_traces.jsonl", "test.jsonl", "teacher.jsonl"):
        assert (tmp_path / name).read_bytes() == (data / name).read_bytes(), name
    assert not (tmp_path / "test_beyond.jsonl").exists() or not (tmp_path / "test_beyond.jsonl").read_text()


def test_same_options_same_bytes(data: Path, tmp_path: Path) -> None:
    write_mini_data(MiniDataConfig(out=str(tmp_path), task="arithmetic", n_test=60, n_train=300, beyond=10, seed=3))
    for name in ("train_traces.jsonl", "test.jsonl", "teacher.jsonl", "corpus.jsonl", "test_beyond.jsonl"):
        assert (tmp_path / name).read_bytes() == (data / name).read_bytes(), name


def test_a_search_tries_every_digit() -> None:
    problem = parse_problem(_question("Find C , keeping only last digits .", "A + 7 = 3 .", "B * 3 = A .", "C + B = A ."))
    a, b, c = problem.order
    assert (a.value, b.value, c.value) == (6, 2, 4) and (b.target, c.k, c.target) == (6, 2, 6)
    lines = work_lines(problem, a)
    assert lines[0] == "A + 7 = 3 , try each digit :" and len(lines) == 11
    assert lines[1] == "1 + 7 = 8 , want 3 , no ." and lines[6] == "6 + 7 = 3 , want 3 , yes ." and lines[-1] == "So A is 6 ."
    later = work_lines(problem, b)
    assert later[0] == "B * 3 = A , where A is 6 , so x * 3 = 6 , try each digit :"
    assert later[2] == "2 * 3 = 6 , want 6 , yes ." and later[-1] == "So B is 2 ."
    both = work_lines(problem, c)  # reading two unknowns, the first is the constant: a copy, no sum
    assert both[0] == "C + B = A , where B is 2 and A is 6 , so x + 2 = 6 , try each digit :"
    assert both[4] == "4 + 2 = 6 , want 6 , yes ." and both[-1] == "So C is 4 ."


def test_every_drawn_line_is_right() -> None:
    """Each try's sum or product and verdict, each looked-up digit and each named result, for many drawn problems."""
    rng = random.Random(7)
    for _ in range(200):
        problem = draw_problem(rng, DrawConfig())
        values = {problem.name(n): n.value for n in problem.order}
        head = None
        for line in make_trace(problem).lines:
            if match := re.fullmatch(r"So ([A-Z]) is ([0-9]) \.", line):
                assert values[match[1]] == int(match[2]), line
            elif match := re.fullmatch(r"([0-9]) ([+*]) ([0-9]) = ([0-9]) , want ([0-9]) , (yes|no) \.", line):
                x, op, k, v = int(match[1]), match[2], int(match[3]), int(match[4])
                assert v == apply(x, op, k) and head is not None and int(match[5]) == head.target, line
                assert (match[6] == "yes") == (v == head.target), line
            elif line.endswith(", try each digit :"):
                step = read_step(line)
                assert step is not None and step.restated_right, line
                assert all(values[n] == v for n, v in step.reads.items()), line
                head = next(n for n in problem.order if line.startswith(problem.equation(n) + " ,"))
                assert step.target == head.target, line
        assert " and ".join(f"{problem.name(n)} is {values[problem.name(n)]}" for n in problem.goal) == problem.answer


def _question(*lines: str) -> str:
    return "\n".join(lines)


def test_the_equations_are_the_dag() -> None:
    """Independent subtasks share a round, a chain has one per round, and the question asks for the sinks."""
    wide = parse_problem(_question("Find C , D , keeping only last digits .", "A + 1 = 5 .", "B * 3 = 6 .", "C + 2 = A .",
                                   "D + B = A ."))
    assert Shape.of(wide).widths == (2, 2) and subtasks(wide) == [["A", "B"], ["C", "D"]]
    assert [n.value for n in wide.order] == [4, 2, 2, 2] and wide.answer == "C is 2 and D is 2"
    chain = parse_problem(_question("Find C , keeping only last digits .", "A + 1 = 5 .", "B * 3 = A .", "C + 2 = B ."))
    assert Shape.of(chain).widths == (1, 1, 1) and subtasks(chain) == [["A"], ["B"], ["C"]]
    trace = make_trace(wide)
    assert trace.lines[:2] == ["First A + 1 = 5 , B * 3 = 6 .", "Now A + 1 = 5 ."]
    assert "Then C + 2 = A , D + B = A ." in trace.lines and trace.lines[-1] == "That is all : C is 2 and D is 2 ."
    assert trace.solution == "The answer is \\boxed{ C is 2 and D is 2 } ."
    assert trace.dag[str(len(trace.components))] == sorted([4, 5, 6])  # the closing reads C, D and its round's opening


def test_a_shuffled_trace_works_each_round_in_an_order_of_its_own() -> None:
    """`--shuffle-rounds`: the same rounds, subtasks and lines, each round in an order drawn from the question (the
    same every time), not always the question's; the teacher's components follow the lines."""
    rng, moved = random.Random(3), 0
    for _ in range(100):
        problem = draw_problem(rng, DrawConfig())
        plain, shuffled = make_trace(problem), make_trace(problem, shuffled=True)
        assert shuffled.lines == make_trace(problem, shuffled=True).lines

        def work(trace: Any) -> tuple[list[str], list[set[str]]]:  # the lines but the openings, the openings' names
            openings = [line for line in trace.lines if line.startswith(("First ", "Then "))]
            return (sorted(line for line in trace.lines if line not in openings),
                    [set(line.split(" ", 1)[1][:-2].split(" , ")) for line in openings])
        assert work(shuffled) == work(plain)
        assert shuffled.solution == plain.solution and len(shuffled.components) == len(plain.components)
        moved += shuffled.lines != plain.lines
        for c in shuffled.components:
            if c["prompt"] != "not found":  # a search: its instruction is the line above its range
                start = int(c["execution"].split("-")[0])
                assert shuffled.lines[start - 2] == c["prompt"] and shuffled.lines[start - 1].startswith(c["prompt"][4])
    assert moved > 30


def test_question_and_prompts_read_back() -> None:
    rng = random.Random(1)
    for _ in range(200):
        problem = draw_problem(rng, DrawConfig())
        again = parse_problem(problem.question)
        assert again.question == problem.question and again.answer == problem.answer
        assert [n.value for n in again.order] == [n.value for n in problem.order]
    assert read_prompt("Now B * 3 = 6 .") == "B" and read_prompt("Now 2 .") is None and read_prompt("Now B .") is None
    assert read_prompt("Now D + A = B .") == "D" and prompt_equation(" Now D + A = B . ") == "D + A = B"
    assert prompt_equation("Now B .") is None and read_prompt("hello") is None
    assert read_result("x\nSo A is 3 .\nSo B is 4 .") == ("B", 4) and read_result("So 2 + 3 = 5 .") is None
    step = read_step("D + A = B , where A is 4 and B is 2 , so x + 4 = 2 , try each digit :\n1 + 4")
    assert step == Step("+", 4, {"A": 4, "B": 2}, 2, True)
    assert read_step("A + 1 = 5 , try each digit :") == Step("+", 1, {}, 5, True)
    swapped = read_step("D + A = B , where A is 4 and B is 2 , so x + 2 = 4 , try each digit :")
    assert swapped == Step("+", 2, {"A": 4, "B": 2}, 4, False)  # the digits restated in each other's place
    assert read_step("C * 7 = A , where A is 6 , so x * 7 = 6 , try each digit :") == Step("*", 7, {"A": 6}, 6, True)
    slip = read_step("C * 7 = A , where A is 6 , so x * 3 = 6 , try each digit :")
    assert slip is not None and not slip.restated_right
    assert read_step("1 + 1 = 2 , no .") is None
    for bad in ("Find A , keeping only last digits .\nA + 1 = B .\nB + 1 = 2 .",   # read before it is defined
                "Find B , keeping only last digits .\nA + 1 = 5 .",              # asks for an unknown it lacks
                "Find A , keeping only last digits .\nA * 5 = 5 .",              # several digits solve it
                "Find A , keeping only last digits .\nA + 4 = 4 .",              # only 0, which no try reaches
                "Find A , keeping only last digits .\nB + 1 = 5 .",              # not named in order
                "Find B , keeping only last digits .\nA + 1 = 5 .\nB * A = A .",  # an unknown constant only adds
                "Find B , keeping only last digits .\nA + 1 = 5 .\nB + A = A .",  # then x is 0
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


def test_grading_reads_the_digits_by_name() -> None:
    task = get_task("arithmetic-mini")
    gold = "A is 7 and C is 2 and D is 3"
    assert task.grade(task.extract("The answer is \\boxed{ A is 7 and C is 2 and D is 3 } ."), gold)
    assert task.grade(task.extract("\\boxed{A is 7  and C is 2 and D is 3}"), gold)  # spacing aside
    assert not task.grade(task.extract("\\boxed{ A is 7 and C is 2 and D is 4 }"), gold)
    assert not task.grade(task.extract("\\boxed{ A is 7 and B is 2 and D is 3 }"), gold)  # another unknown's name
    assert not task.grade(task.extract("\\boxed{ A is 7 and C is 2 }"), gold)
    assert not task.grade(task.extract("\\boxed{ 7 2 3 }"), gold)
    assert not task.grade(None, gold)


def test_a_share_of_traces_check_the_last_step_twice(data: Path) -> None:
    thoughts = [row["thought"] for row in iter_jsonl(data / "train_traces.jsonl")]
    twice = sum("once more :" in t for t in thoughts)
    assert 0.15 < twice / len(thoughts) < 0.35


def test_stages_1_to_3_over_the_teacher_pack_the_ideal_plans(data: Path, tmp_path: Path) -> None:
    """The real stages against the real teacher server: every packed trajectory has exactly its problem's ideal
    packing (fidelity 1), every later execution copies the results it reads, and the packing rules all occur:
    later phases with prompts, `Based on` lines."""
    _, records = teacher_stages(data, 80, tmp_path, "--parallelization-threshold", "0")
    assert len(records) == 80 and all(r["status"] == "ok" for r in records)
    figures = plan_figures(read_run(tmp_path / "p"))
    assert figures.well_formed == figures.fidelity == figures.copies == 1.0 and figures.uses > 0
    texts = [r["trajectory"] for r in records]
    assert any("Based on execution_2." in t for t in texts)
    assert any(len(parse(t).phases) > 2 and parse(t).phases[1].prompts for t in texts)


def test_fidelity_tells_a_wrong_plan_from_a_wrong_search() -> None:
    question = _question("Find C , keeping only last digits .", "A + 1 = 5 .", "B * 3 = 6 .", "C + B = A .")
    good = ("<Question>\n" + question + "\n</Question>\n\n<Plan_1>\nFirst .\n\n<prompt_1.1> Now B * 3 = 6 . </prompt_1.1>"
            "\n\n<prompt_1.2> Now A + 1 = 5 . </prompt_1.2>\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\n"
            "B * 3 = 6 , try each digit :\nSo B is 3 .\n</execution_1.1>\n\n<execution_1.2>\n"
            "A + 1 = 5 , try each digit :\nSo A is 4 .\n</execution_1.2>\n</Execution_1>\n\n"
            "<Plan_2>\n<prompt_2.1> Now C + B = A . </prompt_2.1>\n</Plan_2>\n\n<Execution_2>\n<execution_2.1>\n"
            "C + B = A , where B is 3 and A is 4 , so x + 3 = 4 , try each digit :\nSo C is 1 .\n"
            "</execution_2.1>\n</Execution_2>\n\n<Final_answer>\n\\boxed{ C is 1 }\n</Final_answer>")
    # 3 * 3 is 9, not 6: the executor's slip; the plan, and the copy of what it reported, are still right
    reading = read_plan({"id": "a", "question": question, "trajectory": good})
    assert reading and reading.matches and reading.widths == (2, 1) and (reading.uses, reading.copied) == (2, 2)
    assert reading.miscomputed == 1 and not reading.answer_differs
    assert reading.heads == (("round 1, first", True), ("round 1, second", True), ("later rounds, first", True))
    assert reading.searches == tuple((place, ORDER) for place, _ in reading.heads)  # the tries are left out here
    swapped = read_plan({"id": "e", "question": question, "trajectory": good.replace("B * 3 = 6 ,", "B * 3 = 4 ,")})
    assert swapped and swapped.heads[0] == ("round 1, first", False) and all(right for _, right in swapped.heads[1:])
    assert swapped.prompts == reading.prompts == reading.heads  # the executor miscopied its prompt, not the planner
    planner = read_plan({"id": "f", "question": question, "trajectory": good.replace("Now C + B = A", "Now C + A = B")})
    assert planner and planner.prompts[2] == ("later rounds, first", False) and planner.heads == reading.heads
    miscopied = good.replace("where B is 3 and A is 4", "where B is 2 and A is 4")
    reading = read_plan({"id": "b", "question": question, "trajectory": miscopied})
    assert reading and reading.matches and (reading.uses, reading.copied) == (2, 1)
    serial = good.replace("<prompt_1.2> Now A + 1 = 5 . </prompt_1.2>", "")
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
    copies = lines[lines.index("## Equations copied from the question, by the subtask's place in its round") + 6:][:6]
    assert [row.split(" | ")[0] for row in copies] == [f"| {place}" for place in copy_places()]
    assert all(cell.startswith("0 of ") for row in copies for cell in row.rstrip(" |").split(" | ")[1:])
    searched = lines[lines.index("## The searches, try by try") + 6:][:7]
    assert searched[-1].startswith("| all | 0 of ") and searched[-1] != "| all | 0 of 0 |"
    assert all(row.split(" | ")[1].startswith("0 of ") for row in searched)
    depth_rows = [line for line in lines if line.startswith("| 1 |") or line.startswith("| 2 |") or line.startswith("| 3 |")]
    assert depth_rows and all(row.split(" | ")[2] == row.split(" | ")[3].rstrip(" |") for row in depth_rows)
    assert (root / "miniature" / "figure5.png").stat().st_size > 1000
    assert not (root / "evaluation").exists()  # evaluate's folder, which it replaces whole, holds nothing of the summary


def test_the_summary_of_a_folder_without_sprint_runs_still_writes_its_file(tmp_path: Path) -> None:
    """`sprint mini-summary --task arithmetic` on a folder that holds Table 2 but no SPRINT run: no sections, and
    its miniature.md is written all the same, in its own folder."""
    (tmp_path / "evaluation").mkdir()
    (tmp_path / "evaluation" / "table2.json").write_text(json.dumps({"rows": []}))
    assert print_summary(str(tmp_path), "arithmetic") == 0
    assert (tmp_path / "miniature" / "miniature.md").read_text() == "# The miniature's own figures\n\n\n"
