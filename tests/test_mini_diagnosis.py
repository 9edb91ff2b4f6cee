"""Where a mini SPRINT run's wrong answers went wrong (`sprint.mini.diagnosis`): each verdict from a
trajectory written the way the trained model writes them, with one thing broken."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sprint.mini.countdown import branches, search
from sprint.mini.diagnosis import (ANSWER_COPY, CHECK_COPY, CORRECT, EXECUTION, FAILED_PAIR, MALFORMED, Diagnosis,
                                   arithmetic, diagnose, judge)
from tests.helpers import mini_trajectory

NUMS, TARGET = (4, 3, 4), 19  # only the pair 4 and 4 (kept 3) reaches 19: ( 4 * 4 ) + 3


def trajectory(**parts: Any) -> str:
    """A SPRINT trajectory for NUMS/TARGET as the packer lays it out; keyword arguments override one part."""
    return mini_trajectory(NUMS, TARGET, **parts)


def record(text: str, correct: bool = False) -> dict:
    return {"gold": {"nums": list(NUMS), "target": TARGET}, "trajectory": text, "correct": correct}


def test_each_failure_is_placed_where_it_happened() -> None:
    d = Diagnosis()
    assert judge(record(trajectory(), correct=True), d) == CORRECT
    assert (d.executions, d.exact) == (3, 3)
    executions = ["\n".join(search(pair, rest, TARGET).lines[1:]) for pair, rest in branches(NUMS)]
    executions[0] = executions[0].replace("11 3 28", "11 3 27")
    assert judge(record(trajectory(executions=executions)), d) == EXECUTION
    assert (d.executions, d.exact) == (6, 5)
    assert judge(record(trajectory(based=1)), d) == FAILED_PAIR  # 4 and 3 (kept 4) found nothing
    assert judge(record(trajectory(check="( 4 + 4 ) + 3")), d) == CHECK_COPY
    assert judge(record(trajectory(answer="( 4 * 3 ) + 4")), d) == ANSWER_COPY
    assert judge(record("<Plan_1>\nOkay"), d) == MALFORMED
    assert d.executions == 15  # a malformed trajectory has no executions to count


def test_a_run_folder_is_counted(tmp_path: Path) -> None:
    rows = [record(trajectory(), correct=True), record(trajectory(check="( 4 + 4 ) + 3"))]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = diagnose(tmp_path)
    assert d.verdicts == {CORRECT: 1, CHECK_COPY: 1}
    assert d.exact_share == 1.0


def test_arithmetic_grades_each_step_given_the_numbers_its_line_wrote(tmp_path: Path) -> None:
    right = trajectory()  # 3 result lines per execution, each a first step and its results (up to 3)
    slip = right.replace("4 + 3 = 7 , with 4 for 19 : 11 3 28", "4 + 3 = 8 , with 4 for 19 : 12 4 32", 1)
    (tmp_path / "records.jsonl").write_text(json.dumps(record(right)) + "\n")
    exact = arithmetic(tmp_path)
    assert exact.right == exact.steps == 12 + 10 + 12  # the hit line of pair 4 and 4 stops at its first result
    assert 0 < exact.chance < 1
    (tmp_path / "records.jsonl").write_text(json.dumps(record(slip)) + "\n")
    slipped = arithmetic(tmp_path)  # 4 + 3 = 8 is wrong; 12 4 32 are right for the 8 it wrote
    assert (slipped.right, slipped.steps) == (exact.steps - 1, exact.steps)
