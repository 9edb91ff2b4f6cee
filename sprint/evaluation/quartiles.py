"""Figure 6 by quartiles of the baseline's own length: SPRINT / baseline per quarter of the problems.

Why beside the paper's fixed buckets (<2000, 2000-4000, 4000-8000, >8000 tokens, `metrics.BUCKET_EDGES`):
those fit MATH-500 with a 7B model; a run whose baseline writes a few hundred tokens puts every problem
in one bucket and shows no trend. Quartiles of the baseline's length always split the problems four
ways, so the paper's finding (the reduction grows with the baseline's length) can be read on any run.

The edges are computed once, from the baseline's per-problem length (`metrics.baseline_reference`: the
mean over baseline seeds, over every problem it has a text for), and written with the block, so every
SPRINT method is split at the same token counts and a reader sees them. A quartile's upper edge is
inclusive (pandas' `qcut`): the first quartile is [min, Q1], then (Q1, median], (median, Q3], (Q3, max];
problems tied at an edge stay together in the shorter quartile.

Per quartile and SPRINT method: the ratio of means SPRINT / baseline (as the fixed buckets'
`reduction`, which is 1 − this ratio) of sequential tokens, of measured seconds (only on problems
both runs timed alone: `table2.latency_by_problem`) and of modelled seconds (`modelled`), each with
its bootstrap interval (`metrics.ratio_of_means`). Pure numbers; `quartile_report` renders them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable, Protocol

import numpy as np

from sprint.evaluation import metrics as M
from sprint.evaluation.modelled import schedule_of

QUARTILES = ("Q1", "Q2", "Q3", "Q4")
MIN_PAIRED = 8  # fewer paired problems than this: two per quartile, no interval worth reading
MEASURES = ("tokens", "measured_seconds", "modelled_seconds")


class RunLike(Protocol):
    """What the block reads of a run (evaluate's `RunResult`)."""

    label: str
    results: Sequence[M.ProblemResult]
    manifest: dict


def quartile_edges(lengths: Sequence[float]) -> list[float]:
    """[min, first quartile, median, third quartile, max] of the baseline's lengths (numpy's linear rule)."""
    arr = np.asarray(list(lengths), dtype=float)
    return [float(v) for v in np.quantile(arr, [0.0, 0.25, 0.5, 0.75, 1.0])]


def quartile_of(tokens: float | None, edges: Sequence[float]) -> str | None:
    """The quartile of a baseline length: the first whose upper edge it does not pass (Q4 above the third)."""
    if tokens is None:
        return None
    for label, upper in zip(QUARTILES, edges[1:4]):
        if tokens <= upper:
            return label
    return QUARTILES[-1]


def _ranges(edges: Sequence[float]) -> list[tuple[str, float, float]]:
    return [(label, edges[i], edges[i + 1]) for i, label in enumerate(QUARTILES)]


def _seconds(results: Sequence[M.ProblemResult], read: Callable[[M.ProblemResult], float | None]) -> dict[str, float]:
    return {r.id: float(v) for r in results if (v := read(r)) is not None}


def _ratio(ids: Sequence[str], sprint: Mapping[str, float], base: Mapping[str, float],
           stats: Mapping[str, Any]) -> dict | None:
    """SPRINT / baseline over the ids both sides have (a run may time only some problems)."""
    both = [i for i in ids if i in sprint and i in base]
    return M.ratio_of_means([sprint[i] for i in both], [base[i] for i in both], **stats) if both else None


def _cell(pairs: Sequence[M.Pair], values: Mapping[str, tuple[dict, dict]], stats: Mapping[str, Any]) -> dict:
    """One quartile (or all of them) of one comparison: counts, accuracies and the three ratios."""
    ids = [p.id for p in pairs]
    out: dict[str, Any] = {
        "problems": len(pairs),
        "sprint_accuracy": float(np.mean([p.sprint_correct for p in pairs])) if pairs else None,
        "baseline_accuracy": float(np.mean([p.baseline_correct for p in pairs])) if pairs else None,
    }
    for measure in MEASURES:
        sprint, base = values[measure]
        out[measure] = _ratio(ids, sprint, base, stats)
    return out


def compare_by_quartile(run: RunLike, baseline: RunLike, reference: Mapping[str, float], edges: Sequence[float],
                        stats: Mapping[str, Any]) -> dict:
    """One SPRINT run against the baseline, overall and per quartile; `skipped` (a sentence) when too few pairs."""
    pairs = [p for p in M.pair(run.results, baseline.results, reference)
             if p.sprint_tokens is not None and p.baseline_tokens is not None]
    head = {"run": run.label, "baseline": baseline.label, "schedule": schedule_of(run.manifest), "paired": len(pairs)}
    if len(pairs) < MIN_PAIRED:
        return {**head, "skipped": f"only {len(pairs)} problems have tokens on both sides; quartiles need at least "
                                   f"{MIN_PAIRED}"}
    values = {
        "tokens": ({p.id: float(p.sprint_tokens) for p in pairs if p.sprint_tokens is not None},
                   {p.id: float(p.baseline_tokens) for p in pairs if p.baseline_tokens is not None}),
        "measured_seconds": (_seconds(run.results, lambda r: r.measured_seconds),
                             _seconds(baseline.results, lambda r: r.measured_seconds)),
        "modelled_seconds": (_seconds(run.results, lambda r: r.modelled_seconds),
                             _seconds(baseline.results, lambda r: r.modelled_seconds)),
    }
    quartiles = []
    for label, lower, upper in _ranges(edges):
        inside = [p for p in pairs if quartile_of(p.baseline_tokens, edges) == label]
        quartiles.append({"quartile": label, "lower": lower, "upper": upper, **_cell(inside, values, stats)})
    return {**head, "overall": {"quartile": "all", "lower": edges[0], "upper": edges[-1],
                                **_cell(pairs, values, stats)}, "quartiles": quartiles}


def by_quartile(runs: Sequence[RunLike], baselines: Sequence[RunLike], reference: Mapping[str, float] | None,
                stats: Mapping[str, Any]) -> dict | None:
    """metrics.json's `by_quartile`: the edges (once, from the baseline) and each SPRINT run's comparison,
    paired with the baselines as `compare` is (run i with baseline i mod their number); None without a baseline."""
    if not baselines or reference is None:
        return None
    lengths = list(reference.values())
    block: dict[str, Any] = {"baseline": baselines[0].label, "baseline_problems": len(lengths),
                             "min_paired": MIN_PAIRED, "edges": None, "quartiles": [], "comparisons": [],
                             "skipped": None}
    if len(lengths) < MIN_PAIRED:
        block["skipped"] = (f"the baseline has a length for only {len(lengths)} problems; quartiles need at least "
                            f"{MIN_PAIRED}")
        return block
    edges = quartile_edges(lengths)
    block["edges"] = edges
    block["quartiles"] = [{"quartile": label, "lower": lower, "upper": upper,
                           "baseline_problems": sum(quartile_of(v, edges) == label for v in lengths)}
                          for label, lower, upper in _ranges(edges)]
    block["comparisons"] = [compare_by_quartile(run, baselines[i % len(baselines)], reference, edges, stats)
                            for i, run in enumerate(runs)]
    return block
