"""The trajectory model: parse <-> render <-> token accounting of SPRINT's text format.

Packing renders it, orchestration builds and normalises it, evaluation and the replay server
parse and count it. This is the only module that knows the tag grammar (the tags themselves are
spelled in `sprint.format.tags`):

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
from typing import Any, Callable, Iterator

from tokenizers import Tokenizer

from sprint.core.data import quiet_hub, resolve_local, short_reason, source_problem
from sprint.core.errors import UserError
from sprint.format.boxed import last_boxed
from sprint.format.tags import (
    FINAL, FINAL_END, QUESTION, QUESTION_END, TAG_RE, THINK, execution_close, execution_open, executions_close,
    executions_open, plan_close, plan_open, prompt_close, prompt_open,
)

NO_PROMPT = "No prompt to execute."
_PROMPT_RE = re.compile(r"<prompt_(\d+\.\d+)>(.*?)</prompt_\1>", re.S)
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
        return f"{plan_open(self.number)}\n{self.plan.strip()}\n{plan_close(self.number)}"

    def streamed_plan(self, prompt: Prompt) -> str:
        """What the planner had written when `prompt` closed: `<Plan_p>` and the plan up to its
        `</prompt_p.k>` (the planner tokens a stream-scheduled executor waited for)."""
        return f"{plan_open(self.number)}\n{self.plan[: prompt.end]}"

    def streamed_view(self, prompt: Prompt) -> str:
        """The plan a stream-scheduled executor is shown: the plan up to its `</prompt_p.k>`, closed
        as a plan. Closed, it is a well-formed plan block like the ones executions follow in
        training (an open one invites the executor to go on writing the plan), and for the plan's
        last prompt it is exactly the barrier view (`render_plan`) when nothing follows that prompt."""
        return Phase(self.number, self.plan[: prompt.end]).render_plan()

    def render_executions(self) -> str:
        if not self.executions:
            body = NO_PROMPT
        else:
            body = "\n\n".join(render_execution(e.name, e.text) for e in self.executions)
        return f"{executions_open(self.number)}\n{body}\n{executions_close(self.number)}"

    def render(self) -> str:
        return self.render_plan() + "\n\n" + self.render_executions()


def render_execution(name: str, text: str) -> str:
    return f"{execution_open(name)}\n{text.strip()}\n{execution_close(name)}"


def render_prompt(name: str, text: str) -> str:
    return f"{prompt_open(name)} {text.strip()} {prompt_close(name)}"


def render_final(text: str) -> str:
    return f"{FINAL}\n{text.strip()}\n{FINAL_END}"


def render_question(question: str) -> str:
    return f"{QUESTION}\n{question.strip()}\n{QUESTION_END}"


def baseline_generation(text: str) -> str:
    """What a sequential model generated: its text without a leading question block and the
    `<think>` the prompt pre-filled (run folders store `trajectories/<id>.txt` that way)."""
    if not text.startswith(QUESTION):
        return text
    head = render_question(parse(text, strict=False).question)
    if not text.startswith(head):
        return text
    rest = text[len(head):].lstrip("\n")
    if rest.startswith(THINK + "\n"):
        rest = rest[len(THINK) + 1:]
    return rest


def open_executions(plan_block: str, phase: int) -> str:
    """What every executor of a phase continues after the past phases: the plan as it sees it
    (`render_plan`, or `streamed_view` under the stream schedule), then the opened `<Execution_p>`."""
    return f"{plan_block}\n\n{executions_open(phase)}\n"


def open_execution(name: str) -> str:
    """What executor p.k continues after `open_executions`: its own opened `<execution_p.k>`."""
    return f"{execution_open(name)}\n"


@dataclass
class Trajectory:
    question: str
    phases: list[Phase] = field(default_factory=list)
    final_answer: str | None = None

    def render_body(self) -> str:
        """Everything after the question: what the model generates (inside `<think>`)."""
        blocks = [p.render() for p in self.phases]
        if self.final_answer is not None:
            blocks.append(render_final(self.final_answer))
        return "\n\n".join(blocks)

    def render(self) -> str:
        body = self.render_body()
        return render_question(self.question) + ("\n\n" + body if body else "")

    def render_context(self) -> str:
        """The assistant text a call continues after these phases: the body and the blank line before
        the next block ("" before the first phase)."""
        body = self.render_body()
        return body + ("\n\n" if body else "")

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
    """Every block tag that opens must close, in order, without nesting blocks in blocks.

    `text` is what follows the question: the question itself is never scanned for tags.
    """
    for m, close, _ in _blocks(text, _OPEN_RE):
        name = m.group(1)
        if close < 0:
            if name == "Final_answer":  # a truncated answer still counts as an answer
                return
            raise TrajectoryError(f"unbalanced tags: <{name}> at offset {m.start()} is never closed by </{name}>")
        inner = _OPEN_RE.search(text, m.end(), close)
        if inner:
            raise TrajectoryError(f"misplaced tag: <{inner.group(1)}> opens inside <{name}> at offset {inner.start()}")


def _blocks(text: str, open_re: re.Pattern[str]) -> Iterator[tuple[re.Match[str], int, int]]:
    """The one block scanner: each opening tag `open_re` finds (its group 1 is the tag's name), in
    order, with the offset of its closing tag (-1: never closed) and where the block ends (after the
    closing tag; the text's end when never closed). The scan resumes after a closed block, or right
    after the tag of an unclosed one."""
    pos = 0
    while m := open_re.search(text, pos):
        closing = f"</{m.group(1)}>"
        close = text.find(closing, m.end())
        yield m, close, close + len(closing) if close >= 0 else len(text)
        pos = close + len(closing) if close >= 0 else m.end()


_Q_OPEN, _Q_CLOSE = QUESTION, QUESTION_END
_BLOCK_OPEN_RE = re.compile(r"<(Plan_(\d+)|Execution_(\d+)|Final_answer)>")
_EXEC_OPEN_RE = re.compile(r"<(execution_(\d+\.\d+))>")
# What may directly follow the question's closing tag: the generation's first block, `<think>`,
# a chat template's markers (`<|im_end|>`, `<｜Assistant｜>`), or nothing.
_AFTER_QUESTION = ("<think>", "<Plan_", "<Final_answer>", "<Execution_", "<|", "<\uff5c")


def _outside_blocks(text: str) -> str:
    """The text of `text` that lies outside its (positionally matched) blocks, `<think>` tags removed."""
    out, pos = [], 0
    for m, close, end in _blocks(text, _BLOCK_OPEN_RE):
        out.append(text[pos:m.start()])
        pos = end
        if close < 0:  # never closed: the rest of the text is inside it
            break
    out.append(text[pos:])
    return "".join(out).replace("<think>", "").replace("</think>", "")


def question_span(text: str) -> tuple[int, int] | None:
    """Where the question's text lies: (start, end) offsets between `<Question>` and its `</Question>`.

    The question is opaque text: it may itself hold `</Question>`, `<Plan_1>` or any other tag.
    It starts after the first `<Question>` and ends at the `</Question>` that precedes the
    generation; when the text holds several, the one chosen is the one after which the rest reads
    as a generation: no further `</Question>`, the format's blocks (or `<think>`) right after it,
    no stray text between the blocks. Ties go to the earliest (model text quoting the tag).
    """
    start = text.find(_Q_OPEN)
    if start < 0:
        return None
    start += len(_Q_OPEN)
    closes = [m.start() for m in re.finditer(re.escape(_Q_CLOSE), text[start:])]
    if not closes:
        return None
    if len(closes) == 1:
        return start, start + closes[0]

    def oddities(close: int) -> int:
        rest = text[start + close + len(_Q_CLOSE):]
        follow = rest.lstrip()
        return (rest.count(_Q_CLOSE)
                + bool(follow and not follow.startswith(_AFTER_QUESTION))
                + bool(_outside_blocks(rest).strip()))

    best = min(closes, key=oddities)  # min keeps the earliest of equals
    return start, start + best


def _executions(block: str) -> list[Execution]:
    """The `<execution_p.k>` entries of an Execution block, read in order; their text is opaque."""
    # one never closed is dropped (a cut-off generation)
    return [Execution(m.group(2), block[m.end():close].strip())
            for m, close, _ in _blocks(block, _EXEC_OPEN_RE) if close >= 0]


def parse(text: str, strict: bool = True) -> Trajectory:
    """Read a trajectory text (with or without `<think>`); strict mode rejects unbalanced tags.

    Blocks are read in order by position: the question (see `question_span`) and the text inside
    a plan, an execution or the final answer are never scanned for the format's tags, so a
    question or model text that merely contains `<Plan_1>` or `</Question>` stays text.
    Non-strict mode keeps whatever well-formed blocks it finds, which is what one wants for a
    generation that was cut off.
    """
    span = question_span(text)
    question = text[span[0]:span[1]].strip() if span else ""
    rest = text[span[1] + len(_Q_CLOSE):] if span else text
    if strict:
        _check_balanced(rest)
    execs: dict[int, list[Execution]] = {}
    phases: list[Phase] = []
    final = None
    for m, close, _ in _blocks(rest, _BLOCK_OPEN_RE):
        if m.group(1) == "Final_answer":  # the first final answer ends the trajectory (a cut-off one too)
            final = rest[m.end(): close if close >= 0 else len(rest)].strip()
            break
        if close < 0:  # never closed: dropped in lenient mode (strict mode refused it above)
            continue
        body = rest[m.end():close]
        if m.group(2) is not None:
            phases.append(Phase(int(m.group(2)), body.strip(), []))
        else:
            execs.setdefault(int(m.group(3)), _executions(body))
    for phase in phases:
        phase.executions = execs.get(phase.number, [])
    numbers = [p.number for p in phases]
    if strict and numbers != list(range(1, len(phases) + 1)):
        raise TrajectoryError(f"phases are numbered {numbers}, expected 1..{len(phases)}")
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


# A probe appended to a partial plan: it would lengthen (so change) any prompt that is still open,
# and cannot touch a prompt that is already closed or followed by the next prompt's opening tag.
_SETTLE_PROBE = "x</prompt>"


def settled_prompts(raw: str, phase: int) -> tuple[str, list[Prompt]]:
    """The normalised plan of a partial planner output and its prompts that more text cannot change.

    `normalize_plan` closes a prompt left open (at a blank line or the end), so the prompts of a
    partial text are not all finished. A prompt is settled when the normalised result is the same
    with the probe appended: its closing tag has been written, or the next prompt has opened, or
    the plan was cut (`<Final_answer>`, `<Execution_`). Settled prompts, and the plan text before
    their ends, stay exactly as they are in the normalised final plan.
    """
    plan = normalize_plan(raw, phase).plan
    probed = normalize_plan(raw + _SETTLE_PROBE, phase).plan
    settled = []
    for now, later in zip(Phase(phase, plan).prompts, Phase(phase, probed).prompts):
        if now != later:
            break
        settled.append(now)
    return plan, settled


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
    decoded: int = 0              # the same critical path, tags included


@dataclass
class TokenCounts:
    """The paper's token numbers of one trajectory (`count_tokens` says how each is counted)."""

    sequential: int               # critical path, tags excluded (the paper's headline)
    total: int                    # every generated token, tags included: the text after the question
    planner: int                  # plans + final answer, tags excluded
    executor: int                 # executions, tags excluded
    final: int
    phases: list[PhaseTokens]
    sequential_decoded: int = 0   # critical path, tags included: what the GPU generates on it

    def as_dict(self) -> dict:
        return {
            "sequential_tokens": self.sequential,
            "sequential_tokens_as_decoded": self.sequential_decoded,
            "total_tokens": self.total,
            "planner_tokens": self.planner,
            "executor_tokens": self.executor,
            "final_answer_tokens": self.final,
        }


def _critical_path(plan: int, prefixes: list[int], execs: list[int], orphans: list[int]) -> int:
    """One phase: max over prompts k of (plan up to prompt k + execution k), never less than the
    whole plan (an execution without a prompt runs beside the whole plan)."""
    return max([plan] + [p + e for p, e in zip(prefixes, execs)] + [plan + o for o in orphans])


def count_tokens(traj: Trajectory, planner: Counter, executor: Counter | None = None) -> TokenCounts:
    """The paper's token numbers; the one place they are defined.

    - sequential (the paper's): phase p costs max over its prompts k of (planner tokens up to the
      end of prompt k + tokens of execution k), never less than the whole plan (text after the last
      prompt, phases without prompts); the final answer counts as planner tokens; tags excluded.
    - sequential as decoded: the same critical path with each piece as the model generates it,
      tags included: the plan block from `<Plan_p>` (to the end of `</prompt_p.k>` for prompt k,
      to `</Plan_p>` whole), each `<execution_p.k>` block, the `<Final_answer>` block.
    - total: every generated token, tags included: the trajectory text after the question
      (`render_body`, as the paper's Table 2 counts it), with the planner's tokenizer.
    - planner / executor: the plans (+ final answer) and the executions, tags excluded.
    """
    executor = executor or planner
    phases = []
    planner_total = executor_total = 0
    for ph in traj.phases:
        plan_tokens = planner(strip_tags(ph.plan))
        head = f"{plan_open(ph.number)}\n"
        prefixes, execs, prefixes_dec, execs_dec = [], [], [], []
        for pr in ph.prompts:
            prefixes.append(planner(strip_tags(ph.plan[: pr.end])))
            prefixes_dec.append(planner(head + ph.plan[: pr.end].lstrip()))
            ex = ph.execution(pr.name)
            execs.append(executor(ex.text) if ex else 0)
            execs_dec.append(executor(render_execution(ex.name, ex.text)) if ex else 0)
        # executions without a matching prompt still cost their tokens, in parallel
        named = {pr.name for pr in ph.prompts}
        orphan_execs = [e for e in ph.executions if e.name not in named]
        orphans = [executor(e.text) for e in orphan_execs]
        seq = _critical_path(plan_tokens, prefixes, execs, orphans)
        decoded = _critical_path(planner(ph.render_plan()), prefixes_dec, execs_dec,
                                 [executor(render_execution(e.name, e.text)) for e in orphan_execs])
        phases.append(PhaseTokens(ph.number, plan_tokens, prefixes, execs, seq, decoded))
        planner_total += plan_tokens
        executor_total += sum(execs) + sum(orphans)
    final = planner(traj.final_answer) if traj.final_answer else 0
    final_dec = planner(render_final(traj.final_answer)) if traj.final_answer else 0
    seq_total = sum(p.sequential for p in phases) + final
    return TokenCounts(seq_total, planner(traj.render_body()), planner_total + final, executor_total, final, phases,
                       sum(p.decoded for p in phases) + final_dec)


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
    problem = source_problem(source)  # a missing folder or an unreachable hub: one line, at once
    if problem is not None:
        raise UserError(f"cannot load {'the ' if chat else ''}tokenizer {name!r} ({problem}); "
                        f"{hint or (CHAT_HINT if chat else FAST_HINT)}")
    try:
        if chat:
            # transformers takes about a second to import; packing and `--help` never need it
            from transformers import AutoTokenizer

            with quiet_hub():
                return AutoTokenizer.from_pretrained(source)
        path = Path(source)
        if path.is_dir():
            path = path / "tokenizer.json"
        if path.is_file():
            return Tokenizer.from_file(str(path))
        with quiet_hub():
            return Tokenizer.from_pretrained(source)
    except Exception as exc:  # missing folder, no hub access, broken files
        if chat:
            raise UserError(f"cannot load the tokenizer {name!r} ({short_reason(exc)}); {hint or CHAT_HINT}") from None
        raise UserError(f"cannot load tokenizer {name!r} ({type(exc).__name__}); {hint or FAST_HINT}") from None


def token_counter(name_or_path: str) -> Counter:
    """A fast `text -> number of tokens` (no special tokens added) for a hub id or local path."""
    tok = load_tokenizer(str(name_or_path))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids) if text else 0

    return count
