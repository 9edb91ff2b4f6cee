"""Plan fidelity on the arithmetic task: does the SPRINT model find each problem's parallelism?

The generator knows each problem's ideal packing (`arithmetic.Shape`: the subtasks of each round). A
held-out trajectory is read back against it:

- its shape: the number of prompts in each phase that has any (phases with prompts, widths);
- fidelity: the same number of phases with prompts as the ideal, and in each the same set of
  subtasks in any order, read from the prompts' names (`Now B * 3 = 6 .`);
- equations: each prompt's equation and each execution's first one against the question's line for the
  prompt's name, by the subtask's place in its round (`prompts`, `heads`: where the copy by name fails, the
  planner's or the executor's);
- searches: each execution's own work, try by try (`searches.search_error`);
- copies: every unknown that an execution in a later phase reads; it is copied right when the execution
  looks up the digit an earlier execution of the model reported under that name (a wrong search in round 1
  is the executor's fault, not the copy's), the true digit where none did.

Figure 5 in miniature (phases used and prompts per phase against the problem's depth and size) and
the shape figures come from the same reading, the model's beside the ideal packing's.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.core.data import iter_jsonl
from sprint.format.boxed import last_boxed
from sprint.format.trajectory import TrajectoryError, parse
from sprint.mini.arithmetic import (Shape, apply, copy_place, head_equation, parse_problem, prompt_equation, read_prompt,
                                    read_result, read_step, subtasks)
from sprint.mini.searches import search_error


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
    uses: int = 0                   # unknowns that later-phase executions read
    copied: int = 0                 # ... looked up as the model's earlier execution reported them
    miscomputed: int = 0            # executions whose digit does not solve the equation they restated
    answer_differs: bool = False    # the boxed answer is not what the model's own work gives
    heads: tuple[tuple[str, bool], ...] = ()    # each execution's equation: (its place, copied from the question right)
    prompts: tuple[tuple[str, bool], ...] = ()  # each prompt's equation, the same way
    searches: tuple[tuple[str, str | None], ...] = ()  # each execution: (its place, its search's first error or None)


# why a held-out answer is wrong, the first that applies (the order a reader would check a trajectory in)
CORRECT, MALFORMED, MISCOPIED, PLAN, MISCOMPUTED, ANSWER, OTHER = (
    "correct", "malformed (no strict parse or no final answer)", "a later execution miscopied an earlier result",
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


def read_plan(record: dict[str, Any]) -> PlanReading | None:
    """None when the record's question is not an arithmetic problem (the question is read from the
    trajectory when the record has none, as pack's records)."""
    text = record.get("trajectory") or ""
    question = record.get("question") or parse(text, strict=False).question
    try:
        problem = parse_problem(str(question))
    except ValueError:
        return None
    shape = Shape.of(problem)
    base = {"id": str(record.get("id")), "depth": len(shape.widths), "size": sum(shape.widths), "ideal": shape.widths,
            "correct": bool(record.get("correct"))}
    try:
        traj = parse(text, strict=True)
    except TrajectoryError:
        return PlanReading(**base, formed=False)
    if traj.final_answer is None:
        return PlanReading(**base, formed=False)
    nodes = {problem.name(n): n for n in problem.order}
    phases = [ph for ph in traj.phases if ph.prompts]
    rounds = [[read_prompt(p.text) for p in ph.prompts] for ph in phases]
    reported: dict[str, int] = {}  # name -> the value the model's executions reported first
    uses = copied = miscomputed = 0
    heads: list[tuple[str, bool]] = []
    prompts: list[tuple[str, bool]] = []
    searches: list[tuple[str, str | None]] = []
    for i, ph in enumerate(phases):
        found = []
        for j, (prompt, name) in enumerate(zip(ph.prompts, rounds[i])):
            execution = ph.execution(prompt.name)
            work = execution.text if execution else ""
            step, result = read_step(work), read_result(work)
            if step is not None and result is not None:
                miscomputed += not step.restated_right or apply(result[1], step.op, step.k) != step.target
            if result is not None:
                found.append(result)
            place = copy_place(i, j)
            if execution is not None:
                searches.append((place, search_error(work)))
            node = nodes.get(name or "")
            if node is not None:
                want, written = problem.equation(node), head_equation(work)
                prompts.append((place, prompt_equation(prompt.text) == want))
                if written is not None:
                    heads.append((place, written == want))
            if i == 0 or node is None or step is None:
                continue
            for read in node.reads:
                uses += 1
                copied += step.reads.get(problem.name(read)) == reported.get(problem.name(read), read.value)
        for name, value in found:  # known to later phases only
            reported.setdefault(name, value)
    expected = subtasks(problem)
    matches = len(rounds) == len(expected) and all(Counter(m) == Counter(e) for m, e in zip(rounds, expected))
    own = problem.lookups(reported)
    answer_differs = " ".join((last_boxed(traj.final_answer) or "").split()) != own
    return PlanReading(**base, formed=True, widths=tuple(len(w) for w in rounds), matches=matches,
                       uses=uses, copied=copied, miscomputed=miscomputed, answer_differs=answer_differs,
                       heads=tuple(heads), prompts=tuple(prompts), searches=tuple(searches))


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
