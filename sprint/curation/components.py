"""Stage 1, component separation: cut a reasoning trace into plan / execution / comment components.

The trace is split into numbered sentence-level lines, an LLM names the line ranges of each
component, and the answer is parsed and checked here before anything downstream trusts it.
Records keep both the ranges and the texts they resolve to, so later stages never need the lines.
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.curation.component_markdown import markdown_components
from sprint.core.data import Item
from sprint.llm.client import LLMClient, Sampling
from sprint.core.options import option
from sprint.core.records import RunDir
from sprint.curation.stage import LLMStage, LLMStageConfig, StageOutcome, ask_checked, fill, usage_of

PROMPT_NAME = "component_separation"
NOT_FOUND = "not found"

# ----------------------------------------------------------------------------------------------
# Line splitting
# ----------------------------------------------------------------------------------------------

# A sentence end: one or more of . ! ? (plus closing quotes, brackets or a closing `$`), then space.
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]$]*[ \t]+")
# Words whose trailing period does not end a sentence ("e.g. Newton", "Fig. 3").
ABBREVIATIONS = frozenset({"e.g", "i.e", "cf", "vs", "approx", "resp", "al", "fig", "eq", "eqs", "dr", "mr", "mrs", "ms", "prof"})
_LIST_MARKER = re.compile(r"\s*(?:\d{1,3}|[A-Za-z]|[ivxIVX]{1,4})")
_DISPLAY_OPEN = {"\\[": "\\]", "$$": "$$", "\\begin{align*}": "\\end{align*}", "\\begin{align}": "\\end{align}"}
_DISPLAY_CLOSE = frozenset(_DISPLAY_OPEN.values())


def _sentence_cuts(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Spans of the sentences of text[start:end] (one physical line), whitespace trimmed."""
    spans: list[tuple[int, int]] = []
    seg = start
    for m in _SENTENCE_END.finditer(text, start, end):
        nxt = text[m.end()] if m.end() < end else ""
        if not nxt or nxt.islower():
            continue  # "… 2. then" or a trailing space: not a new sentence
        punct = m.group(0).rstrip()
        before = text[seg : m.start()]
        word = before.split()[-1].lstrip("([").lower() if before.split() else ""
        if punct.startswith(".") and word in ABBREVIATIONS:
            continue
        if punct == "!" and (before[-1:].isalnum() or before.endswith(")")) and not nxt.isupper():
            continue  # a factorial such as "5! = 120" or "(n+1)! / n!"
        if punct.startswith(".") and _LIST_MARKER.fullmatch(before):
            continue  # "1. First, …" keeps its list marker
        cut = m.start() + len(punct)
        spans.append((seg, cut))
        seg = m.end()
    spans.append((seg, end))
    return [_trim(text, s, e) for s, e in spans if text[s:e].strip()]


def _trim(text: str, s: int, e: int) -> tuple[int, int]:
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return s, e


def line_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of each line of `split_lines`, so ranges map back to the original text.

    Splits on newlines and sentence ends; keeps a display-math block (`\\[ … \\]`, `$$ … $$`)
    as one line, drops empty lines.
    """
    spans: list[tuple[int, int]] = []
    pos = 0
    physical: list[tuple[int, int]] = []
    for raw in text.splitlines(keepends=True):
        physical.append((pos, pos + len(raw.rstrip("\r\n"))))
        pos += len(raw)
    stripped_lines = [text[s:e].strip() for s, e in physical]
    # Where each closing delimiter stands alone on a line, so finding a block's end is a bisect,
    # not a scan (a huge trace full of unclosed `\\[` lines would otherwise take quadratic time).
    closers: dict[str, list[int]] = {}
    for j, line in enumerate(stripped_lines):
        if line in _DISPLAY_CLOSE:
            closers.setdefault(line, []).append(j)
    i = 0
    while i < len(physical):
        s, e = physical[i]
        stripped = stripped_lines[i]
        closing = _DISPLAY_OPEN.get(stripped)
        if closing is not None:
            at = closers.get(closing, [])
            k = bisect.bisect_right(at, i)
            if k < len(at):  # a closed block: one line
                j = at[k]
                spans.append(_trim(text, s, physical[j][1]))
                i = j + 1
                continue
        if stripped:
            spans.extend(_sentence_cuts(text, s, e))
        i += 1
    return spans


def _clean(line: str) -> str:
    return " ".join(line.split())


def split_lines(text: str) -> list[str]:
    """Sentence-level lines of a trace, deterministic, whitespace collapsed, none empty."""
    return [_clean(text[s:e]) for s, e in line_spans(text)]


def number_lines(lines: list[str]) -> str:
    """`<Line 1> … </Line 1>` one per row, the form the component prompt shows the model."""
    return "\n".join(f"<Line {i}> {line} </Line {i}>" for i, line in enumerate(lines, 1))


# ----------------------------------------------------------------------------------------------
# Parsing the model's answer
# ----------------------------------------------------------------------------------------------


class AnswerError(ValueError):
    """The model's answer cannot be read (no JSON, wrong shape, a range that is not a range)."""


LineRange = tuple[int, int]


@dataclass
class ComponentRanges:
    """One component as the model gave it; ranges are 1-based and inclusive, None when absent."""

    number: int
    description: str
    plan: LineRange | None
    prompt: str
    execution: LineRange | None
    comment: LineRange | None


_NOT_FOUND_WORDS = {"", "not found", "none", "null", "n/a", "na", "-", "no", "nothing", "absent", "not present", "not applicable"}
_RANGE_RE = re.compile(r"(\d+)\s*(?:-|–|—|:|\.\.\.?|to|through)\s*(\d+)")


def parse_line_range(value: Any) -> LineRange | None:
    """Read "3-7", "Lines 3-7", "3:7", "5", 5, [3, 7], "not found", null; raise AnswerError otherwise."""
    if value is None or value is False:
        return None
    if isinstance(value, bool):
        raise AnswerError(f"{value!r} is not a line range")
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, float) and value.is_integer():
        return (int(value), int(value))
    if isinstance(value, (list, tuple)):
        if len(value) == 0:
            return None
        if len(value) <= 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return (value[0], value[-1])
        raise AnswerError(f"{value!r} is not a line range")
    if not isinstance(value, str):
        raise AnswerError(f"{value!r} is not a line range")
    s = value.lower()
    s = re.sub(r"\([^()\d]*\)", " ", s)  # a remark in brackets: "3-7 (verification)"
    s = re.sub(r"</?\s*lines?\s*(?=\d|>)|>", " ", s)  # tags: "<Line 3> - <Line 7>"
    s = re.sub(r"\blines?\b|\bl(?=\s*\.?\s*\d)\.?", " ", s)  # words: "Lines 3-7", "L. 5"
    s = s.strip(" \t\n.,;:()[]\"'")
    if s in _NOT_FOUND_WORDS or NOT_FOUND in s:
        return None
    m = _RANGE_RE.fullmatch(s)
    if m:
        return (int(m.group(1)), int(m.group(2)))
    m = re.fullmatch(r"(\d+)", s)
    if m:
        return (int(m.group(1)), int(m.group(1)))
    if re.fullmatch(r"[\d\s,;\-–:]+(?:and\s+[\d\s\-–:]+)?", s):
        raise AnswerError(f"{value!r} is not one contiguous line range")
    raise AnswerError(f"{value!r} is not a line range")


def _strip_fences(text: str) -> str:
    m = re.search(r"```[a-zA-Z]*\s*\n?(.*?)```", text, re.S)
    return m.group(1) if m else text


def extract_json(text: str) -> Any:
    """The first JSON list (or object holding one) in the text, tolerating fences and prose."""
    body = _strip_fences(text)
    decoder = json.JSONDecoder()
    empty = False
    for source in (body, text):
        for m in re.finditer(r"[\[{]", source):
            try:
                value, _ = decoder.raw_decode(source, m.start())
            except json.JSONDecodeError:
                # a trailing comma is the one slip worth forgiving
                try:
                    fixed = re.sub(r",\s*([\]}])", r"\1", source[m.start() :])
                    value, _ = decoder.raw_decode(fixed)
                except json.JSONDecodeError:
                    continue
            if isinstance(value, list) and value and isinstance(value[0], dict):
                return value
            if isinstance(value, list) and not value:
                empty = True  # "[]": the answer, unless a real list follows
                continue
            if isinstance(value, dict):
                lists = [v for v in value.values() if isinstance(v, list)]
                if len(lists) == 1:
                    return lists[0]
                if {"description", "plan"} & {str(k).lower() for k in value}:
                    return [value]
    if empty:
        return []
    raise AnswerError("no JSON list of components found in the answer")


_KEY_ALIASES = {
    "description": "description",
    "desc": "description",
    "plan": "plan",
    "plan_lines": "plan",
    "plan_range": "plan",
    "prompt": "prompt",
    "execution": "execution",
    "execution_lines": "execution",
    "execution_range": "execution",
    "comment": "comment",
    "comment_lines": "comment",
    "comment_range": "comment",
}


def _normalise_keys(obj: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = _KEY_ALIASES.get(re.sub(r"[\s-]+", "_", str(key).strip().lower()))
        if name is not None and name not in out:
            out[name] = value
    return out


def _text_field(value: Any) -> str:
    if value is None:
        return ""
    text = str(value).strip()
    return "" if text.lower() in (NOT_FOUND, "none", "n/a", "null") else text


def parse_components(text: str) -> list[ComponentRanges]:
    """Parse the model's answer into components; raise AnswerError when it cannot be read.

    The JSON list the prompt asks for is read first; an answer without one is read as the
    markdown models often write instead (`### Component 1` / `- **Plan:** Lines 3-7`, or a
    table with Plan / Execution columns; see `sprint.curation.component_markdown`).
    """
    if not text or not text.strip():
        raise AnswerError("the answer is empty")
    try:
        raw = extract_json(text)
    except AnswerError:
        raw = markdown_components(text)
        if raw is None:
            raise AnswerError("no JSON list of components found in the answer (nor markdown `Component N` "
                              "sections or a table with Plan/Execution lines)") from None
    if not raw:
        raise AnswerError("the answer lists no components")
    components = []
    for number, obj in enumerate(raw, 1):
        if not isinstance(obj, dict):
            raise AnswerError(f"component {number} is a JSON {type(obj).__name__}, expected an object")
        fields = _normalise_keys(obj)
        ranges: dict[str, LineRange | None] = {}
        for name in ("plan", "execution", "comment"):
            try:
                ranges[name] = parse_line_range(fields.get(name))
            except AnswerError as exc:
                raise AnswerError(f"component {number}: {name} {exc}") from None
        components.append(
            ComponentRanges(
                number=number,
                description=_text_field(fields.get("description")),
                plan=ranges["plan"],
                prompt=_text_field(fields.get("prompt")),
                execution=ranges["execution"],
                comment=ranges["comment"],
            )
        )
    return components


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
    lines = [_clean(thought[s:e]) for s, e in spans]
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
    help="stage 1: split reasoning traces into plan/execution components with an LLM",
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
        template, item.question, [_clean((item.thought or "")[s:e]) for s, e in line_spans(item.thought or "")]),
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


def register(subparsers: argparse._SubParsersAction) -> None:
    COMPONENTS_STAGE.add_parser(subparsers, _main)


def _main(args: argparse.Namespace) -> int:
    return COMPONENTS_STAGE.main(args)
