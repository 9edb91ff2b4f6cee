"""The mini experiment's main task: arithmetic expressions whose subtasks form a different DAG each time.

A problem is an expression of positive integers with + - * and brackets, e.g.
`( ( 4 8 + 7 1 + 5 5 ) - ( 3 7 + 7 4 ) ) * ( 2 + 4 )`. Every operation with a multi-digit operand is a subtask
worked column by column (a long execution); an operation of two one-digit numbers (`2 + 4`) is one
line worked inside the plan (a short execution, which packing merges into its plan). The expression's
tree is the DAG: operations whose operands are known are independent and run in one round; a round
needs the results of the one before; the height of an operation (1 + the highest operation under it)
is its round. So the number of rounds, the number of subtasks per round and which round needs which
result vary with the problem and can be read from its brackets: a chain has no parallelism at all,
four sums combined two by two are four independent subtasks, then two, then one.

The sequential trace works as R1 would, innermost brackets out: a set-up line, the one-digit
operations, then round after round each subtask (`Now 4 7 * 3 .`, the operands restated, one line
per column from the right, the result), each later round opening with the expression rewritten with
the results so far; a share of traces checks the last step once more (R1's habit, the slack GRPO can
remove); then the boxed value. Digits are written one token each (`4 7` is 47) so that a model of
about a million parameters learns column arithmetic in minutes on a CPU; every line is its own
sentence, so stage 1's line numbers are the generator's own.

The generator also knows each trace's components and DAG (`make_trace`, for the stand-in teacher) and
the ideal packing of the problem (`Shape`: the subtasks of each round), read by the summary's plan
fidelity. Seeded and deterministic: the same options give byte-identical files.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from sprint.core.errors import UserError
from sprint.mini.problems import MiniDataConfig, ProblemRows

SETUP = "Okay , innermost brackets first ."
SHORT = "{a} {op} {b} = {value} ."        # a one-digit operation, worked in the plan
NOW = "Now {expr} ."                       # a subtask's instruction: the prompt
RESTATE = "{expr} , column by column from the right :"
TWO_AT_A_TIME = "{expr} , two at a time :"  # a sum of more than two terms
RESULT = "So {expr} = {value} ."
REWRITE = "So it is {expr} ."              # the expression with the results so far: opens each later round
RECHECK = "Wait , let me check the last step once more : {expr} = {value} , yes ."
ANSWER = "The answer is \\boxed{{ {value} }} ."
QUESTION = "Work out {expr} ."
OPS = ("+", "-", "*")
# numbers written digit by digit (`4 7`); False writes them whole (`47`, one token up to 999; with values up to 999):
# measured once, docs/experiments.md "The arithmetic task"
SPACED = True
OP_WEIGHTS = (0.5, 0.3, 0.2)    # chances of +, -, * above round 1: a product by one digit makes a chain
WIDEN = 0.9                # chance that an operation's second operand is a subtask as high as its first
# chances of 2, 3, 4 terms in the sums of round 1 of a problem of two rounds or more: heavy parallel
# subtasks beside light later rounds, so that the longest problems gain most from running them side by side
TERMS = (0.0, 0.3, 0.7)


def digits(n: int) -> str:
    """47 -> '4 7' (SPACED: one token per digit in the project's tokenizer), else '47' (one token up to 999)."""
    return " ".join(str(n)) if SPACED else str(n)


@dataclass(frozen=True)
class Node:
    """A number (`op` is None) or an operation on `args` (a sum may have 2-4 terms)."""

    value: int
    op: str | None = None
    args: tuple[Node, ...] = ()

    @property
    def short(self) -> bool:
        """An operation of two one-digit values: one line, worked inside the plan (its execution would span
        three lines, which packing merges into the plan)."""
        return self.op is not None and len(self.args) == 2 and all(a.value < 10 for a in self.args)

    @property
    def height(self) -> int:
        """The round of a subtask (0: a number). A short operation has the height of its highest operand and
        is worked in the plan of the next round, as soon as its operands are known."""
        if self.op is None:
            return 0
        return max(a.height for a in self.args) + (0 if self.short else 1)

    def known_by(self, known: int) -> bool:
        """Is this value written as a number once the rounds up to `known` are done?"""
        return self.op is None or (self.height < known if self.short else self.height <= known)

    def text(self, known: int = 0, top: bool = True) -> str:
        """The expression with every operation known after round `known` replaced by its value."""
        if self.known_by(known):
            return digits(self.value)
        inner = f" {self.op} ".join(a.text(known, top=False) for a in self.args)
        return inner if top else f"( {inner} )"

    @property
    def work(self) -> str:
        """This operation on its operands' values, as its prompt writes it: `1 4 1 + 1 6 8`."""
        return f" {self.op} ".join(digits(a.value) for a in self.args)

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
    if op == "*" or not SPACED:
        return f"{digits(a)} {op} {digits(b)}"
    width = max(len(str(a)), len(str(b)))
    return f"{digits(a).replace(' ', '').zfill(width).replace('', ' ').strip()} {op} " \
           f"{digits(b).replace(' ', '').zfill(width).replace('', ' ').strip()}"


def step_lines(a: int, op: str, b: int) -> list[str]:
    """One binary step worked column by column from the right: the operands restated, a line per column
    (`x + y + carry = v`: the carry is the first digit of the line before; a difference borrows by
    writing `1 x`), the result (the last column's value, then each column's last digit, bottom up)."""
    value = a + b if op == "+" else a - b if op == "-" else a * b
    lines = [RESTATE.format(expr=_padded(a, b, op))]
    width, carry = max(len(str(a)), 1 if op == "*" else len(str(b))), 0
    for i in range(width):
        x, y = a // 10 ** i % 10, (b if op == "*" else b // 10 ** i % 10)
        if op == "-":
            borrow = x - y - carry < 0
            lines.append(f"{'1 ' if borrow else ''}{x} - {y} - {carry} = {x - y - carry + 10 * borrow} .")
            carry = int(borrow)
            continue
        v = x * y + carry if op == "*" else x + y + carry
        lines.append(f"{x} {op} {y} + {carry} = {digits(v)} .")
        carry = v // 10
    lines.append(RESULT.format(expr=f"{digits(a)} {op} {digits(b) if op != '*' else b}", value=digits(value)))
    return lines


def work_lines(node: Node) -> list[str]:
    """The execution of a subtask: a binary operation is one step; a sum of more terms is added two at a
    time, left to right, each step on its own, and closes with the whole sum's value."""
    values = [a.value for a in node.args]
    if len(values) == 2:
        return step_lines(values[0], node.op or "+", values[1])
    lines = [TWO_AT_A_TIME.format(expr=node.work)]
    total = values[0]
    for v in values[1:]:
        lines += step_lines(total, "+", v)
        total += v
    return lines + [RESULT.format(expr=node.work, value=digits(total))]


# ------------------------------------------------------------------------------ problems


@dataclass(frozen=True)
class DrawConfig:
    """How problems are drawn: rounds, terms and sizes (the held-out problems are drawn the same way)."""

    max_rounds: int = 3
    max_width: int = 4       # long operations in one round
    max_subtasks: int = 7    # long operations in all
    max_value: int = 9999    # every value, so every number has at most four digits
    max_chars: int = 2300    # the sequential trace, about 870 tokens


def _multiplier(rng: random.Random) -> Node:
    """A one-digit factor, now and then a one-digit operation worth 2-9 (worked inside the plan)."""
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


def valid(node: Node, cfg: DrawConfig) -> bool:
    ops = [n for n in node.operations() if not n.short]
    if not ops or len(ops) > cfg.max_subtasks:
        return False
    widths = Shape.of(node).widths
    if len(widths) > cfg.max_rounds or max(widths) > cfg.max_width:
        return False
    for n in node.operations():
        if not 1 <= n.value <= cfg.max_value:
            return False
        if n.op == "-" and n.args[0].value <= n.args[1].value:
            return False
    return True


def draw_problem(rng: random.Random, cfg: DrawConfig) -> Node:
    """One round a quarter of the time, the other depths sharing the rest (deeper problems have more shapes).
    All sums of round 1 have one number of terms, so a problem's parallel subtasks take about as long each:
    two to four in a one-round problem, mostly four in deeper ones (`TERMS`)."""
    heights = range(1, cfg.max_rounds + 1)
    weights = [0.25] + [0.75 / (cfg.max_rounds - 1)] * (cfg.max_rounds - 1) if cfg.max_rounds > 1 else [1.0]
    while True:
        height = rng.choices(heights, weights=weights)[0]
        node = _draw(rng, height, rng.choices((2, 3, 4), weights=TERMS if height > 1 else (1, 1, 1))[0])
        if valid(node, cfg) and len(make_trace(node).thought) <= cfg.max_chars:
            return node


@dataclass(frozen=True)
class Shape:
    """The ideal packing of a problem: the long operations of each round, left to right."""

    rounds: tuple[tuple[Node, ...], ...]

    @classmethod
    def of(cls, node: Node) -> Shape:
        ops = [n for n in node.operations() if not n.short]
        top = max(n.height for n in ops)
        return cls(tuple(tuple(n for n in ops if n.height == r) for r in range(1, top + 1)))

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(len(r) for r in self.rounds)

    def subtasks(self) -> list[list[str]]:
        """Each round's subtasks as the prompts write them (operands as values)."""
        return [[n.work for n in r] for r in self.rounds]


# ------------------------------------------------------------------------------ traces


@dataclass(frozen=True)
class Trace:
    """One problem's sequential trace and the components the generator knows it holds."""

    node: Node
    lines: list[str]
    solution: str
    components: list[dict[str, Any]]
    dag: dict[str, list[int]]

    @property
    def question(self) -> str:
        return QUESTION.format(expr=self.node.text())

    @property
    def thought(self) -> str:
        return "\n".join(self.lines)


def make_trace(node: Node, recheck: bool = False) -> Trace:
    """The trace, and stage 1-2 answers as a careful teacher would give them: the set-up and each
    rewrite plan-only; a one-digit operation with its one line as a (short) execution, which packing
    merges into the plan; a subtask with its instruction as the prompt (no range holds it, as the
    instruction is the trace's own line) and its column work as the execution. Parents: what a line
    reads, so a subtask depends on its round's opening and on the operations under it."""
    lines = [SETUP]
    components: list[dict[str, Any]] = []
    dag: dict[str, list[int]] = {}
    number: dict[int, int] = {}  # id(node) -> component number

    def add(description: str, parents: list[int], plan: str = "not found", prompt: str = "not found",
            execution: str = "not found") -> int:
        components.append({"description": description, "plan": plan, "prompt": prompt,
                           "execution": execution, "comment": "not found"})
        dag[str(len(components))] = sorted(set(parents))
        return len(components)

    opening = add("Decide the order of work", [], plan="1-1")
    ops = node.operations()
    shape = Shape.of(node)
    previous: list[Node] = []  # the operations of the round before
    for r in range(1, len(shape.rounds) + 2):
        round_ops = shape.rounds[r - 1] if r <= len(shape.rounds) else ()
        shorts = [n for n in ops if n.short and n.height == r - 1]
        if not round_ops and not shorts:
            break
        # a later round opens with the expression rewritten, unless it is now the one operation left
        rewritten = node.text(known=r - 1)
        if r > 1 and not (len(round_ops) == 1 and not shorts and rewritten == round_ops[0].work):
            lines.append(REWRITE.format(expr=rewritten))
            opening = add("Rewrite the expression with the results so far",
                          [opening] + [number[id(n)] for n in previous], plan=f"{len(lines)}-{len(lines)}")
        for n in shorts:
            lines.append(SHORT.format(a=n.args[0].value, op=n.op, b=n.args[1].value, value=n.value))
            number[id(n)] = add(f"Work out {n.work}", [opening] + [number[id(a)] for a in n.args if id(a) in number],
                                prompt=f"Work out {n.work} .", execution=f"{len(lines)}-{len(lines)}")
        for n in round_ops:
            work = work_lines(n)
            lines.append(NOW.format(expr=n.work))
            start = len(lines) + 1
            lines += work
            number[id(n)] = add(f"Work out {n.work} column by column",
                                [opening] + [number[id(a)] for a in n.args if id(a) in number],
                                prompt=NOW.format(expr=n.work), execution=f"{start}-{len(lines)}")
        previous = [*shorts, *round_ops]
    start = len(lines) + 1
    lines.append(REWRITE.format(expr=digits(node.value)))
    if recheck:
        lines.append(RECHECK.format(expr=node.work, value=digits(node.value)))
    add("State the value", [opening, number[id(node)]], plan=f"{start}-{len(lines)}")
    return Trace(node, lines, ANSWER.format(value=digits(node.value)), components, dag)


# ------------------------------------------------------------------------------ rows


def problem_row(node: Node, row_id: str, index: int) -> dict[str, Any]:
    """A held-out problem: its question, its value (the gold answer) and its ideal packing."""
    shape = Shape.of(node)
    return {"id": row_id, "index": index, "question": QUESTION.format(expr=node.text()), "answer": str(node.value),
            "rounds": len(shape.widths), "widths": list(shape.widths), "subtasks": shape.subtasks()}


def arithmetic_rows(cfg: MiniDataConfig) -> ProblemRows:
    """Held-out problems first (seeded), then as many other training problems, drawn the same way."""
    if not 1 <= cfg.max_rounds <= 6 or not 1 <= cfg.max_width <= 6 or cfg.max_subtasks < cfg.max_rounds:
        raise UserError("arithmetic draws need 1 <= --max-rounds <= 6, 1 <= --max-width <= 6 and "
                        f"--max-subtasks >= --max-rounds (got {cfg.max_rounds}, {cfg.max_width}, {cfg.max_subtasks})")
    draw = DrawConfig(cfg.max_rounds, cfg.max_width, cfg.max_subtasks)
    rng = random.Random(cfg.seed)
    seen: set[str] = set()

    def fresh(config: DrawConfig, keep: Any = lambda node: True) -> Node:
        while True:
            node = draw_problem(rng, config)
            if keep(node) and node.text() not in seen:
                seen.add(node.text())
                return node

    rows = ProblemRows()
    rows.held_out = [problem_row(fresh(draw), f"ar-test-{i:04d}", i) for i in range(cfg.n_test)]
    wider = DrawConfig(cfg.max_rounds + 1, cfg.max_width + 1, cfg.max_subtasks + 2)
    def beyond_training(node: Node) -> bool:
        widths = Shape.of(node).widths
        return len(widths) > cfg.max_rounds or max(widths) > cfg.max_width

    rows.beyond = [problem_row(fresh(wider, beyond_training), f"ar-beyond-{i:04d}", i) for i in range(cfg.beyond)]
    rechecks = random.Random(f"recheck:{cfg.seed}")  # its own stream: the share changes no problem
    for i in range(cfg.n_train or 4000):
        trace = make_trace(fresh(draw), recheck=rechecks.random() < cfg.recheck_share)
        rows.add_trace({"id": f"ar-{i:05d}", "question": trace.question, "thought": trace.thought,
                        "solution": trace.solution, "answer": str(trace.node.value)},
                       {"components": trace.components, "dag": trace.dag})
    return rows


# ------------------------------------------------------------------------------ reading problems back

_TOKEN = re.compile(r"\(|\)|[+*-]|[0-9]+(?: [0-9]+)*")  # a number: digits, spaced or not


def parse_expression(text: str) -> Node:
    """The tree of an expression as the generator writes it (`( 4 7 + 2 8 ) * 3`, digits spaced); a
    question (`Work out ... .`) is read too. ValueError for anything else. A sum of more than two terms
    at one level is one operation, as the generator draws it."""
    body = text.strip()
    if body.startswith("Work out ") and body.endswith(" ."):
        body = body[len("Work out "):-2]
    tokens = _TOKEN.findall(body)
    if "".join(tokens).replace(" ", "") != body.replace(" ", ""):
        raise ValueError(f"not an expression of the mini task: {text!r}")
    pos = 0

    def operand() -> Node:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"expression ends early: {text!r}")
        token = tokens[pos]
        pos += 1
        if token == "(":
            node = expression()
            if pos >= len(tokens) or tokens[pos] != ")":
                raise ValueError(f"unclosed bracket: {text!r}")
            pos += 1
            return node
        if token[0].isdigit():
            return Node(int(token.replace(" ", "")))
        raise ValueError(f"unexpected {token!r} in {text!r}")

    def expression() -> Node:
        nonlocal pos
        args, op = [operand()], None
        while pos < len(tokens) and tokens[pos] in OPS:
            if op is not None and (tokens[pos] != op or op != "+"):
                raise ValueError(f"mixed operations without brackets: {text!r}")
            op = tokens[pos]
            pos += 1
            args.append(operand())
        return args[0] if op is None else combine(op, tuple(args))

    node = expression()
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r} in {text!r}")
    return node


def read_work(text: str) -> tuple[str, tuple[int, ...]] | None:
    """(operation, operands) of a prompt or a work text (`Now 2 1 4 + 1 8 7 .`); None when it is not one."""
    body = text.strip()
    if body.startswith("Now "):
        body = body[4:]
    body = body.removesuffix(".").strip()
    try:
        node = parse_expression(body)
    except ValueError:
        return None
    if node.op is None or any(a.op is not None for a in node.args):
        return None
    return node.op, tuple(a.value for a in node.args)


_RESULT = re.compile(r"^So (.+) = ([0-9]+(?: [0-9]+)*) \.$", re.M)


def read_result(execution: str) -> int | None:
    """The value an execution reports on its last `So ... = V .` line (None without one)."""
    found = _RESULT.findall(execution)
    return int(found[-1][1].replace(" ", "")) if found else None
