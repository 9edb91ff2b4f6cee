"""The trajectory model: round trips, strictness, planner normalisation, token accounting."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import shared_example

from sprint.format import tags
from sprint.format.boxed import last_boxed
from sprint.format.trajectory import (
    Execution,
    Phase,
    Trajectory,
    TrajectoryError,
    count_tokens,
    normalize_plan,
    open_execution,
    open_executions,
    parse,
    render_prompt,
    strip_tags,
    token_counter,
)


@pytest.fixture(scope="module")
def example() -> str:
    """The worked example trajectory of ../shared/examples (skips without it, as in a fresh clone)."""
    return shared_example("trajectory.txt").read_text()


def words(text: str) -> int:
    """A transparent counter for hand-worked token arithmetic."""
    return len(text.split())


def test_example_round_trip_is_byte_identical(example: str):
    text = example
    traj = parse(text)
    assert traj.render() == text.strip()
    assert [p.number for p in traj.phases] == [1, 2]
    assert [pr.name for pr in traj.phases[0].prompts] == ["1.1", "1.2"]
    assert traj.phases[1].prompts == [] and traj.phases[1].executions == []
    assert traj.final_answer == "Therefore, the remainder is $\\boxed{2}$."


def test_render_from_parts_matches_format():
    traj = Trajectory(
        "What is 1+1?",
        [Phase(1, "Add them. <prompt_1.1> Compute 1+1. </prompt_1.1>", [Execution("1.1", "1+1 = 2.")]), Phase(2, "Done.")],
        "So $\\boxed{2}$.",
    )
    assert traj.render() == (
        "<Question>\nWhat is 1+1?\n</Question>\n\n"
        "<Plan_1>\nAdd them. <prompt_1.1> Compute 1+1. </prompt_1.1>\n</Plan_1>\n\n"
        "<Execution_1>\n<execution_1.1>\n1+1 = 2.\n</execution_1.1>\n</Execution_1>\n\n"
        "<Plan_2>\nDone.\n</Plan_2>\n\n<Execution_2>\nNo prompt to execute.\n</Execution_2>\n\n"
        "<Final_answer>\nSo $\\boxed{2}$.\n</Final_answer>"
    )
    assert parse(traj.render()) == traj


@pytest.mark.parametrize(
    "text, message",
    [
        ("<Question>\nq\n</Question>\n\n<Plan_1>\nplan\n", "never closed"),
        ("<Plan_1>\na <Plan_2> b </Plan_2>\n</Plan_1>", "opens inside"),
        ("<Plan_2>\nx\n</Plan_2>", "expected 1..1"),
    ],
)
def test_strict_parse_rejects_broken_text(text, message):
    with pytest.raises(TrajectoryError, match=message):
        parse(text)


def test_lenient_parse_keeps_complete_blocks_of_truncated_generation():
    text = "<think>\n<Plan_1>\nplan <prompt_1.1> go </prompt_1.1>\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\nres\n</execution_1.1>\n</Execution_1>\n\n<Plan_2>\nhalf"
    traj = parse(text, strict=False)
    assert len(traj.phases) == 1 and traj.phases[0].executions[0].text == "res"
    assert traj.final_answer is None


def test_truncated_final_answer_still_counts():
    traj = parse("<Plan_1>\np\n</Plan_1>\n\n<Final_answer>\nso \\boxed{3}")
    assert traj.final_answer == "so \\boxed{3}"


def test_normalize_sloppy_planner_output():
    raw = (
        "<Plan_3>\nFirst idea. <prompt> do A </prompt>\n"
        "<prompt_9.4> do B\n\nThen <prompt_3.1>do C</prompt_3.1> more.\n</Plan_3>\n<Execution_3>\nhallucinated"
    )
    out = normalize_plan(raw, 3)
    assert out.final_answer is None
    assert out.plan == (
        "First idea. <prompt_3.1> do A </prompt_3.1>\n<prompt_3.2> do B </prompt_3.2>\n\n"
        "Then <prompt_3.3> do C </prompt_3.3> more."
    )
    assert [p.name for p in Phase(3, out.plan).prompts] == ["3.1", "3.2", "3.3"]


def test_normalize_splits_final_answer_out_of_plan():
    out = normalize_plan("All done, nothing to run.\n<Final_answer>\nThe answer is $\\boxed{7}$.\n</Final_answer>", 2)
    assert out.plan == "All done, nothing to run."
    assert out.final_answer == "The answer is $\\boxed{7}$."


def test_sequential_tokens_by_hand_with_word_counter():
    # plan words: "a b" (2) + prompt "c d e" (3) + "f" (1) + prompt "g" (1) + "h i" (2) = 9
    plan = "a b <prompt_1.1> c d e </prompt_1.1> f <prompt_1.2> g </prompt_1.2> h i"
    traj = Trajectory("q", [Phase(1, plan, [Execution("1.1", "x " * 4), Execution("1.2", "y " * 10)]), Phase(2, "z z z")], "w w")
    counts = count_tokens(traj, words)
    ph1 = counts.phases[0]
    assert ph1.prompt_prefixes == [5, 7] and ph1.executions == [4, 10] and ph1.plan == 9
    assert ph1.sequential == max(9, 5 + 4, 7 + 10) == 17
    assert counts.phases[1].sequential == 3
    assert counts.sequential == 17 + 3 + 2
    # total: every word of the text after the question, tags included (a tag is one "word" here):
    # Plan_1 block 15, Execution_1 block 1 + (1 + 4 + 1) + (1 + 10 + 1) + 1 = 20, Plan_2 block 5,
    # Execution_2 block 1 + "No prompt to execute." 4 + 1 = 6, Final_answer block 4
    assert counts.total == 15 + 20 + 5 + 6 + 4
    # as decoded: phase 1 = max(plan block 15, "<Plan_1> a b <prompt_1.1> c d e </prompt_1.1>" 8 + execution
    # block 6, 8 + "f <prompt_1.2> g </prompt_1.2>" 4 + execution block 12) = 24; phase 2 = 5; final block 4
    assert counts.phases[0].decoded == 24 and counts.sequential_decoded == 24 + 5 + 4
    assert counts.planner == 9 + 3 + 2 and counts.executor == 14


def test_plan_after_last_prompt_can_dominate_phase():
    plan = "<prompt_1.1> a </prompt_1.1> " + "t " * 20
    traj = Trajectory("q", [Phase(1, plan, [Execution("1.1", "e")])])
    assert count_tokens(traj, words).sequential == 21


def test_tags_are_not_counted():
    assert strip_tags("<Plan_1>\nx <prompt_1.1> y </prompt_1.1>\n</Plan_1>") == "\nx  y \n"


def test_real_tokenizer_counts_example(tok_dir: Path, example: str):
    count = token_counter(str(tok_dir))
    assert count("Hello world") == 2
    traj = parse(example)
    counts = count_tokens(traj, count)
    ph1 = counts.phases[0]
    # each prompt prefix is the tag-stripped plan up to that prompt's end, counted independently
    plan = traj.phases[0].plan
    first_end = plan.index("</prompt_1.1>") + len("</prompt_1.1>")
    assert ph1.prompt_prefixes[0] == count(strip_tags(plan[:first_end]))
    assert ph1.sequential == max(ph1.plan, *(p + e for p, e in zip(ph1.prompt_prefixes, ph1.executions)))
    assert counts.planner + counts.executor == ph1.plan + sum(ph1.executions) + counts.phases[1].plan + count(traj.final_answer)
    assert counts.total == count(example.split("</Question>\n\n", 1)[1].rstrip("\n"))  # tags included
    assert counts.sequential < counts.sequential_decoded < counts.total


def test_context_helpers_build_what_callers_continue() -> None:
    """The contexts orchestration, the schedules and time-replay send, built from the format's helpers."""
    phase = Phase(2, "a " + render_prompt("2.1", "x") + " b", [Execution("2.1", "y")])
    prompt = phase.prompts[0]
    assert phase.streamed_plan(prompt) == "<Plan_2>\na <prompt_2.1> x </prompt_2.1>"
    assert open_executions(phase.render_plan(), 2) == "<Plan_2>\na <prompt_2.1> x </prompt_2.1> b\n</Plan_2>\n\n<Execution_2>\n"
    assert open_execution("2.1") == "<execution_2.1>\n"
    traj = Trajectory("q", [Phase(1, "p"), phase])
    assert traj.render_context() == traj.render_body() + "\n\n" and Trajectory("q").render_context() == ""
    assert traj.answer() is None and last_boxed("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"


def test_last_tag_reads_what_a_prompt_ends_with() -> None:
    head = "<Question>\nq\n</Question>\n\n<think>\n"
    executor = tags.last_tag(head + "<execution_1.3>\n")
    assert executor is not None and executor.opens_execution and (executor.phase, executor.prompt) == (1, "1.3")
    assert [t is not None and t.is_boundary for t in map(tags.last_tag, (head, head + "<Execution_2>x</Execution_2>"))] == [True, True]
    plan = tags.last_tag(head + tags.plan_open(4))
    assert plan is not None and plan.opens_plan and plan.phase == 4 and not plan.is_boundary
    final = tags.last_tag(head + tags.FINAL)
    assert final is not None and final.opens_final and final.text == "<Final_answer>"
    assert tags.last_tag("no tags at all") is None
