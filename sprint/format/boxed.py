"""The answer of a generation: the content of its last `\\boxed{…}`.

It is part of the text format (the trajectory model reads a trajectory's answer with it), so it
lives here; `sprint.tasks.grading` builds its answer normalisation on top of it.
"""

from __future__ import annotations

import re

BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def braced(text: str, start: int) -> tuple[str, int] | None:
    """Content of the balanced `{...}` opening at `start`, and the index after it."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":  # `\{`, `\}` and `\\` are escapes, not grouping
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None


def _one_box(text: str, after: int) -> tuple[str, int] | None:
    """Parse what follows `\\boxed` at index `after`: `{...}` or the `\\boxed 5` form."""
    i = after
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        return braced(text, i)
    if i == after or i >= len(text):  # `\boxed` glued to nothing, or at the very end
        return None
    m = re.match(r"[^\s$]+", text[i:])
    if m is None:
        return None
    return m.group(0).rstrip(".,;"), i + m.end()


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` / `\\fbox{...}` (nested braces kept)."""
    if not text:
        return None
    found: str | None = None
    pos = 0
    while True:
        m = BOX_RE.search(text, pos)
        if m is None:
            return found
        got = _one_box(text, m.end())
        if got is None:
            pos = m.end()
            continue
        content, end = got
        found = content.strip()
        pos = end
