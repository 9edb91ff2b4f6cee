"""Where a sequential arithmetic output first leaves the generator's trace (`sprint.mini.departure`): each
kind from the generator's own trace with one line broken, read back from a run's records."""

from __future__ import annotations

import json
import random
from pathlib import Path

from sprint.mini.arithmetic import DrawConfig, draw_problem, make_trace, parse_problem
from sprint.mini.departure import (KINDS, RIGHT, UNREAD, departures, first_departure, format_departures, head_copies,
                                   kind_of, rft_head_copies)

QUESTION = "Find C , D , keeping only last digits .\nA + 7 = 3 .\nB * 3 = 4 .\nC * 7 = A .\nD + B = A ."


def generation(lines: list[str]) -> str:
    trace = make_trace(parse_problem(QUESTION))
    return "<think>\n" + "\n".join(lines) + "\n</think>\n\n" + trace.solution


def broken(kind: str) -> str:
    """The generator's trace with the first line of this kind changed."""
    lines = make_trace(parse_problem(QUESTION)).lines
    i = next(k for k, line in enumerate(lines) if kind_of(line) == kind)
    return generation([*lines[:i], lines[i].replace(" . ", " , ", 1) + " x", *lines[i + 1:]])


def test_the_generators_trace_with_or_without_its_check_departs_nowhere() -> None:
    problem = parse_problem(QUESTION)
    assert first_departure(QUESTION, generation(make_trace(problem).lines)) is None
    assert first_departure(QUESTION, generation(make_trace(problem, recheck=True).lines)) is None


def test_each_kind_of_line_is_named_where_it_first_goes_wrong() -> None:
    lines = make_trace(parse_problem(QUESTION)).lines
    kinds = {kind_of(line) for line in lines}
    assert kinds == {"round names", "prompt", "definition", "try", "result", "lookup head", "end"}
    for kind in kinds:
        found = first_departure(QUESTION, broken(kind))
        assert found is not None and found.kind == kind, kind
        assert found.want == lines[found.line] and found.got.endswith(" x")
    stopped = first_departure(QUESTION, generation(lines[:5]))
    assert stopped is not None and (stopped.line, stopped.got) == (5, "")  # a trace cut short
    assert stopped.want == lines[5]


def test_a_runs_records_are_counted_by_kind(tmp_path: Path) -> None:
    rows = [{"question": QUESTION, "generation": generation(make_trace(parse_problem(QUESTION)).lines)},
            {"question": QUESTION, "generation": broken("lookup head")},
            {"question": QUESTION, "generation": broken("try")},
            {"question": QUESTION, "generation": None},
            {"question": "Use 4 3 4 to make 19 .", "generation": "x"}]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen = departures(tmp_path)
    assert seen.counts == {RIGHT: 1, "lookup head": 1, "try": 1, "round names": 1, UNREAD: 1}
    assert set(seen.examples) == {"lookup head", "try", "round names"}
    lines = format_departures(seen)
    assert lines[0].endswith("of 5  the generator's trace, line for line")
    at = lines.index("   1 of 5  " + KINDS["lookup head"])
    assert lines[at + 1].startswith("          e.g. want: C * 7 = A , where A is 6 , so x * 7 = 6")
    assert lines[at + 2].endswith(" x")


def test_every_line_of_drawn_traces_has_a_kind() -> None:
    rng = random.Random(0)
    for _ in range(50):
        problem = draw_problem(rng, DrawConfig())
        trace = make_trace(problem, recheck=True)
        assert {kind_of(line) for line in trace.lines} <= set(KINDS)
        assert first_departure(problem.question, generation(trace.lines)) is None
        assert first_departure(problem.question, generation(make_trace(problem, shuffled=True).lines)) is None


def test_rfts_equations_are_read_by_their_place_in_the_round(tmp_path: Path) -> None:
    """Each equation after a `Now` line, against the question's line of that name: A and B in round 1, C and D after."""
    right = generation(make_trace(parse_problem(QUESTION)).lines)
    assert head_copies(QUESTION, right) == [("round 1, first", True), ("round 1, second", True),
                                            ("later rounds, first", True), ("later rounds, second", True)]
    wrong = right.replace("B * 3 = 4 , try", "B * 3 = 7 , try")
    assert head_copies(QUESTION, wrong)[1] == ("round 1, second", False)
    rows = [{"question": QUESTION, "generation": right}, {"question": QUESTION, "generation": wrong},
            {"question": "Use 4 3 4 to make 19 .", "generation": "x"}]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rft_head_copies(tmp_path) == {"round 1, first": (0, 2), "round 1, second": (1, 2),
                                         "later rounds, first": (0, 2), "later rounds, second": (0, 2)}
