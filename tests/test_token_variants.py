"""Tokens as the paper counts them: total with tags, sequential without, sequential as decoded with.

Every expected number is the shared tokenizer's count of a piece of text written out literally
below (the tagged blocks as the model generates them), combined by the rule each definition
states; nothing is taken from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import write_run
from tokenizers import Tokenizer

from sprint.evaluation.evaluate import evaluate
from sprint.format.trajectory import count_tokens, parse

FAST = {"resamples": 50, "workers": 1, "plots": False}

PLAN1_HEAD = "First I compute the product, then I add."
PROMPT1 = "Compute 3 * 4."
PLAN1_MID = "Separately I check the order of operations."
PROMPT2 = "State which operation comes first."
EXEC1 = (
    "3 * 4 means three groups of four: 4 + 4 + 4. Adding them one at a time gives 4, then 8, then 12, "
    "so the product is 12. Checking with the times table, 3 * 4 = 12 as well, which confirms it."
)
EXEC2 = "Multiplication first."
PLAN2 = "Based on execution_1.1, execution_1.2:\nAdding 2 to 12 gives 14."
FINAL = "The answer is $\\boxed{14}$."

BODY = f"""<Plan_1>
{PLAN1_HEAD}

<prompt_1.1> {PROMPT1} </prompt_1.1>

{PLAN1_MID}

<prompt_1.2> {PROMPT2} </prompt_1.2>
</Plan_1>

<Execution_1>
<execution_1.1>
{EXEC1}
</execution_1.1>

<execution_1.2>
{EXEC2}
</execution_1.2>
</Execution_1>

<Plan_2>
{PLAN2}
</Plan_2>

<Execution_2>
No prompt to execute.
</Execution_2>

<Final_answer>
{FINAL}
</Final_answer>"""
TRAJECTORY = "<Question>\nWhat is 2 + 3 * 4?\n</Question>\n\n" + BODY

# The pieces, tags stripped (the paper's sequential tokens) ...
PREFIX1 = f"{PLAN1_HEAD}\n\n {PROMPT1} "
PLAN1 = f"{PREFIX1}\n\n{PLAN1_MID}\n\n {PROMPT2} "
# ... and as decoded: the plan block from `<Plan_1>`, each execution block with its tags, the final block.
PREFIX1_DEC = f"<Plan_1>\n{PLAN1_HEAD}\n\n<prompt_1.1> {PROMPT1} </prompt_1.1>"
PREFIX2_DEC = f"{PREFIX1_DEC}\n\n{PLAN1_MID}\n\n<prompt_1.2> {PROMPT2} </prompt_1.2>"
PLAN1_DEC = f"{PREFIX2_DEC}\n</Plan_1>"
EXEC1_DEC = f"<execution_1.1>\n{EXEC1}\n</execution_1.1>"
EXEC2_DEC = f"<execution_1.2>\n{EXEC2}\n</execution_1.2>"
PLAN2_DEC = f"<Plan_2>\n{PLAN2}\n</Plan_2>"
FINAL_DEC = f"<Final_answer>\n{FINAL}\n</Final_answer>"

BASELINE = "Okay, 3 * 4 is 12 and 2 + 12 is 14.\n\nSo the answer is \\boxed{14}."


@pytest.fixture(scope="module")
def n(tok_dir: Path):
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def expected(n) -> dict[str, int]:
    # Built so that prompt 1's branch is the critical path of phase 1 under both definitions.
    assert n(PREFIX1) + n(EXEC1) > n(PLAN1) + n(EXEC2)
    assert n(PREFIX1_DEC) + n(EXEC1_DEC) > max(n(PLAN1_DEC), n(PREFIX2_DEC) + n(EXEC2_DEC))
    return {
        "sequential": n(PREFIX1) + n(EXEC1) + n(PLAN2) + n(FINAL),
        "sequential_decoded": n(PREFIX1_DEC) + n(EXEC1_DEC) + n(PLAN2_DEC) + n(FINAL_DEC),
        "total": n(BODY),
        "planner": n(PLAN1) + n(PLAN2) + n(FINAL),
        "executor": n(EXEC1) + n(EXEC2),
    }


def test_the_three_definitions_on_a_hand_made_trajectory(n, expected: dict[str, int]) -> None:
    counts = count_tokens(parse(TRAJECTORY), n)
    assert (counts.sequential, counts.sequential_decoded, counts.total) == (
        expected["sequential"], expected["sequential_decoded"], expected["total"])
    # tags cost tokens: each variant with tags is larger than its tag-free twin
    assert counts.sequential < counts.sequential_decoded < counts.total
    assert counts.total > counts.planner + counts.executor
    assert counts.as_dict()["sequential_tokens_as_decoded"] == expected["sequential_decoded"]
    assert counts.as_dict()["total_tokens"] == expected["total"]


def test_evaluate_reports_all_three(tmp_path: Path, tok_dir: Path, n, expected: dict[str, int]) -> None:
    common = {"question": "What is 2 + 3 * 4?", "gold": "14", "predicted": None, "status": "ok", "calls": []}
    run = write_run(tmp_path / "sprint", [{"id": "p1", **common, "forced_final": False, "trajectory": TRAJECTORY}])
    base = write_run(tmp_path / "base", [{"id": "p1", **common, "generation": BASELINE}])
    ev = evaluate(run, baseline=base, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out", **FAST)

    row = ev.metrics["runs"][0]["problems"][0]
    for key, value in expected.items():
        assert row[key] == value, key
    # a sequential model: every definition is its output length, tags included
    brow = ev.metrics["baselines"][0]["problems"][0]
    assert brow["sequential"] == brow["sequential_decoded"] == brow["total"] == n(BASELINE)

    summary = ev.metrics["runs"][0]["summary"]
    assert summary["mean_sequential_decoded"] == expected["sequential_decoded"]
    assert summary["mean_total"] == expected["total"]
    comp = ev.metrics["comparisons"][0]
    assert comp["overall"]["mean_sprint_sequential_decoded"] == expected["sequential_decoded"]
    bucket = next(b for b in comp["buckets"] if b["problems"])
    assert bucket["mean_sprint_sequential_decoded"] == expected["sequential_decoded"]

    on_disk = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert on_disk["runs"][0]["summary"]["mean_sequential_decoded"] == expected["sequential_decoded"]
    report = (tmp_path / "out" / "report.md").read_text()
    lines = report.splitlines()
    value = f"{expected['sequential_decoded']:,}"
    summary_row = next(line for line in lines if line.startswith("| Mean sequential tokens as decoded"))
    assert summary_row.split("|")[2].strip() == value  # the SPRINT column of the summary table
    header = next(line for line in lines if line.startswith("| Baseline length (tokens)"))
    column = [c.strip() for c in header.split("|")].index("Mean SPRINT sequential tokens as decoded")
    all_row = next(line for line in lines if line.startswith("| all |"))
    assert [c.strip() for c in all_row.split("|")][column] == value  # the per-bucket table
    assert "- **Sequential tokens as decoded**: the same critical path" in report  # defined
    assert "- **Total tokens**: every generated token, tags included" in report
    assert "Tags excluded" in report
