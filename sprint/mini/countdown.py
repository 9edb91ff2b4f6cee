"""The mini experiment's task: small Countdown problems with R1-style sequential search traces.

A problem is three numbers and a target; an answer uses each number once with + - *. A trace is
what a sequential reasoning model writes when it plans an exhaustive search: it states the plan
(try each pair first, then the third number), tries every pair one after another (each pair is an
independent subtask: the parallelism SPRINT should find), abandons the pairs that fail, checks the
one that works (a share of the traces checks it twice, as R1 does), and answers in `\\boxed{}`.
The text is deliberately regular and tokenised at word level (every word, number and symbol
separated by one space) so that a model of about a million parameters can learn it in minutes on a
CPU; each result line repeats the number left and the target, because a tiny model adds, multiplies
and compares far more reliably when every operand is a few tokens away; an answer writes its larger
operand first, one rule for every operation (`expression`).

Because the generator writes the trace, it also knows its components and their DAG: `teacher_answer`
gives them in the JSON / parent-dictionary formats GPT-4o answers stages 1-2 with, for the
deterministic stand-in teacher (`sprint teacher-server`). Every sentence is its own line, so the
stage-1 line numbers are the generator's own (a test checks it against `trace_lines.split_lines`).

Seeded and deterministic: the same options give byte-identical files.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.core.errors import UserError
from sprint.mini.problems import MiniDataConfig, ProblemRows

OPS = ("+", "-", "*")  # subtraction always takes the smaller number from the larger: no negatives

INTRO = "Okay , I need {t} from {a} {b} {c} , so let me try each pair first ."
TRY = "Keep {z} for last and try {x} and {y} first ."  # the number left first: the easiest slot to copy
LEFT = "Then {z} is left , and I need {t} ."
# one first operation, then its value with the number left by each operation ("!" at a hit, where it stops)
RESULT = "{first} = {mid} , with {z} for {t} : {results} {mark}"
FOUND = "Yes , {expr} = {t} ."
FAILED = "None of these is {t} , so this pair does not work ."
CHECK = "Let me check {expr} = {t} , it is correct ."
# R1's habit of checking once more before answering (a share of the traces, --recheck-share)
RECHECK = ("Wait , let me make sure once more .", "{first} = {mid} , and {second} = {t} , so it is right .")
ANSWER = "The answer is \\boxed{{ {expr} }} ."
QUESTION = "Use {a} {b} {c} to make {t} ."


def apply(a: int, op: str, b: int) -> tuple[int, str]:
    """(value, text) of `a op b`; a difference is written larger minus smaller."""
    if op == "+":
        return a + b, f"{a} + {b}"
    if op == "*":
        return a * b, f"{a} * {b}"
    hi, lo = max(a, b), min(a, b)
    return hi - lo, f"{hi} - {lo}"


def branches(nums: tuple[int, int, int]) -> list[tuple[tuple[int, int], int]]:
    """The three subtasks: a pair to combine first, and the number left for the second step."""
    a, b, c = nums
    return [((a, b), c), ((a, c), b), ((b, c), a)]


def expression(left: str, value: int, op: str, rest: int) -> str:
    """`left op rest` (`left` written out, worth `value`), the larger operand first as a difference is
    written: one rule for every operation, in the answer (`left` the pair's step in brackets) and in
    the recheck (`left` its value). (Writing the pair first except in `rest - (first)` made that form
    rare, 5 % of answers, and the planner's check, trained a third as often as RFT's trace, copied it
    into the common order: that one form was the whole accuracy gap at the 750-step budget.)"""
    return f"{rest} {op} {left}" if rest > value else f"{left} {op} {rest}"


@dataclass(frozen=True)
class Branch:
    """One pair tried: its lines (TRY, LEFT, one line per first operation, the verdict) and the
    expression it found (None: this pair does not reach the target)."""

    lines: list[str]
    expr: str | None
    recheck: list[str] | None = None  # the found expression computed once more (RECHECK)


def search(pair: tuple[int, int], rest: int, target: int) -> Branch:
    """Try the pair with each operation, then each operation with the number left.

    Every first operation gets its line, so a subtask is always six lines long (the packer keeps an
    execution of that length as parallel work); within a line the results stop at the first hit,
    marked `!` instead of `.`.
    """
    x, y = pair
    lines = [TRY.format(x=x, y=y, z=rest), LEFT.format(z=rest, t=target)]
    found: str | None = None
    recheck: list[str] | None = None
    for op1 in OPS:
        mid, first = apply(x, op1, y)
        results: list[str] = []
        hit = None
        for op2 in OPS:
            value, _ = apply(mid, op2, rest)
            results.append(str(value))
            if value == target:
                hit = op2
                break
        lines.append(RESULT.format(first=first, mid=mid, z=rest, t=target, results=" ".join(results), mark="!" if hit else "."))
        if hit and found is None:
            found = expression(f"( {first} )", mid, hit, rest)
            second = expression(str(mid), mid, hit, rest)
            recheck = [RECHECK[0], RECHECK[1].format(first=first, mid=mid, second=second, t=target)]
    lines.append(FOUND.format(expr=found, t=target) if found else FAILED.format(t=target))
    return Branch(lines, found, recheck)


@dataclass(frozen=True)
class Trace:
    """One problem's sequential trace, its answer, and what the generator knows about its structure."""

    nums: tuple[int, int, int]
    target: int
    lines: list[str]  # the thought, one sentence per line
    solution: str  # the sentence holding the boxed answer
    expr: str
    branch_spans: list[tuple[int, int]]  # 1-based inclusive line ranges of the three subtasks
    winner: int  # index (0-2) of the subtask whose expression is the answer

    @property
    def question(self) -> str:
        a, b, c = self.nums
        return QUESTION.format(a=a, b=b, c=c, t=self.target)

    @property
    def thought(self) -> str:
        return "\n".join(self.lines)


def make_trace(nums: tuple[int, int, int], target: int, recheck: bool = False) -> Trace:
    """`recheck`: the check is followed by the expression computed once more (RECHECK)."""
    a, b, c = nums
    lines = [INTRO.format(t=target, a=a, b=b, c=c)]
    spans: list[tuple[int, int]] = []
    found: list[Branch] = []
    for pair, rest in branches(nums):
        branch = search(pair, rest, target)
        spans.append((len(lines) + 1, len(lines) + len(branch.lines)))
        lines += branch.lines
        found.append(branch)
    winner = next((i for i, b in enumerate(found) if b.expr), None)
    if winner is None:
        raise ValueError(f"{nums} cannot make {target}")
    expr = found[winner].expr or ""
    lines.append(CHECK.format(expr=expr, t=target))
    if recheck:
        lines += found[winner].recheck or []
    return Trace(nums, target, lines, ANSWER.format(expr=expr), expr, spans, winner)


def teacher_answer(trace: Trace) -> dict[str, Any]:
    """Stages 1-2 as a careful teacher would answer them: the set-up (plan only), one component per
    pair (its instruction as the prompt, its work as the execution), and the check (plan only),
    which depends on the pair that found the answer. A subtask's first line is the instruction the
    trace gave itself: it becomes the prompt, so no range holds it (stage 1 keeps such an answer
    with its `no_plan` and `uncovered_lines` warnings, as it keeps GPT-4o's)."""
    components: list[dict[str, Any]] = [
        {"description": "Set up the search over pairs", "plan": "1-1", "prompt": "not found",
         "execution": "not found", "comment": "not found"},
    ]
    for (pair, rest), (start, end) in zip(branches(trace.nums), trace.branch_spans):
        components.append({
            "description": f"Search the pair {pair[0]} and {pair[1]}", "plan": "not found",
            "prompt": TRY.format(x=pair[0], y=pair[1], z=rest), "execution": f"{start + 1}-{end}", "comment": "not found",
        })
    last = len(trace.lines)
    check = trace.branch_spans[-1][1] + 1
    components.append({"description": "Check the expression found", "plan": f"{check}-{last}", "prompt": "not found",
                       "execution": "not found", "comment": "not found"})
    dag = {"1": [], "2": [1], "3": [1], "4": [1], "5": [2 + trace.winner]}
    return {"components": components, "dag": dag}


def all_problems(low: int, high: int) -> list[tuple[tuple[int, int, int], int]]:
    """Every (numbers, target) that some pair, operation and third number reach (targets >= 1)."""
    found: set[tuple[tuple[int, int, int], int]] = set()
    for nums in itertools.product(range(low, high + 1), repeat=3):
        for (x, y), rest in branches(nums):  # type: ignore[arg-type]
            for op1, op2 in itertools.product(OPS, OPS):
                target, _ = apply(apply(x, op1, y)[0], op2, rest)
                if target >= 1:
                    found.add((nums, target))  # type: ignore[arg-type]
    return sorted(found)


def split_problems(cfg: MiniDataConfig) -> tuple[list, list]:
    """Held-out problems drawn as a problem is made (numbers, then a random expression), so the
    test set has the training set's mix of targets; training = the rest, shuffled."""
    if not 1 <= cfg.low <= cfg.high <= 30:
        raise UserError(f"numbers must satisfy 1 <= --low <= --high <= 30, got {cfg.low}..{cfg.high}")
    pool = all_problems(cfg.low, cfg.high)
    if cfg.n_test >= len(pool):
        raise UserError(f"--n-test {cfg.n_test} leaves no training problems (there are {len(pool)} in all)")
    rng = random.Random(cfg.seed)
    test: list = []
    seen: set = set()
    while len(test) < cfg.n_test:
        nums = tuple(rng.randint(cfg.low, cfg.high) for _ in range(3))
        (x, y), rest = rng.choice(branches(nums))  # type: ignore[arg-type]
        target, _ = apply(apply(x, rng.choice(OPS), y)[0], rng.choice(OPS), rest)
        if target >= 1 and (nums, target) not in seen:
            seen.add((nums, target))
            test.append((nums, target))
    train = [p for p in pool if p not in seen]
    rng.shuffle(train)
    return (train[: cfg.n_train] if cfg.n_train else train), test


def countdown_rows(cfg: MiniDataConfig) -> ProblemRows:
    """Training traces with their teacher answers, and the held-out problems."""
    train, test = split_problems(cfg)
    rechecks = random.Random(f"recheck:{cfg.seed}")  # its own stream: the share changes no problem
    rows = ProblemRows()
    for i, (nums, target) in enumerate(train):
        trace = make_trace(nums, target, recheck=rechecks.random() < cfg.recheck_share)
        row_id = f"cd-{i:05d}"
        rows.add_trace({"id": row_id, "question": trace.question, "thought": trace.thought,
                        "solution": trace.solution, "answer": trace.expr, "nums": list(nums), "target": target},
                       teacher_answer(trace))
    rows.held_out = [{"id": f"cd-test-{i:04d}", "index": i, "question": make_trace(n, t).question, "nums": list(n),
                      "target": t} for i, (n, t) in enumerate(test)]
    return rows
