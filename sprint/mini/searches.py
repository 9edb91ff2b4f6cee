"""Each search of the arithmetic task read back try by try: where a subtask's own work first goes wrong.

A search is the work under one subtask: its first line (the equation restated, with the digits it looked up),
a try for each digit 1-9 (`4 * 3 = 2 , want 4 , no .`) and the digit found (`So B is 8 .`). SPRINT writes one in
each execution, a sequential model one after each `Now` line of its thought. Each is read against its own first
line, not against the question (the copies are counted elsewhere: `fidelity`, `departure.head_copies`), so a
wrong answer's search is told as a wrong sum or product, a wrong verdict, a try out of order or a result that
is not the try that fit, in either model, by the subtask's place in its round.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from sprint.core.data import iter_jsonl
from sprint.format.tags import THINK, THINK_END
from sprint.mini.arithmetic import (DONE, OPENINGS, apply, copy_place, copy_places, lead, read_prompt, read_result,
                                    read_step)

# the first thing a search gets wrong, in the order it writes them (None: right to the end)
HEAD, RESTATED, ORDER, OPERANDS, VALUE, VERDICT, RESULT = (
    "no first line", "restated with another operation or other digits", "a try missing or out of order",
    "a try on another equation", "a try's sum or product", "a try's verdict", "the digit found is not the try that fit")
ERRORS = (HEAD, RESTATED, ORDER, OPERANDS, VALUE, VERDICT, RESULT)
_TRY = re.compile(r"^([0-9]) ([+*]) ([0-9]) = ([0-9]) , want ([0-9]) , (yes|no) \.$")
_CLOSING = lead(DONE)


def search_error(work: str) -> str | None:
    """The first error of one search's text (an execution, or the lines under a `Now`), None when it has none."""
    step = read_step(work)
    if step is None:
        return HEAD
    if not step.restated_right:
        return RESTATED
    tries = [_TRY.match(line.strip()) for line in work.split("\n") if line[:1].isdigit()]
    fit = None
    for x, found in enumerate(tries, 1):
        if found is None or int(found[1]) != x:
            return ORDER
        op, k, v, t, said = found[2], int(found[3]), int(found[4]), int(found[5]), found[6] == "yes"
        if (op, k, t) != (step.op, step.k, step.target):
            return OPERANDS
        if v != apply(x, op, k):
            return VALUE
        if said != (v == t):
            return VERDICT
        fit = x if said else fit
    if len(tries) != 9:
        return ORDER
    result = read_result(work)
    return None if result is not None and result[1] == fit else RESULT


def thought_lines(generation: str) -> list[str]:
    """The lines between `<think>` and `</think>` (all of them when a tag is missing)."""
    text = generation.split(THINK + "\n", 1)[-1].split(THINK_END, 1)[0]
    return text.rstrip("\n").split("\n")


def sequential_works(lines: list[str]) -> list[tuple[str, str, str]]:
    """(place in its round, the `Now` line, the lines under it up to the next opening, `Now` or closing) for each
    subtask a sequential thought's lines work."""
    works: list[tuple[str, str, list[str]]] = []
    round_index, position, current = 0, -1, None
    for i, line in enumerate(lines):
        if line.startswith(OPENINGS):
            round_index, position, current = round_index + (i > 0), -1, None
        elif read_prompt(line) is not None:
            position += 1
            current = []
            works.append((copy_place(round_index, position), line, current))
        elif line.startswith(_CLOSING):
            current = None
        elif current is not None:
            current.append(line)
    return [(place, prompt, "\n".join(work)) for place, prompt, work in works]


def tally_errors(searches: Iterable[tuple[str, str | None]]) -> dict[str, dict[str, int]]:
    """(place, error) pairs -> place: {"searches": n, "wrong": n, error: n, ...}, places in reading order, and
    `all` over them."""
    counts: dict[str, dict[str, int]] = {}
    for place, error in searches:
        for key in (place, "all"):
            row = counts.setdefault(key, {"searches": 0, "wrong": 0})
            row["searches"] += 1
            if error is not None:
                row["wrong"] += 1
                row[error] = row.get(error, 0) + 1
    return {p: counts[p] for p in (*copy_places(), "all") if p in counts}


def sequential_search_errors(run: Path) -> dict[str, dict[str, int]]:
    """A sequential run's searches (`records.jsonl`'s generations), tallied as `tally_errors` does."""
    searches = []
    for row in iter_jsonl(run / "records.jsonl"):
        lines = thought_lines(row.get("generation") or "")
        searches += [(place, search_error(work)) for place, _, work in sequential_works(lines)]
    return tally_errors(searches)
