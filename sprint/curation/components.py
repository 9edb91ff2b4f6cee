"""Stage 1, component separation: cut a reasoning trace into plan / execution / comment components.

The trace is split into numbered sentence-level lines (`sprint.curation.trace_lines`), an LLM names
the line ranges of each component, and the answer is read (`sprint.curation.component_answer`) and
checked here before anything downstream trusts it: what cannot be rendered is rejected, other
defects are kept as named warnings. Records keep both the ranges and the texts they resolve to, so
later stages never need the lines.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.core.data import Item
from sprint.llm.client import LLMClient, Sampling
from sprint.core.options import option
from sprint.core.records import RunDir
from sprint.curation.ask import ask_checked, usage_of
from sprint.curation.component_answer import AnswerError, ComponentRanges, LineRange, parse_components
from sprint.curation.stage import LLMStage, StageOutcome
from sprint.curation.stage_config import LLMStageConfig
from sprint.curation.templates import fill
from sprint.curation.trace_lines import clean_line, line_spans, number_lines, split_lines

PROMPT_NAME = "component_separation"

# ----------------------------------------------------------------------------------------------
# Validation: reject only what cannot be rendered; name everything else as a warning
# ----------------------------------------------------------------------------------------------

# The slips GPT-4o makes routinely on real traces; the authors kept such traces, so we keep them too.
WARNING_KINDS = (
    "no_description",
    "no_plan",                  # rendered with an empty plan text
    "plan_equals_execution",    # rendered as the authors did: the same lines in plan and execution
    "overlap_plan_execution",   # two ranges share lines; each part keeps its own text
    "overlap_execution_comment",
    "overlap_plan_comment",
    "overlap_plan_plan",
    "overlap_execution_execution",
    "overlap_comment_comment",
    "uncovered_lines",          # lines in no range: missing from the trajectory
)
_PART_ORDER = {"plan": 0, "execution": 1, "comment": 2}


@dataclass(frozen=True)
class ComponentWarning:
    """A defect that does not stop the trace from being rendered; `component` is None for the trace."""

    kind: str
    component: int | None
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "component": self.component, "message": self.message}


def _ranges(components: list[ComponentRanges]) -> list[tuple[int, str, LineRange]]:
    out = []
    for c in components:
        for name in ("plan", "execution", "comment"):
            r = getattr(c, name)
            if r is not None:
                out.append((c.number, name, r))
    return out


def render_errors(components: list[ComponentRanges], num_lines: int) -> list[str]:
    """What makes an answer unusable: no components, a range that is not within the trace, or an
    execution without a prompt (nothing to name its executor call). An empty list: renderable."""
    if not components:
        return ["no components"]
    errors: list[str] = []
    for c in components:
        if c.execution is not None and not c.prompt:
            errors.append(f"component {c.number} has an execution but no prompt")
    for number, name, (start, end) in _ranges(components):
        if start > end:
            errors.append(f"component {number} {name} range {start}-{end} runs backwards")
        elif start < 1 or end > num_lines:
            errors.append(f"component {number} {name} range {start}-{end} is outside lines 1-{num_lines}")
    return errors


def component_warnings(components: list[ComponentRanges], num_lines: int) -> list[ComponentWarning]:
    """Every rule of the prompt the answer breaks without becoming unrenderable, in component order."""
    found: list[ComponentWarning] = []
    for c in components:
        if not c.description:
            found.append(ComponentWarning("no_description", c.number, f"component {c.number} has no description"))
        if c.plan is None:
            found.append(ComponentWarning("no_plan", c.number, f"component {c.number} has no plan"))
        elif c.plan == c.execution:
            s, e = c.plan
            found.append(ComponentWarning("plan_equals_execution", c.number,
                                          f"component {c.number} plan {s}-{e} equals its execution range"))
    spans = [r for r in _ranges(components) if 1 <= r[2][0] <= r[2][1] <= num_lines]
    spans.sort(key=lambda r: (r[2][0], r[2][1], r[0], _PART_ORDER[r[1]]))
    for i, (n1, k1, (s1, e1)) in enumerate(spans):
        for n2, k2, (s2, e2) in spans[i + 1:]:
            if s2 > e1:
                break
            if n1 == n2 and {k1, k2} == {"plan", "execution"} and (s1, e1) == (s2, e2):
                continue  # plan_equals_execution, named above
            kinds = sorted((k1, k2), key=_PART_ORDER.__getitem__)
            found.append(ComponentWarning(f"overlap_{kinds[0]}_{kinds[1]}", n2,
                                          f"component {n1} {k1} {s1}-{e1} overlaps component {n2} {k2} {s2}-{e2}"))
    missing = uncovered_lines(components, num_lines)
    if missing:
        found.append(ComponentWarning("uncovered_lines", None, f"{len(missing)} line(s) in no range: {_runs(missing)}"))
    found.sort(key=lambda w: (w.component is None, w.component or 0))
    return found


def _runs(numbers: list[int]) -> str:
    """[3, 4, 5, 9] -> "3-5, 9"."""
    parts: list[str] = []
    start = prev = numbers[0]
    for n in numbers[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        if n is not None:
            start = prev = n
    return ", ".join(parts)


def validate_components(components: list[ComponentRanges], num_lines: int, strict: bool = False) -> list[str]:
    """Why the answer is rejected; an empty list means it is kept.

    By default only what cannot be rendered is rejected (`render_errors`); `strict=True` also
    rejects every warning except uncovered lines (the stage's behaviour before warnings existed:
    a missed filler line such as "Hmm." never made the components wrong).
    """
    errors = render_errors(components, num_lines)
    if strict and components:
        errors += [w.message for w in component_warnings(components, num_lines) if w.kind != "uncovered_lines"]
    return errors


def warning_counts(records: Any) -> dict[str, int]:
    """Warnings per kind over the ok records of a stage folder (or any records carrying `warnings`)."""
    counts: dict[str, int] = {}
    for r in records:
        if r.get("status", "ok") != "ok":
            continue
        for w in r.get("warnings") or []:
            kind = w.get("kind") if isinstance(w, dict) else None
            if kind:
                counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def uncovered_lines(components: list[ComponentRanges], num_lines: int) -> list[int]:
    """Lines that belong to no range (a warning: the model was asked to cover all of them)."""
    covered = set()
    for _, _, (start, end) in _ranges(components):
        covered.update(range(max(1, start), min(num_lines, end) + 1))
    return [i for i in range(1, num_lines + 1) if i not in covered]


def resolve_text(text: str, spans: list[tuple[int, int]], r: LineRange | None) -> str | None:
    """The original trace text of a line range, with its own line breaks and spacing kept."""
    if r is None:
        return None
    return text[spans[r[0] - 1][0] : spans[r[1] - 1][1]]


def component_record(c: ComponentRanges, thought: str, spans: list[tuple[int, int]]) -> dict[str, Any]:
    """One component as stored: ranges as [start, end] (or null) and the texts they cover.

    Every key is always present so that `datasets` infers one schema for the whole file.
    """
    return {
        "number": c.number,
        "description": c.description,
        "plan": list(c.plan) if c.plan else None,
        "prompt": c.prompt or None,
        "execution": list(c.execution) if c.execution else None,
        "comment": list(c.comment) if c.comment else None,
        "plan_text": resolve_text(thought, spans, c.plan),
        "execution_text": resolve_text(thought, spans, c.execution),
        "comment_text": resolve_text(thought, spans, c.comment),
    }


def ranges_from_record(record: dict[str, Any]) -> list[ComponentRanges]:
    """The inverse of `component_record` (texts dropped), for later stages and tests."""
    def rng(v: Any) -> LineRange | None:
        return (int(v[0]), int(v[1])) if v else None

    return [
        ComponentRanges(
            number=int(c["number"]),
            description=c.get("description") or "",
            plan=rng(c.get("plan")),
            prompt=c.get("prompt") or "",
            execution=rng(c.get("execution")),
            comment=rng(c.get("comment")),
        )
        for c in record.get("components") or []
    ]


# ----------------------------------------------------------------------------------------------
# The stage
# ----------------------------------------------------------------------------------------------

FAILURE_KINDS = ("no_question", "no_thought", "truncated", "unparseable", "invalid", "crashed")  # plus llm_<kind>


def empty_components_record(item: Item) -> dict[str, Any]:
    """A stage-1 record with every key present, so `datasets` sees one schema on every line."""
    thought = item.thought or ""
    return {
        "id": item.id,
        "index": item.index,
        "question": item.question,
        "solution": item.solution,
        "answer": item.answer,
        "thought": thought,
        "num_lines": 0,
        "components": [],
        "uncovered_lines": [],
        "warnings": [],  # {kind, component, message} per defect kept (see WARNING_KINDS)
        "status": "ok",
        "error": None,
        "retryable": False,
        "components_answer": None,
        "components_usage": usage_of(None),
    }


def components_prompt(template: str, question: str, lines: list[str]) -> str:
    return fill(template, question=question.strip(), lines=number_lines(lines), num_lines=str(len(lines)))


REQUIRED_PLACEHOLDERS = ("question", "lines")  # {num_lines} is optional


async def separate_one(item: Item, client: LLMClient, template: str, sampling: Sampling,
                       strict: bool = False) -> dict[str, Any]:
    """One trace -> one record; every failure becomes a status with a readable error.

    A renderable answer is kept with its defects listed in `warnings`; `strict` rejects them.
    """
    record = empty_components_record(item)
    thought = record["thought"]
    spans = line_spans(thought)
    record["num_lines"] = len(spans)
    if not item.question.strip():
        return {**record, "status": "no_question", "error": "the item has no question (problem) text"}
    if not spans:
        return {**record, "status": "no_thought", "error": "the item has no reasoning trace (thought) to separate"}
    lines = [clean_line(thought[s:e]) for s, e in spans]
    content = components_prompt(template, item.question, lines)
    components = await ask_checked(client, content, sampling, record, "components", parse_components, AnswerError,
                                   lambda found: validate_components(found, len(spans), strict))
    if components is None:
        return record
    record["components"] = [component_record(c, thought, spans) for c in components]
    record["uncovered_lines"] = uncovered_lines(components, len(spans))
    record["warnings"] = [w.as_dict() for w in component_warnings(components, len(spans))]
    return record


@dataclass
class ComponentsConfig(LLMStageConfig):
    """`sprint components` settings: the shared LLM-stage ones plus the input's column names."""

    input: str = option(help="traces: a hub id, a .jsonl/.json/.parquet file or a folder (question + thought columns)",
                        flags=("--input", "-i"), var="DATA")
    max_tokens: int = option(8192, "answer length limit (a long trace's components need room)", var="MAX_TOKENS")
    question_col: str | None = option(None, "question column (default: detected)", flags=("--question-column",),
                                      var="QUESTION_COLUMN")
    id_col: str | None = option(None, "id column (default: detected)", flags=("--id-column",), var="ID_COLUMN")
    # Off by default: the authors kept traces with these slips, and rejecting them loses most of a
    # GPT-4o curation run (see WARNING_KINDS).
    strict: bool = option(False, "also reject answers with a named warning (no plan, plan = execution, overlapping "
                          "ranges, no description); by default they are kept and listed in each record's `warnings`",
                          var="STRICT")


def _warnings_note(run: RunDir) -> list[str]:
    ok = [r for r in run.records() if r.get("status") == "ok"]
    warned = [r for r in ok if r.get("warnings")]
    if not warned:
        return []
    kinds = ", ".join(f"{k} {n}" for k, n in warning_counts(ok).items())
    return [f"{len(warned)} of {len(ok)} ok records kept with warnings: {kinds} (see `warnings` in records.jsonl; "
            "--strict rejects them)"]


def _manifest_warnings(run: RunDir) -> dict[str, Any]:
    return {"warnings": warning_counts(run.records())}


COMPONENTS_STAGE = LLMStage(
    name="components",
    description=(
        "Stage 1 (component separation). Each trace is split into numbered sentence-level lines; an "
        "LLM returns its components (description, plan/execution/comment line ranges, prompt). "
        "Answers (JSON, or the markdown layout models often write) are parsed and validated: one that "
        "cannot be rendered is rejected, other defects are kept as named `warnings` (--strict rejects "
        "them too); every item gets one record with a status. Re-running the "
        "same command resumes. The API key is read from OPENAI_API_KEY."
    ),
    config_cls=ComponentsConfig,
    prompt_name=PROMPT_NAME,
    placeholders=REQUIRED_PLACEHOLDERS,
    require=("question", "thought"),
    config_keys=("question_col", "id_col", "strict"),
    base_record=empty_components_record,
    process=separate_one,
    prompt_text=lambda item, template: components_prompt(
        template, item.question, split_lines(item.thought or "")),
    process_options=lambda cfg: {"strict": cfg.strict},
    notes=_warnings_note,
    manifest_extra=_manifest_warnings,
)


def separate_components(input: str, out_dir: str | Path, **settings: Any) -> StageOutcome:
    """Stage 1: cut each trace of `input` into components; records go to `out_dir`.

    Resumable: items already in `out_dir/records.jsonl` are skipped (transient failures are
    retried). Keyword arguments are the fields of `ComponentsConfig`.
    """
    return COMPONENTS_STAGE.run(input, out_dir, **settings)


def register(parser: argparse.ArgumentParser) -> None:
    COMPONENTS_STAGE.register(parser)


def handle(args: argparse.Namespace) -> int:
    return COMPONENTS_STAGE.handle(args)
