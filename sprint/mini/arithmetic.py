"""The mini experiment's main task: digit equations whose dependencies form a different DAG each time.

A problem asks for a sum of unknown digits, each fixed by one equation on last digits (a sum or product
keeps only its last digit):

    Find C + D , keeping only last digits .
    A + 7 = 3 .
    B * 3 = 4 .
    C * 7 = A .
    D + 3 = A + B .

Each equation is a subtask: find the digit that solves it by trying every digit 1-9, one line a try
(`4 * 3 = 2 , no .`, the one that fits `8 * 3 = 4 , yes .`; all nine, to be sure only one fits, so an
execution is 11 lines: long enough that packing keeps it as parallel work). A right side that names
other unknowns needs their digits first, so the equations' names are the DAG: equations whose right side
is a number are independent and run in one round, an equation that reads the round before runs in the
next, and an unknown's height (1 + the highest it reads) is its round. The number of rounds, the
subtasks per round and which subtask reads which vary with the problem, and are read from it only by
reading which equation names which (a chain has no parallelism at all). The question lists the equations
round by round, shuffled within a round and named A, B, ... in that order; where one round ends is what
the plan must read.

The sequential trace works as R1 would: each round opens with the subtasks it can do now (`First A , B .`,
later `Then C , D .`), then each subtask in turn
(`Now C .`; its equation restated with the digits it reads, looked up in the words of their results,
`where A is 6`; the tries; `So C is 8 .`); a share of traces checks the last search once more (R1's habit,
the slack GRPO can remove); then the digits asked for are looked up the same way and added in the plan
(`That is all : C is 8 and D is 1 , so 8 + 1 makes 9 .`), and the sum boxed.

Why digits and searches (the named multi-digit sums before them are measured in docs/experiments.md,
"The arithmetic task"): a model of about a million parameters copies single tokens by name (`A is`) and
from the line above early, but a multi-digit number from a question full of digits only late, and that
copy was where every deeper problem failed. Here a copy from the question is three one-token values
after the name that starts a line, and every try repeats the line above's operands at a fixed distance;
the demo's tokenizer makes each right part one token (` * 3 = 1`), so the copy is one token after the name,
learned far sooner than three (docs/experiments.md, "Digit equations"). The equation keeps a try's spaces,
so the same kind of token ends every try (` * 3 = 4` of `8 * 3 = 4`) and is written nine times a subtask:
written apart from the tries (`B *3 =4`, a token only the heads write), the copy formed far later.
Deep problems are kept small (`DrawConfig.max_deep`) and the widest problems are the longest, so the
ideal packing has the paper's Figure 6 shape (the longest quartile gains most).

The generator also knows each trace's components and DAG (`make_trace`, for the stand-in teacher) and the
ideal packing of the problem (`Shape`: the subtasks of each round), read by the summary's plan fidelity.
Seeded and deterministic: the same options give byte-identical files.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from sprint.core.errors import UserError
from sprint.mini.problems import MiniDataConfig, ProblemRows

QUESTION = "Find {goal} , keeping only last digits ."
DEFINITION = "{name} {op} {k} = {rhs}"                  # an equation, as the question and its execution write it
FIRST = "First {names} ."                                # round 1's opening (what needs only numbers): the plan
NEXT = "Then {names} ."                                  # each later round's opening (what needs those)
NOW = "Now {name} ."                                     # a subtask's instruction: the prompt
HEAD = "{equation} , try each digit :"                   # an execution's first line
READS = "{equation} , where {lookups}{added} , so {restated}"  # ... for a right side that names unknowns
ADDED = " , and {work}"                                # two digits read: their sum worked out before the equation
LOOKUP = "{name} is {value}"                            # a digit read by name: the same words as its result
TRY = "{x} {op} {k} = {v} , {verdict} ."               # verdict: yes for the one digit that fits, else no
RESULT = "So {name} is {x} ."                           # a subtask's digit: `A is` occurs nowhere else
DONE = "That is all : {work} ."
RECHECK = "Wait , let me check {name} once more : {x} {op} {k} = {t} , yes ."
ANSWER = "The answer is \\boxed{{ {value} }} ."
SUM_STEP = " makes "                                     # a sum worked out: `6 + 2 + 3 makes 8 + 3 makes 1`
OPS = ("+", "*")
FACTORS = (3, 7, 9)  # a product's factor: a unit mod 10, so exactly one digit solves each equation
NAMES = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MERGE = 0.4          # chance that an equation above round 1 also reads a second, earlier unknown
# chances of one, two, three (and more) rounds: deep problems are kept short (`DrawConfig.max_deep`), so too
# many of them would leave the shorter half of the problems little to gain (overall ratio)
DEPTHS = (0.25, 0.45, 0.30)
MAX_GOAL = 4         # most unknowns in the sum asked for (the DAG's sinks)
# `sprint mini-tokenizer --phrases` for this task (scripts/mini_demo.sh): each right part (` * 3 = 1`, ` + 3 = A`),
# each further name of a sum (` + B`) and each lookup's key (` A is`) one token, so an equation is copied from the
# question as one token after its name (docs/experiments.md, "Digit equations")
PHRASES = " [+*] [0-9] = [0-9A-Z]| [+] [A-Z]| [A-Z] is"


def apply(x: int, op: str, k: int) -> int:
    return (x + k) % 10 if op == "+" else (x * k) % 10


def add_up(values: list[int]) -> str:
    """`6 + 2 + 3 makes 8 + 3 makes 1`: the first two added at a time, the rest carried along (one digit: itself).

    `makes`, not `=`: with `=` the demo's tokenizer fuses ` + 3 = 1` into the token an equation's right part is
    (`PHRASES`), so the sum's digit would only exist inside a token the tries also write for other digits, and
    the answer and the tries' verdicts would have to read it out of that token (docs/experiments.md, "Sums
    spelled apart")."""
    parts = [" + ".join(map(str, values))]
    while len(values) > 1:
        values = [(values[0] + values[1]) % 10, *values[2:]]
        parts.append(" + ".join(map(str, values)))
    return SUM_STEP.join(parts)


@dataclass(frozen=True, eq=False)
class Node:
    """An unknown digit `value` with its equation `value op k = right side`: a number, or the sum of the
    unknowns it `reads` (compared by identity: two unknowns may have equal equations)."""

    value: int
    op: str
    k: int
    reads: tuple[Node, ...] = ()
    number: int | None = None  # the right side when it names no unknown

    @property
    def target(self) -> int:
        return self.number if self.number is not None else sum(r.value for r in self.reads) % 10

    @property
    def height(self) -> int:
        """The round of the subtask: 1 + the highest unknown it reads."""
        return 1 + max((r.height for r in self.reads), default=0)


def solve(op: str, k: int, target: int) -> int | None:
    """The one digit x with `x op k = target` on last digits, None when none or several do."""
    found = [x for x in range(10) if apply(x, op, k) == target]
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class Problem:
    """Equations listed in the question's order (round by round; names A, B, ... in that order), and the
    unknowns whose sum is asked for."""

    order: tuple[Node, ...]
    goal: tuple[Node, ...]

    def name(self, node: Node) -> str:
        return NAMES[next(i for i, n in enumerate(self.order) if n is node)]

    @property
    def value(self) -> int:
        return sum(n.value for n in self.goal) % 10

    def equation(self, node: Node) -> str:
        rhs = str(node.number) if node.number is not None else " + ".join(self.name(r) for r in node.reads)
        return DEFINITION.format(name=self.name(node), op=node.op, k=node.k, rhs=rhs)

    @property
    def question(self) -> str:
        goal = " + ".join(self.name(n) for n in self.goal)
        return "\n".join([QUESTION.format(goal=goal), *(f"{self.equation(n)} ." for n in self.order)])


# ------------------------------------------------------------------------------ problems


@dataclass(frozen=True)
class DrawConfig:
    """How problems are drawn (the held-out problems are drawn the same way)."""

    max_rounds: int = 3
    max_width: int = 4       # subtasks in one round
    max_subtasks: int = 7    # subtasks in all
    max_deep: int = 4        # subtasks in a problem of three rounds or more: the longest problems are the wide ones


def _equation(rng: random.Random, target: int | None) -> tuple[int, str, int]:
    """(x, op, k) with x in 1-9: any, when the right side is still free (None), else one that gives `target`."""
    while True:
        x, op = rng.randint(1, 9), rng.choice(OPS)
        if target is None:
            return x, op, rng.randint(1, 9) if op == "+" else rng.choice(FACTORS)
        ks = [k for k in (range(1, 10) if op == "+" else FACTORS) if apply(x, op, k) == target]
        if ks:
            return x, op, ks[0]


def _pick(rng: random.Random, pool: list[Node], read: set[int]) -> Node:
    """An unknown of `pool`, one nobody reads yet when there is one (so that few are left for the goal)."""
    unread = [n for n in pool if id(n) not in read]
    return rng.choice(unread or pool)


def _widths(rng: random.Random, cfg: DrawConfig) -> list[int]:
    """The depth first (`DEPTHS`), then each round 1 to `max_width` subtasks wide within that depth's bound."""
    weights = DEPTHS[: cfg.max_rounds] + (DEPTHS[-1],) * (cfg.max_rounds - len(DEPTHS))
    depth = rng.choices(range(1, cfg.max_rounds + 1), weights=weights)[0]
    bound = cfg.max_subtasks if depth < 3 else cfg.max_deep
    while True:
        widths = [rng.randint(1, cfg.max_width) for _ in range(depth)]
        if sum(widths) <= max(bound, depth):
            return widths


def draw_problem(rng: random.Random, cfg: DrawConfig) -> Problem:
    """Widths by `_widths`; an equation above round 1 reads one unknown of the round before and now and then
    a second from any earlier round."""
    while True:
        widths = _widths(rng, cfg)
        rounds: list[list[Node]] = []
        read: set[int] = set()
        for width in widths:
            this = []
            for _ in range(width):
                if not rounds:
                    x, op, k = _equation(rng, None)
                    this.append(Node(x, op, k, number=apply(x, op, k)))
                    continue
                reads = [_pick(rng, rounds[-1], read)]
                earlier = [n for r in rounds for n in r if n is not reads[0]]
                if earlier and rng.random() < MERGE:
                    reads.append(_pick(rng, earlier, read))
                read.update(id(n) for n in reads)
                x, op, k = _equation(rng, sum(n.value for n in reads) % 10)
                this.append(Node(x, op, k, reads=tuple(reads)))
            rng.shuffle(this)
            rounds.append(this)
        order = tuple(n for r in rounds for n in r)
        goal = tuple(n for n in order if id(n) not in read)
        if len(goal) <= MAX_GOAL:
            return Problem(order, goal)


@dataclass(frozen=True)
class Shape:
    """The ideal packing of a problem: the subtasks of each round, in the question's order."""

    rounds: tuple[tuple[Node, ...], ...]

    @classmethod
    def of(cls, problem: Problem) -> Shape:
        top = max(n.height for n in problem.order)
        return cls(tuple(tuple(n for n in problem.order if n.height == r) for r in range(1, top + 1)))

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(len(r) for r in self.rounds)


def subtasks(problem: Problem) -> list[list[str]]:
    """Each round's subtasks by name, as the prompts write them."""
    return [[problem.name(n) for n in r] for r in Shape.of(problem).rounds]


# ------------------------------------------------------------------------------ traces


def work_lines(problem: Problem, node: Node) -> list[str]:
    """The execution of a subtask: its equation restated with the digits it reads, then one line a try for
    every digit 1-9 (all of them, to be sure only one fits), then the digit under its name."""
    name, equation = problem.name(node), problem.equation(node)
    if node.reads:
        lookups = " and ".join(LOOKUP.format(name=problem.name(r), value=r.value) for r in node.reads)
        added = ADDED.format(work=add_up([r.value for r in node.reads])) if len(node.reads) > 1 else ""
        restated = DEFINITION.format(name=name, op=node.op, k=node.k, rhs=node.target)  # the digit for the names
        equation = READS.format(equation=equation, lookups=lookups, added=added, restated=restated)
    lines = [HEAD.format(equation=equation)]
    lines += [TRY.format(x=x, op=node.op, k=node.k, v=apply(x, node.op, node.k),
                         verdict="yes" if x == node.value else "no") for x in range(1, 10)]
    return lines + [RESULT.format(name=name, x=node.value)]


def done_line(problem: Problem) -> str:
    """The digits asked for, each looked up in the words of its result as a search's head looks up what it
    reads, then added in the plan: `C is 8 and D is 1 , so 8 + 1 makes 9` (one: `D is 1`)."""
    lookups = " and ".join(LOOKUP.format(name=problem.name(n), value=n.value) for n in problem.goal)
    if len(problem.goal) == 1:
        return DONE.format(work=lookups)
    return DONE.format(work=f"{lookups} , so {add_up([n.value for n in problem.goal])}")


@dataclass(frozen=True)
class Trace:
    """One problem's sequential trace and the components the generator knows it holds."""

    problem: Problem
    lines: list[str]
    solution: str
    components: list[dict[str, Any]]
    dag: dict[str, list[int]]

    @property
    def question(self) -> str:
        return self.problem.question

    @property
    def thought(self) -> str:
        return "\n".join(self.lines)


def make_trace(problem: Problem, recheck: bool = False) -> Trace:
    """The trace, and stage 1-2 answers as a careful teacher would give them: each round's opening
    plan-only; a subtask with its instruction as the prompt (no range holds it, as the instruction is the
    trace's own line) and its search as the execution; the closing sum plan-only. Parents: what a line
    reads, so a subtask depends on its round's opening and on the subtasks it reads, and the sum on the
    subtasks it adds."""
    lines: list[str] = []
    components: list[dict[str, Any]] = []
    dag: dict[str, list[int]] = {}
    number: dict[int, int] = {}  # id(node) -> component number

    def add(description: str, parents: list[int], plan: str = "not found", prompt: str = "not found",
            execution: str = "not found") -> int:
        components.append({"description": description, "plan": plan, "prompt": prompt,
                           "execution": execution, "comment": "not found"})
        dag[str(len(components))] = sorted(set(parents))
        return len(components)

    name = problem.name
    opening, previous = 0, []
    for r, round_nodes in enumerate(Shape.of(problem).rounds, 1):
        lines.append((FIRST if r == 1 else NEXT).format(names=" , ".join(name(n) for n in round_nodes)))
        opening = add(f"Choose the subtasks of round {r}", [opening] * (r > 1) + [number[id(n)] for n in previous],
                      plan=f"{len(lines)}-{len(lines)}")
        for n in round_nodes:
            lines.append(NOW.format(name=name(n)))
            start = len(lines) + 1
            lines += work_lines(problem, n)
            number[id(n)] = add(f"Find {name(n)} by trying each digit", [opening, *(number[id(r)] for r in n.reads)],
                                prompt=NOW.format(name=name(n)), execution=f"{start}-{len(lines)}")
        previous = list(round_nodes)
    start = len(lines) + 1
    lines.append(done_line(problem))
    if recheck:
        last = problem.order[-1]
        lines.append(RECHECK.format(name=name(last), x=last.value, op=last.op, k=last.k, t=last.target))
    add("Add the digits asked for", [opening, *(number[id(n)] for n in problem.goal)], plan=f"{start}-{len(lines)}")
    return Trace(problem, lines, ANSWER.format(value=problem.value), components, dag)


# ------------------------------------------------------------------------------ rows


def problem_row(problem: Problem, row_id: str, index: int) -> dict[str, Any]:
    """A held-out problem: its question, its value (the gold answer) and its ideal packing."""
    widths = Shape.of(problem).widths
    return {"id": row_id, "index": index, "question": problem.question, "answer": str(problem.value),
            "rounds": len(widths), "widths": list(widths), "subtasks": subtasks(problem)}


def arithmetic_rows(cfg: MiniDataConfig) -> ProblemRows:
    """Held-out problems first (seeded), then as many other training problems, drawn the same way, then
    the problems beyond training's sizes (`--beyond`)."""
    if not 1 <= cfg.max_rounds <= 6 or not 1 <= cfg.max_width <= 6 or cfg.max_subtasks < cfg.max_rounds:
        raise UserError("arithmetic draws need 1 <= --max-rounds <= 6, 1 <= --max-width <= 6 and "
                        f"--max-subtasks >= --max-rounds (got {cfg.max_rounds}, {cfg.max_width}, {cfg.max_subtasks})")
    if cfg.max_subtasks + 2 > len(NAMES):
        raise UserError(f"--max-subtasks {cfg.max_subtasks}: at most {len(NAMES) - 2} (one letter per unknown)")
    draw = DrawConfig(cfg.max_rounds, cfg.max_width, cfg.max_subtasks)
    rng = random.Random(cfg.seed)
    seen: set[str] = set()

    def fresh(config: DrawConfig, keep: Any = lambda problem: True) -> Problem:
        while True:
            problem = draw_problem(rng, config)
            if keep(problem) and problem.question not in seen:
                seen.add(problem.question)
                return problem

    rows = ProblemRows()
    rows.held_out = [problem_row(fresh(draw), f"ar-test-{i:04d}", i) for i in range(cfg.n_test)]
    wider = DrawConfig(cfg.max_rounds + 1, cfg.max_width + 1, cfg.max_subtasks + 2, DrawConfig.max_deep + 2)

    def beyond_training(problem: Problem) -> bool:
        widths = Shape.of(problem).widths
        return len(widths) > cfg.max_rounds or max(widths) > cfg.max_width

    rechecks = random.Random(f"recheck:{cfg.seed}")  # its own stream: the share changes no problem
    for i in range(cfg.n_train or 4000):
        trace = make_trace(fresh(draw), recheck=rechecks.random() < cfg.recheck_share)
        rows.add_trace({"id": f"ar-{i:05d}", "question": trace.question, "thought": trace.thought,
                        "solution": trace.solution, "answer": str(trace.problem.value)},
                       {"components": trace.components, "dag": trace.dag})
    # drawn last, so that asking for them changes no training problem
    rows.beyond = [problem_row(fresh(wider, beyond_training), f"ar-beyond-{i:04d}", i) for i in range(cfg.beyond)]
    return rows


# ------------------------------------------------------------------------------ reading problems back

_GOAL = re.compile(r"^Find ([A-Z](?: \+ [A-Z])*) , keeping only last digits \.$")
_EQUATION = re.compile(r"^([A-Z]) ([+*]) ([0-9]) = ([0-9]|[A-Z](?: \+ [A-Z])*) \.$")


def parse_problem(text: str) -> Problem:
    """A question as the generator writes it, back into its problem; ValueError for anything else."""
    lines = text.strip().split("\n")
    head = _GOAL.match(lines[0].strip())
    if not head:
        raise ValueError(f"not a question of the mini task: {text[:80]!r}")
    built: dict[str, Node] = {}
    for i, line in enumerate(lines[1:]):
        match = _EQUATION.match(line.strip())
        if not match or match[1] != NAMES[i]:
            raise ValueError(f"not an equation of the mini task, named in order: {line!r}")
        name, op, k, rhs = match[1], match[2], int(match[3]), match[4]
        reads = () if rhs.isdigit() else tuple(built[r] for r in rhs.split(" + ") if r in built)
        if not rhs.isdigit() and len(reads) != len(rhs.split(" + ")):
            raise ValueError(f"{line!r} reads an unknown not defined above it")
        target = int(rhs) if rhs.isdigit() else sum(r.value for r in reads) % 10
        x = solve(op, k, target)
        if not x:  # 0 is no try's digit either
            raise ValueError(f"no single digit 1-9 solves {line!r}")
        built[name] = Node(x, op, k, reads=reads, number=int(rhs) if rhs.isdigit() else None)
    goal_names = head[1].split(" + ")
    if any(g not in built for g in goal_names):
        raise ValueError(f"the question asks for an unknown it does not define: {lines[0]!r}")
    return Problem(tuple(built.values()), tuple(built[g] for g in goal_names))


@dataclass(frozen=True)
class Step:
    """An execution's first line read back: its equation, the digits it looked up by name, and the right
    side's value as it worked it out."""

    op: str
    k: int
    reads: dict[str, int]
    target: int
    sum_right: bool  # the looked-up digits add up to `target` (always, for a number)


_PROMPT = re.compile(r"^Now ([A-Z]) \.$")
_RESULT = re.compile(r"^So ([A-Z]) is ([0-9]) \.$", re.M)
_HEAD = re.compile(r"^([A-Z]) ([+*]) ([0-9]) = (?:([0-9])|[A-Z](?: \+ [A-Z])* , where ([A-Z] is [0-9](?: and [A-Z] is [0-9])*)"
                   r"(?: , and ([0-9](?: \+ [0-9])+(?: makes [0-9](?: \+ [0-9])*)+))? , so \1 \2 \3 = ([0-9])) , try each digit :$",
                   re.M)


def read_prompt(text: str) -> str | None:
    """The name a prompt (`Now B .`) asks for; None when it is not one."""
    match = _PROMPT.match(text.strip())
    return match[1] if match else None


def read_result(execution: str) -> tuple[str, int] | None:
    """(name, digit) an execution reports on its last `So B is 6 .` line (None without one)."""
    found = _RESULT.findall(execution)
    return (found[-1][0], int(found[-1][1])) if found else None


def read_step(execution: str) -> Step | None:
    """An execution's first line (`C * 7 = A , where A is 6 , so C * 7 = 6 , try each digit :`; reading two,
    `... where A is 6 and B is 7 , and 6 + 7 makes 3 , so C * 7 = 3 , ...`); None when it has none."""
    match = _HEAD.search(execution)
    if not match:
        return None
    op, k = match[2], int(match[3])
    if match[4] is not None:
        return Step(op, k, {}, int(match[4]), True)
    looked_up = [(n, int(v)) for n, v in re.findall(r"([A-Z]) is ([0-9])", match[5])]
    reads, values, target = dict(looked_up), [v for _, v in looked_up], int(match[7])
    work = add_up(values) if len(values) > 1 else None  # what the head should write between lookups and equation
    return Step(op, k, reads, target, match[6] == work and target == sum(values) % 10)
