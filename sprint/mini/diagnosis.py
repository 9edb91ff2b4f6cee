"""Where a SPRINT run on the mini task goes wrong: each held-out trajectory read against what the
generator would have written.

The generator knows every subtask's exact work (`countdown.search`), so a trajectory's failure can be
placed: an executor that miscomputed its pair (or worked on another), a plan built on a pair that
found nothing, a check that miscopied the expression it was based on, an answer that miscopied the
check. That tells a user which role needs more training (the executors' arithmetic, or the planner's
reading of their results). `arithmetic` grades the executors' single steps (each operation given
the numbers it was handed) against chance: a model trained for the minutes CI allows computes far
more of them right than chance long before it gets a whole search right.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sprint.core.data import iter_jsonl
from sprint.format.trajectory import TrajectoryError, parse
from sprint.mini.countdown import CHECK, OPS, RESULT, apply, branches, search

# the verdicts, in the order a trajectory is checked (the first that applies)
CORRECT = "correct"
MALFORMED = "malformed (no strict parse or no final answer)"
UNEXPECTED_PLAN = "plan not of the trained shape (3 pairs, then a check)"
EXECUTION = "an execution is not its pair's search (miscomputed, or another pair's)"
FAILED_PAIR = "check based on a pair that found nothing"
CHECK_COPY = "check miscopied the expression found"
ANSWER_COPY = "answer miscopied the check"
OTHER = "other"
VERDICTS = (CORRECT, MALFORMED, UNEXPECTED_PLAN, EXECUTION, FAILED_PAIR, CHECK_COPY, ANSWER_COPY, OTHER)


def _pattern(template: str, whole_line: bool = False, **fields: str) -> re.Pattern[str]:
    """A regex of one of the generator's sentence templates, each `{field}` replaced by its pattern."""
    pattern = re.escape(template)
    for name, field_pattern in fields.items():
        pattern = pattern.replace(re.escape("{" + name + "}"), field_pattern)
    return re.compile(f"^{pattern}$" if whole_line else pattern, re.M)


_BASED_ON = re.compile(r"execution_1\.(\d+)")
_CHECK = _pattern(CHECK, expr="(.+?)", t=r"-?\d+")
# groups: x, op, y, mid, the number left, the results
_RESULT_LINE = _pattern(RESULT, whole_line=True, first=r"(\d+) ([-+*]) (\d+)", mid=r"(\d+)", z=r"(\d+)", t=r"\d+",
                        results=r"([\d ]+)", mark="[.!]")


@dataclass
class Diagnosis:
    """The verdict counts of one run, and its executions: how many ran and how many are exact."""

    verdicts: Counter = field(default_factory=Counter)
    executions: int = 0
    exact: int = 0

    @property
    def exact_share(self) -> float:
        return self.exact / self.executions if self.executions else 0.0


def judge(record: dict[str, Any], diagnosis: Diagnosis) -> str:
    """The verdict of one record (`orchestrate`'s records.jsonl row); counts its executions into `diagnosis`."""
    nums, target = tuple(record["gold"]["nums"]), int(record["gold"]["target"])
    try:
        traj = parse(record.get("trajectory") or "", strict=True)
    except TrajectoryError:
        traj = None
    if traj is None or traj.final_answer is None:
        return MALFORMED
    found = [search(pair, rest, target) for pair, rest in branches(nums)]  # type: ignore[arg-type]
    first = traj.phases[0]
    exact = [(e := first.execution(p.name)) is not None and e.text.strip() == "\n".join(b.lines[1:])
             for p, b in zip(first.prompts, found)]
    diagnosis.executions += len(exact)
    diagnosis.exact += sum(exact)
    if record.get("correct"):
        return CORRECT
    if len(first.prompts) != len(found) or len(traj.phases) < 2:
        return UNEXPECTED_PLAN
    if not all(exact):
        return EXECUTION
    check_plan = traj.phases[1].plan
    based, check = _BASED_ON.search(check_plan), _CHECK.search(check_plan)
    if based is None or check is None:
        return OTHER
    index = int(based.group(1)) - 1
    if not 0 <= index < len(found) or found[index].expr is None:
        return FAILED_PAIR
    if check.group(1) != found[index].expr:
        return CHECK_COPY
    return ANSWER_COPY if check.group(1) not in (traj.final_answer or "") else OTHER


def diagnose(run: Path) -> Diagnosis:
    """Every record of a SPRINT run folder, judged."""
    diagnosis = Diagnosis()
    for record in iter_jsonl(run / "records.jsonl"):
        diagnosis.verdicts[judge(record, diagnosis)] += 1
    return diagnosis


def format_diagnosis(d: Diagnosis) -> list[str]:
    n = sum(d.verdicts.values()) or 1
    lines = [f"executions exactly right: {d.exact} of {d.executions} ({d.exact_share:.1%})"]
    lines += [f"{verdict}: {d.verdicts[verdict]} ({d.verdicts[verdict] / n:.1%})" for verdict in VERDICTS if d.verdicts[verdict]]
    return lines


@dataclass(frozen=True)
class Arithmetic:
    """The executors' steps in a run: how many are right, and how many a guess would get right."""

    right: int
    steps: int
    chance: float  # P(written == true) for a written number and a true value drawn independently

    @property
    def share(self) -> float:
        return self.right / self.steps if self.steps else 0.0


def arithmetic(run: Path) -> Arithmetic:
    """Every step of every result line in a run's trajectories: `x op y = mid`, and each result of
    `mid` with the number left, graded given the numbers the line wrote (so one slip costs one step).
    Chance is what writing numbers with the same frequencies, but blind to the operands, would score."""
    steps: list[tuple[int, int]] = []  # (written, true)
    for record in iter_jsonl(run / "records.jsonl"):
        for x, op, y, mid, rest, results in _RESULT_LINE.findall(record.get("trajectory") or ""):
            steps.append((int(mid), apply(int(x), op, int(y))[0]))
            steps += [(int(r), apply(int(mid), op2, int(rest))[0]) for op2, r in zip(OPS, results.split())]
    if not steps:
        return Arithmetic(0, 0, 0.0)
    written, true = Counter(w for w, _ in steps), Counter(t for _, t in steps)
    chance = sum(n * true[v] for v, n in written.items()) / len(steps) ** 2
    return Arithmetic(sum(w == t for w, t in steps), len(steps), chance)
