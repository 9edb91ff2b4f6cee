"""The ideal packing of a held-out arithmetic problem, as text and tokens: what the generator built.

The generator writes the problem's sequential trace and the teacher's components and DAG for it; the
stages' own functions (stage 1's range resolution, pack's rules) turn them into the trajectory the
SPRINT model was trained to write for such a problem. Counted with the demo's tokenizer, the trace is
the ideal RFT output and the trajectory the ideal SPRINT output, so Figures 5 and 6 can show the
ideal beside each model: what the model adds to what the generator built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sprint.curation.component_answer import parse_components
from sprint.curation.components import component_record
from sprint.curation.packing import PackSettings, pack_record
from sprint.curation.trace_lines import line_spans
from sprint.format.tokencount import TokenCounter
from sprint.format.trajectory import Trajectory, count_tokens
from sprint.mini.arithmetic import make_trace, parse_problem

# the demo's packing of this task: every trace kept (scripts/mini_demo.sh THRESHOLD)
SETTINGS = PackSettings(parallelization_threshold=0.0)


@dataclass(frozen=True)
class Ideal:
    """One problem's ideal outputs and their tokens (sequential: SPRINT's critical path; RFT: its length)."""

    trajectory: Trajectory
    trace: str
    sprint_sequential: int
    rft_tokens: int


def ideal_trajectory(question: str) -> tuple[Trajectory, str]:
    """(packed trajectory, sequential output) of a problem, as the generator and the stages make them."""
    trace = make_trace(parse_problem(question))
    components = parse_components(json.dumps(trace.components))
    spans = line_spans(trace.thought)
    row = {"components": [component_record(c, trace.thought, spans) for c in components], "dag": trace.dag,
           "solution": trace.solution}
    packed = pack_record("ideal", trace.question, row, SETTINGS)
    if packed.trajectory is None:
        raise ValueError(f"the ideal packing of {question!r} failed: {packed.error}")
    return packed.trajectory, f"{trace.thought}\n</think>\n\n{trace.solution}"


def ideal(question: str, count: TokenCounter) -> Ideal:
    """Counted with the demo's tokenizer, as `evaluate` counts the models' outputs."""
    trajectory, sequential = ideal_trajectory(question)
    tokens = count_tokens(trajectory, count.count)
    return Ideal(trajectory, sequential, tokens.sequential, count.count(sequential))
