"""Plan fidelity on the arithmetic task: does the SPRINT model find each problem's parallelism?

The generator knows each problem's ideal packing (`arithmetic.Shape`: the subtasks of each round). A
held-out trajectory is read back against it:

- its shape: the number of prompts in each phase that has any (phases with prompts, widths);
- fidelity: the same number of phases with prompts as the ideal, and in each the same set of
  subtasks in any order, read from the prompts' operands. A later round's subtasks are expected with
  the operands the model's own earlier executions reported (a wrong sum in round 1 is the executor's
  fault, not the plan's), the true values where it reported none;
- copies: every operand of a prompt in a later phase that is not a number of the question (nor a
  one-digit factor) uses an earlier result; it is copied right when an execution of an earlier phase
  reported that value.

Figure 5 in miniature (phases used and prompts per phase against the problem's depth and size) and
the shape figures come from the same reading, the model's beside the ideal packing's.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.core.data import iter_jsonl
from sprint.format.trajectory import TrajectoryError, parse
from sprint.format.boxed import last_boxed
from sprint.mini.arithmetic import Node, Shape, combine, parse_expression, read_result, read_work

Work = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class PlanReading:
    """One held-out problem's trajectory read against its ideal packing."""

    id: str
    depth: int                      # rounds of the ideal packing
    size: int                       # subtasks of the ideal packing
    ideal: tuple[int, ...]          # subtasks per round, ideal
    correct: bool                   # as the run graded it
    formed: bool                    # parses strictly and has a final answer
    widths: tuple[int, ...] = ()    # prompts per phase with prompts, the model's
    matches: bool = False           # phase structure equals the ideal packing
    uses: int = 0                   # operands of later-phase prompts that use an earlier result
    copied: int = 0                 # ... equal to a value an earlier execution reported
    miscomputed: int = 0            # executions whose reported value is not their own prompt's value
    answer_differs: bool = False    # the boxed answer is not the value the model's own work gives


# why a held-out answer is wrong, the first that applies (the order a reader would check a trajectory in)
CORRECT, MALFORMED, MISCOPIED, PLAN, MISCOMPUTED, ANSWER, OTHER = (
    "correct", "malformed (no strict parse or no final answer)", "a later prompt miscopied an earlier result",
    "plan differs from the ideal packing", "an execution miscomputed its subtask", "answer miscopied the work",
    "other")
VERDICTS = (CORRECT, MALFORMED, MISCOPIED, PLAN, MISCOMPUTED, ANSWER, OTHER)


def verdict(reading: PlanReading) -> str:
    if reading.correct:
        return CORRECT
    if not reading.formed:
        return MALFORMED
    for failed, name in ((reading.copied < reading.uses, MISCOPIED), (not reading.matches, PLAN),
                         (reading.miscomputed > 0, MISCOMPUTED), (reading.answer_differs, ANSWER)):
        if failed:
            return name
    return OTHER


def _leaves(node: Node) -> set[int]:
    return {node.value} if node.op is None else {v for a in node.args for v in _leaves(a)}


def _expected(node: Node, results: dict[Work, int]) -> int:
    """A subtask's value as the model's own executions give it (the true value where they give none)."""
    if node.op is None or node.short:
        return node.value
    return results.get(_work(node, results), node.value)


def _work(node: Node, results: dict[Work, int]) -> Work:
    return node.op or "", tuple(_expected(a, results) for a in node.args)


def read_plan(record: dict[str, Any]) -> PlanReading | None:
    """None when the record's question is not an arithmetic problem (the question is read from the
    trajectory when the record has none, as pack's records)."""
    text = record.get("trajectory") or ""
    question = record.get("question") or parse(text, strict=False).question
    try:
        node = parse_expression(str(question))
    except ValueError:
        return None
    if node.op is None:
        return None
    shape = Shape.of(node)
    base = {"id": str(record.get("id")), "depth": len(shape.widths), "size": sum(shape.widths), "ideal": shape.widths,
            "correct": bool(record.get("correct"))}
    try:
        traj = parse(text, strict=True)
    except TrajectoryError:
        return PlanReading(**base, formed=False)
    if traj.final_answer is None:
        return PlanReading(**base, formed=False)
    phases = [ph for ph in traj.phases if ph.prompts]
    rounds: list[list[Work | None]] = [[read_work(p.text) for p in ph.prompts] for ph in phases]
    results: dict[Work, int] = {}
    reported: list[set[int]] = []  # values reported by the executions of each phase with prompts
    miscomputed = 0
    for ph, works in zip(phases, rounds):
        values = set()
        for prompt, work in zip(ph.prompts, works):
            execution = ph.execution(prompt.name)
            value = read_result(execution.text) if execution else None
            if value is not None:
                values.add(value)
                if work is not None:
                    results.setdefault(work, value)
                    miscomputed += value != combine(work[0], tuple(Node(v) for v in work[1])).value
        reported.append(values)
    expected = [[_work(n, results) for n in r] for r in shape.rounds]
    matches = len(rounds) == len(expected) and all(Counter(m) == Counter(e) for m, e in zip(rounds, expected))
    literals, uses, copied = _leaves(node), 0, 0
    for i, works in enumerate(rounds[1:], 1):
        earlier = set().union(*reported[:i])
        for work in works:
            if work is None:
                continue
            op, operands = work
            for j, value in enumerate(operands):
                if value in literals or (op == "*" and j == 1):
                    continue
                uses += 1
                copied += value in earlier
    boxed = "".join((last_boxed(traj.final_answer) or "").split())
    answer_differs = not (boxed.isascii() and boxed.isdigit() and int(boxed) == _expected(node, results))
    return PlanReading(**base, formed=True, widths=tuple(len(w) for w in rounds), matches=matches,
                       uses=uses, copied=copied, miscomputed=miscomputed, answer_differs=answer_differs)


def read_run(run: Path) -> list[PlanReading]:
    """The readings of a run folder's records (orchestrate's records.jsonl, or pack's)."""
    return [r for r in (read_plan(row) for row in iter_jsonl(run / "records.jsonl")) if r is not None]


@dataclass(frozen=True)
class PlanFigures:
    """The readings summed up over the held-out problems: shares, counts, means by depth and size."""

    problems: int
    well_formed: float
    fidelity: float
    shape_fidelity: float           # prompts per phase equal the ideal's, whatever the prompts say
    copies: float | None            # None: no later phase used an earlier result
    uses: int
    phase_counts: dict[int, int]    # phases with prompts -> problems (well-formed only)
    largest_widths: dict[int, int]  # widest phase -> problems
    top_shape: tuple[tuple[int, ...], float]  # the commonest shape and its share of all problems
    by_depth: dict[int, dict[str, float]]     # depth -> mean phases, mean prompts per phase (model, ideal)
    by_size: dict[int, dict[str, float]]


def _means(readings: list[PlanReading], key: str) -> dict[int, dict[str, float]]:
    groups: dict[int, list[PlanReading]] = defaultdict(list)
    for r in readings:
        groups[getattr(r, key)].append(r)
    out = {}
    for k, group in sorted(groups.items()):
        formed = [r for r in group if r.formed and r.widths]
        out[k] = {
            "problems": len(group),
            "phases": sum(len(r.widths) for r in formed) / len(formed) if formed else float("nan"),
            "ideal_phases": sum(r.depth for r in group) / len(group),
            "prompts_per_phase": (sum(sum(r.widths) / len(r.widths) for r in formed) / len(formed)
                                  if formed else float("nan")),
            "ideal_prompts_per_phase": sum(r.size / r.depth for r in group) / len(group),
        }
    return out


def plan_figures(readings: list[PlanReading]) -> PlanFigures:
    n = len(readings) or 1
    formed = [r for r in readings if r.formed]
    shapes = Counter(r.widths for r in formed)
    top = shapes.most_common(1)[0] if shapes else ((), 0)
    uses = sum(r.uses for r in readings)
    return PlanFigures(
        problems=len(readings),
        well_formed=len(formed) / n,
        fidelity=sum(r.matches for r in readings) / n,
        shape_fidelity=sum(r.formed and r.widths == r.ideal for r in readings) / n,
        copies=sum(r.copied for r in readings) / uses if uses else None,
        uses=uses,
        phase_counts=dict(sorted(Counter(len(r.widths) for r in formed).items())),
        largest_widths=dict(sorted(Counter(max(r.widths, default=0) for r in formed).items())),
        top_shape=(top[0], top[1] / n),
        by_depth=_means(readings, "depth"),
        by_size=_means(readings, "size"),
    )
