"""Packing (stage 3): merge, phases, prompt names, plan layout, filters, SFT files.

Every expected text below was worked out by hand from DESIGN.md's rules, not printed by the code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import shared_example

from sprint.cli import main as cli_main
from sprint.core.errors import UserError
from sprint.core.resources import prompt_file
from sprint.curation.packing import PackSettings, n_test_rows, pack, pack_record, sft_example, split_ids, sft_user_content
from sprint.curation.phases import assign_phases, final_answer_from_solution, packed_components, prompt_names
from sprint.format.trajectory import Trajectory

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
AGENT_PROMPT = prompt_file("agent").read_text()

SOLUTION = "We compute things. So $x = 3.5$ here. Hence the answer is $\\boxed{7}$. Done!"


def comp(plan: str, prompt: str | None = None, execution: str | None = None, span: tuple[int, int] | None = None,
         comment: str | None = None) -> dict[str, Any]:
    """A stage-2 component dict; `span` is the execution line range."""
    return {
        "description": plan,
        "plan_text": plan,
        "prompt": prompt,
        "execution_text": execution,
        "comment_text": comment,
        "plan": [1, 1],
        "execution": list(span) if span else None,
        "comment": [2, 2] if comment else None,
    }


def record(components: list[dict], dag: dict[str, list[int]], **extra: Any) -> dict[str, Any]:
    return {"id": "t", "question": "What is x?", "solution": SOLUTION, "answer": "7", "status": "ok",
            "components": components, "dag": dag, **extra}


def chain(n: int) -> dict[str, Any]:
    """n components, each with an execution, each depending on the previous one: n phases."""
    comps = [comp(f"P{i}.", f"Q{i}", f"E{i}.", (10 * i, 10 * i + 5)) for i in range(1, n + 1)]
    return record(comps, {str(i): ([i - 1] if i > 1 else []) for i in range(1, n + 1)})


def packed(row: dict[str, Any], **settings: Any):
    return pack_record(row["id"], row["question"], row, PackSettings(**settings))


def body_of(text: str) -> str:
    """A full trajectory text without its question block."""
    return text.split("</Question>\n\n", 1)[1]


# ------------------------------------------------------------------------------------------
# The worked example of the format


def test_worked_example_components_reproduce_the_shared_example_exactly():
    row = json.loads((DATA / "packing_example.json").read_text())
    res = packed(row, parallelization_threshold=1.0)  # 2 executions / 2 phases: below the default 1.5
    assert res.status == "ok", res.error
    assert (res.phases, res.prompts) == (2, 2)
    assert packed(row).reason == "low_parallelization"
    assert res.trajectory.render() + "\n" == shared_example("trajectory.txt").read_text()


def test_worked_example_merge_and_observation_by_hand():
    row = json.loads((DATA / "packing_example.json").read_text())
    traj = packed(row, parallelization_threshold=1.0).trajectory
    # component 3's execution spans 14..15 (< 3): merged into its plan on a new line; component 1's
    # comment is dropped by default (the released data has none)
    assert traj.phases[1].plan == (
        "Based on execution_1.1, execution_1.2:\n"
        "Both terms are 1 mod 5, so the sum is 2 mod 5.\n"
        "Fermat's little theorem agrees: a^4 is 1 mod 5 whenever 5 does not divide a."
    )
    assert traj.phases[1].executions == []
    assert traj.final_answer == "Therefore, the remainder is $\\boxed{2}$."
    observed = packed(row, parallelization_threshold=1.0, comments="observe").trajectory
    assert observed.phases[1].plan == "Observation about execution_1.1: So the first term contributes 1.\n\n" + traj.phases[1].plan
    assert [p.plan for p in observed.phases[:1]] == [p.plan for p in traj.phases[:1]]


# ------------------------------------------------------------------------------------------
# Phases, names and plan layout on hand-made DAGs

SEVERAL_PARENTS = record(
    [
        comp("P1.", "Q1", "E1 line.", (1, 5), "C1 note."),
        comp("P2.", "Q2", "E2.", (10, 13)),          # span exactly 3: kept as an execution
        comp("P3.", "Q3", "E3.", (20, 30)),
        comp("P4.", "Q4", "E4.", (40, 45)),
        comp("P5.", "Q5", "E5.", (50, 52), "C5 note."),  # span 2: merged, plan-only
        comp("P6.", "Q6", "E6.", (60, 64), "C6 note."),
        comp("P7.", "Q7", "E7.", (70, 75)),
        comp("P8.", "Q8", "E8.", (80, 85)),
    ],
    {"1": [], "2": [], "3": [], "4": [1, 3], "5": [1, 3], "6": [2], "7": [4, 6], "8": [2]},
)

# The default (comments dropped, as in the released data): no observation lines, no plan-only comment.
SEVERAL_PARENTS_TEXT = """<Question>
What is x?
</Question>

<Plan_1>
P1.

<prompt_1.1> Q1 </prompt_1.1>

P2.

<prompt_1.2> Q2 </prompt_1.2>

P3.

<prompt_1.3> Q3 </prompt_1.3>
</Plan_1>

<Execution_1>
<execution_1.1>
E1 line.
</execution_1.1>

<execution_1.2>
E2.
</execution_1.2>

<execution_1.3>
E3.
</execution_1.3>
</Execution_1>

<Plan_2>
Based on execution_1.1, execution_1.3:
P4.

<prompt_2.1> Q4 </prompt_2.1>

P5.
E5.

Based on execution_1.2:
P6.

<prompt_2.2> Q6 </prompt_2.2>
-----

P8.

<prompt_2.3> Q8 </prompt_2.3>
</Plan_2>

<Execution_2>
<execution_2.1>
E4.
</execution_2.1>

<execution_2.2>
E6.
</execution_2.2>

<execution_2.3>
E8.
</execution_2.3>
</Execution_2>

<Plan_3>
Based on execution_2.1, execution_2.2:
P7.

<prompt_3.1> Q7 </prompt_3.1>
</Plan_3>

<Execution_3>
<execution_3.1>
E7.
</execution_3.1>
</Execution_3>

<Final_answer>
Hence the answer is $\\boxed{7}$. Done!
</Final_answer>"""

# With --comments observe (the paper's description): observation lines and the plan-only comment.
SEVERAL_PARENTS_OBSERVE_TEXT = """<Question>
What is x?
</Question>

<Plan_1>
P1.

<prompt_1.1> Q1 </prompt_1.1>

P2.

<prompt_1.2> Q2 </prompt_1.2>

P3.

<prompt_1.3> Q3 </prompt_1.3>
</Plan_1>

<Execution_1>
<execution_1.1>
E1 line.
</execution_1.1>

<execution_1.2>
E2.
</execution_1.2>

<execution_1.3>
E3.
</execution_1.3>
</Execution_1>

<Plan_2>
Observation about execution_1.1: C1 note.

Based on execution_1.1, execution_1.3:
P4.

<prompt_2.1> Q4 </prompt_2.1>
Observation about execution_1.1: C1 note.

P5.\nE5.

C5 note.

Based on execution_1.2:
P6.

<prompt_2.2> Q6 </prompt_2.2>
-----

P8.

<prompt_2.3> Q8 </prompt_2.3>
</Plan_2>

<Execution_2>
<execution_2.1>
E4.
</execution_2.1>

<execution_2.2>
E6.
</execution_2.2>

<execution_2.3>
E8.
</execution_2.3>
</Execution_2>

<Plan_3>
Observation about execution_2.2: C6 note.

Based on execution_2.1, execution_2.2:
P7.

<prompt_3.1> Q7 </prompt_3.1>
</Plan_3>

<Execution_3>
<execution_3.1>
E7.
</execution_3.1>
</Execution_3>

<Final_answer>
Hence the answer is $\\boxed{7}$. Done!
</Final_answer>"""


def test_several_parents_phases_and_names():
    comps = packed_components(SEVERAL_PARENTS)
    phases = assign_phases(comps)
    assert phases == {1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2, 7: 3, 8: 2}
    assert prompt_names(comps, phases) == {1: "1.1", 2: "1.2", 3: "1.3", 4: "2.1", 6: "2.2", 7: "3.1", 8: "2.3"}
    assert [c.merged for c in comps] == [False, False, False, False, True, False, False, False]


def test_several_parents_full_text():
    res = packed(SEVERAL_PARENTS)
    assert res.status == "ok", res.error
    assert (res.phases, res.prompts, res.max_prompts_in_plan) == (3, 7, 3)
    assert res.ratio == pytest.approx(7 / 3)
    assert res.trajectory.render() == SEVERAL_PARENTS_TEXT
    observed = packed(SEVERAL_PARENTS, comments="observe")
    assert observed.trajectory.render() == SEVERAL_PARENTS_OBSERVE_TEXT
    assert (observed.phases, observed.prompts) == (res.phases, res.prompts)  # comments change text, not structure


PLAN_ONLY_CHAIN = record(
    [
        comp("A.", None, None, None, "A comment."),   # plan-only, comment inline
        comp("B.", "QB", "B short.", (5, 6)),         # merged: plan-only, same phase as its parent
        comp("C.", "QC", "EC.", (7, 12)),
        comp("D.", "QD", "ED.", (13, 20), "D note."),
        comp("E.", "QE", "EE.", (21, 30)),
        comp("F."),                                  # plan-only child of two executions
    ],
    {"2": [1], "3": [2], "4": [3], "5": [3], "6": [4, 5]},  # node 1 left out: no parents
)

PLAN_ONLY_CHAIN_BODY = """<Plan_1>
A.

B.
B short.

C.

<prompt_1.1> QC </prompt_1.1>
</Plan_1>

<Execution_1>
<execution_1.1>
EC.
</execution_1.1>
</Execution_1>

<Plan_2>
Based on execution_1.1:
D.

<prompt_2.1> QD </prompt_2.1>

E.

<prompt_2.2> QE </prompt_2.2>
</Plan_2>

<Execution_2>
<execution_2.1>
ED.
</execution_2.1>

<execution_2.2>
EE.
</execution_2.2>
</Execution_2>

<Plan_3>
Based on execution_2.1, execution_2.2:
F.
</Plan_3>

<Execution_3>
No prompt to execute.
</Execution_3>

<Final_answer>
Hence the answer is $\\boxed{7}$. Done!
</Final_answer>"""

PLAN_ONLY_CHAIN_OBSERVE_BODY = """<Plan_1>
A.

A comment.

B.\nB short.

C.

<prompt_1.1> QC </prompt_1.1>
</Plan_1>

<Execution_1>
<execution_1.1>
EC.
</execution_1.1>
</Execution_1>

<Plan_2>
Based on execution_1.1:
D.

<prompt_2.1> QD </prompt_2.1>

E.

<prompt_2.2> QE </prompt_2.2>
</Plan_2>

<Execution_2>
<execution_2.1>
ED.
</execution_2.1>

<execution_2.2>
EE.
</execution_2.2>
</Execution_2>

<Plan_3>
Observation about execution_2.1: D note.

Based on execution_2.1, execution_2.2:
F.
</Plan_3>

<Execution_3>
No prompt to execute.
</Execution_3>

<Final_answer>
Hence the answer is $\\boxed{7}$. Done!
</Final_answer>"""


def test_plan_only_chain_joins_its_parents_phase():
    comps = packed_components(PLAN_ONLY_CHAIN)
    phases = assign_phases(comps)
    assert phases == {1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 3}
    assert prompt_names(comps, phases) == {3: "1.1", 4: "2.1", 5: "2.2"}
    res = packed(PLAN_ONLY_CHAIN, parallelization_threshold=1.0)
    assert res.status == "ok", res.error
    assert res.trajectory.render_body() == PLAN_ONLY_CHAIN_BODY
    observed = packed(PLAN_ONLY_CHAIN, parallelization_threshold=1.0, comments="observe")
    assert observed.trajectory.render_body() == PLAN_ONLY_CHAIN_OBSERVE_BODY


def test_plan_only_chain_fails_the_default_ratio():
    res = packed(PLAN_ONLY_CHAIN)  # 3 executions / 3 phases = 1.0 < 1.5
    assert (res.status, res.reason, res.ratio) == ("dropped", "low_parallelization", 1.0)
    assert res.trajectory is not None  # the text is still kept in records.jsonl for inspection


def test_ratio_filter_boundary():
    # two parallel roots then one child: 3 executions / 2 phases = 1.5 -> kept (not below)
    row = record([comp("P1.", "Q1", "E1.", (1, 9)), comp("P2.", "Q2", "E2.", (10, 19)), comp("P3.", "Q3", "E3.", (20, 29))],
                 {"1": [], "2": [], "3": [1, 2]})
    assert packed(row).status == "ok"
    assert packed(row, parallelization_threshold=1.51).reason == "low_parallelization"
    assert packed(chain(3)).reason == "low_parallelization"  # 3 / 3


def test_too_many_phases():
    assert packed(chain(11), parallelization_threshold=0).status == "ok"
    res = packed(chain(12), parallelization_threshold=0)
    assert (res.status, res.reason, res.phases) == ("dropped", "too_many_phases", 12)
    assert packed(chain(4), max_phases=5, parallelization_threshold=0).status == "ok"
    assert packed(chain(5), max_phases=5, parallelization_threshold=0).reason == "too_many_phases"


def test_too_many_prompts_in_one_plan():
    def parallel(n: int) -> dict[str, Any]:
        return record([comp(f"P{i}.", f"Q{i}", f"E{i}.", (10 * i, 10 * i + 5)) for i in range(1, n + 1)], {"1": []})

    assert packed(parallel(8)).status == "ok"
    res = packed(parallel(9))
    assert (res.reason, res.max_prompts_in_plan) == ("too_many_prompts_in_plan", 9)
    assert [p.name for p in res.trajectory.phases[0].prompts] == [f"1.{k}" for k in range(1, 10)]


def test_break_line_between_trains_of_thought_in_phase_one():
    # roots 1, 2 and 4 share phase 1; 3 depends on 2, so 4 follows 2 in the plan: a break
    row = record([comp("P1.", "Q1", "E1.", (1, 9)), comp("P2.", "Q2", "E2.", (10, 19)),
                  comp("P3.", "Q3", "E3.", (20, 29)), comp("P4.", "Q4", "E4.", (30, 39))],
                 {"3": [2]})
    plan = packed(row).trajectory.phases[0].plan
    assert plan == "P1.\n\n<prompt_1.1> Q1 </prompt_1.1>\n\nP2.\n\n<prompt_1.2> Q2 </prompt_1.2>\n-----\n\nP4.\n\n<prompt_1.3> Q4 </prompt_1.3>"


# ------------------------------------------------------------------------------------------
# Final answer and invalid input


def test_final_answer_sentence_and_the_rest():
    assert final_answer_from_solution(SOLUTION) == "Hence the answer is $\\boxed{7}$. Done!"
    assert final_answer_from_solution("First $\\boxed{1}$. Then $\\boxed{2}$ wins.") == "Then $\\boxed{2}$ wins."
    assert final_answer_from_solution("No box here.") is None
    assert final_answer_from_solution(None) is None
    text = "It checks out.\n\n**Final Answer**\n\\[\n\\boxed{5}\n\\]"
    assert final_answer_from_solution(text) == "**Final Answer**\n\\[\n\\boxed{5}\n\\]"  # the heading stays


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        # "!" and "." followed by a space inside math are not sentence ends
        ("Seat them. The answer is $3! \\times 5! = \\boxed{720}$.", "The answer is $3! \\times 5! = \\boxed{720}$."),
        ("So $x = 1. 5$ or $\\boxed{2}$ works.", "So $x = 1. 5$ or $\\boxed{2}$ works."),
        # a display ending in a period ends the sentence, one without does not
        ("We get\n\\[x = 46.\\]Therefore, $x = \\boxed{46}.$", "Therefore, $x = \\boxed{46}.$"),
        ("Hence\n\\[x = \\boxed{46}\\]as claimed.", "Hence\n\\[x = \\boxed{46}\\]as claimed."),
        ("\\begin{align*}a &= b. c\\end{align*}So $\\boxed{c}$.", "\\begin{align*}a &= b. c\\end{align*}So $\\boxed{c}$."),
        # escaped dollars are money, not math
        ("It costs \\$5. Then \\$3 more. Total \\boxed{8}.", "Total \\boxed{8}."),
    ],
)
def test_final_answer_ignores_sentence_ends_inside_math(solution, expected):
    assert final_answer_from_solution(solution) == expected


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"components": []}, "no_components"),
        ({"dag": None}, "no_dag"),
        ({"dag": {"1": [], "2": [2]}}, "invalid_dag"),
        ({"dag": {"1": [], "2": [1], "9": [1]}}, "invalid_dag"),
        ({"dag": {"1": ["x"]}}, "invalid_dag"),
        ({"components": "not a list"}, "invalid_components"),
        ({"components": [comp("P1.", "Q1", "E1.", (1, 9)), comp("P2.", None, "E2.", (10, 19))]}, "invalid_components"),
        ({"dag": [[1]]}, "invalid_dag"),
        ({"solution": "The answer is 7."}, "no_boxed"),
        ({"status": "llm_timeout"}, "upstream_failed"),
        ({"question": "  "}, "no_question"),
    ],
)
def test_invalid_records_are_dropped_with_a_reason(change, reason):
    row = {**record([comp("P1.", "Q1", "E1.", (1, 9)), comp("P2.", "Q2", "E2.", (10, 19))], {"1": [], "2": [1]}), **change}
    res = packed(row)
    assert (res.status, res.reason) == ("dropped", reason)
    assert res.error


@pytest.mark.parametrize("text", ["P1 </Plan_1>.", "P1 <prompt_1.5> x </prompt_1.5>.", "a <execution_2.1> b", "</think>"])
def test_tag_like_text_is_dropped(text):
    row = record([comp(text, "Q1", "E1.", (1, 9)), comp("P2.", "Q2", "E2.", (10, 19))], {})
    res = packed(row, parallelization_threshold=0)
    assert (res.reason, res.trajectory) == ("tag_in_text", None)
    assert "component 1" in res.error


def test_why_tags_in_text_are_refused():
    # had the guard let `</Plan_1>` through, the plan would be cut short when parsed back
    row = record([comp("P1.", "Q1", "E1.", (1, 9)), comp("P2.", "Q2", "E2.", (10, 19))], {})
    body = packed(row, parallelization_threshold=0).trajectory.render_body().replace("P2.", "P2 </Plan_1>.")
    again = Trajectory.parse(body)
    assert [p.name for p in again.phases[0].prompts] == ["1.1"]  # prompt 1.2 is lost
    assert again.render_body() != body


def test_final_answer_heading_kept_in_the_trajectory_and_removed_from_the_sft_turn_only():
    row = record([comp("P1.\n**Final Answer**\nStill P1.", "Q1", "E1.", (1, 9)), comp("P2.", "Q2", "E2.", (10, 19))], {},
                 solution="It checks out.\n\n**Final Answer**\n\\[\n\\boxed{5}\n\\]")
    res = packed(row)
    assert res.status == "ok", res.error
    traj = res.trajectory.render()
    assert traj.count("**Final Answer**\n") == 2
    assert "<Plan_1>\nP1.\n**Final Answer**\nStill P1.\n\n<prompt_1.1> Q1 </prompt_1.1>\n\nP2." in traj
    assert traj.endswith("<Final_answer>\n**Final Answer**\n\\[\n\\boxed{5}\n\\]\n</Final_answer>")
    assistant = sft_example(AGENT_PROMPT, "t", res.trajectory, res.body)["messages"][1]["content"]
    assert "Final Answer" not in assistant
    assert assistant.startswith("<think>\n<Plan_1>\nP1.\nStill P1.\n\n<prompt_1.1> Q1 </prompt_1.1>\n\nP2.")
    assert assistant.endswith("<Final_answer>\n\\[\n\\boxed{5}\n\\]\n</Final_answer>\n</think>")
    # everything else of the turn is the trajectory body, unchanged
    assert assistant == "<think>\n" + body_of(traj).replace("**Final Answer**\n", "") + "\n</think>"


def test_split_is_reproducible_and_disjoint():
    ids = [f"id{i}" for i in range(100)]
    train, test = split_ids(ids, 0.1, 7)
    assert len(test) == 10 and len(train) == 90 and not train & test
    assert split_ids(list(reversed(ids)), 0.1, 7) == (train, test)  # input order does not matter
    assert split_ids(ids, 0.1, 8)[1] != test
    with pytest.raises(UserError):
        split_ids(ids, 1.0, 7)


# ------------------------------------------------------------------------------------------
# The stage end to end


def synthetic_rows(n: int) -> list[dict[str, Any]]:
    """A mix: wide DAGs (kept), chains (ratio fails), and a few broken records."""
    rows = []
    for i in range(n):
        if i % 5 == 4:
            row = chain(3)
        elif i % 7 == 6:
            row = record([comp("P1.", "Q1", "E1.", (1, 9))], {"1": []}, solution="no box")
        else:
            row = json.loads(json.dumps(SEVERAL_PARENTS))
        row["id"] = f"item{i}"
        row["question"] = f"Question number {i}?"
        rows.append(row)
    return rows


def write_stage(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    failed = {"id": "broken", "status": "llm_timeout", "error": "timed out"}
    with open(folder / "records.jsonl", "w") as f:
        for r in rows + [failed]:
            f.write(json.dumps(r) + "\n")
    return folder


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_pack_stage_folder_writes_sft_files(tmp_path: Path, capsys):
    stage = write_stage(tmp_path / "dag", synthetic_rows(40))
    out = tmp_path / "sft"
    summary = pack(str(stage), out, seed=3)
    printed = capsys.readouterr().out
    assert "kept" in printed and "low_parallelization" in printed

    records = read_jsonl(out / "records.jsonl")
    assert len(records) == 41  # the failed stage-2 record is counted too (upstream_failed)
    kept = [r for r in records if r["status"] == "ok"]
    # i%5==4 -> 8 chains; i%7==6 and i%5!=4 -> 4; the failed stage-2 record
    expected_dropped = {"low_parallelization": 8, "no_boxed": 4, "upstream_failed": 1}
    assert summary["dropped"] == expected_dropped
    assert summary["kept"] == len(kept) == 40 - 12
    train, test = read_jsonl(out / "train.jsonl"), read_jsonl(out / "test.jsonl")
    assert len(test) == 3 and len(train) + len(test) == len(kept)  # ceil(28 * 0.1)
    assert {r["id"] for r in train} == {r["id"] for r in kept if r["split"] == "train"}
    assert json.loads((out / "summary.json").read_text())["kept"] == len(kept)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "pack" and manifest["counts"] == {"ok": 28, "dropped": 13}
    assert manifest["inputs"]["rows"] == 41

    # exactly the messages layout, and the assistant turn parses back to the same body
    row = train[0]
    assert set(row) == {"messages", "id"}
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
    user, assistant = row["messages"][0]["content"], row["messages"][1]["content"]
    q = next(r for r in records if r["id"] == row["id"])
    assert q["trajectory"] == Trajectory.parse(q["trajectory"]).render()
    assert q["trajectory"].startswith(f"<Question>\nQuestion number {row['id'][4:]}?\n</Question>\n\n<Plan_1>")
    assert user == AGENT_PROMPT.rstrip() + f"\n\n<Question>\n{Trajectory.parse(q['trajectory']).question}\n</Question>\n\n"
    assert assistant.startswith("<think>\n<Plan_1>\n") and assistant.endswith("</Final_answer>\n</think>")
    body = assistant[len("<think>\n"): -len("\n</think>")]
    assert Trajectory.parse(assistant).render_body() == body
    assert body == SEVERAL_PARENTS_TEXT.split("</Question>\n\n", 1)[1]

    # a re-run is identical; another seed needs --overwrite
    before = (out / "train.jsonl").read_bytes()
    pack(str(stage), out, seed=3)
    assert (out / "train.jsonl").read_bytes() == before
    with pytest.raises(UserError, match="overwrite"):
        pack(str(stage), out, seed=4)
    pack(str(stage), out, seed=4, overwrite=True)
    assert len(read_jsonl(out / "test.jsonl")) == len(test)


def test_sft_files_load_with_datasets(tmp_path: Path):
    datasets = pytest.importorskip("datasets")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(30)))
    out = tmp_path / "sft"
    pack(str(src), out, test_frac=0.2)
    ds = datasets.load_dataset("json", data_files={"train": str(out / "train.jsonl"), "test": str(out / "test.jsonl")})
    assert ds["train"].column_names == ["messages", "id"]
    assert len(ds["train"]) + len(ds["test"]) == 20
    questions = {r["id"]: r["question"] for r in synthetic_rows(30)}
    for row in ds["train"]:
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
        assert row["messages"][0]["content"] == sft_user_content(AGENT_PROMPT, questions[row["id"]])
        assistant = row["messages"][1]["content"]
        assert "<think>\n" + Trajectory.parse(assistant).render_body() + "\n</think>" == assistant


def test_range_and_cli(tmp_path: Path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(20)))
    out = tmp_path / "sft"
    assert cli_main(["pack", "-i", str(src), "-o", str(out), "--range", "0:10", "--test-frac", "0", "--max-phases", "3"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    # chain(3) has 3 phases > MAX_PHASES-1 = 2 now; the wide DAG also has 3 phases: all dropped
    assert summary["input"] == 10 and summary["kept"] == 0
    assert summary["dropped"]["too_many_phases"] == 9


def test_cli_entry_point_reports_user_errors(tmp_path: Path, capsys):
    code = cli_main(["pack", "-i", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o")])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_shell_script_uses_env_overrides(tmp_path: Path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(10)))
    out = tmp_path / "sft"
    env = {**os.environ, "DATA": str(src), "OUT_DIR": str(out), "PARALLELIZATION_THRESHOLD": "0.5",
           "TEST_FRAC": "0.5", "SEED": "1", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "run_finetuning_data_preparation.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    # threshold 0.5 keeps the chains too; only the records without \boxed are dropped
    assert summary["dropped"] == {"no_boxed": 1} and summary["kept"] == 9 and summary["test"] == 5  # ceil(4.5)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["parallelization_threshold"] == 0.5 and manifest["config"]["seed"] == 1
    # RANGE, and a push asked for without a repo is refused before anything runs
    proc = subprocess.run(["bash", str(REPO / "run_finetuning_data_preparation.sh"), "--overwrite"],
                          env={**env, "RANGE": "0:4"}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["input"] == 4
    proc = subprocess.run(["bash", str(REPO / "run_finetuning_data_preparation.sh")],
                          env={**env, "PUSH_TO_HUB": "true"}, capture_output=True, text=True)
    assert proc.returncode == 2 and "OUTPUT_HUB_PATH" in proc.stderr


def test_parquet_input_with_struct_filled_dags(tmp_path: Path):
    """Through `datasets`, each dag becomes a struct holding every row's keys (absent ones None)."""
    datasets = pytest.importorskip("datasets")
    rows = synthetic_rows(10)  # chains have nodes 1..3, the wide DAGs 1..8
    src = tmp_path / "in.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(src))
    back = datasets.load_dataset("parquet", data_files=str(src), split="train")[4]
    assert back["dag"]["8"] is None  # the chain's row got the other rows' keys
    out = tmp_path / "sft"
    summary = pack(str(src), out)
    assert summary["dropped"] == {"low_parallelization": 2, "no_boxed": 1} and summary["kept"] == 7
    train = read_jsonl(out / "train.jsonl") + read_jsonl(out / "test.jsonl")
    assert {r["messages"][1]["content"] for r in train} == {"<think>\n" + SEVERAL_PARENTS_TEXT.split("</Question>\n\n", 1)[1] + "\n</think>"}


def test_push_to_hub_only_when_asked_and_failure_is_a_user_error(tmp_path: Path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls: list[tuple[str, dict[str, int]]] = []

    def fake_push(self, repo, *args, **kwargs):
        calls.append((repo, {k: len(v) for k, v in self.items()}))
        if repo == "me/broken":
            raise ConnectionError("no route to the hub")

    monkeypatch.setattr(datasets.DatasetDict, "push_to_hub", fake_push)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(20)))
    pack(str(src), tmp_path / "a")
    assert calls == []
    pack(str(src), tmp_path / "b", push_to_hub="me/sprint-sft")
    assert calls == [("me/sprint-sft", {"train": 12, "test": 2})]  # 20 - 4 chains - 2 without \boxed; ceil(1.4)
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["pushed_to_hub"] == "me/sprint-sft"
    with pytest.raises(UserError, match="me/broken.*ConnectionError.*no route"):
        pack(str(src), tmp_path / "c", push_to_hub="me/broken")
    assert (tmp_path / "c" / "train.jsonl").is_file()  # the local files are written first


_SWIFT_READ = r"""
import json, sys
from swift import get_processor, get_template, load_dataset
model, data = sys.argv[1], sys.argv[2]
train, _ = load_dataset([data], strict=True, num_proc=1, load_from_cache_file=False)
proc = get_processor(model, model_type="qwen2", use_hf=True)
tpl = get_template(proc, template_type="deepseek_r1", max_length=100000)
tpl.set_mode("train")
out = []
for row in train:
    enc = tpl.encode(row)
    labels = [t for t in enc["labels"] if t != -100]
    out.append({"messages": row["messages"], "trained_text": proc.decode(labels)})
print(json.dumps(out))
"""


@pytest.mark.swift
def test_ms_swift_reads_the_sft_files(tmp_path: Path, tiny_model_dir: Path):
    """ms-swift's own loader keeps our messages unchanged and trains on the whole assistant turn."""
    from sprint.training.finetune import default_swift_bin, swift_python

    python = swift_python(default_swift_bin())
    if not python.exists():
        pytest.skip(f"ms-swift venv missing ({python}); run scripts/install_swift.sh")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(12)))
    pack(str(src), tmp_path / "sft")
    ours = read_jsonl(tmp_path / "sft" / "train.jsonl")
    result = subprocess.run([str(python), "-c", _SWIFT_READ, str(tiny_model_dir), str(tmp_path / "sft" / "train.jsonl")],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    swift_rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert [[(m["role"], m["content"]) for m in r["messages"]] for r in swift_rows] == [
        [(m["role"], m["content"]) for m in r["messages"]] for r in ours
    ]
    for row in swift_rows:
        body = row["messages"][1]["content"].split("<think>\n", 1)[1].rsplit("\n</think>", 1)[0]
        assert body in row["trained_text"]  # the whole trajectory is a training target


# ------------------------------------------------------------------------------------------
# Faithfulness options, split counts and upstream failures


def test_split_test_count_rounds_up_as_scikit_learn_does():
    assert [n_test_rows(n, 0.1) for n in (0, 1, 2, 5, 9, 10, 11, 28, 1700)] == [0, 0, 1, 1, 1, 1, 2, 3, 170]
    assert n_test_rows(9, 0.5) == 5 and n_test_rows(3, 0.9) == 2  # train keeps one row
    assert n_test_rows(40, 0.0) == 0
    train, test = split_ids([f"id{i}" for i in range(5)], 0.1, 42)
    assert (len(train), len(test)) == (4, 1)


def five_traces() -> list[dict[str, Any]]:
    rows = []
    for i in range(5):
        row = json.loads(json.dumps(SEVERAL_PARENTS))
        row["id"], row["question"] = f"t{i}", f"Question {i}?"
        rows.append(row)
    return rows


def test_five_traces_give_four_train_and_one_test_row(tmp_path: Path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in five_traces()))
    summary = pack(str(src), tmp_path / "sft")
    assert (summary["kept"], summary["train"], summary["test"]) == (5, 4, 1)
    assert len(read_jsonl(tmp_path / "sft" / "train.jsonl")) == 4 and len(read_jsonl(tmp_path / "sft" / "test.jsonl")) == 1
    assert "test set is empty" not in capsys.readouterr().out


def test_an_empty_test_set_is_reported(tmp_path: Path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(five_traces()[0]) + "\n")
    summary = pack(str(src), tmp_path / "sft")
    assert (summary["kept"], summary["train"], summary["test"]) == (1, 1, 0)
    out = capsys.readouterr().out
    assert "warning: the test set is empty" in out and "1 kept trace" in out


def test_upstream_failures_count_the_same_from_a_folder_or_its_file(tmp_path: Path, capsys):
    stage = write_stage(tmp_path / "dag", five_traces())  # plus one failed record (llm_timeout)
    from_folder = pack(str(stage), tmp_path / "a")
    from_file = pack(str(stage / "records.jsonl"), tmp_path / "b")
    for summary in (from_folder, from_file):
        assert summary["input"] == 6 and summary["kept"] == 5
        assert summary["dropped"] == {"upstream_failed": 1}
    assert "dropped      1  upstream_failed" in capsys.readouterr().out
    rec = next(r for r in read_jsonl(tmp_path / "a" / "records.jsonl") if r["id"] == "broken")
    assert rec["status"] == "dropped" and "llm_timeout" in rec["error"]
    # a range selects records of the folder as it does of the file
    assert pack(str(stage), tmp_path / "c", range_spec="4:6")["dropped"] == {"upstream_failed": 1}
    assert pack(str(stage), tmp_path / "d", range_spec="-2:")["dropped"] == {"upstream_failed": 1}  # loaded whole


def test_comments_option_cli_manifest_and_summary(tmp_path: Path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in five_traces()))
    for mode in ("drop", "observe"):
        out = tmp_path / mode
        args = ["pack", "-i", str(src), "-o", str(out)] + (["--comments", mode] if mode == "observe" else [])
        assert cli_main(args) == 0
        summary = json.loads((out / "summary.json").read_text())
        manifest = json.loads((out / "manifest.json").read_text())
        assert summary["comments"] == manifest["config"]["comments"] == mode
        texts = [r["trajectory"] for r in read_jsonl(out / "records.jsonl")]
        assert all(("Observation about execution_" in t) == (mode == "observe") for t in texts)
        assert all(("C5 note." in t) == (mode == "observe") for t in texts)
        sft = read_jsonl(out / "train.jsonl")[0]["messages"][1]["content"]
        assert sft == "<think>\n" + body_of(SEVERAL_PARENTS_OBSERVE_TEXT if mode == "observe" else SEVERAL_PARENTS_TEXT) + "\n</think>"
    with pytest.raises(SystemExit):
        cli_main(["pack", "-i", str(src), "-o", str(tmp_path / "x"), "--comments", "keep"])


def test_comments_variable_of_the_shell_script(tmp_path: Path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in five_traces()))
    base = {**os.environ, "DATA": str(src), "PYTHON": sys.executable}
    for value, mode in (("", "drop"), ("observe", "observe")):
        out = tmp_path / f"sft-{mode}"
        proc = subprocess.run(["bash", str(REPO / "run_finetuning_data_preparation.sh")],
                              env={**base, "OUT_DIR": str(out), "COMMENTS": value}, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert json.loads((out / "manifest.json").read_text())["config"]["comments"] == mode


def test_stage1_warnings_are_counted_in_the_summary(tmp_path: Path):
    rows = five_traces()
    rows[0]["warnings"] = [{"kind": "no_plan", "component": 2, "message": "component 2 has no plan"},
                           {"kind": "plan_equals_execution", "component": 3, "message": "m"}]
    rows[1]["warnings"] = [{"kind": "no_plan", "component": 1, "message": "component 1 has no plan"}]
    rows[2] = {**chain(3), "id": "chain", "question": "Chain?",
               "warnings": [{"kind": "overlap_execution_comment", "component": 1, "message": "m"}]}
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = pack(str(src), tmp_path / "sft")
    assert summary["warnings"] == {"no_plan": 2, "overlap_execution_comment": 1, "plan_equals_execution": 1}
    assert summary["kept_warnings"] == {"no_plan": 2, "plan_equals_execution": 1}  # the chain is dropped
    manifest = json.loads((tmp_path / "sft" / "manifest.json").read_text())
    assert manifest["summary"]["warnings"] == summary["warnings"]


def test_a_trace_without_plan_ranges_packs_with_empty_plans():
    # stage 1 kept a component with no plan range (warning no_plan): its plan text is None
    row = record([comp("P1.", "Q1", "E1.", (1, 9)), {**comp("", "Q2", "E2.", (10, 19)), "plan_text": None, "plan": None},
                  comp("P3.", "Q3", "E3.", (20, 29))], {"3": [1, 2]})
    res = packed(row)
    assert res.status == "ok", res.error
    assert res.trajectory.phases[0].plan == "P1.\n\n<prompt_1.1> Q1 </prompt_1.1>\n\n<prompt_1.2> Q2 </prompt_1.2>"


def test_plan_equal_to_execution_renders_both_as_released():
    same = "Compute 2 + 2 by counting up from 2 twice, which gives 4."
    row = record([comp(same, "Count up.", same, (1, 4)), comp("P2.", "Q2", "E2.", (10, 19))], {})
    body = packed(row).trajectory.render_body()
    assert body.startswith(f"<Plan_1>\n{same}\n\n<prompt_1.1> Count up. </prompt_1.1>\n\nP2.")
    assert f"<execution_1.1>\n{same}\n</execution_1.1>" in body
