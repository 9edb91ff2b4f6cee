"""Task adapters: question text and gold answers for MATH, GPQA and Countdown rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sprint.core.errors import UserError
from sprint.tasks.grading import check_countdown
from sprint.tasks.registry import LETTERS, get_task, load_problems


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ---- MATH ---------------------------------------------------------------------------------------


def test_math_rows_keep_the_question_and_take_gold_from_answer_or_solution(tmp_path: Path) -> None:
    rows = [
        {"problem": "  What is 1+1?  ", "answer": "2", "solution": "It is \\boxed{3}.", "unique_id": "test/algebra/1.json"},
        {"problem": "What is 2+2?", "solution": "First \\boxed{5}, no: \\boxed{\\frac{8}{2}}.", "unique_id": "test/algebra/2.json"},
        {"problem": "No gold here", "unique_id": "test/x/3.json"},
    ]
    problems = load_problems(get_task("math"), _write_jsonl(tmp_path / "m.jsonl", rows))
    assert [p.id for p in problems] == ["test_algebra_1", "test_algebra_2", "test_x_3"]
    assert problems[0].question == "What is 1+1?"
    assert problems[0].gold == "2"  # the answer column wins over the solution
    assert problems[1].gold == "\\frac{8}{2}"  # last box of the solution, nested braces kept
    assert problems[2].gold is None
    task = get_task("math")
    assert task.grade("4", problems[1].gold) is True
    assert task.grade("5", problems[1].gold) is False
    assert task.grade("4", None) is None  # nothing to grade against


def test_math500_local_copy_gives_safe_ids_and_answers(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPRINT_LOCAL_DATA", str(shared_data))
    problems = load_problems(get_task("math"), "HuggingFaceH4/MATH-500", range_spec="0:3")
    raw = [json.loads(line) for line in (shared_data / "math500" / "test.jsonl").read_text().splitlines()[:3]]
    assert [p.question for p in problems] == [r["problem"].strip() for r in raw]
    assert [p.gold for p in problems] == [r["answer"] for r in raw]
    for p, r in zip(problems, raw):
        assert "/" not in p.id and not p.id.endswith(".json")
        assert p.id == r["unique_id"][: -len(".json")].replace("/", "_")


# ---- GPQA ---------------------------------------------------------------------------------------


def _gpqa_rows(n: int) -> list[dict]:
    return [
        {
            "Record ID": f"rec{i}",
            "Question": f"Question number {i}?",
            "Correct Answer": f"right {i}",
            "Incorrect Answer 1": f"wrong a{i}",
            "Incorrect Answer 2": f"wrong b{i}",
            "Incorrect Answer 3": f"wrong c{i}",
        }
        for i in range(n)
    ]


def _options(question: str) -> dict[str, str]:
    return {line[1]: line[4:] for line in question.splitlines() if line[:1] == "(" and line[2:3] == ")"}


def test_gpqa_options_are_shuffled_labelled_and_the_gold_letter_names_the_correct_one(tmp_path: Path) -> None:
    rows = _gpqa_rows(24)
    problems = load_problems(get_task("gpqa"), _write_jsonl(tmp_path / "g.jsonl", rows))
    letters_used = set()
    for p, row in zip(problems, rows):
        assert p.id == row["Record ID"]
        assert p.question.startswith(row["Question"])
        options = _options(p.question)
        assert sorted(options) == list(LETTERS)
        assert sorted(options.values()) == sorted(
            [row["Correct Answer"], row["Incorrect Answer 1"], row["Incorrect Answer 2"], row["Incorrect Answer 3"]]
        )
        assert options[p.gold] == row["Correct Answer"]
        letters_used.add(p.gold)
        assert "\\boxed{" in p.question
    assert len(letters_used) >= 3  # a real shuffle, not always the same position

    # Fixed per item: the same row gives the same order whatever its position in the file.
    again = load_problems(get_task("gpqa"), _write_jsonl(tmp_path / "r.jsonl", list(reversed(rows))))
    by_id = {p.id: p for p in problems}
    for p in again:
        assert p.question == by_id[p.id].question and p.gold == by_id[p.id].gold
    # ...and a different seed gives a different shuffle for some items.
    other = load_problems(get_task("gpqa", seed=1), str(tmp_path / "g.jsonl"))
    assert any(a.gold != b.gold for a, b in zip(problems, other))

    task = get_task("gpqa")
    wrong = next(letter for letter in LETTERS if letter != problems[0].gold)
    assert task.grade(f"so \\boxed{{{problems[0].gold}}}", problems[0].gold) is True
    assert task.grade(f"\\boxed{{{wrong}}}", problems[0].gold) is False


def test_gpqa_row_without_the_answer_columns_is_a_user_error(tmp_path: Path) -> None:
    rows = [{"Question": "Q?", "Correct Answer": "x"}]
    with pytest.raises(UserError, match="Incorrect Answer 1"):
        load_problems(get_task("gpqa"), _write_jsonl(tmp_path / "g.jsonl", rows))


# ---- Countdown ----------------------------------------------------------------------------------


def test_countdown_rows_become_puzzles_with_a_checkable_gold(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPRINT_LOCAL_DATA", str(shared_data))
    problems = load_problems(get_task("countdown"), "Jiayi-Pan/Countdown-Tasks-3to4", range_spec="0:5")
    lines = (shared_data / "countdown" / "countdown_3to4_uft.jsonl").read_text().splitlines()
    test_rows = [r for r in map(json.loads, lines) if r["split"] == "test"][:5]  # default split: test
    assert len(problems) == 5
    task = get_task("countdown")
    for p, row in zip(problems, test_rows):
        assert p.gold == {"nums": row["nums"], "target": row["target"]}
        assert p.id == str(row["index"])
        assert str(row["target"]) in p.question
        assert all(str(n) in p.question for n in row["nums"])
        assert "exactly once" in p.question and "\\boxed{}" in p.question
        assert task.grade(f"\\boxed{{{row['solution']}}}", p.gold) is True
        assert check_countdown(row["solution"], p.gold["nums"], p.gold["target"])
        assert task.grade("\\boxed{1 + 1}", p.gold) is False


def test_countdown_without_nums_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="nums"):
        load_problems(get_task("countdown"), _write_jsonl(tmp_path / "c.jsonl", [{"target": 3}]))


def test_unknown_task_is_a_user_error() -> None:
    with pytest.raises(UserError, match="math, gpqa, countdown"):
        get_task("chess")
