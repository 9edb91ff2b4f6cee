"""The mini experiment's main task: digit equations whose dependencies form a different DAG each time.

A problem asks for unknown digits, each fixed by one equation on last digits (a sum or product keeps only
its last digit):

    Find C , D , keeping only last digits .
    A + 7 = 3 .
    B * 3 = 4 .
    C * 7 = A .
    D + A = B .

Each equation is a subtask: find the digit that solves it by trying every digit 1-9, one line a try
(`4 * 3 = 2 , want 4 , no .`, the one that fits `8 * 3 = 4 , want 4 , yes .`; all nine, to be sure only one
fits, so an execution is 11 lines: long enough that packing keeps it as parallel work). Each try restates the
digit it wants, so its verdict compares two digits of its own line, and an execution is long beside the plan
lines that open it (the ideal packing's longest quartile 0.46 of the trace's tokens, 0.53 without).

A right side that names other unknowns needs their digits first, so the equations' names are the DAG:
equations whose right side is a number are independent and run in one round, an equation that reads the
round before runs in the next, and an unknown's height (1 + the highest it reads) is its round. The number
of rounds, the subtasks per round and which subtask reads which vary with the problem, and are read from it
only by reading which equation names which (a chain has no parallelism at all). The question lists the equations
round by round, shuffled within a round and named A, B, ... in that order; where one round ends is what
the plan must read.

The sequential trace works as R1 would: each round opens with the equations it can do now, copied from the
question (`First A + 7 = 3 , B * 3 = 4 .`, later `Then C * 7 = A , D + A = B .`), then each subtask in turn
(`Now C * 7 = A .`, copied from the opening; that equation with the digits it reads, looked up in the words of
their results, `where A is 6 , so x * 7 = 6`; the tries; `So C is 8 .`); a share of traces checks the last search
once more (R1's habit, the slack GRPO can remove); then the digits asked for are looked up the same way in the
plan (`That is all : C is 8 and D is 2 .`), and the answer boxes those words (`\boxed{ C is 8 and D is 2 }`):
each digit in it is again a lookup by name. Boxed bare (`\boxed{ 8 2 }`), SPRINT's final answer copied its
digits by place from a closing twenty tokens up, and boxed other digits than its closing in 23 of 200 answers
(docs/experiments.md, "Answers by name").

The restated equation names no unknown (`so x * 7 = 6`, as the tries write it): restated under its own name
(`so C * 7 = 6`), the name was where a later executor slipped to a sibling's, whose equation it then restated and
searched, the one error left in SPRINT's searches (docs/experiments.md, "A restated equation without a name").

Every step is a copy or a try, none a sum: an equation that reads two unknowns reads one as its constant
(`D + A = B`, so `x + 6 = 8`), and several digits asked for are listed, not added. A model of this size
learned the tries and the copies but not sums of looked-up digits, which the equations and the answer once
asked for (docs/experiments.md, "No sums").

Why digits and searches (the named multi-digit sums before them are measured in docs/experiments.md,
"The arithmetic task"): a model of about a million parameters copies single tokens by name (`A is`) and
from the line above early, but a multi-digit number from a question full of digits only late, and that
copy was where every deeper problem failed. Here a copy from the question is three one-token values
after the name that starts a line, and every try repeats the line above's operands at a fixed distance;
the demo's tokenizer makes each right part one token (` * 3 = 1`), so the copy is one token after the name,
learned far sooner than three (docs/experiments.md, "Digit equations"). The equation keeps a try's spaces,
so the same kind of token ends every try (` * 3 = 4` of `8 * 3 = 4`) and is written nine times a subtask:
written apart from the tries (`B *3 =4`, a token only the heads write), the copy formed far later.
The instruction carries its equation so that an executor only copies its own prompt: with bare names
(`Now C .`) each executor had to find its equation in the question by name with no earlier work in its view,
and a model of this size did so only for the first subtask of a round (docs/experiments.md, "Executions that
open with their instruction"). The opening carries the round's equations so that the one copy by name from the
question is made in a line the sequential trace writes word for word, and a plan's later instructions copy from
the line above them: copied from the question past a round's first place, a later round's instructions were
wrong one time in three (docs/experiments.md, "Openings that carry the round's equations").
Deep problems are kept small (`DrawConfig.max_deep`) and the widest problems are the longest, so the
ideal packing has the paper's Figure 6 shape (the longest quartile gains most; docs/experiments.md, "No sums").

The generator also knows each trace's components and DAG (`make_trace`, for the stand-in teacher) and the
ideal packing of the problem (`Shape`: the subtasks of each round), read by the summary's plan fidelity.
Seeded and deterministic: the same options give byte-identical files.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sprint.core.errors import UserError
from sprint.mini.problems import MiniDataConfig, ProblemRows

QUESTION = "Find {goal} , keeping only last digits ."  # goal: the names asked for, `C , D`
DEFINITION = "{name} {op} {k} = {rhs}"                  # an equation, as the question and its execution write it
FIRST = "First {equations} ."                            # round 1's opening (what needs only numbers): the plan
NEXT = "Then {equations} ."                              # each later round's opening (what needs those)
NOW = "Now {equation} ."                                 # a subtask's instruction, copied from its opening: the prompt
HEAD = "{equation} , try each digit :"                   # an execution's first line
READS = "{equation} , where {lookups} , so {restated}"  # ... for an equation that names unknowns
RESTATED = "x {op} {k} = {t}"                            # that equation with the digits it read: the tries' own
LOOKUP = "{name} is {value}"                            # a digit read by name: the same words as its result
TRY = "{x} {op} {k} = {v} , want {t} , {verdict} ."     # verdict: yes for the one digit that fits, else no
RESULT = "So {name} is {x} ."                           # a subtask's digit: `A is` occurs nowhere else
DONE = "That is all : {work} ."
RECHECK = "Wait , let me check {name} once more : {x} {op} {k} = {t} , yes ."
ANSWER = "The answer is \\boxed{{ {answer} }} ."          # answer: the digits asked for by name (`C is 8 and D is 2`)
OPS = ("+", "*")
FACTORS = (3, 7, 9)  # a product's factor: a unit mod 10, so exactly one digit solves each equation
NAMES = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MERGE = 0.4          # chance that an equation above round 1 also reads a second, earlier unknown (as its constant)
# chances of one, two, three (and more) rounds: deep problems are kept short (`DrawConfig.max_deep`), so too
# many of them would leave the shorter half of the problems little to gain (overall ratio)
DEPTHS = (0.25, 0.45, 0.30)
MAX_GOAL = 4         # most unknowns asked for (the DAG's sinks)
# `sprint mini-tokenizer --phrases` for this task (scripts/mini_demo.sh): each right part (` * 3 = 1`, ` + 3 = A`,
# ` + B = A`) and each lookup's key (` A is`) one token, so an equation is copied from the question as one token
# after its name (docs/experiments.md, "Digit equations")
PHRASES = " [+*] [0-9] = [0-9A-Z]| [+] [A-Z] = [A-Z]| [A-Z] is"


def apply(x: int, op: str, k: int) -> int:
    return (x + k) % 10 if op == "+" else (x * k) % 10


@dataclass(frozen=True, eq=False)
class Node:
    """An unknown digit `value` with its equation `value op k = right side`, the right side a number or the
    unknown it reads; reading two (`D + B = A`), the first is the constant `k` (compared by identity: two
    unknowns may have equal equations)."""

    value: int
    op: str
    k: int
    reads: tuple[Node, ...] = ()
    number: int | None = None  # the right side when it names no unknown

    @property
    def target(self) -> int:
        return self.number if self.number is not None else self.reads[-1].value

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
    unknowns asked for."""

    order: tuple[Node, ...]
    goal: tuple[Node, ...]

    def name(self, node: Node) -> str:
        return NAMES[next(i for i, n in enumerate(self.order) if n is node)]

    @property
    def answer(self) -> str:
        """The digits asked for, each by name, in the question's order: the gold answer (`C is 8 and D is 2`)."""
        return self.lookups({})

    def lookups(self, values: dict[str, int]) -> str:
        """The goal's digits in the words of their results, `values` (name -> digit) where given, else the true
        ones: the closing's and the answer's words."""
        return " and ".join(LOOKUP.format(name=self.name(n), value=values.get(self.name(n), n.value)) for n in self.goal)

    def equation(self, node: Node) -> str:
        rhs = str(node.number) if node.number is not None else self.name(node.reads[-1])
        k = self.name(node.reads[0]) if len(node.reads) > 1 else node.k
        return DEFINITION.format(name=self.name(node), op=node.op, k=k, rhs=rhs)

    @property
    def question(self) -> str:
        goal = " , ".join(self.name(n) for n in self.goal)
        return "\n".join([QUESTION.format(goal=goal), *(f"{self.equation(n)} ." for n in self.order)])


# ------------------------------------------------------------------------------ problems


@dataclass(frozen=True)
class DrawConfig:
    """How problems are drawn (the held-out problems are drawn the same way)."""

    max_rounds: int = 3
    max_width: int = 4       # subtasks in one round
    max_subtasks: int = 8    # subtasks in all
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
    a second from any earlier round, one of the two as its constant (`x + k = t`, so unknowns of different
    digits: x would be 0, which no try reaches)."""
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
                earlier = [n for r in rounds for n in r if n.value != reads[0].value]
                if earlier and rng.random() < MERGE:
                    reads.append(_pick(rng, earlier, read))
                    rng.shuffle(reads)
                read.update(id(n) for n in reads)
                if len(reads) == 2:
                    k, t = reads[0].value, reads[1].value
                    this.append(Node((t - k) % 10, "+", k, reads=tuple(reads)))
                    continue
                x, op, k = _equation(rng, reads[0].value)
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
        restated = RESTATED.format(op=node.op, k=node.k, t=node.target)  # the digits for the names
        equation = READS.format(equation=equation, lookups=lookups, restated=restated)
    lines = [HEAD.format(equation=equation)]
    lines += [TRY.format(x=x, op=node.op, k=node.k, v=apply(x, node.op, node.k), t=node.target,
                         verdict="yes" if x == node.value else "no") for x in range(1, 10)]
    return lines + [RESULT.format(name=name, x=node.value)]


def done_line(problem: Problem) -> str:
    """The digits asked for, each looked up in the words of its result as a search's head looks up what it
    reads: `That is all : C is 8 and D is 2 .`"""
    return DONE.format(work=problem.answer)


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


def work_order(problem: Problem, round_nodes: tuple[Node, ...], shuffled: bool) -> list[Node]:
    """A round's subtasks in the question's order, or (`shuffled`) in an order drawn from the question itself, so
    that a trace stays a function of its question."""
    if not shuffled:
        return list(round_nodes)
    return random.Random(f"order:{problem.question}").sample(list(round_nodes), len(round_nodes))


def make_trace(problem: Problem, recheck: bool = False, shuffled: bool = False) -> Trace:
    """The trace, and stage 1-2 answers as a careful teacher would give them: each round's opening
    plan-only; a subtask with its instruction as the prompt (no range holds it, as the instruction is the
    trace's own line) and its search as the execution; the closing lookups plan-only. Parents: what a line
    reads, so a subtask depends on its round's opening and on the subtasks it reads, and the closing on the
    subtasks it looks up. `shuffled`: each round's subtasks in an order of their own (`work_order`), so that the
    next equation is not the question's next line."""
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
    for r, round_nodes in enumerate((work_order(problem, nodes, shuffled) for nodes in Shape.of(problem).rounds), 1):
        lines.append((FIRST if r == 1 else NEXT).format(equations=" , ".join(problem.equation(n) for n in round_nodes)))
        opening = add(f"Choose the subtasks of round {r}", [opening] * (r > 1) + [number[id(n)] for n in previous],
                      plan=f"{len(lines)}-{len(lines)}")
        for n in round_nodes:
            prompt = NOW.format(equation=problem.equation(n))
            lines.append(prompt)
            start = len(lines) + 1
            lines += work_lines(problem, n)
            number[id(n)] = add(f"Find {name(n)} by trying each digit", [opening, *(number[id(r)] for r in n.reads)],
                                prompt=prompt, execution=f"{start}-{len(lines)}")
        previous = list(round_nodes)
    start = len(lines) + 1
    lines.append(done_line(problem))
    if recheck:
        last = problem.order[-1]
        lines.append(RECHECK.format(name=name(last), x=last.value, op=last.op, k=last.k, t=last.target))
    add("Collect the digits asked for", [opening, *(number[id(n)] for n in problem.goal)], plan=f"{start}-{len(lines)}")
    return Trace(problem, lines, ANSWER.format(answer=problem.answer), components, dag)


# ------------------------------------------------------------------------------ rows


def problem_row(problem: Problem, row_id: str, index: int) -> dict[str, Any]:
    """A held-out problem: its question, its answer (the gold, by name) and its ideal packing."""
    widths = Shape.of(problem).widths
    return {"id": row_id, "index": index, "question": problem.question, "answer": problem.answer,
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
        trace = make_trace(fresh(draw), recheck=rechecks.random() < cfg.recheck_share, shuffled=cfg.shuffle_rounds)
        rows.add_trace({"id": f"ar-{i:05d}", "question": trace.question, "thought": trace.thought,
                        "solution": trace.solution, "answer": trace.problem.answer},
                       {"components": trace.components, "dag": trace.dag})
    # drawn last, so that asking for them changes no training problem
    rows.beyond = [problem_row(fresh(wider, beyond_training), f"ar-beyond-{i:04d}", i) for i in range(cfg.beyond)]
    return rows


# ------------------------------------------------------------------------------ reading problems back

_GOAL = re.compile(r"^Find ([A-Z](?: , [A-Z])*) , keeping only last digits \.$")
_EQUATION = re.compile(r"^([A-Z]) (?:([+*]) ([0-9]) = ([0-9A-Z])|(\+) ([A-Z]) = ([A-Z])) \.$")


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
        name, op, k, rhs = match[1], match[2] or match[5], match[3] or match[6], match[4] or match[7]
        names = [v for v in (k, rhs) if v.isalpha()]
        if any(v not in built for v in names):
            raise ValueError(f"{line!r} reads an unknown not defined above it")
        k_value, target = (built[v].value if v.isalpha() else int(v) for v in (k, rhs))
        x = solve(op, k_value, target)
        if not x:  # 0 is no try's digit either
            raise ValueError(f"no single digit 1-9 solves {line!r}")
        built[name] = Node(x, op, k_value, reads=tuple(built[v] for v in names),
                           number=None if rhs.isalpha() else target)
    goal_names = head[1].split(" , ")
    if any(g not in built for g in goal_names):
        raise ValueError(f"the question asks for an unknown it does not define: {lines[0]!r}")
    return Problem(tuple(built.values()), tuple(built[g] for g in goal_names))


@dataclass(frozen=True)
class Step:
    """An execution's first line read back: its equation, the digits it looked up by name, and the equation
    restated with them."""

    op: str
    k: int
    reads: dict[str, int]
    target: int
    restated_right: bool  # the restated equation keeps the operation and holds the looked-up digits where it names them


_PROMPT = re.compile(r"^Now ([A-Z] [+*] [0-9A-Z] = [0-9A-Z]) \.$")
_RESULT = re.compile(r"^So ([A-Z]) is ([0-9]) \.$", re.M)
_HEAD = re.compile(r"^([A-Z]) ([+*]) (?:([0-9]) = ([0-9])|([0-9A-Z]) = ([A-Z]) , where ([A-Z] is [0-9](?: and [A-Z] is [0-9])*)"
                   r" , so x ([+*]) ([0-9]) = ([0-9])) , try each digit :$", re.M)


_EQUATION_LINE = re.compile(r"^[A-Z] [+*] [0-9A-Z] = [0-9A-Z](?= |$)", re.M)
PLACES = ("first", "second", "third or later")  # a subtask's place in its round, as the copy tables group it


def lead(template: str) -> str:
    """The fixed words a template's lines start with (`Now ` of `Now {equation} .`)."""
    return template.split("{", 1)[0]


OPENINGS = (lead(FIRST), lead(NEXT))  # what a round's opening line starts with


def head_equation(text: str) -> str | None:
    """The first equation a text restates at the start of a line (`C * 7 = A` of `C * 7 = A , where ...`), to be
    read against the question's line; None when no line starts with one."""
    match = _EQUATION_LINE.search(text)
    return match[0] if match else None


def copy_place(round_index: int, position: int) -> str:
    """`round 1, second`, `later rounds, first`, ...: where a subtask stands (0-based round and place)."""
    return f"{'round 1' if round_index == 0 else 'later rounds'}, {PLACES[min(position, len(PLACES) - 1)]}"


def copy_places() -> list[str]:
    """Every `copy_place`, in reading order."""
    return [copy_place(r, k) for r in (0, 1) for k in range(len(PLACES))]


def tally(copies: Iterable[tuple[str, bool]]) -> dict[str, tuple[int, int]]:
    """(place, copied right) pairs -> place: (wrong, written), places in reading order."""
    counts: dict[str, list[int]] = {place: [0, 0] for place in copy_places()}
    for place, right in copies:
        counts[place][0] += not right
        counts[place][1] += 1
    return {place: (wrong, written) for place, (wrong, written) in counts.items() if written}


def read_prompt(text: str) -> str | None:
    """The name a prompt (`Now B * 3 = 6 .`) asks for; None when it is not one."""
    equation = prompt_equation(text)
    return equation.split(" ", 1)[0] if equation else None


def prompt_equation(text: str) -> str | None:
    """The equation a prompt carries (`B * 3 = 6` of `Now B * 3 = 6 .`); None when it is not a prompt."""
    match = _PROMPT.match(text.strip())
    return match[1] if match else None


def read_result(execution: str) -> tuple[str, int] | None:
    """(name, digit) an execution reports on its last `So B is 6 .` line (None without one)."""
    found = _RESULT.findall(execution)
    return (found[-1][0], int(found[-1][1])) if found else None


def read_step(execution: str) -> Step | None:
    """An execution's first line (`C * 7 = A , where A is 6 , so x * 7 = 6 , try each digit :`; reading two,
    `D + B = A , where B is 4 and A is 6 , so x + 4 = 6 , ...`); None when it has none."""
    match = _HEAD.search(execution)
    if not match:
        return None
    op = match[2]
    if match[3] is not None:
        return Step(op, int(match[3]), {}, int(match[4]), True)
    reads = {n: int(v) for n, v in re.findall(r"([A-Z]) is ([0-9])", match[7])}
    k, target = int(match[9]), int(match[10])
    want_k = reads.get(match[5]) if match[5].isalpha() else int(match[5])
    return Step(op, k, reads, target, match[8] == op and want_k == k and reads.get(match[6]) == target)
