"""Where a sequential arithmetic output first departs from the trace the generator would write.

The sequential model (RFT, or the base it starts from) was trained on the generator's traces, which are a
function of the question, so its output can be read line by line against `make_trace` of its question.
The first line that differs names the skill that is missing: copying the question (a restated
equation), choosing a round's names, the next prompt, a lookup (a later subtask's head, which restates
its equation and reads earlier results), a try of the search, or the digit it found.
That is what tells a user whether more steps, another model shape or another trace format is needed
(docs/experiments.md, "The arithmetic task").
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sprint.core.data import iter_jsonl
from sprint.mini.arithmetic import (NOW, OPENINGS, RESULT, head_equation, lead, make_trace, parse_problem, read_prompt,
                                    tally)
from sprint.mini.searches import sequential_works, thought_lines

RIGHT = "the generator's trace, line for line"
UNREAD = "a question the arithmetic generator cannot read"
KINDS = {  # kind -> what the model got wrong there
    "round names": "a round's opening (the equations it can do now)",
    "prompt": "the next subtask of a round",
    "lookup head": "a later subtask's equation or the digits it reads",
    "definition": "an equation copied from the question",
    "try": "a try of the search (its sum or product, or its verdict)",
    "result": "the digit a search found",
    "end": "the closing lines",
}


@dataclass(frozen=True)
class Departure:
    line: int   # 0-based, in the thought
    kind: str
    want: str
    got: str


def kind_of(line: str) -> str:
    """The kind of a line of the generator's trace, told by the templates that write them."""
    if line.startswith(OPENINGS):
        return "round names"
    if line.startswith(lead(NOW)):
        return "prompt"
    if re.match(r"^[A-Z] [+*] [0-9A-Z] = ", line):
        return "lookup head" if " where " in line else "definition"
    if line.startswith(lead(RESULT)):
        return "result"
    if line[:1].isdigit():
        return "try"
    return "end"


def first_departure(question: str, generation: str) -> Departure | None:
    """The first line where `generation` leaves the generator's trace (with or without its second check, in the
    question's order or its own, whichever it follows longest); None when it follows one of them to the end."""
    problem, got = parse_problem(question), thought_lines(generation)
    best: Departure | None = None
    for recheck, shuffled in ((False, False), (True, False), (False, True), (True, True)):
        want = make_trace(problem, recheck=recheck, shuffled=shuffled).lines
        i = next((k for k, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
        if i == len(want) == len(got):
            return None
        wanted, written = (want[i] if i < len(want) else ""), (got[i] if i < len(got) else "")
        found = Departure(i, kind_of(wanted), wanted, written)
        if best is None or found.line > best.line:
            best = found
    return best


def head_copies(question: str, generation: str) -> list[tuple[str, bool]]:
    """Each subtask a `Now` line opens: (its place in its round, whether the equation its work restates first is
    the question's line of that name), as `fidelity` reads SPRINT's executions."""
    problem = parse_problem(question)
    nodes = {problem.name(n): n for n in problem.order}
    copies = []
    for place, prompt, work in sequential_works(thought_lines(generation)):
        name, written = read_prompt(prompt), head_equation(work)
        if name in nodes and written is not None:
            copies.append((place, written == problem.equation(nodes[name])))
    return copies


def rft_head_copies(run: Path) -> dict[str, tuple[int, int]]:
    """A sequential run's equations after its `Now` lines, wrong of written by place (`arithmetic.tally`)."""
    copies: list[tuple[str, bool]] = []
    for row in iter_jsonl(run / "records.jsonl"):
        try:
            copies += head_copies(row["question"], row.get("generation") or "")
        except ValueError:  # not a question of this task
            continue
    return tally(copies)


@dataclass
class Departures:
    """A run's outputs counted by where each first departs, with the first example of each kind."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, Departure] = field(default_factory=dict)

    def add(self, kind: str, found: Departure | None = None) -> None:
        self.counts[kind] += 1
        if found is not None:
            self.examples.setdefault(kind, found)


def departures(run: Path) -> Departures:
    """A sequential run's records (`records.jsonl`), read against the generator's traces."""
    seen = Departures()
    for row in iter_jsonl(run / "records.jsonl"):
        try:
            found = first_departure(row["question"], row.get("generation") or "")
        except ValueError:  # not a question of this task
            seen.add(UNREAD)
            continue
        seen.add(found.kind if found else RIGHT, found)
    return seen


def format_departures(seen: Departures) -> list[str]:
    total = sum(seen.counts.values())
    lines = []
    for kind, n in seen.counts.most_common():
        lines.append(f"{n:4d} of {total}  {KINDS.get(kind, kind)}")
        if kind in seen.examples:
            example = seen.examples[kind]
            lines += [f"          e.g. want: {example.want}", f"               got:  {example.got}"]
    return lines
