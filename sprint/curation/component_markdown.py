"""Stage 1 answers written as markdown instead of the JSON list the prompt asks for.

GPT-4o ignores "answer with a JSON list" on some traces and writes either sections
(`### Component 1` / `- **Plan:** Lines 3-7`) or a table (`| # | Description | Plan | … |`).
Both are turned into the plain dicts a JSON answer decodes to, so `components.parse_components`
reads and validates them exactly as it does JSON. A range written with prose after it
(`Lines 1-2, where the model restates the question`) keeps its leading range only; a number in the
prose is never read as part of the range.
"""

from __future__ import annotations

import re

RANGE_FIELDS = ("plan", "execution", "comment")

# ----------------------------------------------------------------------------------------------
# A range with prose after it
# ----------------------------------------------------------------------------------------------

# The leading `Lines a-b` / `Line a` / `a-b` / `a` of a value, in optional bold or code ticks.
_LEAD_RANGE = re.compile(
    r"\s*(?:\*\*|__|`)?\s*(?:lines?\s*:?\s*)?(\d+)"
    r"(?:\s*(?:-|–|—|to|through)\s*(?:lines?\s*)?(\d+))?(?:\s*(?:\*\*|__|`))?",
    re.I,
)
# A leading "none" / "not found" / "N/A" (the parser reads them as no range).
_LEAD_NONE = re.compile(r"\s*(?:\*\*|__|`)?\s*(?:lines?\s+)?(?:not\s+found|not\s+applicable|none|n/a|null|nothing|absent)"
                        r"\b(?:\s*(?:\*\*|__|`))?", re.I)
# What may separate a range from the prose after it: punctuation, a spaced dash, or a space.
_PROSE = re.compile(r"(?:\s*[,;:.—–]\s*|\s+-\s+|\s+)[^\W\d_]|\s*\(", re.I)
# More line numbers after the range ("3-5, 7-9", "lines 3 and 5", "(and 9)") or a range left open
# ("Lines 3 to the end"): not prose; left whole, so the parser rejects it as it did before.
_MORE_LINES = re.compile(
    r"\s*(?:[,;&+]|\b(?:and|or|plus|also)\b)?\s*(?:lines?\b\s*)?\d"
    r"|\s*\(\s*(?:[,;&+]|\b(?:and|or|plus|also)\b)\s*(?:lines?\b\s*)?\d"
    r"|\s*(?:to|through|thru|until|till|onwards?)\b",
    re.I,
)
_ONLY_DASHES = re.compile(r"[\s\-–—]+")


def leading_range(value: str) -> str:
    """`Lines 1-2, where …` -> `1-2`; `None - the model …` -> `not found`; anything else unchanged.

    Only a range (or a none word) followed by prose is cut: a value the parser reads already,
    or one listing more lines, is returned as it is.
    """
    if _ONLY_DASHES.fullmatch(value):
        return "not found"  # a table's "—" for an empty cell
    m = _LEAD_RANGE.match(value)
    if m:
        rest = value[m.end():]
        if rest and _PROSE.match(rest) and not _MORE_LINES.match(rest):
            return f"{m.group(1)}-{m.group(2)}" if m.group(2) else m.group(1)
        return value
    m = _LEAD_NONE.match(value)
    if m and value[m.end():] and _PROSE.match(value[m.end():]):
        return "not found"
    return value


def _md_value(value: str) -> str:
    """A field's text without the markdown around it (bold, code ticks, quotes)."""
    text = value.strip()
    text = re.sub(r"^(?:\*\*|__)|(?:\*\*|__)$", "", text).strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "`\"'":
        text = text[1:-1].strip()
    return text


def _field(name: str, value: str) -> str:
    text = _md_value(value)
    return leading_range(text) if name in RANGE_FIELDS else text


# ----------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------

# A header naming the component ("### Component 2", "**Component 2:** Setup", "Component 2 - Setup"),
# then one labelled field per line ("- **Plan:** Lines 3-7", "**Execution lines**: 8–12",
# "Comment: Lines not found"); a field's text may run on over the following lines until the next
# label or header.
_MD_HEADER = re.compile(r"^[ \t]*(?:#{1,6}[ \t]*)?(?:[-*+][ \t]+)?(?:\*\*|__)?[ \t]*Component[ \t]*#?[ \t]*(\d+)\b[^\n]*$",
                        re.I | re.M)
_MD_FIELD = re.compile(
    r"^[ \t]*(?:[-*+•][ \t]*|\d{1,2}[.)][ \t]*)?(?:\*\*|__)?[ \t]*"
    r"(description|desc|plan|prompt|execution|comment)(?:[ \t]*(?:lines?|range|line[ \t]+range))?"
    r"[ \t]*(?:\*\*|__)?[ \t]*[:：][ \t]*(?:\*\*|__)?(.*)$",
    re.I,
)
_MD_LABELS = {"desc": "description"}


def section_components(text: str) -> list[dict[str, str]]:
    """Components written as `Component N` sections of labelled fields.

    A section counts only when it holds at least one labelled field, so prose that merely
    mentions "component 2" is not mistaken for an answer.
    """
    headers = list(_MD_HEADER.finditer(text))
    out: list[dict[str, str]] = []
    for i, h in enumerate(headers):
        body = text[h.end(): headers[i + 1].start() if i + 1 < len(headers) else len(text)]
        fields: dict[str, list[str]] = {}
        current: str | None = None
        for line in body.splitlines():
            m = _MD_FIELD.match(line)
            if m:
                label = m.group(1).lower()
                current = _MD_LABELS.get(label, label)
                if current in fields:  # a second "Plan:" in one section: keep the first
                    current = None
                    continue
                fields[current] = [m.group(2)]
            elif current is not None and line.strip() and not re.fullmatch(r"\s*(?:-{3,}|\*{3,}|_{3,})\s*", line):
                fields[current].append(line.strip())
            elif not line.strip() and current in RANGE_FIELDS:
                current = None  # a range never runs on past a blank line
        if fields:
            out.append({name: _field(name, " ".join(parts)) for name, parts in fields.items()})
    return out


# ----------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------

_TABLE_RULE = re.compile(r"[ \t]*\|?[ \t]*:?-{2,}:?[ \t]*(?:\|[ \t]*:?-{2,}:?[ \t]*)+\|?[ \t]*")
_NUMBER_HEADERS = frozenset({"#", "no", "no.", "n", "nr", "id", "index", "number", "num"})
_NUMBER_CELL = re.compile(r"(?:(?:component|step)\s*)?#?\s*\d+\s*[:.)\-–—]?\s*", re.I)


def _cells(line: str) -> list[str]:
    """A table row's cells; `\\|` inside a cell is a literal bar."""
    row = line.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)]


def _column(header: str) -> str | None:
    """Which field a column holds, from its header ("Plan lines" -> plan, "#" -> number)."""
    name = re.sub(r"[*_`]", "", header).strip().lower()
    if "prompt" in name or "instruction" in name:
        return "prompt"
    if "plan" in name:
        return "plan"
    if "exec" in name:
        return "execution"
    if re.search(r"comment|observation|remark|reflection|reaction", name):
        return "comment"
    if re.search(r"desc|summary|title|name|purpose|goal", name):
        return "description"
    if name in _NUMBER_HEADERS or re.match(r"(?:component|step)\b", name):
        return "number"
    return None


def _table_row(cells: list[str], columns: list[str | None]) -> dict[str, str]:
    row: dict[str, str] = {}
    for kind, cell in zip(columns, cells + [""] * (len(columns) - len(cells))):
        if kind is None or kind in row:
            continue  # an unknown column, or a second one of a kind: the first wins
        row[kind] = re.sub(r"<br\s*/?>", " ", cell, flags=re.I)
    number = row.pop("number", "")
    if "description" not in row:  # "| Component 1: Set up |" names the step itself
        label = _md_value(number)
        m = _NUMBER_CELL.match(label)
        rest = label[m.end():] if m else label
        if rest.strip():
            row["description"] = rest
    return {name: _field(name, value) for name, value in row.items()}


def table_components(text: str) -> list[dict[str, str]]:
    """Components written as markdown table rows, from every table with a plan or execution column."""
    lines = text.splitlines()
    out: list[dict[str, str]] = []
    for i in range(1, len(lines)):
        if "|" not in lines[i - 1] or not _TABLE_RULE.fullmatch(lines[i]):
            continue
        columns = [_column(h) for h in _cells(lines[i - 1])]
        if not {"plan", "execution"} & set(columns):
            continue
        for line in lines[i + 1:]:
            if "|" not in line or not line.strip():
                break
            cells = _cells(line)
            if not any(c.strip("*_` ") for c in cells):
                continue
            out.append(_table_row(cells, columns))
    return out


def markdown_components(text: str) -> list[dict[str, str]] | None:
    """Components written as markdown, as plain dicts for `parse_components`; None if none.

    Sections are read first (a table beside them is a summary of the same components), tables
    only when there are none.
    """
    return section_components(text) or table_components(text) or None
