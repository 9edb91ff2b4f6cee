"""The exact Countdown checker: the shared dataset's reference solutions and crafted cases."""

from __future__ import annotations

import json

import pytest
from tests.helpers import shared_path

from sprint.tasks.grading import check_countdown


def _rows() -> list[dict]:
    path = shared_path("countdown/countdown_3to4_uft.jsonl")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return _rows()


def test_every_reference_solution_passes(rows: list[dict]) -> None:
    assert len(rows) == 11264
    failed = [r for r in rows if not check_countdown(r["solution"], r["nums"], r["target"])]
    assert failed == []


def test_reference_solutions_fail_for_another_target(rows: list[dict]) -> None:
    sample = rows[::50]
    assert not any(check_countdown(r["solution"], r["nums"], r["target"] + 1) for r in sample)


def test_reference_solutions_with_expr_equals_target(rows: list[dict]) -> None:
    sample = rows[::50]
    for r in sample:
        nums, target, solution = r["nums"], r["target"], r["solution"]
        assert check_countdown(f"{solution} = {target}", nums, target)
        assert check_countdown(f"{target} = {solution}", nums, target)
        assert not check_countdown(f"{solution} = {target + 1}", nums, target)


def test_numbers_must_be_the_given_ones(rows: list[dict]) -> None:
    """Missing, reused and foreign numbers are rejected even when the value is right."""
    for r in rows[:200]:
        nums, target = r["nums"], r["target"]
        total = sum(nums)
        plus_all = " + ".join(str(n) for n in nums)
        assert check_countdown(plus_all, nums, total)
        # a number left out
        assert not check_countdown(" + ".join(str(n) for n in nums[1:]), nums, total - nums[0])
        # a number used twice
        assert not check_countdown(f"{plus_all} + {nums[0]}", nums, total + nums[0])
        # a number that was not given
        changed = [nums[0] + 1] + nums[1:]
        assert not check_countdown(" + ".join(str(n) for n in changed), nums, total + 1)
        # the reference solution with one given number swapped for another value
        assert not check_countdown(r["solution"], nums[:-1] + [nums[-1] + 1], target)


@pytest.mark.parametrize(
    ("expr", "nums", "target", "expected"),
    [
        # fractions on the way are fine when the end result is exact
        ("8 / 3 * 3", [8, 3, 3], 8, True),
        ("(1 / 3 + 1) * 3", [1, 3, 1, 3], 4, True),
        ("7 / 2 * 2", [7, 2, 2], 7, True),
        ("7 / 2 + 2", [7, 2, 2], 5, False),  # 5.5
        ("(6 / 4) * 2 / 3", [6, 4, 2, 3], 1, True),
        # division by zero is invalid, never a crash
        ("5 / (3 - 3) + 1", [5, 3, 3, 1], 1, False),
        ("(5 - 5) / (3 - 3)", [5, 5, 3, 3], 0, False),
        # notation
        (r"44 \times 2 - 3 = 85", [44, 2, 3], 85, True),
        ("(44 ÷ 4) × 5 − 2", [44, 4, 5, 2], 53, True),
        (r"\frac{44}{4} \cdot 5 - 2", [44, 4, 5, 2], 53, True),
        (r"\left( 44 \div 4 \right) * 5 - 2", [44, 4, 5, 2], 53, True),
        (r"$\boxed{(44 : 4) * 5 - 2}$", [44, 4, 5, 2], 53, True),
        ("[44 - 4] * 5 - 2", [44, 4, 5, 2], 198, True),
        # not allowed
        ("-44 + 4 + 5", [44, 4, 5], -35, False),  # unary minus
        ("2 ** 3 + 1", [2, 3, 1], 9, False),
        ("8 ^ 2 + 1", [8, 2, 1], 11, False),
        ("9 // 2 + 1", [9, 2, 1], 5, False),
        ("44.0 + 19 + 35", [44, 19, 35], 98, False),
        ("2(3 + 4) + 1", [2, 3, 4, 1], 15, False),
        ("44 + 19 + 35 = 98 = 98", [44, 19, 35], 98, False),
        ("44 + 19 = 63, 63 + 35 = 98", [44, 19, 35], 98, False),
        ("44 + 19 + 35 = 44 + 54", [44, 19, 35], 98, False),
        # garbage
        ("hello", [1, 2, 3], 6, False),
        ("__import__('os').system('true')", [1, 2, 3], 6, False),
        ("1 + 2 + 3; 6", [1, 2, 3], 6, False),
        ("(1 + 2 + 3", [1, 2, 3], 6, False),
        ("98", [44, 19, 35], 98, False),
        ("(" * 90 + "1 + 2 + 3" + ")" * 90, [1, 2, 3], 6, True),  # redundant brackets are fine
        ("(" * 5000 + "1 + 2 + 3" + ")" * 5000, [1, 2, 3], 6, False),  # absurdly long: no crash
        ("", [1, 2, 3], 6, False),
        (None, [1, 2, 3], 6, False),
    ],
)
def test_crafted_cases(expr: str | None, nums: list[int], target: int, expected: bool) -> None:
    assert check_countdown(expr, nums, target) is expected
