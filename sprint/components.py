"""Stage 1, component separation: cut a reasoning trace into plan / execution / comment components.

The trace is split into numbered sentence-level lines, an LLM names the line ranges of each
component, and the answer is parsed and checked here before anything downstream trusts it.
Records keep both the ranges and the texts they resolve to, so later stages never need the lines.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.data import Item, fingerprint, load_items
from sprint.llm import LLMClient, Sampling
from sprint.records import RunDir, text_hash
from sprint.stage import (
    DEFAULT_MODEL,
    DEFAULT_SERVER_URL,
    add_input_args,
    add_llm_args,
    ask,
    crash_record,
    fill,
    input_identity,
    llm_config,
    load_prompt,
    resolve_cache_dir,
    run_stage,
    sampling_for,
    StageOutcome,
    usage_of,
)

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
class Component:
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


def parse_components(text: str) -> list[Component]:
    """Parse the model's answer into components; raise AnswerError when it cannot be read."""
    if not text or not text.strip():
        raise AnswerError("the answer is empty")
    raw = extract_json(text)
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
            Component(
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
# Validation
# ----------------------------------------------------------------------------------------------


def _ranges(components: list[Component]) -> list[tuple[int, str, LineRange]]:
    out = []
    for c in components:
        for name in ("plan", "execution", "comment"):
            r = getattr(c, name)
            if r is not None:
                out.append((c.number, name, r))
    return out


def validate_components(components: list[Component], num_lines: int) -> list[str]:
    """Every rule a usable answer must follow; an empty list means valid.

    Uncovered lines are not an error (see `uncovered_lines`): the paper asks for full coverage,
    but a missed filler line ("Hmm.") does not make the components wrong.
    """
    errors: list[str] = []
    if not components:
        return ["no components"]
    for c in components:
        if not c.description:
            errors.append(f"component {c.number} has no description")
        if c.plan is None:
            errors.append(f"component {c.number} has no plan")
        if c.execution is not None and not c.prompt:
            errors.append(f"component {c.number} has an execution but no prompt")
    spans = _ranges(components)
    for number, name, (start, end) in spans:
        if start > end:
            errors.append(f"component {number} {name} range {start}-{end} runs backwards")
        elif start < 1 or end > num_lines:
            errors.append(f"component {number} {name} range {start}-{end} is outside lines 1-{num_lines}")
    ordered = sorted((r for r in spans if r[2][0] <= r[2][1]), key=lambda r: (r[2][0], r[2][1]))
    reach: tuple[int, str, LineRange] | None = None  # the range seen so far that ends last
    for n2, k2, (s2, e2) in ordered:
        if reach is not None and s2 <= reach[2][1]:
            n1, k1, (s1, e1) = reach
            errors.append(f"component {n1} {k1} {s1}-{e1} overlaps component {n2} {k2} {s2}-{e2}")
        if reach is None or e2 > reach[2][1]:
            reach = (n2, k2, (s2, e2))
    return errors


def uncovered_lines(components: list[Component], num_lines: int) -> list[int]:
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


def component_record(c: Component, thought: str, spans: list[tuple[int, int]]) -> dict[str, Any]:
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


def components_from_record(record: dict[str, Any]) -> list[Component]:
    """The inverse of `component_record` (texts dropped), for later stages and tests."""
    def rng(v: Any) -> LineRange | None:
        return (int(v[0]), int(v[1])) if v else None

    return [
        Component(
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


def base_record(item: Item) -> dict[str, Any]:
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
        "status": "ok",
        "error": None,
        "retryable": False,
        "components_answer": None,
        "components_usage": usage_of(None),
    }


def build_prompt(template: str, question: str, lines: list[str]) -> str:
    return fill(template, question=question.strip(), lines=number_lines(lines), num_lines=str(len(lines)))


REQUIRED_PLACEHOLDERS = ("question", "lines")  # {num_lines} is optional


async def separate_one(item: Item, client: LLMClient, template: str, sampling: Sampling) -> dict[str, Any]:
    """One trace -> one record; every failure becomes a status with a readable error."""
    record = base_record(item)
    thought = record["thought"]
    spans = line_spans(thought)
    record["num_lines"] = len(spans)
    if not item.question.strip():
        return {**record, "status": "no_question", "error": "the item has no question (problem) text"}
    if not spans:
        return {**record, "status": "no_thought", "error": "the item has no reasoning trace (thought) to separate"}
    lines = [_clean(thought[s:e]) for s, e in spans]
    answer = await ask(client, build_prompt(template, item.question, lines), sampling, record, "components")
    if answer is None:
        return record
    try:
        components = parse_components(answer)
    except AnswerError as exc:
        return {**record, "status": "unparseable", "error": str(exc)}
    errors = validate_components(components, len(spans))
    if errors:
        return {**record, "status": "invalid", "error": "; ".join(errors)}
    record["components"] = [component_record(c, thought, spans) for c in components]
    record["uncovered_lines"] = uncovered_lines(components, len(spans))
    return record


async def separate_components_async(
    input: str,
    out_dir: str | Path,
    *,
    model: str = DEFAULT_MODEL,
    server_url: str = DEFAULT_SERVER_URL,
    split: str | None = "train",
    subset: str | None = None,
    range_spec: str | None = None,
    num_workers: int = 8,
    max_tokens: int = 8192,
    temperature: float = 0.0,
    timeout: float = 600.0,
    max_retries: int = 3,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    overwrite: bool = False,
    prompt_file: str | Path | None = None,
    question_col: str | None = None,
    id_col: str | None = None,
    check_server: bool = True,
    progress: bool = True,
) -> StageOutcome:
    """Stage 1 over a dataset; see `separate_components`."""
    out = Path(out_dir).expanduser()
    template = load_prompt(PROMPT_NAME, prompt_file)
    fill(template, REQUIRED_PLACEHOLDERS)  # fail now, not per item, on a bad template
    items = load_items(input, split, subset, range_spec, question_col, id_col, require=("question", "thought"))
    sampling = sampling_for(max_tokens, temperature)
    config = {
        "stage": "components",
        "input": input_identity(input),
        "split": split,
        "subset": subset,
        "question_col": question_col,
        "id_col": id_col,
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "prompt_hash": text_hash(template),
        "range": range_spec,
        "num_workers": num_workers,
        "server_url": server_url,
        "timeout": timeout,
        "max_retries": max_retries,
        "cache_dir": str(cache_dir) if cache_dir else None,
    }
    llm = llm_config(
        server_url=server_url, model=model, num_workers=num_workers, timeout=timeout,
        max_retries=max_retries, cache_dir=resolve_cache_dir(out, cache_dir, use_cache),
    )
    run = RunDir(out, "components", config, overwrite=overwrite)  # after the checks: a refused run leaves no folder
    inputs = {"source": input, "rows": len(items), "fingerprint": fingerprint(input, items)}
    async with LLMClient(llm) as client:
        if check_server and any(not run.is_done(it.id) for it in items):
            await client.check()
        outcome = await run_stage(
            "components",
            items,
            lambda item: separate_one(item, client, template, sampling),
            run,
            workers=num_workers,
            on_crash=lambda item, exc: crash_record(base_record(item), exc),
            usage=client.usage.as_dict,
            usage_key="components_usage",
            manifest=lambda used: run.write_manifest(inputs=inputs, prompts={PROMPT_NAME: template}, usage=used),
            progress=progress,
        )
    ok = [r for r in run.records() if r.get("status") == "ok"]
    partial = [r for r in ok if r.get("uncovered_lines")]
    if partial:
        lines = sum(len(r["uncovered_lines"]) for r in partial)
        outcome.notes.append(f"{len(partial)} of {len(ok)} ok records leave {lines} line(s) uncovered (see uncovered_lines)")
    return outcome


def separate_components(input: str, out_dir: str | Path, **kwargs: Any) -> StageOutcome:
    """Stage 1: cut each trace of `input` into components; records go to `out_dir`.

    Resumable: items already in `out_dir/records.jsonl` are skipped (transient failures are
    retried). Keyword arguments are those of `separate_components_async`.
    """
    return asyncio.run(separate_components_async(input, out_dir, **kwargs))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "components",
        help="stage 1: split reasoning traces into plan/execution components with an LLM",
        description=(
            "Stage 1 (component separation). Each trace is split into numbered sentence-level lines; an "
            "LLM returns its components (description, plan/execution/comment line ranges, prompt). "
            "Answers are parsed and validated; every item gets one record with a status. Re-running the "
            "same command resumes. The API key is read from OPENAI_API_KEY."
        ),
    )
    add_input_args(parser, "traces: a hub id, a .jsonl/.json/.parquet file or a folder (question + thought columns)")
    add_llm_args(parser, max_tokens=8192)
    parser.add_argument("--question-column", dest="question_col", default=None, help="question column (default: detected)")
    parser.add_argument("--id-column", dest="id_col", default=None, help="id column (default: detected)")
    parser.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    kwargs = {k: v for k, v in vars(args).items() if k not in ("func", "command", "input", "out_dir")}
    outcome = separate_components(args.input, args.out_dir, **kwargs)
    print(outcome.summary())
    return 0
