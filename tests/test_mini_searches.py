"""Each search read back try by try (`sprint.mini.searches`): the generator's own work has no error, each kind of
slip is named where it first occurs, and a sequential thought is cut into its subtasks' work by place."""

from __future__ import annotations

import json
import random
from pathlib import Path

from sprint.mini.arithmetic import DrawConfig, draw_problem, make_trace, parse_problem, work_lines
from sprint.mini.searches import (HEAD, OPERANDS, ORDER, RESTATED, RESULT, VALUE, VERDICT, search_error,
                                  sequential_search_errors, sequential_works, tally_errors)

QUESTION = "Find C , D , keeping only last digits .\nA + 7 = 3 .\nB * 3 = 4 .\nC * 7 = A .\nD + B = A ."


def test_the_generators_searches_have_no_error() -> None:
    rng = random.Random(5)
    for _ in range(50):
        problem = draw_problem(rng, DrawConfig())
        for node in problem.order:
            assert search_error("\n".join(work_lines(problem, node))) is None


def test_each_slip_is_named_where_it_first_occurs() -> None:
    problem = parse_problem(QUESTION)
    d = problem.order[3]  # D + B = A: B is 8, A is 6, so x + 8 = 6 and D is 8
    lines = work_lines(problem, d)
    assert lines[0] == "D + B = A , where B is 8 and A is 6 , so x + 8 = 6 , try each digit :"
    assert lines[8] == "8 + 8 = 6 , want 6 , yes ." and lines[-1] == "So D is 8 ."

    def slip(i: int, old: str, new: str) -> str | None:
        assert old in lines[i]
        return search_error("\n".join([*lines[:i], lines[i].replace(old, new, 1), *lines[i + 1:]]))

    assert slip(0, "D + B = A , where", "the digit D , where") == HEAD
    assert slip(0, "so x + 8 = 6", "so x + 8 = 5") == RESTATED
    assert slip(0, "so x + 8 = 6", "so x * 3 = 6") == RESTATED  # another equation's operation
    assert slip(3, "3 + 8", "4 + 8") == ORDER
    assert search_error("\n".join(lines[:5] + lines[6:])) == ORDER  # a try left out
    assert slip(3, "3 + 8 = 1", "3 * 8 = 1") == OPERANDS
    assert slip(3, "want 6", "want 5") == OPERANDS
    assert slip(3, "3 + 8 = 1", "3 + 8 = 2") == VALUE
    assert slip(8, "yes", "no") == VERDICT
    assert slip(3, "no", "yes") == VERDICT
    assert slip(10, "D is 8", "D is 7") == RESULT
    assert search_error("\n".join(lines[:-1])) == RESULT  # no digit found
    # the first slip is the one named
    assert search_error("\n".join([lines[0], lines[1].replace("= 9", "= 1"), *lines[2:-1], "So D is 7 ."])) == VALUE


def test_a_sequential_thought_is_cut_into_its_subtasks_work() -> None:
    problem = parse_problem(QUESTION)
    trace = make_trace(problem, recheck=True)
    works = sequential_works(trace.lines)
    assert [place for place, _, _ in works] == ["round 1, first", "round 1, second", "later rounds, first",
                                                "later rounds, second"]
    assert [prompt for _, prompt, _ in works] == [f"Now {problem.equation(n)} ." for n in problem.order]
    assert [work for _, _, work in works] == ["\n".join(work_lines(problem, n)) for n in problem.order]


def test_a_runs_searches_are_tallied_by_place_and_kind(tmp_path: Path) -> None:
    trace = make_trace(parse_problem(QUESTION))
    right = "<think>\n" + trace.thought + "\n</think>\n\n" + trace.solution
    wrong = right.replace("8 * 3 = 4 , want 4 , yes .", "8 * 3 = 4 , want 4 , no .")  # B's search, round 1, second
    rows = [{"question": QUESTION, "generation": right}, {"question": QUESTION, "generation": wrong}]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = sequential_search_errors(tmp_path)
    assert list(counts) == ["round 1, first", "round 1, second", "later rounds, first", "later rounds, second", "all"]
    assert counts["round 1, second"] == {"searches": 2, "wrong": 1, VERDICT: 1}
    assert counts["round 1, first"] == {"searches": 2, "wrong": 0}
    assert counts["all"] == {"searches": 8, "wrong": 1, VERDICT: 1}
    assert tally_errors([]) == {}
