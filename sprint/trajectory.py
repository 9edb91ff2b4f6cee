"""The trajectory model: parse <-> render <-> token accounting of SPRINT's text format.

Packing renders it, orchestration builds and normalises it, evaluation and the replay server
parse and count it. This is the only module that knows the tag grammar:

    <Question>\\n…\\n</Question>

    <Plan_p>\\n… <prompt_p.k> … </prompt_p.k> …\\n</Plan_p>

    <Execution_p>\\n<execution_p.k>\\n…\\n</execution_p.k>\\n\\n…\\n</Execution_p>

    <Final_answer>\\n…\\n</Final_answer>
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from tokenizers import Tokenizer

from sprint.data import resolve_local
from sprint.errors import UserError
from sprint.grading import last_boxed

NO_PROMPT = "No prompt to execute."

TAG_RE = re.compile(
    r"</?(?:Question|Plan_\d+|Execution_\d+|execution_\d+\.\d+|prompt_\d+\.\d+|prompt|Final_answer|think)>"
)
_PLAN_RE = re.compile(r"<Plan_(\d+)>(.*?)</Plan_\1>", re.S)
_EXEC_BLOCK_RE = re.compile(r"<Execution_(\d+)>(.*?)</Execution_\1>", re.S)
_EXEC_RE = re.compile(r"<execution_(\d+\.\d+)>(.*?)</execution_\1>", re.S)
_PROMPT_RE = re.compile(r"<prompt_(\d+\.\d+)>(.*?)</prompt_\1>", re.S)
_QUESTION_RE = re.compile(r"<Question>(.*?)</Question>", re.S)
_FINAL_RE = re.compile(r"<Final_answer>(.*?)(?:</Final_answer>|\Z)", re.S)
_OPEN_RE = re.compile(r"<(Question|Plan_\d+|Execution_\d+|Final_answer)>")


class TrajectoryError(ValueError):
    """The text is not a well-formed trajectory (unbalanced or misplaced tags)."""


@dataclass(frozen=True)
class Prompt:
    """One `<prompt_p.k>` of a plan; `end` is the offset in the plan just after its closing tag."""

    name: str
    text: str
    start: int
    end: int


@dataclass
class Execution:
    name: str
    text: str


@dataclass
class Phase:
    """A plan (with its prompts inline, as written) and the executions of its prompts."""

    number: int
    plan: str
    executions: list[Execution] = field(default_factory=list)

    @property
    def prompts(self) -> list[Prompt]:
        return [Prompt(m.group(1), m.group(2).strip(), m.start(), m.end()) for m in _PROMPT_RE.finditer(self.plan)]

    def execution(self, name: str) -> Execution | None:
        return next((e for e in self.executions if e.name == name), None)

    def render_plan(self) -> str:
        return f"<Plan_{self.number}>\n{self.plan.strip()}\n</Plan_{self.number}>"

    def render_executions(self) -> str:
        if not self.executions:
            body = NO_PROMPT
        else:
            body = "\n\n".join(render_execution(e.name, e.text) for e in self.executions)
        return f"<Execution_{self.number}>\n{body}\n</Execution_{self.number}>"

    def render(self) -> str:
        return self.render_plan() + "\n\n" + self.render_executions()


def render_execution(name: str, text: str) -> str:
    return f"<execution_{name}>\n{text.strip()}\n</execution_{name}>"


def render_prompt(name: str, text: str) -> str:
    return f"<prompt_{name}> {text.strip()} </prompt_{name}>"


def render_question(question: str) -> str:
    return f"<Question>\n{question.strip()}\n</Question>"


@dataclass
class Trajectory:
    question: str
    phases: list[Phase] = field(default_factory=list)
    final_answer: str | None = None

    def render_body(self) -> str:
        """Everything after the question: what the model generates (inside `<think>`)."""
        blocks = [p.render() for p in self.phases]
        if self.final_answer is not None:
            blocks.append(f"<Final_answer>\n{self.final_answer.strip()}\n</Final_answer>")
        return "\n\n".join(blocks)

    def render(self) -> str:
        body = self.render_body()
        return render_question(self.question) + ("\n\n" + body if body else "")

    @property
    def prompt_count(self) -> int:
        return sum(len(p.prompts) for p in self.phases)

    def answer(self) -> str | None:
        """The last `\\boxed{}` of the trajectory, as the paper's evaluation reads it."""
        return last_boxed(self.render())

    @classmethod
    def parse(cls, text: str, strict: bool = True) -> "Trajectory":
        return parse(text, strict=strict)


def _check_balanced(text: str) -> None:
    """Every block tag that opens must close, in order, without nesting blocks in blocks."""
    pos = 0
    while True:
        m = _OPEN_RE.search(text, pos)
        if not m:
            return
        name = m.group(1)
        close = text.find(f"</{name}>", m.end())
        if close < 0:
            if name == "Final_answer":  # a truncated answer still counts as an answer
                return
            raise TrajectoryError(f"unbalanced tags: <{name}> at offset {m.start()} is never closed by </{name}>")
        inner = _OPEN_RE.search(text, m.end(), close)
        if inner:
            raise TrajectoryError(f"misplaced tag: <{inner.group(1)}> opens inside <{name}> at offset {inner.start()}")
        pos = close + len(name) + 3


def parse(text: str, strict: bool = True) -> Trajectory:
    """Read a trajectory text (with or without `<think>`); strict mode rejects unbalanced tags.

    Non-strict mode keeps whatever well-formed blocks it finds, which is what one wants for a
    generation that was cut off.
    """
    if strict:
        _check_balanced(text)
    q = _QUESTION_RE.search(text)
    question = q.group(1).strip() if q else ""
    rest = text[q.end():] if q else text
    execs: dict[int, list[Execution]] = {}
    for m in _EXEC_BLOCK_RE.finditer(rest):
        execs[int(m.group(1))] = [Execution(e.group(1), e.group(2).strip()) for e in _EXEC_RE.finditer(m.group(2))]
    phases = []
    for m in _PLAN_RE.finditer(rest):
        number = int(m.group(1))
        phases.append(Phase(number, m.group(2).strip(), execs.get(number, [])))
    numbers = [p.number for p in phases]
    if strict and numbers != list(range(1, len(phases) + 1)):
        raise TrajectoryError(f"phases are numbered {numbers}, expected 1..{len(phases)}")
    f = _FINAL_RE.search(rest)
    final = f.group(1).strip() if f else None
    return Trajectory(question, phases, final)


def strip_tags(text: str) -> str:
    """Remove the format's tags: they are not counted as generated tokens."""
    return TAG_RE.sub("", text)


# ---------------------------------------------------------------------------------------------
# Planner output normalisation (orchestration): models write sloppy tags, we store clean ones.

_ANY_PROMPT_OPEN = re.compile(r"<prompt(?:_\d+(?:\.\d+)?)?>")
_ANY_PROMPT_CLOSE = re.compile(r"</prompt(?:_\d+(?:\.\d+)?)?>")
_PLAN_TAG = re.compile(r"</?Plan_\d+>|</?Plan>")


@dataclass
class PlannerOutput:
    """A normalised planner generation: the clean plan of this phase, and a final answer if any."""

    plan: str
    final_answer: str | None


def normalize_plan(raw: str, phase: int) -> PlannerOutput:
    """Clean one planner generation for phase `phase`.

    - drop `<Plan_p>`/`</Plan_p>` tags (wrongly numbered too) and anything from `<Execution_` on;
    - number prompts `p.1, p.2, …` in order, whatever the model wrote (`<prompt>`, `<prompt_3.7>`);
    - close a prompt left open at the next prompt, a blank line, or the end;
    - split off a `<Final_answer>` written inside the plan.
    """
    text = raw
    final = None
    fm = re.search(r"<Final_answer>", text)
    if fm:
        final_part = text[fm.end():]
        final = re.split(r"</Final_answer>", final_part, maxsplit=1)[0].strip()
        text = text[: fm.start()]
    cut = re.search(r"<Execution_\d+>|<execution_\d+\.\d+>", text)
    if cut:
        text = text[: cut.start()]
    text = _PLAN_TAG.sub("", text)
    out: list[str] = []
    k = 0
    pos = 0
    while True:
        m = _ANY_PROMPT_OPEN.search(text, pos)
        if not m:
            out.append(_ANY_PROMPT_CLOSE.sub("", text[pos:]))
            break
        out.append(_ANY_PROMPT_CLOSE.sub("", text[pos: m.start()]))
        k += 1
        nxt_open = _ANY_PROMPT_OPEN.search(text, m.end())
        close = _ANY_PROMPT_CLOSE.search(text, m.end())
        limit = nxt_open.start() if nxt_open else len(text)
        if close and close.start() < limit:
            body, pos = text[m.end(): close.start()], close.end()
        else:  # unclosed: the prompt ends at a blank line or where the next one starts
            blank = text.find("\n\n", m.end(), limit)
            end = blank if blank >= 0 else limit
            body, pos = text[m.end(): end], end
        out.append(render_prompt(f"{phase}.{k}", body))
    plan = "".join(out).strip()
    return PlannerOutput(plan=plan, final_answer=final)


# ---------------------------------------------------------------------------------------------
# Token accounting.

Counter = Callable[[str], int]


@dataclass
class PhaseTokens:
    number: int
    plan: int                     # whole plan, tags stripped
    prompt_prefixes: list[int]    # plan tokens up to the end of prompt k
    executions: list[int]         # tokens of execution k (0 when missing)
    sequential: int               # critical path of this phase


@dataclass
class TokenCounts:
    sequential: int
    total: int
    planner: int
    executor: int
    final: int
    phases: list[PhaseTokens]

    def as_dict(self) -> dict:
        return {
            "sequential_tokens": self.sequential,
            "total_tokens": self.total,
            "planner_tokens": self.planner,
            "executor_tokens": self.executor,
            "final_answer_tokens": self.final,
        }


def count_tokens(traj: Trajectory, planner: Counter, executor: Counter | None = None) -> TokenCounts:
    """Sequential and total tokens as the paper defines them.

    Phase p costs max over its prompts k of (planner tokens up to the end of prompt k + tokens
    of execution k). The whole plan must also be written before the next phase starts, so a
    phase never costs less than its plan (this only matters for text after the last prompt and
    for phases without prompts). The final answer counts as planner tokens; tags are not counted.
    """
    executor = executor or planner
    phases = []
    planner_total = executor_total = 0
    for ph in traj.phases:
        plan_tokens = planner(strip_tags(ph.plan))
        prefixes, execs = [], []
        for pr in ph.prompts:
            prefixes.append(planner(strip_tags(ph.plan[: pr.end])))
            ex = ph.execution(pr.name)
            execs.append(executor(ex.text) if ex else 0)
        # executions without a matching prompt still cost their tokens, in parallel
        named = {pr.name for pr in ph.prompts}
        orphans = [executor(e.text) for e in ph.executions if e.name not in named]
        seq = max([plan_tokens] + [p + e for p, e in zip(prefixes, execs)] + [plan_tokens + o for o in orphans])
        phases.append(PhaseTokens(ph.number, plan_tokens, prefixes, execs, seq))
        planner_total += plan_tokens
        executor_total += sum(execs) + sum(orphans)
    final = planner(traj.final_answer) if traj.final_answer else 0
    seq_total = sum(p.sequential for p in phases) + final
    return TokenCounts(seq_total, planner_total + executor_total + final, planner_total + final, executor_total, final, phases)


FAST_HINT = "pass a local directory holding tokenizer.json or a hub id reachable from this machine"
CHAT_HINT = "pass --tokenizer DIR, a folder holding the model's tokenizer files"


def tokenizer_source(name: str) -> str:
    """Where a tokenizer name points: a local path as given, a known hub id's local copy
    (`SPRINT_LOCAL_DATA`), else the hub id itself."""
    if Path(name).exists():
        return name
    local = resolve_local(name)
    return str(local) if local is not None else name


@lru_cache(maxsize=8)
def load_tokenizer(name: str, *, chat: bool = False, hint: str | None = None) -> Any:
    """THE tokenizer loader (cached: loading one takes a second and stages ask repeatedly).

    `chat=False`: a fast `tokenizers.Tokenizer` for counting tokens (a folder holding
    tokenizer.json, the file itself, or a hub id). `chat=True`: a `transformers` tokenizer, for
    what only it has (chat template, BOS/EOS tokens). `hint` ends the error message (what to pass).
    """
    source = tokenizer_source(str(name))
    try:
        if chat:
            # transformers takes about a second to import; packing and `--help` never need it
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(source)
        path = Path(source)
        if path.is_dir():
            path = path / "tokenizer.json"
        if path.is_file():
            return Tokenizer.from_file(str(path))
        return Tokenizer.from_pretrained(source)
    except Exception as exc:  # missing folder, no hub access, broken files
        if chat:
            raise UserError(f"cannot load the tokenizer {name!r} ({type(exc).__name__}: {str(exc)[:200]}); "
                            f"{hint or CHAT_HINT}") from None
        raise UserError(f"cannot load tokenizer {name!r} ({type(exc).__name__}); {hint or FAST_HINT}") from None


def token_counter(name_or_path: str) -> Counter:
    """A fast `text -> number of tokens` (no special tokens added) for a hub id or local path."""
    tok = load_tokenizer(str(name_or_path))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids) if text else 0

    return count
