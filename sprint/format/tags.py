"""The tags of SPRINT's text format, spelled in one place.

`sprint.format.trajectory` renders and parses whole trajectories with them. Modules that build a
call's context or count a tag's tokens (orchestration, the schedules, the latency model, replay,
time-replay) use these names instead of writing a tag by hand, so the format can only change here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

QUESTION, QUESTION_END = "<Question>", "</Question>"
THINK, THINK_END = "<think>", "</think>"
FINAL, FINAL_END = "<Final_answer>", "</Final_answer>"

# Every tag of the format, numbered ones included (and the model's unnumbered `<prompt>`).
TAG_RE = re.compile(
    r"</?(?:Question|Plan_\d+|Execution_\d+|execution_\d+\.\d+|prompt_\d+\.\d+|prompt|Final_answer|think)>"
)
_TAG_PARTS_RE = re.compile(r"<(/?)(\w+?)(?:_(\d+)(?:\.(\d+))?)?>")


def plan_open(phase: int) -> str:
    return f"<Plan_{phase}>"


def plan_close(phase: int) -> str:
    return f"</Plan_{phase}>"


def executions_open(phase: int) -> str:
    """The opening of a phase's block of executions (`<Execution_p>`)."""
    return f"<Execution_{phase}>"


def executions_close(phase: int) -> str:
    return f"</Execution_{phase}>"


def execution_open(name: str) -> str:
    """The opening of one execution (`<execution_p.k>`)."""
    return f"<execution_{name}>"


def execution_close(name: str) -> str:
    return f"</execution_{name}>"


def prompt_open(name: str) -> str:
    return f"<prompt_{name}>"


def prompt_close(name: str) -> str:
    return f"</prompt_{name}>"


@dataclass(frozen=True)
class Tag:
    """One tag read from a text: `<Plan_2>` is Tag("Plan", False, 2, None, …), `</execution_1.3>` is
    Tag("execution", True, 1, "1.3", …); `end` is the offset just after it."""

    name: str  # Question | Plan | Execution | execution | prompt | Final_answer | think
    closing: bool
    phase: int | None
    prompt: str | None  # "p.k" of an execution or prompt tag
    text: str  # the tag as written
    end: int

    @property
    def is_boundary(self) -> bool:
        """A new block comes next: after `</Question>`, `<think>` or `</Execution_p>` (the planner
        of the next phase writes its own `<Plan_p>`)."""
        return (self.closing and self.name in ("Question", "Execution")) or (not self.closing and self.name == "think")

    @property
    def is_think(self) -> bool:
        return not self.closing and self.name == "think"

    @property
    def opens_plan(self) -> bool:
        return not self.closing and self.name == "Plan" and self.phase is not None

    @property
    def opens_execution(self) -> bool:
        """`<execution_p.k>` (one execution, not a phase's `<Execution_p>` block)."""
        return not self.closing and self.name == "execution" and self.prompt is not None

    @property
    def opens_final(self) -> bool:
        return not self.closing and self.name == "Final_answer"


def last_tag(text: str) -> Tag | None:
    """The last tag of the format in `text` (None when it holds none)."""
    last = None
    for last in TAG_RE.finditer(text):
        pass
    if last is None:
        return None
    m = _TAG_PARTS_RE.fullmatch(last.group(0))
    assert m is not None  # every TAG_RE match has this shape
    phase = int(m.group(3)) if m.group(3) else None
    prompt = f"{phase}.{m.group(4)}" if m.group(4) is not None else None
    return Tag(m.group(2), bool(m.group(1)), phase, prompt, last.group(0), last.end())
