"""Stage 1: line splitting, the answer parser and validator, and the stage over real HTTP.

The stage tests run the real `openai` client against the scripted fake server; each item's
question names the answer the server gives, so one run mixes good and broken answers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import datasets
import pytest
from tests.fake_server import Handler, Reply, ScriptedServer, dead_url

from sprint.cli import main as cli_main
from sprint.curation.components import (
    AnswerError,
    ComponentRanges,
    component_record,
    line_spans,
    number_lines,
    parse_components,
    separate_components,
    split_lines,
    WARNING_KINDS,
    component_warnings,
    uncovered_lines,
    validate_components,
)
from sprint.curation.component_answer import parse_line_range
from sprint.core.errors import UserError

TRACES = Path(__file__).resolve().parent / "data" / "traces.jsonl"
MODEL = "test-model"


def load_traces() -> list[dict]:
    return [json.loads(line) for line in TRACES.read_text().splitlines() if line.strip()]


def question_in(request: dict) -> str:
    """The question a stage prompt carries (both stages wrap it in <Question> tags)."""
    content = request["messages"][-1]["content"]
    m = re.search(r"<Question>\n(.*?)\n</Question>", content, re.S)
    assert m, "prompt without a <Question> block"
    return m.group(1)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def by_question(rows: list[dict], reply_for: Callable[[dict], Any]) -> Callable[[dict, str], Any]:
    """A fake-server handler answering each request with `reply_for(row)` of the row it asks about."""
    index = {r["question"].strip(): r for r in rows}

    def handler(request: dict, endpoint: str) -> Any:
        return reply_for(index[question_in(request)])

    return handler


def run_stage1(inp: Path, out: Path, url: str, **kw: Any):
    # 2.5 s: half the scripted timeout reply's delay (5 s), and far above an ordinary reply even on a loaded
    # machine (at 1 s one ordinary reply timed out there, and its retry changed what a rerun asked for)
    settings = dict(model=MODEL, server_url=url, num_workers=4, timeout=2.5, max_retries=1, progress=False)
    settings.update(kw)
    return separate_components(str(inp), out, **settings)


def records_of(out: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate records"
    return {r["id"]: r for r in rows}


# --- line splitting -----------------------------------------------------------------------


def test_split_keeps_decimals_abbreviations_and_drops_empty_lines() -> None:
    text = "Okay, so pi is about 3.14. Let me think, e.g. about circles.\n\n\n  Hmm... wait. Wait!  So 5! = 120 here?  Yes."
    assert split_lines(text) == [
        "Okay, so pi is about 3.14.",
        "Let me think, e.g. about circles.",
        "Hmm... wait.",
        "Wait!",
        "So 5! = 120 here?",
        "Yes.",
    ]


def test_split_list_markers_display_math_and_fig() -> None:
    text = "1. First expand (see Fig. 2). Then simplify.\n\\[\nx^2 = 4\n\\]\nSo $x = 2.$ Done."
    assert split_lines(text) == ["1. First expand (see Fig. 2).", "Then simplify.", "\\[ x^2 = 4 \\]", "So $x = 2.$", "Done."]


def test_spans_point_into_the_original_text() -> None:
    for row in load_traces():
        thought = row["thought"]
        lines = split_lines(thought)
        spans = line_spans(thought)
        assert len(lines) == len(spans) > 3
        for line, (s, e) in zip(lines, spans):
            assert " ".join(thought[s:e].split()) == line
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:]))  # in order, disjoint
        assert split_lines(thought) == lines  # deterministic


def test_number_lines() -> None:
    assert number_lines(["A.", "B c."]) == "<Line 1> A. </Line 1>\n<Line 2> B c. </Line 2>"


# --- parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        ("3-7", (3, 7)),
        ("Lines 3-7", (3, 7)),
        ("lines 3 - 7", (3, 7)),
        ("3:7", (3, 7)),
        ("3–7", (3, 7)),
        ("3 to 7", (3, 7)),
        ("<Line 3> - <Line 7>", (3, 7)),
        ("5", (5, 5)),
        ("Line 5", (5, 5)),
        (5, (5, 5)),
        ([3, 7], (3, 7)),
        ("not found", None),
        ("Lines not found", None),
        ("Not Found.", None),
        ("", None),
        (None, None),
        ("none", None),
        ("7-3", (7, 3)),  # read as written; the validator reports it
        ("L5", (5, 5)),
        ("lines: 3-7", (3, 7)),
        ("Line 3 to Line 7", (3, 7)),
        ("Lines 3-7 (verification)", (3, 7)),
        ("None (no execution)", None),
    ],
)
def test_parse_line_range(value: Any, expected: Any) -> None:
    assert parse_line_range(value) == expected


@pytest.mark.parametrize("value", ["banana", "3-5, 7-9", "lines 3 and 5", {"start": 3}, True, [1, 2, 3]])
def test_parse_line_range_rejects(value: Any) -> None:
    with pytest.raises(AnswerError):
        parse_line_range(value)


GOOD = [
    {"description": "Set up", "plan": "1-2", "prompt": "Solve 6w = 30.", "execution": "3-4", "comment": "5"},
    {"description": "Answer", "plan": "Lines 6-7", "prompt": "not found", "execution": "Lines not found", "comment": None},
]


def test_parse_components_tolerates_fences_prose_and_wrappers() -> None:
    plain = json.dumps(GOOD)
    variants = [
        plain,
        f"```json\n{plain}\n```",
        f"Sure, here are the components:\n{plain}\nI hope this helps. [1]",
        f"Lines [1] and [] below are grouped as follows {{see}}:\n{plain}",
        json.dumps({"components": GOOD}),
        plain.replace("}]", "},]"),  # a trailing comma
        json.dumps([{k.capitalize(): v for k, v in c.items()} for c in GOOD]),
    ]
    for text in variants:
        components = parse_components(text)
        assert components == [
            ComponentRanges(1, "Set up", (1, 2), "Solve 6w = 30.", (3, 4), (5, 5)),
            ComponentRanges(2, "Answer", (6, 7), "", None, None),
        ], text


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("I could not find any components.", "no JSON list"),
        ("[]", "no components"),
        ("Nothing here: []", "no components"),
        ('[{"description": "x", "plan": "banana"}]', "component 1: plan"),
        ('[{"description": "x", "plan": "1-2"}, "oops"]', "component 2 is a JSON str"),
    ],
)
def test_parse_components_errors(text: str, message: str) -> None:
    with pytest.raises(AnswerError, match=message):
        parse_components(text)


# --- markdown answers ---------------------------------------------------------------------
# Layouts models return when they ignore "answer with a JSON list"; each must read as GOOD does.

MD_HEADERS_BULLETS_BOLD = """Here is the breakdown of the reasoning into components:

### Component 1
- **Description:** Set up
- **Plan:** Lines 1-2
- **Prompt:** Solve 6w = 30.
- **Execution:** Lines 3-4
- **Comment:** Line 5

### Component 2
- **Description:** Answer
- **Plan:** Lines 6-7
- **Prompt:** Not found
- **Execution:** Lines not found
- **Comment:** Lines not found
"""

MD_BOLD_HEADERS_LINE_LABELS = """**Component 1: Setting up the equation**
Description: Set up
Plan lines: 1\u20132
Prompt: "Solve 6w = 30."
Execution lines: 3\u20134
Comment lines: 5

**Component 2: Reporting the answer**
Description: Answer
Plan lines: 6-7
Prompt: N/A
Execution lines: N/A
Comment lines: N/A"""

MD_NUMBERED_FIELDS = """## Component 1
1. **Description**: Set up
2. **Plan**: `Lines 1-2`
3. **Prompt**: Solve
   6w = 30.
4. **Execution**: **Lines 3-4**
5. **Comment**: Line 5

---

## Component 2
1. **Description**: Answer
2. **Plan**: Lines 6 to 7
3. **Prompt**: not found
4. **Execution**: not found
5. **Comment**: not found

Let me know if you want a different split."""

MD_PLAIN = """Component 1
* Description: Set up
* Plan: Lines 1-2
* Prompt: Solve 6w = 30.
* Execution: Lines 3-4
* Comment: Line 5
Component 2
* Description: Answer
* Plan: Lines 6-7
* Prompt: None
* Execution: None
* Comment: None"""


@pytest.mark.parametrize("text", [MD_HEADERS_BULLETS_BOLD, MD_BOLD_HEADERS_LINE_LABELS, MD_NUMBERED_FIELDS, MD_PLAIN],
                         ids=["headers-bullets-bold", "bold-headers-line-labels", "numbered-fields", "plain"])
def test_parse_components_reads_markdown_layouts(text: str) -> None:
    assert parse_components(text) == [
        ComponentRanges(1, "Set up", (1, 2), "Solve 6w = 30.", (3, 4), (5, 5)),
        ComponentRanges(2, "Answer", (6, 7), "", None, None),
    ]


@pytest.mark.parametrize(
    "text, n, outcome",
    [
        # GPT-4o leaves out the plan of a short step: kept, named
        ("### Component 1\n- **Description:** Check\n- **Plan:** Lines not found\n- **Prompt:** Check it.\n"
         "- **Execution:** Lines 1-2\n- **Comment:** Lines not found", 2, ("ok", ["no_plan"])),
        # plan range = execution range: kept, named
        ("### Component 1\n- **Description:** Check\n- **Plan:** Lines 1-2\n- **Prompt:** Check it.\n"
         "- **Execution:** Lines 1-2\n- **Comment:** Lines not found", 2, ("ok", ["plan_equals_execution"])),
        # the execution runs into the comment: kept, named
        ("### Component 1\n- **Description:** Check\n- **Plan:** Line 1\n- **Prompt:** Check it.\n"
         "- **Execution:** Lines 2-4\n- **Comment:** Line 4", 4, ("ok", ["overlap_execution_comment"])),
        # a range past the end of the trace: rejected
        ("### Component 1\n- **Description:** Check\n- **Plan:** Lines 1-9\n- **Prompt:** Not found\n"
         "- **Execution:** Lines not found", 4, ("invalid", "outside lines 1-4")),
        # an execution without a prompt: rejected
        ("### Component 1\n- **Description:** Check\n- **Plan:** Line 1\n- **Prompt:** Not found\n"
         "- **Execution:** Lines 2-4", 4, ("invalid", "execution but no prompt")),
        # a label holding no range: unparseable
        ("### Component 1\n- **Description:** Check\n- **Plan:** the first few lines", 4, ("unparseable", "component 1: plan")),
        # prose naming components but giving no fields: unparseable
        ("Component 1 is the setup and component 2 the answer.", 4, ("unparseable", "no JSON list")),
        # the same defects as GPT-4o writes them in the JSON the prompt asks for
        ('```json\n[{"description": "Check", "plan": "not found", "prompt": "Check it.", "execution": "1-2", '
         '"comment": "not found"}]\n```', 2, ("ok", ["no_plan"])),
        ('[{"description": "Check", "plan": "1-2", "prompt": "Check it.", "execution": "1-2", "comment": "not found"}]',
         2, ("ok", ["plan_equals_execution"])),
        ('[{"description": "Check", "plan": "1-1", "prompt": "Check it.", "execution": "2-4", "comment": "4-4"}]',
         4, ("ok", ["overlap_execution_comment"])),
        ('[{"description": "A", "plan": "1-2", "prompt": "Do A.", "execution": "3-5", "comment": "not found"}, '
         '{"description": "B", "plan": "5-6", "prompt": "not found", "execution": "not found", "comment": "not found"}]',
         6, ("ok", ["overlap_plan_execution"])),
        ('[{"description": "A", "plan": "1-2", "prompt": "Do A.", "execution": "3-4", "comment": "not found"}]',
         6, ("ok", ["uncovered_lines"])),
        ('[{"description": "Check", "plan": "1-9", "prompt": "not found", "execution": "not found"}]',
         4, ("invalid", "outside lines 1-4")),
        ('[{"description": "Check", "plan": "1-1", "prompt": "not found", "execution": "2-4"}]',
         4, ("invalid", "execution but no prompt")),
        ('[{"description": "Check", "plan": "the start"}]', 4, ("unparseable", "component 1: plan")),
    ],
)
def test_markdown_answers_are_checked_like_json(text: str, n: int, outcome: tuple) -> None:
    try:
        components = parse_components(text)
    except AnswerError as exc:
        assert outcome[0] == "unparseable" and outcome[1] in str(exc), exc
        return
    errors = validate_components(components, n)
    if outcome[0] == "invalid":
        assert any(outcome[1] in e for e in errors), errors
    else:
        assert errors == [] and outcome[0] == "ok"
        assert [w.kind for w in component_warnings(components, n)] == outcome[1]
        # --strict rejects it, except for uncovered lines alone
        assert bool(validate_components(components, n, strict=True)) == (outcome[1] != ["uncovered_lines"])


def test_json_wins_over_markdown_in_the_same_answer() -> None:
    text = "### Component 1\n- **Plan:** Lines 1-1\n\n" + json.dumps(GOOD)
    assert [c.plan for c in parse_components(text)] == [(1, 2), (6, 7)]


# --- markdown tables and prose after ranges -----------------------------------------------
# GPT-4o's other two habits: a table of components, and a range followed by an explanation.

GOOD_RANGES = [
    ComponentRanges(1, "Set up", (1, 2), "Solve 6w = 30.", (3, 4), (5, 5)),
    ComponentRanges(2, "Answer", (6, 7), "", None, None),
]

TABLE_PLAIN = """Here are the components:

| # | Description | Plan | Prompt | Execution | Comment |
|---|-------------|------|--------|-----------|---------|
| 1 | Set up | 1-2 | Solve 6w = 30. | 3-4 | 5 |
| 2 | Answer | 6-7 | not found | not found | not found |
"""

TABLE_COMPONENT_CELLS = """| Component | Plan lines | Prompt | Execution lines | Comments |
| :-- | :--: | --- | --: | --- |
| **Component 1: Set up** | `Lines 1\u20132` | "Solve 6w = 30." | **Lines 3\u20134** | Line 5 |
| Component 2 \u2013 Answer | Lines 6-7 | N/A | N/A | Lines not found |

Let me know if you need anything else."""

TABLE_NO_OUTER_BARS = """Step | Summary | Planning | Prompt | Execution | Observation
---|---|---|---|---|---
Step 1 | Set up | Lines 1-2 (restating the question) | Solve<br>6w = 30. | 3-4, the division by 6 | 5
Step 2 | Answer | 6-7 | None | - | \u2014
"""

TABLE_EXTRA_COLUMNS = """| Step | Title | Plan range | Execution range | Comment range | Prompt | Confidence |
|------|-------|-----------|-----------------|---------------|--------|------------|
| 1. | Set up | L1-2 | 3 to 4 | 5 | `Solve 6w = 30.` | high |
|  |  |  |  |  |  |  |
| 2. | Answer | 6\u20137 | None (the model only states the result) | Lines not found | Not found | 90% |
"""


@pytest.mark.parametrize("text", [TABLE_PLAIN, TABLE_COMPONENT_CELLS, TABLE_NO_OUTER_BARS, TABLE_EXTRA_COLUMNS],
                         ids=["plain", "component-cells", "no-outer-bars", "extra-columns"])
def test_parse_components_reads_markdown_tables(text: str) -> None:
    assert parse_components(text) == GOOD_RANGES


def test_table_without_prompt_column_parses_and_is_then_validated() -> None:
    text = ("| Component | Description | Plan lines | Execution lines | Comment lines |\n"
            "|---|---|---|---|---|\n"
            "| 1 | Understand the problem | 1-3 | 4-9 | Lines not found |\n"
            "| 2 | Compute the sum | Lines 10-11 | 12-20 | 21 |\n")
    components = parse_components(text)
    assert components == [
        ComponentRanges(1, "Understand the problem", (1, 3), "", (4, 9), None),
        ComponentRanges(2, "Compute the sum", (10, 11), "", (12, 20), (21, 21)),
    ]
    # the executions name no prompt: rejected like the same JSON answer would be
    assert validate_components(components, 21) == ["component 1 has an execution but no prompt",
                                                   "component 2 has an execution but no prompt"]


@pytest.mark.parametrize("cell, json_value", [("the first lines", "the first lines"), ("3-5, 7-9", "3-5, 7-9"),
                                              ("Lines 2 to the end", "Lines 2 to the end")])
def test_bad_table_cell_is_unparseable_like_a_bad_json_range(cell: str, json_value: str) -> None:
    table = ("| # | Description | Plan | Prompt | Execution | Comment |\n|---|---|---|---|---|---|\n"
             "| 1 | Set up | 1-2 | Solve it. | 3-4 | 5 |\n"
             f"| 2 | Answer | {cell} | not found | not found | not found |\n")
    as_json = json.dumps([{"description": "Set up", "plan": "1-2", "prompt": "Solve it.", "execution": "3-4", "comment": "5"},
                          {"description": "Answer", "plan": json_value, "prompt": "not found", "execution": "not found",
                           "comment": "not found"}])
    with pytest.raises(AnswerError) as from_table:
        parse_components(table)
    with pytest.raises(AnswerError) as from_json:
        parse_components(as_json)
    assert str(from_table.value) == str(from_json.value)
    assert str(from_table.value).startswith("component 2: plan")


def test_table_answers_get_the_same_warnings_and_strict() -> None:
    text = ("| # | Description | Plan | Prompt | Execution | Comment |\n|---|---|---|---|---|---|\n"
            "| 1 | Check | Lines not found | Check it. | 1-2 | not found |\n")
    components = parse_components(text)
    assert validate_components(components, 2) == []
    assert [w.kind for w in component_warnings(components, 2)] == ["no_plan"]
    assert validate_components(components, 2, strict=True) == ["component 1 has no plan"]


def test_tables_without_range_columns_are_not_components() -> None:
    text = "| Line | Text |\n|---|---|\n| 1 | Let x = 2. |\n| 2 | So 2x = 4. |\n"
    with pytest.raises(AnswerError, match="no JSON list"):
        parse_components(text)


def test_json_wins_over_a_table_and_sections_over_a_summary_table() -> None:
    assert parse_components(TABLE_PLAIN.replace("| 1-2 |", "| 1-1 |") + "\n" + json.dumps(GOOD)) == GOOD_RANGES
    summary = "\n\nSummary:\n" + TABLE_PLAIN.replace("| 6-7 |", "| 6-9 |")
    assert parse_components(MD_HEADERS_BULLETS_BOLD + summary) == GOOD_RANGES


@pytest.mark.parametrize(
    "value, expected",
    [
        ("Lines 1-2, where the model restates the question", (1, 2)),
        ("Lines 1-2 where the model restates the question", (1, 2)),
        ("8\u201312 (the computation)", (8, 12)),
        ("**Lines 8-12** (the computation)", (8, 12)),
        ("Line 8. The model checks the result", (8, 8)),
        ("8 \u2013 the model checks the result", (8, 8)),
        ("Lines 8 to 12: substituting x", (8, 12)),
        # numbers in the prose never become a range end
        ("Lines 1-2, where the model computes 3 + 4 = 7 over 10 cases", (1, 2)),
        ("Line 8 (checks lines 12-15 again)", (8, 8)),
        ("Lines 8-12 (5 lines)", (8, 12)),
        ("8, then 9 more cases", (8, 8)),
        ("N/A, the model never comments", None),
        ("None \u2013 the model goes straight to line 4", None),
        # read as before
        ("Lines 3-7 (verification)", (3, 7)),
        ("Line 3 to Line 7", (3, 7)),
        ("Line 5.", (5, 5)),
    ],
)
def test_markdown_range_followed_by_prose(value: str, expected: Any) -> None:
    text = (f"### Component 1\n- **Description:** Step\n- **Plan:** {value}\n- **Prompt:** Do it.\n"
            f"- **Execution:** Lines 20-21\n\n**Component 2**\nPlan lines: 22\nExecution lines: {value}\nPrompt: Go.\n")
    first, second = parse_components(text)
    assert (first.plan, first.execution) == (expected, (20, 21))
    assert (second.plan, second.execution) == ((22, 22), expected)


@pytest.mark.parametrize("value", ["Lines 3-5, 7-9 (two blocks)", "Lines 3 and 5, the checks", "Lines 4-9 and line 10",
                                   "Lines 3 to the end", "Lines 3-4 (and 9)", "the first lines, 1-2",
                                   "Line 1.5 of the trace"])
def test_a_list_or_open_range_before_prose_stays_unparseable(value: str) -> None:
    with pytest.raises(AnswerError, match="component 1: plan"):
        parse_components(f"### Component 1\n- **Description:** Step\n- **Plan:** {value}\n")


# --- validation ---------------------------------------------------------------------------


def comp(n: int, plan: Any, execution: Any = None, comment: Any = None, description: str = "d", prompt: str = "p") -> ComponentRanges:
    return ComponentRanges(n, description, plan, prompt, execution, comment)


def test_validate_accepts_good_components_and_reports_uncovered_lines() -> None:
    cs = [comp(1, (1, 2), (3, 5), (6, 6)), comp(2, (8, 9))]
    assert validate_components(cs, 9) == []
    assert uncovered_lines(cs, 9) == [7]
    assert uncovered_lines(cs[:1], 6) == []


# Only what cannot be rendered is rejected, whatever the mode.
@pytest.mark.parametrize(
    "components, n, message",
    [
        ([comp(1, (1, 2), (3, 9))], 5, "execution range 3-9 is outside lines 1-5"),
        ([comp(1, (0, 2))], 5, "outside lines 1-5"),
        ([comp(1, (4, 2))], 5, "runs backwards"),
        ([comp(1, (1, 2), (3, 4), prompt="")], 5, "component 1 has an execution but no prompt"),
        ([], 5, "no components"),
    ],
)
def test_validate_rejects_what_cannot_be_rendered(components: list[ComponentRanges], n: int, message: str) -> None:
    for strict in (False, True):
        errors = validate_components(components, n, strict=strict)
        assert any(message in e for e in errors), errors


# GPT-4o's routine slips: kept with a named warning by default, rejected with --strict.
@pytest.mark.parametrize(
    "components, n, kinds",
    [
        ([comp(1, None, (1, 2)), comp(2, (3, 5))], 5, [("no_plan", 1)]),
        ([comp(1, None), comp(2, (1, 5))], 5, [("no_plan", 1)]),
        ([comp(1, (1, 3), (1, 3)), comp(2, (4, 5))], 5, [("plan_equals_execution", 1)]),
        ([comp(1, (1, 2), (3, 4), (4, 5))], 5, [("overlap_execution_comment", 1)]),
        ([comp(1, (1, 3), (3, 5))], 5, [("overlap_plan_execution", 1)]),
        ([comp(1, (1, 2), (3, 5)), comp(2, (5, 6))], 6, [("overlap_plan_execution", 2)]),
        ([comp(1, (1, 4)), comp(2, (2, 2))], 5, [("overlap_plan_plan", 2), ("uncovered_lines", None)]),
        ([comp(1, (1, 2), description="")], 2, [("no_description", 1)]),
        ([comp(1, (1, 9)), comp(2, (2, 2)), comp(3, (5, 6))], 9, [("overlap_plan_plan", 2), ("overlap_plan_plan", 3)]),
    ],
)
def test_warnings_are_named_and_strict_rejects_them(components: list[ComponentRanges], n: int, kinds: list) -> None:
    assert validate_components(components, n) == []
    found = component_warnings(components, n)
    assert [(w.kind, w.component) for w in found] == kinds
    assert all(w.kind in WARNING_KINDS for w in found)
    strict = validate_components(components, n, strict=True)
    assert strict == [w.message for w in found if w.kind != "uncovered_lines"]


def test_warning_messages_name_the_ranges() -> None:
    [w] = component_warnings([comp(1, (1, 2), (3, 4), (4, 5))], 5)
    assert w.message == "component 1 execution 3-4 overlaps component 1 comment 4-5"
    [w] = component_warnings([comp(1, (1, 3), (1, 3)), comp(2, (4, 5))], 5)
    assert w.message == "component 1 plan 1-3 equals its execution range"
    [w] = component_warnings([comp(1, (1, 2)), comp(2, (5, 5))], 8)
    assert (w.kind, w.message) == ("uncovered_lines", "5 line(s) in no range: 3-4, 6-8")
    assert validate_components([comp(1, (1, 2)), comp(2, (5, 5))], 8, strict=True) == []  # never rejected


def test_plan_equal_to_execution_renders_the_same_lines_in_both() -> None:
    thought = "Compute 2 + 2. It is 4.\nDone."
    spans = line_spans(thought)
    rec = component_record(comp(1, (1, 2), (1, 2)), thought, spans)
    assert rec["plan_text"] == rec["execution_text"] == "Compute 2 + 2. It is 4."


def test_component_record_resolves_original_text() -> None:
    thought = "First line.\n\nSecond line. Third one.\nFourth."
    spans = line_spans(thought)
    rec = component_record(comp(1, (1, 1), (2, 4)), thought, spans)
    assert rec["plan"] == [1, 1] and rec["execution"] == [2, 4] and rec["comment"] is None
    assert rec["plan_text"] == "First line."
    assert rec["execution_text"] == "Second line. Third one.\nFourth."  # line breaks kept
    assert rec["comment_text"] is None


# --- the stage over HTTP ------------------------------------------------------------------


def good_answer(row: dict) -> str:
    return row["scripted_components"]


def base_components(row: dict) -> list[dict]:
    return json.loads(re.search(r"\[.*\]", good_answer(row), re.S).group(0))


def edited(row: dict, edit: Callable[[list[dict]], None]) -> str:
    comps = base_components(row)
    edit(comps)
    return json.dumps(comps)


def _set(index: int, **values: Any) -> Callable[[list[dict]], None]:
    return lambda cs: cs[index].update(values)


def case_rows() -> tuple[list[dict], dict[str, Callable[[dict], Any]]]:
    """The four fixture traces plus copies of the first one, each scripted to fail one way."""
    traces = load_traces()
    base = traces[0]  # remainder-2-3-pow: 14 lines, 5 components
    calls: dict[str, int] = {}

    def once_500_then_good(row: dict) -> Any:
        calls[row["id"]] = calls.get(row["id"], 0) + 1
        if calls[row["id"]] == 1:
            return Reply(status=500, error="boom", headers={"Retry-After": "0"})
        return good_answer(row)

    cases: dict[str, Callable[[dict], Any]] = {
        "missing-fields": lambda r: edited(r, lambda cs: (cs[1].pop("description"), cs[4].pop("plan"))),
        "overlap": lambda r: edited(r, _set(2, execution="8-10")),
        "past-end": lambda r: edited(r, _set(4, plan="13-20")),
        "lines-not-found": lambda r: json.dumps([
            {"description": "Everything", "plan": "Lines 1-14", "prompt": "n/a", "execution": "Lines not found", "comment": None}
        ]),
        "prose": lambda r: f"Sure! Here is my analysis.\n{edited(r, lambda cs: None)}\nLet me know if you need more.",
        "no-json": lambda r: "I am sorry, but I cannot split this reasoning.",
        "blank": lambda r: "   ",
        "empty": lambda r: Reply(empty=True),
        "500-then-ok": once_500_then_good,
        "timeout": lambda r: Reply(text=good_answer(r), delay=5),
        "truncated": lambda r: Reply(text=good_answer(r), finish_reason="length"),
        "gap": lambda r: edited(r, _set(3, comment="not found")),
        "no-thought": lambda r: pytest.fail("no request expected for an item without a thought"),
    }
    rows = [dict(t) for t in traces]
    replies: dict[str, Callable[[dict], Any]] = {t["id"]: good_answer for t in traces}
    for name in cases:
        row = {**base, "id": f"case-{name}", "question": f"{base['question']} [{name}]"}
        if name == "no-thought":
            row["thought"] = ""
        rows.append(row)
        replies[row["id"]] = cases[name]
    return rows, replies


def case_handler(rows: list[dict], replies: dict[str, Callable[[dict], Any]]) -> Handler:
    """The scripted server's handler for `case_rows`: each row answered by its own reply."""
    return by_question(rows, lambda row: replies[row["id"]](row))


# What an LLM stage records for the fixture traces, and for each way the server can answer badly
# (test_dag expects the same of stage 2).
FIXTURE_OK = {name: ("ok", None) for name in ("remainder-2-3-pow", "rectangle-area", "sum-of-divisors-36", "circle-circumference")}
SERVER_CASES = {
    "case-blank": ("unparseable", "the answer is empty"),
    "case-empty": ("llm_empty", "empty completion"),
    "case-500-then-ok": ("ok", None),
    "case-timeout": ("llm_timeout", "timed out"),
    "case-truncated": ("truncated", "max_tokens"),
}
EXPECTED = {
    **FIXTURE_OK,
    **SERVER_CASES,
    "case-missing-fields": ("ok", None),  # kept with warnings (see WARNINGS); --strict rejects it
    "case-overlap": ("ok", None),
    "case-past-end": ("invalid", "component 5 plan range 13-20 is outside lines 1-14"),
    "case-lines-not-found": ("ok", None),
    "case-prose": ("ok", None),
    "case-no-json": ("unparseable", "no JSON list of components found"),
    "case-gap": ("ok", None),
    "case-no-thought": ("no_thought", "no reasoning trace"),
}
# The defects kept, per record, as (kind, component); worked out from the edits in `case_rows`.
WARNINGS = {
    "case-missing-fields": [("no_description", 2), ("no_plan", 5), ("uncovered_lines", None)],  # plan 13-14 gone
    "case-overlap": [("overlap_plan_execution", 4)],  # component 3 execution 8-10 runs into component 4 plan 10-10
    "case-gap": [("uncovered_lines", None)],  # component 4's comment (line 12) dropped
}
# What --strict says instead (uncovered lines alone never reject).
STRICT = {
    "case-missing-fields": ("invalid", "component 2 has no description; component 5 has no plan"),
    "case-overlap": ("invalid", "component 3 execution 8-10 overlaps component 4 plan 10-10"),
}


def test_stage_records_every_item_with_a_clear_status(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    rows, replies = case_rows()
    inp = write_jsonl(tmp_path / "traces.jsonl", rows)
    out = tmp_path / "components"
    srv = scripted_server(case_handler(rows, replies))
    outcome = run_stage1(inp, out, srv.base_url)
    assert not srv.errors
    records = records_of(out)
    assert set(records) == set(EXPECTED)
    for item_id, (status, message) in EXPECTED.items():
        rec = records[item_id]
        assert rec["status"] == status, (item_id, rec["status"], rec["error"])
        if message is None:
            assert rec["error"] is None
        else:
            assert message in rec["error"], (item_id, rec["error"])
        assert rec["retryable"] == (status in ("llm_empty", "llm_timeout")), item_id
        assert (rec["components"] != []) == (status == "ok"), item_id

    # good answers resolve to the original text, line breaks included
    rem = records["remainder-2-3-pow"]
    assert rem["num_lines"] == 14 and rem["uncovered_lines"] == []
    assert [c["number"] for c in rem["components"]] == [1, 2, 3, 4, 5]
    c4 = rem["components"][3]
    assert (c4["plan"], c4["execution"], c4["comment"]) == ([10, 10], [11, 11], [12, 12])
    assert c4["plan_text"] == "Wait, let me double-check with Fermat's little theorem."
    assert c4["comment_text"] == "Yes, that matches."
    div = records["sum-of-divisors-36"]["components"][1]
    assert div["execution_text"] == "sigma(2^2) = 1 + 2 + 4 = 7. sigma(3^2) = 1 + 3 + 9 = 13.\nSo sigma(36) = 7 * 13 = 91."
    assert records["rectangle-area"]["components"][2]["execution"] is None
    assert records["case-gap"]["uncovered_lines"] == [12]
    assert records["case-lines-not-found"]["components"][0]["prompt"] is None
    assert records["case-prose"]["components"] == rem["components"]
    assert rem["question"] and rem["solution"].endswith("$\\boxed{2}$.") and rem["answer"] == "2"
    assert rem["components_usage"]["completion_tokens"] > 0
    assert "8-10" in records["case-overlap"]["components_answer"]  # the raw answer is kept for debugging

    for item_id, rec in records.items():
        assert [(w["kind"], w["component"]) for w in rec["warnings"]] == WARNINGS.get(item_id, []), item_id
    assert records["case-overlap"]["warnings"][0]["message"] == "component 3 execution 8-10 overlaps component 4 plan 10-10"
    # the kept texts are the original lines of each range, overlap included
    ov = records["case-overlap"]["components"]
    assert ov[2]["execution_text"].endswith(ov[3]["plan_text"])
    assert records["case-missing-fields"]["components"][4]["plan_text"] is None

    assert outcome.counts["ok"] == 10 and outcome.processed == len(EXPECTED) and outcome.skipped == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "components" and manifest["counts"] == outcome.counts
    assert manifest["warnings"] == {"uncovered_lines": 2, "no_description": 1, "no_plan": 1, "overlap_plan_execution": 1}
    assert manifest["config"]["strict"] is False
    assert manifest["usage"]["completion_tokens"] == sum(r["components_usage"]["completion_tokens"] for r in records.values()) > 0
    assert manifest["usage"]["this_run"]["retries"] >= 3  # the 500, the empty answer, the timeout
    assert "component_separation" in manifest["prompt_hashes"]
    assert "3 of 10 ok records kept with warnings: uncovered_lines 2, no_description 1, no_plan 1, " \
           "overlap_plan_execution 1" in outcome.summary()
    assert "ok: 10" in outcome.summary() and str(out / "records.jsonl") in outcome.summary()

    ds = datasets.load_dataset("json", data_files=str(out / "records.jsonl"), split="train")
    assert len(ds) == len(EXPECTED)
    assert sorted(ds["status"]) == sorted(s for s, _ in EXPECTED.values())


def test_strict_rejects_the_kept_defects(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    rows, replies = case_rows()
    names = ("case-missing-fields", "case-overlap", "case-gap", "case-prose")
    rows = [r for r in rows if r["id"] in names]
    inp = write_jsonl(tmp_path / "traces.jsonl", rows)
    out = tmp_path / "strict"
    srv = scripted_server(case_handler(rows, replies))
    outcome = run_stage1(inp, out, srv.base_url, strict=True)
    records = records_of(out)
    for item_id in names:
        status, message = STRICT.get(item_id, ("ok", None))
        assert records[item_id]["status"] == status, item_id
        assert message is None or message in records[item_id]["error"], records[item_id]["error"]
    assert records["case-gap"]["warnings"][0]["kind"] == "uncovered_lines"
    assert outcome.counts == {"ok": 2, "invalid": 2}
    assert json.loads((out / "manifest.json").read_text())["config"]["strict"] is True


def test_rerun_retries_only_transient_failures(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    rows, replies = case_rows()
    inp = write_jsonl(tmp_path / "traces.jsonl", rows)
    out = tmp_path / "components"
    srv = scripted_server(case_handler(rows, replies))
    run_stage1(inp, out, srv.base_url)
    first = records_of(out)
    replies["case-empty"] = good_answer  # the server recovered
    replies["case-timeout"] = good_answer
    srv = scripted_server(case_handler(rows, replies))
    outcome = run_stage1(inp, out, srv.base_url)
    asked = sorted(question_in(body) for endpoint, body in srv.completion_requests)
    assert asked == sorted(r["question"] for r in rows if r["id"] in ("case-empty", "case-timeout"))
    second = records_of(out)
    assert outcome.processed == 2 and outcome.skipped == len(rows) - 2
    assert second["case-empty"]["status"] == second["case-timeout"]["status"] == "ok"
    assert {k: v for k, v in second.items() if k not in ("case-empty", "case-timeout")} == {
        k: v for k, v in first.items() if k not in ("case-empty", "case-timeout")
    }


def test_cache_makes_a_fresh_run_free(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    traces = load_traces()
    inp = write_jsonl(tmp_path / "traces.jsonl", traces)
    cache = tmp_path / "cache"
    srv = scripted_server(by_question(traces, good_answer))
    run_stage1(inp, tmp_path / "a", srv.base_url, cache_dir=cache)
    n = len(srv.completion_requests)
    outcome = run_stage1(inp, tmp_path / "b", srv.base_url, cache_dir=cache)
    assert n == len(traces) and len(srv.completion_requests) == n
    assert outcome.usage["this_run"]["cache_hits"] == len(traces)
    assert outcome.usage["this_run"]["prompt_tokens"] == 0  # nothing generated, nothing paid
    assert outcome.usage["prompt_tokens"] > 0  # the folder's records still say what they cost
    assert records_of(tmp_path / "a") == records_of(tmp_path / "b")


def test_prompt_shows_numbered_lines_and_sends_temperature_zero(tmp_path: Path,
                                                                scripted_server: ScriptedServer) -> None:
    traces = load_traces()[:1]
    inp = write_jsonl(tmp_path / "traces.jsonl", traces)
    srv = scripted_server(by_question(traces, good_answer))
    run_stage1(inp, tmp_path / "out", srv.base_url, max_tokens=5000)
    (_, body), = srv.completion_requests
    content = body["messages"][0]["content"]
    assert body["temperature"] == 0.0 and body["max_tokens"] == 5000 and body["model"] == MODEL
    assert "<Line 1> Okay, so I need to find the remainder when 2^100 + 3^100 is divided by 5. </Line 1>" in content
    assert "<Line 14> The remainder is 2. </Line 14>" in content and "<Line 15>" not in content
    assert "The reasoning has 14 lines." in content
    assert "{question}" not in content and "{lines}" not in content


def test_api_key_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            scripted_server: ScriptedServer) -> None:
    traces = load_traces()[:1]
    inp = write_jsonl(tmp_path / "traces.jsonl", traces)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
    srv = scripted_server(by_question(traces, good_answer), api_key="sk-test-123")
    outcome = run_stage1(inp, tmp_path / "out", srv.base_url)
    assert outcome.counts == {"ok": 1}
    monkeypatch.setenv("OPENAI_API_KEY", "wrong")
    srv = scripted_server(by_question(traces, good_answer), api_key="sk-test-123")
    with pytest.raises(UserError, match="OPENAI_API_KEY"):
        run_stage1(inp, tmp_path / "out2", srv.base_url)


def test_unreachable_server_is_a_user_error(tmp_path: Path) -> None:
    inp = write_jsonl(tmp_path / "traces.jsonl", load_traces())
    with pytest.raises(UserError, match="no server answers"):
        run_stage1(inp, tmp_path / "out", dead_url())


def test_input_without_thoughts_is_a_user_error(tmp_path: Path) -> None:
    inp = write_jsonl(tmp_path / "q.jsonl", [{"question": "What is 1+1?", "id": "a"}])
    with pytest.raises(UserError, match="no thought column"):
        run_stage1(inp, tmp_path / "out", dead_url())


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], scripted_server: ScriptedServer) -> None:
    traces = load_traces()
    inp = write_jsonl(tmp_path / "traces.jsonl", traces)
    out = tmp_path / "out"
    srv = scripted_server(by_question(traces, good_answer))
    code = cli_main([
        "components", "--input", str(inp), "--out-dir", str(out), "--model", MODEL,
        "--server-url", srv.base_url, "--num-workers", "2", "--range", "1:3", "--no-progress",
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert "components: 2 items" in printed and "ok: 2" in printed and str(out) in printed
    assert set(records_of(out)) == {"rectangle-area", "sum-of-divisors-36"}
    code = cli_main(["components", "--input", str(tmp_path / "missing.jsonl"), "--out-dir", str(out)])
    assert code == 2 and "does not exist" in capsys.readouterr().err


def test_a_crash_in_one_item_is_recorded_and_the_rest_go_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            scripted_server: ScriptedServer) -> None:
    import sprint.curation.components as components

    traces = load_traces()
    inp = write_jsonl(tmp_path / "traces.jsonl", traces)
    real = components.parse_components

    def flaky(text: str):
        if "Factor 36" in text:
            raise RuntimeError("parser bug")
        return real(text)

    monkeypatch.setattr(components, "parse_components", flaky)
    srv = scripted_server(by_question(traces, good_answer))
    outcome = run_stage1(inp, tmp_path / "out", srv.base_url)
    records = records_of(tmp_path / "out")
    crashed = records["sum-of-divisors-36"]
    assert crashed["status"] == "crashed" and crashed["error"] == "RuntimeError: parser bug" and crashed["retryable"]
    assert set(crashed) == set(records["rectangle-area"])  # same schema as ok records
    assert outcome.counts == {"ok": 3, "crashed": 1}
    monkeypatch.setattr(components, "parse_components", real)  # the bug is fixed: a re-run redoes the item
    srv = scripted_server(by_question(traces, good_answer))
    outcome = run_stage1(inp, tmp_path / "out", srv.base_url)
    assert len(srv.completion_requests) == 0  # answered from the cache
    assert outcome.counts == {"ok": 4} and outcome.processed == 1


def test_auth_failure_mid_run_stops_the_run_and_keeps_finished_records(tmp_path: Path,
                                                                       scripted_server: ScriptedServer) -> None:
    traces = load_traces()
    inp = write_jsonl(tmp_path / "traces.jsonl", traces)

    def reply(row: dict) -> Any:
        if row["id"] == "circle-circumference":
            return Reply(status=401, error="key revoked")
        return good_answer(row)

    srv = scripted_server(by_question(traces, reply))
    with pytest.raises(UserError, match="key revoked.*API key"):
        run_stage1(inp, tmp_path / "out", srv.base_url, num_workers=1)
    records = records_of(tmp_path / "out")
    assert "circle-circumference" not in records and all(r["status"] == "ok" for r in records.values())
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["counts"] == {"ok": len(records)}


def test_cost_estimate_for_a_priced_model(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    traces = load_traces()
    inp = write_jsonl(tmp_path / "traces.jsonl", traces)
    srv = scripted_server(by_question(traces, good_answer), models=["gpt-4o"])
    outcome = run_stage1(inp, tmp_path / "out", srv.base_url, model="gpt-4o")
    u = outcome.usage
    assert u["estimated_cost_usd"] == round((u["prompt_tokens"] * 2.5 + u["completion_tokens"] * 10) / 1e6, 4)
    assert "at gpt-4o prices" in outcome.summary()


def test_strict_variable_of_the_shell_script(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    import os
    import subprocess
    import sys

    rows, replies = case_rows()
    rows = [r for r in rows if r["id"] == "case-overlap"]
    inp = write_jsonl(tmp_path / "traces.jsonl", rows)
    script = Path(__file__).resolve().parents[1] / "run_component_separation.sh"
    srv = scripted_server(case_handler(rows, replies))
    for value, status in (("", "ok"), ("false", "ok"), ("true", "invalid"), ("maybe", None)):
        out = tmp_path / f"out-{value or 'unset'}"
        env = {**os.environ, "PYTHON": sys.executable, "DATA": str(inp), "OUT_DIR": str(out), "MODEL": MODEL,
               "SERVER_URL": srv.base_url, "STRICT": value}
        proc = subprocess.run(["bash", str(script), "--no-progress"], env=env, capture_output=True, text=True)
        if status is None:
            assert proc.returncode == 2 and "STRICT=maybe" in proc.stderr
            continue
        assert proc.returncode == (0 if status == "ok" else 3), proc.stderr
        assert records_of(out)["case-overlap"]["status"] == status
        assert json.loads((out / "manifest.json").read_text())["config"]["strict"] is (value == "true")
