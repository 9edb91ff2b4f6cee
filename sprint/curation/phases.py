"""Phases: how one trace's components and DAG become a SPRINT trajectory (DESIGN.md's rendering rules).

Merge short executions into their plan, assign phases (longest path, a plan-only parent keeps its
child in its phase), name prompts `p.k`, render each phase's plan with its `-----` breaks,
`Based on …:` heads and (optionally) observation lines, and take the final answer line from the
reference solution. `sprint.curation.packing` (the stage) drives it; `sprint.format.trajectory` writes the tags.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sprint.core.resources import prompt_file
from sprint.format.boxed import BOX_RE
from sprint.format.trajectory import Execution, Phase, Trajectory, render_prompt

# ------------------------------------------------------------------------------------------
# Input adapter: the field names of stage-2 records. A rename upstream is a one-line change here.

F_COMPONENTS = "components"
F_DAG = "dag"
F_DESCRIPTION = "description"
F_PLAN_TEXT = "plan_text"
F_PROMPT = "prompt"
F_EXECUTION_TEXT = "execution_text"
F_COMMENT_TEXT = "comment_text"
F_EXECUTION_RANGE = "execution"  # [start, end] line numbers or None
F_SOLUTION = "solution"
F_STATUS = "status"
F_WARNINGS = "warnings"  # stage 1's kept defects, counted per kind in the summary

# ------------------------------------------------------------------------------------------
# Rules and defaults.

MERGE_SPAN = 3            # an execution with end - start < MERGE_SPAN becomes part of its plan
MERGE_SEP = "\n"          # between a plan and its merged execution text (the released data's join)
TAIL_SEP = "\n\n"         # between a plan text and its prompt tag / plan-only comment
BREAK = "-----"           # between trains of thought inside one plan
DEFAULT_MAX_PHASES = 12
DEFAULT_THRESHOLD = 1.5
DEFAULT_TEST_FRAC = 0.1
DEFAULT_SEED = 42
MAX_PROMPTS_PER_PLAN = 8  # plans with more prompts than this are not used as training targets
COMMENT_MODES = ("drop", "observe")  # drop: as the released data (no comments); observe: as the paper describes
DEFAULT_COMMENTS = "drop"
FINAL_ANSWER_HEADING = "**Final Answer**\n"  # removed from the SFT assistant turn only
DEFAULT_AGENT_PROMPT = prompt_file("agent")

# Sentence ends and the math delimiters that hide them ("$3! \times 5!$" holds no sentence end).
_MATH_ENVS = r"(?:align|equation|eqnarray|gather|multline|displaymath)\*?"
_SENTENCE_TOKENS = re.compile(
    r"\\\$|\$\$|\$|\\\[|\\\]|\\\(|\\\)|\\begin\{(" + _MATH_ENVS + r")\}|\\end\{(" + _MATH_ENVS + r")\}"
    r"|[.!?][\"')\]]*\s+|\n[ \t]*\n"
)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_CLOSER = {"$$": "$$", "$": "$", "\\[": "\\]", "\\(": "\\)"}


class PackError(ValueError):
    """A trace that cannot or must not be packed; `reason` is a short code for the summary."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class PackedComponent:
    """One component after the merge rule: `execution is None` means plan-only."""

    number: int
    plan: str
    prompt: str
    execution: str | None
    comment: str | None
    parents: list[int] = field(default_factory=list)
    merged: bool = False


def _text(value: Any) -> str:
    """A component text field, stripped; None/"not found" -> "". Headings such as `**Final Answer**`
    stay: the trajectory keeps them (the SFT assistant turn drops that one, `sft_assistant_content`)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PackError("invalid_components", f"expected a text field, got {type(value).__name__}")
    text = value.strip()
    if len(text) == 9 and text.lower() == "not found":
        return ""
    return text


def _span(value: Any, number: int) -> int | None:
    """end - start of a [start, end] range (or "start:end"), None when absent."""
    if value is None or value == "" or (isinstance(value, str) and value.strip().lower() == "not found"):
        return None
    try:
        if isinstance(value, str):
            start, end = (int(x) for x in value.split(":" if ":" in value else "-"))
        else:
            start, end = (int(x) for x in value)
    except (TypeError, ValueError):
        raise PackError("invalid_components", f"component {number}: execution range {value!r} is not [start, end]") from None
    return end - start


def read_dag(raw: Any, n: int) -> dict[int, list[int]]:
    """Parent lists by component number; a node missing from the dict has no parents."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise PackError("invalid_dag", "dag is a string that is not JSON") from None
    if raw is None:
        raise PackError("no_dag", "record has no dag")
    if not isinstance(raw, dict):
        raise PackError("invalid_dag", f"dag must be a {{node: [parents]}} object, got {type(raw).__name__}")
    parents: dict[int, list[int]] = {i: [] for i in range(1, n + 1)}
    for key, value in raw.items():
        if value is None:  # `datasets` fills the keys other rows have with None
            continue
        try:
            node = int(key)
            plist = sorted({int(p) for p in (value or [])})
        except (TypeError, ValueError):
            raise PackError("invalid_dag", f"dag entry {key!r}: {value!r} is not a list of component numbers") from None
        if node not in parents:
            raise PackError("invalid_dag", f"dag names node {node}, but there are {n} components")
        bad = [p for p in plist if not 1 <= p < node]
        if bad:
            raise PackError("invalid_dag", f"dag node {node} has parents {bad}: parents must be earlier components")
        parents[node] = plist
    return parents


def packed_components(row: dict[str, Any]) -> list[PackedComponent]:
    """Read a stage-2 record's components + dag and apply the merge rule."""
    raw = row.get(F_COMPONENTS)
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise PackError("invalid_components", "components is a string that is not JSON") from None
    if not raw:
        raise PackError("no_components", "record has no components")
    if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
        raise PackError("invalid_components", "components must be a list of objects")
    dag = read_dag(row.get(F_DAG), len(raw))
    out = []
    for i, c in enumerate(raw, 1):
        plan = _text(c.get(F_PLAN_TEXT))
        execution = _text(c.get(F_EXECUTION_TEXT))
        span = _span(c.get(F_EXECUTION_RANGE), i)
        merged = bool(execution) and span is not None and span < MERGE_SPAN
        if merged:
            plan = MERGE_SEP.join(t for t in (plan, execution) if t)
        prompt = _text(c.get(F_PROMPT))
        has_execution = bool(execution) and not merged
        if has_execution and not prompt:
            raise PackError("invalid_components", f"component {i} has an execution but no prompt")
        out.append(PackedComponent(i, plan, prompt, execution if has_execution else None,
                                   _text(c.get(F_COMMENT_TEXT)) or None, dag[i], merged))
    return out


# ------------------------------------------------------------------------------------------
# Phases, names, plans.


def assign_phases(components: list[PackedComponent]) -> dict[int, int]:
    """Longest-path phase of each component, in component order (parents come first)."""
    phase: dict[int, int] = {}
    by_number = {c.number: c for c in components}
    for c in components:
        phase[c.number] = max(
            (phase[p] + (1 if by_number[p].execution is not None else 0) for p in c.parents), default=1
        )
    return phase


def prompt_names(components: list[PackedComponent], phases: dict[int, int]) -> dict[int, str]:
    """`p.k` for every component with an execution, k counting in component order within phase p."""
    counts: Counter[int] = Counter()
    names = {}
    for c in components:
        if c.execution is not None:
            p = phases[c.number]
            counts[p] += 1
            names[c.number] = f"{p}.{counts[p]}"
    return names


def render_plan(members: list[PackedComponent], phases: dict[int, int], names: dict[int, str],
                by_number: dict[int, PackedComponent], comments: str = DEFAULT_COMMENTS) -> str:
    """The plan text of one phase (without the `<Plan_p>` tags), per DESIGN's six steps.

    `comments="drop"` (the released data) leaves out steps 1 and 6's comment; "observe" renders them.
    """
    observe = comments == "observe"
    blocks: list[str] = []
    prev: PackedComponent | None = None
    prev_based: list[str] = []
    for c in members:
        sources = [by_number[p] for p in c.parents
                   if by_number[p].execution is not None and phases[p] < phases[c.number]]
        lines = [f"Observation about execution_{names[p.number]}: {p.comment}" for p in sources if p.comment and observe]
        if prev is not None and c.number != prev.number + 1:
            lines.append(BREAK)
        lines.append("")
        based = [names[p.number] for p in sources]
        head = "Based on " + ", ".join(f"execution_{n}" for n in based) + ":\n" if based and based != prev_based else ""
        tail = render_prompt(names[c.number], c.prompt) if c.execution is not None else (c.comment or "") if observe else ""
        text = (head + TAIL_SEP.join(t for t in (c.plan, tail) if t)).rstrip()
        if text or len(lines) > 1:
            lines.append(text)
            blocks.append("\n".join(lines))
        prev, prev_based = c, based
    return "\n".join(blocks).strip()


def build_trajectory(question: str, components: list[PackedComponent], final_answer: str | None,
                     comments: str = DEFAULT_COMMENTS) -> Trajectory:
    """Components (merged, with parents) -> the trajectory model; rendering is left to it."""
    phases = assign_phases(components)
    names = prompt_names(components, phases)
    by_number = {c.number: c for c in components}
    out = []
    for p in range(1, max(phases.values(), default=0) + 1):
        members = [c for c in components if phases[c.number] == p]
        plan = render_plan(members, phases, names, by_number, comments)
        executions = [Execution(names[c.number], c.execution) for c in members if c.execution is not None]
        out.append(Phase(p, plan, executions))
    return Trajectory(question.strip(), out, final_answer)


def final_answer_from_solution(solution: str | None) -> str | None:
    """The sentence of the reference solution holding its last `\\boxed`, and what follows it."""
    if not solution or not isinstance(solution, str):  # a number or list from a sloppy file: no usable answer
        return None
    boxes = list(BOX_RE.finditer(solution))
    if not boxes:
        return None
    return _text(solution[_sentence_start(solution, boxes[-1].start()):]) or None


def _sentence_start(text: str, at: int) -> int:
    """Where the sentence holding offset `at` starts: after the last sentence end outside math.

    A display block whose content ends with a period (`… = 5.\\]Next`) ends a sentence too, and
    a blank line ends everything (LaTeX allows no blank line in math).
    """
    start = 0
    closer: str | None = None
    for m in _SENTENCE_TOKENS.finditer(text, 0, at):
        tok = m.group(0)
        if tok == "\\$":
            continue
        if "\n" in tok and _BLANK_LINE.search(tok):
            closer, start = None, m.end()
            continue
        if closer is not None:
            if tok == closer:
                display = closer != "$" and closer != "\\)"
                if display and text[max(0, m.start() - 16): m.start()].rstrip().endswith((".", "!", "?")):
                    start = m.end()
                closer = None
            continue
        if tok in _CLOSER:
            closer = _CLOSER[tok]
        elif m.group(1):
            closer = f"\\end{{{m.group(1)}}}"
        elif tok[0] in ".!?":
            start = m.end()
    return start
