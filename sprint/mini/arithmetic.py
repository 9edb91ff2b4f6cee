"""The mini experiment's main task: named arithmetic steps whose dependencies form a different DAG each time.

A problem is a value to find and the definitions it rests on, listed in no particular order:

    Work out E .
    A = 4 8 + 7 1 + 5 5 .
    B = A - C .
    C = 3 7 + 7 4 .
    D = 2 + 4 .
    E = B * D .

Every definition with a multi-digit operand is a subtask worked column by column (a long execution); one
of two one-digit numbers (`D`) is one line worked inside the plan (a short execution, which packing merges
into its plan). The definitions' references are the DAG: subtasks whose operands are known are
independent and run in one round, a round needs the results of the one before, and a subtask's height (1
+ the highest subtask it reads) is its round. So the number of rounds, the number of subtasks per round and
which round needs which result vary with the problem, and can be read from it only by reading which
definition uses which: a chain has no parallelism at all, four sums combined two by two are four
independent subtasks, then two, then one.

The sequential trace works as R1 would: each round opens with the subtasks it can do now (`First , what
needs only numbers : A , C .`, later `Next , what needs those : B .`), the one-digit definitions are one
line each, then each subtask in turn (`Now A .`, its definition restated with the values it reads, one line
per column from the right, `So A is 1 7 4 .`); a share of traces checks the last step once more (R1's
habit, the slack GRPO can remove); then the boxed value. Names keep the plans short (a prompt is three
tokens, and no round rewrites the whole problem), so the ideal packing saves about half of the longest
traces, as the paper's Figure 6 does; every copy is then a lookup by name, which a small model learns later
than the column work (docs/experiments.md, "The arithmetic task"). A value read from an earlier subtask is
looked up in the words of its result (`So A is 1 7 4 .` there, `where A is 1 7 4` here; `A is` occurs
nowhere else), so the copy is the pattern a small model's induction heads learn first; the question's
numbers are copied after `A =`.
Digits are one token each (`4 7` is 47) for the column work; every line is its own sentence, so stage 1's
line numbers are the generator's own.

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

QUESTION = "Work out {name} ."
DEFINITION = "{name} = {expr} ."
FIRST = "First , what needs only numbers : {names} ."   # round 1's opening: the plan
NEXT = "Next , what needs those : {names} ."            # each later round's opening
SHORT = "{name} = {a} {op} {b} , so {name} is {value} ."  # a one-digit definition, worked in the plan
NOW = "Now {name} ."                                     # a subtask's instruction: the prompt
RESTATE = "{head} , column by column from the right :"
TWO_AT_A_TIME = "{head} , two at a time :"               # a sum of more than two terms
STEP = "So {expr} = {value} ."                           # one step of a longer sum
RESULT = "So {name} is {value} ."                       # a subtask's value: `A is` occurs nowhere else
LOOKUP = "{name} is {value}"                            # a value read by name: the same words as its result
DONE = "That is all : {name} is {value} ."
RECHECK = "Wait , let me check the last step once more : {expr} = {value} , yes ."
ANSWER = "The answer is \\boxed{{ {value} }} ."
OPS = ("+", "-", "*")
NAMES = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
OP_WEIGHTS = (0.5, 0.3, 0.2)    # chances of +, -, * above round 1: a product by one digit makes a chain
WIDEN = 0.9                # chance that an operation's second operand is a subtask as high as its first
# chances of 2, 3, 4 terms in the sums of round 1 of a problem of two rounds or more: heavy parallel
# subtasks beside light later rounds, so that the longest problems gain most from running them side by side
TERMS = (0.0, 0.3, 0.7)


def digits(n: int) -> str:
    """47 -> '4 7': one token per digit in the project's tokenizer, so the column work is token by token."""
    return " ".join(str(n))


@dataclass(frozen=True)
class Node:
    """A number (`op` is None) or an operation on `args` (a sum may have 2-4 terms)."""

    value: int
    op: str | None = None
    args: tuple[Node, ...] = ()

    @property
    def short(self) -> bool:
        """Two one-digit numbers: one line, worked inside the plan (its execution would span one line, which
        packing merges into the plan)."""
        return self.op is not None and len(self.args) == 2 and all(a.op is None and a.value < 10 for a in self.args)

    @property
    def height(self) -> int:
        """The round of a subtask (0: a number or a one-digit definition, known from the first plan on)."""
        if self.op is None or self.short:
            return 0
        return max(a.height for a in self.args) + 1

    def operations(self) -> list[Node]:
        """Every operation, operands before the operation that uses them, left to right."""
        if self.op is None:
            return []
        return [n for a in self.args for n in a.operations()] + [self]


def combine(op: str, args: tuple[Node, ...]) -> Node:
    if op == "+":
        return Node(sum(a.value for a in args), op, args)
    if op == "-":
        return Node(args[0].value - args[1].value, op, args)
    return Node(args[0].value * args[1].value, op, args)


# ------------------------------------------------------------------------------ the column-by-column work


def _padded(a: int, b: int, op: str) -> str:
    """`a op b` with both numbers padded to one width (a sum or difference: one digit under another)."""
    if op == "*":
        return f"{digits(a)} {op} {digits(b)}"
    width = max(len(str(a)), len(str(b)))
    return f"{' '.join(str(a).zfill(width))} {op} {' '.join(str(b).zfill(width))}"


def column_lines(a: int, op: str, b: int) -> list[str]:
    """One binary step worked column by column from the right, a line per column (`x + y + carry = v`: the
    carry is the first digit of the line before; a difference borrows by writing `1 x`)."""
    lines, carry = [], 0
    for i in range(max(len(str(a)), 1 if op == "*" else len(str(b)))):
        x, y = a // 10 ** i % 10, (b if op == "*" else b // 10 ** i % 10)
        if op == "-":
            borrow = x - y - carry < 0
            lines.append(f"{'1 ' if borrow else ''}{x} - {y} - {carry} = {x - y - carry + 10 * borrow} .")
            carry = int(borrow)
            continue
        v = x * y + carry if op == "*" else x + y + carry
        lines.append(f"{x} {op} {y} + {carry} = {digits(v)} .")
        carry = v // 10
    return lines


def work_lines(name: str, definition: str, node: Node, reads: tuple[str, ...] = ()) -> list[str]:
    """The execution of a subtask: its definition restated, each value it reads by name looked up in the
    words of its result (`B = A * D , where A is 1 7 4 and D is 6 , so B = 1 7 4 * 6`; `reads`: the names
    of the operands that are operations, in order), then a binary step column by column, or a sum of more
    terms added two at a time, each step on its own; closed by the subtask's value under its name."""
    values = [a.value for a in node.args]
    op = node.op or "+"
    head = f"{name} = {definition}"
    if len(values) == 2:
        looked_up = [a.value for a in node.args if a.op is not None]
        if looked_up:
            lookups = (LOOKUP.format(name=n, value=digits(v)) for n, v in zip(reads, looked_up, strict=True))
            head += f" , where {' and '.join(lookups)} , so {name} = {_padded(values[0], values[1], op)}"
        lines = [RESTATE.format(head=head), *column_lines(values[0], op, values[1])]
    else:
        lines, total = [TWO_AT_A_TIME.format(head=head)], values[0]
        for v in values[1:]:
            lines += [RESTATE.format(head=_padded(total, v, "+")), *column_lines(total, "+", v),
                      STEP.format(expr=f"{digits(total)} + {digits(v)}", value=digits(total + v))]
            total += v
    return lines + [RESULT.format(name=name, value=digits(node.value))]


def node_work(node: Node) -> str:
    """The operation on its operands' values: `1 7 4 * 6`."""
    return f" {node.op} ".join(digits(a.value) for a in node.args)


# ------------------------------------------------------------------------------ problems


@dataclass(frozen=True)
class DrawConfig:
    """How problems are drawn: rounds, terms and sizes (the held-out problems are drawn the same way)."""

    max_rounds: int = 3
    max_width: int = 4       # subtasks in one round
    max_subtasks: int = 7    # subtasks in all
    max_value: int = 9999    # every value, so every number has at most four digits
    max_chars: int = 2600    # the sequential trace, at most about 980 tokens


def _multiplier(rng: random.Random) -> Node:
    """A one-digit factor, now and then a one-digit definition worth 2-9 (worked inside the plan)."""
    if rng.random() < 0.25:
        while True:
            op = rng.choice(OPS)
            node = combine(op, (Node(rng.randint(1, 9)), Node(rng.randint(1, 9))))
            if 2 <= node.value <= 9 and not (op == "*" and 1 in (node.args[0].value, node.args[1].value)):
                return node
    return Node(rng.randint(2, 9))


def _draw(rng: random.Random, height: int, terms: int) -> Node:
    """An operation of exactly this height: in round 1 a sum of `terms` two-digit numbers (the heavy
    subtasks, run side by side); above it a sum or difference of two operands, or a product by one digit:
    one operand of height - 1 (the chain), the other as likely of that height too (a parallel subtask) as
    of any lower height (a two-digit number at height 0)."""
    if height == 1:
        return combine("+", tuple(Node(rng.randint(10, 99)) for _ in range(terms)))
    op = rng.choices(OPS, weights=OP_WEIGHTS)[0]
    if op == "*":
        return combine(op, (_draw(rng, height - 1, terms), _multiplier(rng)))
    other = height - 1 if rng.random() < WIDEN else rng.randint(0, height - 1)
    args = [_draw(rng, height - 1, terms), Node(rng.randint(10, 99)) if other == 0 else _draw(rng, other, terms)]
    rng.shuffle(args)
    if op == "-":
        args.sort(key=lambda a: -a.value)
    return combine(op, tuple(args))


@dataclass(frozen=True)
class Problem:
    """A tree of operations with a name for each, listed in the question's order (names A, B, ... in that
    order, so the listing, not the names, hides which round a definition belongs to)."""

    root: Node
    order: tuple[Node, ...]   # every operation, as the question lists them

    def name(self, node: Node) -> str:
        return NAMES[next(i for i, n in enumerate(self.order) if n is node)]

    def definition(self, node: Node) -> str:
        """`A - C`: numbers as digits, operations by name."""
        return f" {node.op} ".join(digits(a.value) if a.op is None else self.name(a) for a in node.args)

    @property
    def question(self) -> str:
        return "\n".join([QUESTION.format(name=self.name(self.root)),
                          *(DEFINITION.format(name=self.name(n), expr=self.definition(n)) for n in self.order)])


def name_problem(root: Node, rng: random.Random) -> Problem:
    order = list(root.operations())
    rng.shuffle(order)
    return Problem(root, tuple(order))


def valid(node: Node, cfg: DrawConfig) -> bool:
    ops = node.operations()
    if not node.op or node.short or len(ops) > len(NAMES) or sum(not n.short for n in ops) > cfg.max_subtasks:
        return False
    widths = Shape.of(Problem(node, tuple(ops))).widths
    if len(widths) > cfg.max_rounds or max(widths) > cfg.max_width:
        return False
    for n in ops:
        if not 1 <= n.value <= cfg.max_value:
            return False
        if n.op == "-" and n.args[0].value <= n.args[1].value:
            return False
        if not n.short and len(n.args) == 2 and len(column_lines(n.args[0].value, n.op, n.args[1].value)) < 2:
            return False  # one column line (`A * 8` with A = 3): an execution packing merges, not a subtask
    return True


def draw_problem(rng: random.Random, cfg: DrawConfig) -> Problem:
    """One round a quarter of the time, the other depths sharing the rest (deeper problems have more shapes).
    All sums of round 1 have one number of terms, so a problem's parallel subtasks take about as long each:
    two to four in a one-round problem, mostly four in deeper ones (`TERMS`)."""
    heights = range(1, cfg.max_rounds + 1)
    weights = [0.25] + [0.75 / (cfg.max_rounds - 1)] * (cfg.max_rounds - 1) if cfg.max_rounds > 1 else [1.0]
    while True:
        height = rng.choices(heights, weights=weights)[0]
        node = _draw(rng, height, rng.choices((2, 3, 4), weights=TERMS if height > 1 else (1, 1, 1))[0])
        if not valid(node, cfg):
            continue
        problem = name_problem(node, rng)
        if len(make_trace(problem).thought) <= cfg.max_chars:
            return problem


@dataclass(frozen=True)
class Shape:
    """The ideal packing of a problem: the subtasks of each round, in the question's order."""

    rounds: tuple[tuple[Node, ...], ...]

    @classmethod
    def of(cls, problem: Problem) -> Shape:
        ops = [n for n in problem.order if not n.short]
        top = max(n.height for n in ops)
        return cls(tuple(tuple(n for n in ops if n.height == r) for r in range(1, top + 1)))

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(len(r) for r in self.rounds)


def subtasks(problem: Problem) -> list[list[str]]:
    """Each round's subtasks by name, as the prompts write them."""
    return [[problem.name(n) for n in r] for r in Shape.of(problem).rounds]


# ------------------------------------------------------------------------------ traces


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
    plan-only; a one-digit definition with its one line as a (short) execution, which packing merges into
    the plan; a subtask with its instruction as the prompt (no range holds it, as the instruction is the
    trace's own line) and its column work as the execution. Parents: what a line reads, so a subtask
    depends on its round's opening and on the subtasks and one-digit definitions it reads."""
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

    def reads(node: Node) -> list[int]:
        return [number[id(a)] for a in node.args if id(a) in number]

    name = problem.name
    shorts = [n for n in problem.order if n.short]
    opening, previous = 0, []
    for r, round_ops in enumerate(Shape.of(problem).rounds, 1):
        names = " , ".join(name(n) for n in round_ops)
        lines.append((FIRST if r == 1 else NEXT).format(names=names))
        opening = add(f"Choose the subtasks of round {r}", [opening] * (r > 1) + [number[id(n)] for n in previous],
                      plan=f"{len(lines)}-{len(lines)}")
        for n in shorts if r == 1 else ():
            lines.append(SHORT.format(name=name(n), a=n.args[0].value, op=n.op, b=n.args[1].value,
                                      value=n.value))
            number[id(n)] = add(f"Work out {name(n)}", [opening], prompt=f"Work out {name(n)} .",
                                execution=f"{len(lines)}-{len(lines)}")
        for n in round_ops:
            lines.append(NOW.format(name=name(n)))
            start = len(lines) + 1
            lines += work_lines(name(n), problem.definition(n), n, tuple(name(a) for a in n.args if a.op is not None))
            number[id(n)] = add(f"Work out {name(n)} column by column", [opening, *reads(n)],
                                prompt=NOW.format(name=name(n)), execution=f"{start}-{len(lines)}")
        previous = list(round_ops)
    root = problem.root
    start = len(lines) + 1
    lines.append(DONE.format(name=name(root), value=digits(root.value)))
    if recheck:
        lines.append(RECHECK.format(expr=node_work(root), value=digits(root.value)))
    add("State the value", [opening, number[id(root)]], plan=f"{start}-{len(lines)}")
    return Trace(problem, lines, ANSWER.format(value=digits(root.value)), components, dag)


# ------------------------------------------------------------------------------ rows


def problem_row(problem: Problem, row_id: str, index: int) -> dict[str, Any]:
    """A held-out problem: its question, its value (the gold answer) and its ideal packing."""
    widths = Shape.of(problem).widths
    return {"id": row_id, "index": index, "question": problem.question, "answer": str(problem.root.value),
            "rounds": len(widths), "widths": list(widths), "subtasks": subtasks(problem)}


def arithmetic_rows(cfg: MiniDataConfig) -> ProblemRows:
    """Held-out problems first (seeded), then as many other training problems, drawn the same way."""
    if not 1 <= cfg.max_rounds <= 6 or not 1 <= cfg.max_width <= 6 or cfg.max_subtasks < cfg.max_rounds:
        raise UserError("arithmetic draws need 1 <= --max-rounds <= 6, 1 <= --max-width <= 6 and "
                        f"--max-subtasks >= --max-rounds (got {cfg.max_rounds}, {cfg.max_width}, {cfg.max_subtasks})")
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
    wider = DrawConfig(cfg.max_rounds + 1, cfg.max_width + 1, cfg.max_subtasks + 2)

    def beyond_training(problem: Problem) -> bool:
        widths = Shape.of(problem).widths
        return len(widths) > cfg.max_rounds or max(widths) > cfg.max_width

    rows.beyond = [problem_row(fresh(wider, beyond_training), f"ar-beyond-{i:04d}", i) for i in range(cfg.beyond)]
    rechecks = random.Random(f"recheck:{cfg.seed}")  # its own stream: the share changes no problem
    for i in range(cfg.n_train or 4000):
        trace = make_trace(fresh(draw), recheck=rechecks.random() < cfg.recheck_share)
        rows.add_trace({"id": f"ar-{i:05d}", "question": trace.question, "thought": trace.thought,
                        "solution": trace.solution, "answer": str(trace.problem.root.value)},
                       {"components": trace.components, "dag": trace.dag})
    return rows


# ------------------------------------------------------------------------------ reading problems back

_NUMBER = r"[0-9](?: [0-9])*"
_DEFINITION = re.compile(rf"^([A-Z]) = ((?:{_NUMBER}|[A-Z])(?: [+*-] (?:{_NUMBER}|[A-Z]))+) \.$")


def parse_problem(text: str) -> Problem:
    """A question as the generator writes it, back into its problem; ValueError for anything else."""
    lines = text.strip().split("\n")
    head = re.fullmatch(r"Work out ([A-Z]) \.", lines[0].strip())
    if not head:
        raise ValueError(f"not a question of the mini task: {text[:80]!r}")
    defined: dict[str, tuple[str, list[str]]] = {}
    for line in lines[1:]:
        match = _DEFINITION.match(line.strip())
        if not match:
            raise ValueError(f"not a definition of the mini task: {line!r}")
        tokens = re.findall(rf"{_NUMBER}|[A-Z]|[+*-]", match[2])
        ops = set(tokens[1::2])
        if len(ops) != 1 or (len(tokens) > 3 and ops != {"+"}):
            raise ValueError(f"mixed operations in one definition: {line!r}")
        defined[match[1]] = (tokens[1], tokens[::2])
    built: dict[str, Node] = {}

    def build(name: str, seen: tuple[str, ...] = ()) -> Node:
        if name in seen or name not in defined:
            raise ValueError(f"{name} is undefined or defined through itself in {text[:80]!r}")
        if name not in built:
            op, args = defined[name]
            built[name] = combine(op, tuple(build(a, (*seen, name)) if a.isalpha() else Node(int(a.replace(" ", "")))
                                            for a in args))
        return built[name]

    root = build(head[1])
    order = tuple(build(name) for name in defined)
    if list(defined) != list(NAMES[: len(defined)]):
        raise ValueError(f"definitions are not named A, B, ... in order: {text[:80]!r}")
    return Problem(root, order)


_PROMPT = re.compile(r"^Now ([A-Z]) \.$")
_RESULT = re.compile(r"^So ([A-Z]) is ([0-9](?: [0-9])*) \.$", re.M)
_HEAD = re.compile(rf"^[A-Z] = .*?((?:{_NUMBER})(?: [+*-] {_NUMBER})+) , (?:column by column from the right|two at a time) :$",
                   re.M)


def read_prompt(text: str) -> str | None:
    """The name a prompt (`Now B .`) asks for; None when it is not one."""
    match = _PROMPT.match(text.strip())
    return match[1] if match else None


def read_result(execution: str) -> tuple[str, int] | None:
    """(name, value) an execution reports on its last `So B = V .` line (None without one)."""
    found = _RESULT.findall(execution)
    return (found[-1][0], int(found[-1][1].replace(" ", ""))) if found else None


def read_step(execution: str) -> tuple[str, tuple[int, ...]] | None:
    """(operation, operand values) of an execution's first line, as it restated them (`B = A * D = 1 7 4 * 6
    , column by column from the right :`); None when it has none."""
    match = _HEAD.search(execution)
    if not match:
        return None
    tokens = re.findall(rf"{_NUMBER}|[+*-]", match[1])
    return tokens[1], tuple(int(t.replace(" ", "")) for t in tokens[::2])
