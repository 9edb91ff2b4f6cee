"""A reasoning trace as the numbered sentence-level lines the component prompt shows (stage 1).

Ranges in the model's answer refer to these lines, and `line_spans` maps each back to its place in
the original text, so a component's text keeps the trace's own spacing and line breaks.
"""

from __future__ import annotations

import bisect
import re

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


def clean_line(line: str) -> str:
    """A line as the prompt shows it: whitespace runs collapsed to one space."""
    return " ".join(line.split())


def split_lines(text: str) -> list[str]:
    """Sentence-level lines of a trace, deterministic, whitespace collapsed, none empty."""
    return [clean_line(text[s:e]) for s, e in line_spans(text)]


def number_lines(lines: list[str]) -> str:
    """`<Line 1> … </Line 1>` one per row, the form the component prompt shows the model."""
    return "\n".join(f"<Line {i}> {line} </Line {i}>" for i, line in enumerate(lines, 1))
