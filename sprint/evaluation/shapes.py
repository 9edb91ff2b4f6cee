"""Plan shapes: how many phases a SPRINT trajectory gives work to, and how wide they are.

Why: mean phases and mean prompts per phase hide a model that writes one template for every
problem. The distributions below, and the share of the commonest shape, say whether the plan
varies with the problem. A phase counts when it holds at least one prompt (a plan-only phase,
such as a closing check, runs nothing in parallel); a problem's shape is the list of its
prompt-holding phases' widths, in order (`[3, 1]`: three prompts, later one). Read from each
result's `prompts_per_phase`, which evaluate takes from the trajectory model's phases.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from sprint.evaluation import metrics as M


class RunLike(Protocol):
    """What the block reads of a run (evaluate's `RunResult`)."""

    label: str
    results: Sequence[M.ProblemResult]


def shape_of(prompts_per_phase: Sequence[int]) -> tuple[int, ...]:
    """The widths of the phases that hold at least one prompt, in order."""
    return tuple(int(k) for k in prompts_per_phase if k > 0)


def _distribution(counter: Counter) -> dict[str, int]:
    """{value: problems}, keys as JSON writes them (strings), in numeric order."""
    return {str(k): counter[k] for k in sorted(counter)}


def run_shapes(label: str, results: Sequence[M.ProblemResult]) -> dict[str, Any]:
    """One SPRINT run's distributions over its problems with a trajectory (failed or missing texts left out)."""
    shapes = [shape_of(r.prompts_per_phase) for r in results if r.has_text and r.phases is not None]
    n = len(shapes)
    phases = Counter(len(s) for s in shapes)
    widths = Counter(max(s, default=0) for s in shapes)
    counts = Counter(shapes)
    common = min(counts.items(), key=lambda kv: (-kv[1], kv[0])) if counts else None  # ties: the smaller shape
    return {
        "run": label,
        "problems": n,
        "phases_with_prompts": _distribution(phases),
        "largest_phase_width": _distribution(widths),
        "distinct_phase_counts": len(phases),
        "distinct_largest_widths": len(widths),
        "distinct_shapes": len(counts),
        "mean_phases_with_prompts": sum(len(s) for s in shapes) / n if n else None,
        "mean_largest_phase_width": sum(max(s, default=0) for s in shapes) / n if n else None,
        "commonest_shape": None if common is None else {"shape": list(common[0]), "problems": common[1],
                                                        "share": common[1] / n},
    }


def plan_shapes(runs: Sequence[RunLike]) -> list[dict[str, Any]]:
    """metrics.json's `plan_shapes`: one entry per SPRINT run, in the order given."""
    return [run_shapes(r.label, r.results) for r in runs]
