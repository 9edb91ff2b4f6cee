"""Reading stage 1's answer: the model's JSON list (or markdown) of components -> `ComponentRanges`.

Only reading happens here; what makes an answer rejected or kept with warnings is decided in
`sprint.curation.components`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from sprint.curation.component_markdown import markdown_components

NOT_FOUND = "not found"

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
