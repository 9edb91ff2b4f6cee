"""Rewards of latency-aware GRPO on hand-written trajectories, values worked out by hand.

Token counts use a whitespace counter (one token per word, tags stripped by the trajectory model)
so each figure below can be checked on paper.
"""

from __future__ import annotations

import json

import pytest

from sprint.core.errors import UserError
from sprint.rl.rewards import batch_rewards, correctness, format_score, latency, model_answer, trajectory_infos
from sprint.tasks.registry import get_task


def words(text: str) -> int:
    return len(text.split())


QUESTION = "What is (2+3)+(4+5)?"

# Phase 1: plan "Split the sum." + two prompts (3 + 4 + 4 = 11 words); prefix up to prompt 1.1 = 7,
# up to prompt 1.2 = 11; executions 5 words each -> phase cost max(11, 7+5, 11+5) = 16.
# Phase 2: plan "Combine: 5 + 9." = 4, no prompt -> 4. Final "The sum is \boxed{14}." = 4.
# Sequential = 16 + 4 + 4 = 24. Total = every word after the question, tags included (each tag one word):
# Plan_1 block 17 + Execution_1 block 16 + Plan_2 block 6 + Execution_2 block 6 + Final_answer block 6 = 51.
PARALLEL = """<Question>
What is (2+3)+(4+5)?
</Question>

<Plan_1>
Split the sum.
<prompt_1.1> Add 2 and 3. </prompt_1.1>
<prompt_1.2> Add 4 and 5. </prompt_1.2>
</Plan_1>

<Execution_1>
<execution_1.1>
2 plus 3 is 5
</execution_1.1>

<execution_1.2>
4 plus 5 is 9
</execution_1.2>
</Execution_1>

<Plan_2>
Combine: 5 + 9.
</Plan_2>

<Execution_2>
No prompt to execute.
</Execution_2>

<Final_answer>
The sum is \\boxed{14}.
</Final_answer>"""

# The same work one step after the other: phase 1 = 7 + 5 = 12, phase 2 = ("Next part." 2 + 4) + 5
# = 11, phase 3 = 4, final 4 -> sequential 31 (nothing runs in parallel).
SEQUENTIAL = """<Question>
What is (2+3)+(4+5)?
</Question>

<Plan_1>
Split the sum.
<prompt_1.1> Add 2 and 3. </prompt_1.1>
</Plan_1>

<Execution_1>
<execution_1.1>
2 plus 3 is 5
</execution_1.1>
</Execution_1>

<Plan_2>
Next part.
<prompt_2.1> Add 4 and 5. </prompt_2.1>
</Plan_2>

<Execution_2>
<execution_2.1>
4 plus 5 is 9
</execution_2.1>
</Execution_2>

<Plan_3>
Combine: 5 + 9.
</Plan_3>

<Execution_3>
No prompt to execute.
</Execution_3>

<Final_answer>
The sum is \\boxed{14}.
</Final_answer>"""

WRONG = PARALLEL.replace("\\boxed{14}", "\\boxed{15}")

# <Plan_1> never closes: strict parsing fails; the lenient parse keeps only the final answer.
MALFORMED = """<Question>
What is (2+3)+(4+5)?
</Question>

<Plan_1>
Split the sum.
<prompt_1.1> Add 2 and 3. </prompt_1.1>

<Execution_1>
<execution_1.1>
2 plus 3 is 5
</execution_1.1>
</Execution_1>

<Final_answer>
\\boxed{14}
</Final_answer>"""

REFERENCE = 48  # the problem's sequential length (e.g. a baseline run's)
MATH = get_task("math")


def test_token_accounting_of_hand_written_trajectories():
    par = trajectory_infos(PARALLEL, words)
    seq = trajectory_infos(SEQUENTIAL, words)
    assert (par["sequential_tokens"], par["total_tokens"]) == (24, 51)
    # total: blocks Plan_1 11 + Execution_1 9 + Plan_2 10 + Execution_2 9 + Plan_3 6 + Execution_3 6 + Final 6
    assert (seq["sequential_tokens"], seq["total_tokens"]) == (31, 57)
    assert (par["num_phases"], par["num_prompts"], par["executed_prompts"]) == (2, 2, 2)
    assert (seq["num_phases"], seq["num_prompts"], seq["executed_prompts"]) == (3, 2, 2)
    assert par["parses"] and seq["parses"] and par["final_answer"] == "The sum is \\boxed{14}."
    json.dumps(par)  # rollout_infos travel over HTTP: must be JSON


def test_correct_short_critical_path_earns_more_latency_than_a_long_one():
    par, seq = trajectory_infos(PARALLEL, words), trajectory_infos(SEQUENTIAL, words)
    assert correctness(par, MATH, "14") == 1.0 and correctness(seq, MATH, "14") == 1.0
    assert latency(par, MATH, "14", REFERENCE) == pytest.approx(1 - 24 / 48)  # 0.5
    assert latency(seq, MATH, "14", REFERENCE) == pytest.approx(1 - 31 / 48)  # 17/48
    assert latency(seq, MATH, "14", 20) == 0.0  # longer than the reference: clipped at 0, never negative
    assert format_score(par, MATH) == 1.0 and format_score(seq, MATH) == 1.0


def test_incorrect_answer_earns_no_correctness_and_no_latency():
    wrong = trajectory_infos(WRONG, words)
    assert wrong["sequential_tokens"] == 24  # as short as the correct one ...
    assert correctness(wrong, MATH, "14") == 0.0
    assert latency(wrong, MATH, "14", REFERENCE) == 0.0  # ... but speed is paid only for a right answer
    assert format_score(wrong, MATH) == 1.0  # well formed all the same


def test_malformed_trajectory_loses_the_parse_check_and_the_latency_term():
    bad = trajectory_infos(MALFORMED, words)
    assert not bad["parses"] and bad["num_phases"] == 0 and bad["sequential_tokens"] == 1
    assert correctness(bad, MATH, "14") == 1.0  # the answer itself is right
    assert latency(bad, MATH, "14", REFERENCE) == 0.0  # but an unmeasurable critical path earns nothing
    assert format_score(bad, MATH) == pytest.approx(2 / 3)  # executed (none pending) + answered, not parsed


def test_failed_or_forced_runs_lose_their_format_checks():
    missing = PARALLEL.replace("<execution_1.2>\n4 plus 5 is 9\n</execution_1.2>", "")
    failed = trajectory_infos(missing, words, status="error")
    assert failed["executed_prompts"] == 1 and failed["num_prompts"] == 2
    assert correctness(failed, MATH, "14") == 0.0  # an errored run is never rewarded as correct
    assert format_score(failed, MATH) == pytest.approx(2 / 3)  # parses + answered; prompt 1.2 not executed
    forced = trajectory_infos(PARALLEL, words, forced_final=True)
    assert format_score(forced, MATH) == pytest.approx(2 / 3)  # the answer was pre-filled, not the model's
    unanswered = trajectory_infos(PARALLEL.replace("The sum is \\boxed{14}.", "I am not sure."), words)
    assert format_score(unanswered, MATH) == pytest.approx(2 / 3) and correctness(unanswered, MATH, "14") == 0.0


COUNTDOWN_QUESTION = ("Using the numbers 44, 19, 35, write an arithmetic expression whose value is 98. Each number "
                      "must be used exactly once; you may use +, -, \\times and \\div and parentheses. Give the "
                      "expression (without the result) inside \\boxed{}, e.g. \\boxed{(1 + 2) \\times 3}.")


def countdown(final: str) -> str:
    return (f"<Question>\n{COUNTDOWN_QUESTION}\n</Question>\n\n<Plan_1>\nTry sums.\n<prompt_1.1> Add 19 and 35. "
            f"</prompt_1.1>\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\n19 + 35 = 54\n</execution_1.1>\n"
            f"</Execution_1>\n\n<Final_answer>\n{final}\n</Final_answer>")


def test_countdown_uses_the_exact_checker_and_never_the_questions_example_box():
    task = get_task("countdown")
    gold = {"nums": [44, 19, 35], "target": 98}
    right = trajectory_infos(countdown("\\boxed{44 + (19 + 35)}"), words)
    reuse = trajectory_infos(countdown("\\boxed{44 + 19 + 35 + 0}"), words)  # 98, but a number not given
    silent = trajectory_infos(countdown("I could not find one."), words)
    assert correctness(right, task, gold) == 1.0
    assert correctness(reuse, task, gold) == 0.0
    assert model_answer(silent, task) is None  # the question's `\boxed{(1 + 2) \times 3}` is not an answer
    assert correctness(silent, task, gold) == 0.0
    # plan "Try sums. Add 19 and 35." 6 words (prefix = whole plan) + execution "19 + 35 = 54" 5 -> 11;
    # final "\boxed{44 + (19 + 35)}" 5 words -> 16
    assert right["sequential_tokens"] == 16
    assert latency(right, task, gold, 32) == pytest.approx(0.5)


def test_batch_rewards_as_ms_swift_calls_them():
    infos = [trajectory_infos(t, words) for t in (PARALLEL, SEQUENTIAL, WRONG, countdown("\\boxed{44 + (19 + 35)}"))]
    tasks = ["math", "math", "math", "countdown"]
    golds = [json.dumps("14")] * 3 + [json.dumps({"nums": [44, 19, 35], "target": 98})]
    refs = [48, 48, 48, 32]
    assert batch_rewards("sprint_correct", infos, tasks, golds, refs) == [1.0, 1.0, 0.0, 1.0]
    assert batch_rewards("sprint_latency", infos, tasks, golds, refs) == pytest.approx([0.5, 17 / 48, 0.0, 0.5])
    assert batch_rewards("sprint_format", infos, tasks, golds, refs) == [1.0, 1.0, 1.0, 1.0]
    # the critical path is measured, right or wrong, and needs no reference (it is logged with weight 0)
    paths = batch_rewards("sprint_critical_path", infos, tasks, golds, None)
    assert paths == [float(i["sequential_tokens"]) for i in infos] and paths[3] == 16.0
    with pytest.raises(UserError, match="reference"):
        batch_rewards("sprint_latency", infos, tasks, golds, None)
    with pytest.raises(UserError, match="positive reference"):
        batch_rewards("sprint_latency", infos[:1], tasks[:1], golds[:1], [0])
    with pytest.raises(UserError, match="rollout infos"):
        batch_rewards("sprint_correct", [{}], ["math"], ['"14"'], [48])
