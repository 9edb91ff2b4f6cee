"""Evaluation numbers: per-problem results, accuracy, token means, pairing with a baseline,
length buckets, McNemar's exact test, bootstrap confidence intervals, spread over seeds.

Pure numbers only: no files, no tokenizers, no grading. `sprint.evaluation.evaluate` turns run folders into
`ProblemResult`s; this module turns those into the dictionaries `metrics.json` holds, which
`sprint.evaluation.report` renders. Keeping it pure makes every figure of the report checkable by hand.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

# Length buckets of the sequential baseline's output, as in the paper (lower edge inclusive).
BUCKET_EDGES: tuple[int, ...] = (2000, 4000, 8000)

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95


@dataclass
class ProblemResult:
    """What one method produced for one problem, graded and counted.

    Token fields are None when there was no text to count (a failed call, a missing file);
    `phases`/`prompts` are None for a sequential baseline, which has neither.
    """

    id: str
    correct: bool
    answered: bool
    status: str = "ok"
    forced_final: bool = False
    predicted: str | None = None
    sequential: int | None = None  # tags excluded (the paper's); definitions: trajectory.count_tokens
    sequential_decoded: int | None = None  # the same critical path, tags included
    total: int | None = None  # every generated token, tags included
    planner: int | None = None
    executor: int | None = None
    phases: int | None = None
    prompts: int | None = None
    prompts_per_phase: list[int] = field(default_factory=list)
    malformed: bool = False
    reported_tokens: int | None = None  # completion tokens the server reported, when recorded
    modelled_seconds: float | None = None  # on the evaluation's latency model, under the run's schedule
    modelled_by_schedule: dict[str, float] = field(default_factory=dict)  # barrier/stream (SPRINT), sequential
    measured_seconds: float | None = None  # wall-clock as recorded, when it ran alone (table2.latency_by_problem)

    @property
    def has_text(self) -> bool:
        return self.sequential is not None

    def as_row(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- small statistics


@dataclass
class Spread:
    """Mean ± sample standard deviation (and range) of one figure over several runs (seeds)."""

    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    n: int
    values: list[float | None]

    def as_dict(self) -> dict:
        return asdict(self)


def spread(values: Sequence[float | None]) -> Spread:
    """Spread of the defined values; std uses ddof=1 (0 for a single run)."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return Spread(None, None, None, None, 0, list(values))
    arr = np.asarray(vals)
    std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    return Spread(float(arr.mean()), std, float(arr.min()), float(arr.max()), len(vals), list(values))


def mean_or_none(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def median_or_none(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.median(vals)) if vals else None


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b and c discordant pairs.

    Under the null each discordant pair goes either way with probability 1/2, so the smaller count
    is Binomial(b + c, 1/2); the two-sided p is twice its lower tail, capped at 1. Computed with
    exact integers, so it is right for any table size.
    """
    if b < 0 or c < 0:
        raise ValueError("discordant counts must be non-negative")
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = Fraction(sum(math.comb(n, i) for i in range(k + 1)), 2**n)
    return float(min(Fraction(1), 2 * tail))


def bootstrap_ci(
    statistic: Callable[..., np.ndarray],
    arrays: Sequence[np.ndarray],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `statistic` over problems (rows resampled together).

    `statistic(*resampled)` receives arrays of shape (resamples, n) and returns one value per
    resample; NaN values (e.g. an empty denominator) are ignored. Seeded, so reports are stable.
    """
    n = len(arrays[0]) if arrays else 0
    if n == 0 or resamples <= 0:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    with np.errstate(divide="ignore", invalid="ignore"):
        stats = np.asarray(statistic(*(np.asarray(a)[idx] for a in arrays)), dtype=float)
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return None
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(stats, [alpha, 1 - alpha])
    return float(lo), float(hi)


def _mean_rows(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=1)


def _reduction_rows(sprint: np.ndarray, base: np.ndarray) -> np.ndarray:
    return 1.0 - sprint.mean(axis=1) / base.mean(axis=1)


def _difference_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.mean(axis=1) - b.mean(axis=1)


def _ratio_rows(sprint: np.ndarray, base: np.ndarray) -> np.ndarray:
    return sprint.mean(axis=-1) / base.mean(axis=-1)


def ratio_of_means(
    sprint: Sequence[float],
    base: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict | None:
    """mean SPRINT / mean baseline over paired problems (row i of each is one problem), with its bootstrap
    interval: {"value", "ci", "n", "sprint", "baseline"} (the two means). None without pairs or with a zero
    baseline mean. With the same seed and problems it is exactly 1 − `reduction` and its interval, flipped."""
    s, b = np.asarray(list(sprint), dtype=float), np.asarray(list(base), dtype=float)
    if s.size == 0 or s.size != b.size or b.mean() <= 0:
        return None
    ci = bootstrap_ci(_ratio_rows, [s, b], resamples=resamples, seed=seed, confidence=confidence)
    return {"value": float(s.mean() / b.mean()), "ci": list(ci) if ci else None, "n": int(s.size),
            "sprint": float(s.mean()), "baseline": float(b.mean())}


def mean_with_ci(
    values: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict | None:
    """A mean over problems with its percentile-bootstrap interval: {"value", "ci", "n"}.

    None without values, so a measure nobody recorded reads as missing rather than as 0.
    """
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return None
    ci = bootstrap_ci(_mean_rows, [arr], resamples=resamples, seed=seed, confidence=confidence)
    return {"value": float(arr.mean()), "ci": list(ci) if ci else None, "n": int(arr.size)}


def reduction(sprint_tokens: Sequence[float], baseline_tokens: Sequence[float]) -> float | None:
    """1 − mean SPRINT sequential tokens / mean baseline tokens (positive = SPRINT is shorter)."""
    if len(sprint_tokens) == 0 or len(baseline_tokens) == 0:
        return None
    base = float(np.mean(baseline_tokens))
    if base <= 0:
        return None
    return 1.0 - float(np.mean(sprint_tokens)) / base


# --------------------------------------------------------------------------- one run


def bucket_of(tokens: float | None, edges: Sequence[int] = BUCKET_EDGES) -> str | None:
    """The paper's length bucket of a baseline token count: `<2000`, `2000-4000`, …, `>8000`."""
    if tokens is None:
        return None
    for i, edge in enumerate(edges):
        if tokens < edge:
            return f"<{edge}" if i == 0 else f"{edges[i - 1]}-{edge}"
    return f">{edges[-1]}"


def bucket_labels(edges: Sequence[int] = BUCKET_EDGES) -> list[str]:
    labels = [f"<{edges[0]}"] + [f"{a}-{b}" for a, b in zip(edges, edges[1:])] + [f">{edges[-1]}"]
    return labels


def summarize_results(
    results: Sequence[ProblemResult],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict:
    """Headline numbers of one run.

    `accuracy` counts a problem without a final answer as wrong (over all problems);
    `accuracy_answered` is the authors' variant, over answered problems only.
    Token means are over problems that have a text to count.
    """
    n = len(results)
    correct = sum(r.correct for r in results)
    answered = sum(r.answered for r in results)
    counted = [r for r in results if r.has_text]
    phases = [r.phases for r in counted if r.phases is not None]
    per_phase = [k for r in counted for k in r.prompts_per_phase]
    ci = bootstrap_ci(_mean_rows, [np.array([r.correct for r in results], dtype=float)],
                      resamples=resamples, seed=seed, confidence=confidence)
    return {
        "problems": n,
        "correct": correct,
        "answered": answered,
        "no_answer": n - answered,
        "accuracy": correct / n if n else None,
        "accuracy_ci": list(ci) if ci else None,
        "accuracy_answered": correct / answered if answered else None,
        "failed": sum(r.status != "ok" for r in results),
        "missing_text": n - len(counted),
        "forced_final": sum(r.forced_final for r in results),
        "malformed": sum(r.malformed for r in results),
        "counted": len(counted),
        "mean_sequential": mean_or_none(r.sequential for r in counted),
        "median_sequential": median_or_none(r.sequential for r in counted),
        "mean_sequential_decoded": mean_or_none(r.sequential_decoded for r in counted),
        "mean_total": mean_or_none(r.total for r in counted),
        "mean_planner": mean_or_none(r.planner for r in counted),
        "mean_executor": mean_or_none(r.executor for r in counted),
        "mean_reported_tokens": mean_or_none(r.reported_tokens for r in results),
        "mean_phases": mean_or_none(phases) if phases else None,
        "mean_prompts": mean_or_none(r.prompts for r in counted if r.prompts is not None) if phases else None,
        "mean_prompts_per_phase": mean_or_none(per_phase) if phases else None,
    }


# --------------------------------------------------------------------------- pairing


@dataclass
class Pair:
    """One problem solved by both methods; tokens are None where a side had no text."""

    id: str
    sprint_correct: bool
    baseline_correct: bool
    sprint_tokens: float | None
    baseline_tokens: float | None
    bucket: str | None
    sprint_tokens_decoded: float | None = None  # sequential tokens as decoded (tags included)


def baseline_reference(baselines: Sequence[Sequence[ProblemResult]]) -> dict[str, float]:
    """Per-problem baseline length: the mean over baseline runs (seeds) that have a text for it.

    Buckets and reductions use this one reference, so every SPRINT seed is compared with the same
    lengths and lands problems in the same buckets.
    """
    sums: dict[str, list[float]] = {}
    for run in baselines:
        for r in run:
            if r.sequential is not None:
                sums.setdefault(r.id, []).append(float(r.sequential))
    return {k: float(np.mean(v)) for k, v in sums.items()}


def pair(
    sprint: Sequence[ProblemResult],
    baseline: Sequence[ProblemResult],
    reference: Mapping[str, float] | None = None,
    edges: Sequence[int] = BUCKET_EDGES,
) -> list[Pair]:
    """Match problems by id (in SPRINT's order). Baseline tokens come from `reference` when given."""
    base = {r.id: r for r in baseline}
    pairs = []
    for s in sprint:
        b = base.get(s.id)
        if b is None:
            continue
        bt = reference.get(s.id) if reference is not None else b.sequential
        bt = None if bt is None else float(bt)
        pairs.append(Pair(s.id, s.correct, b.correct, None if s.sequential is None else float(s.sequential), bt,
                          bucket_of(bt, edges),
                          None if s.sequential_decoded is None else float(s.sequential_decoded)))
    return pairs


def mcnemar(pairs: Sequence[Pair]) -> dict:
    """The 2×2 table of paired correctness and the exact McNemar p-value."""
    both = sum(p.sprint_correct and p.baseline_correct for p in pairs)
    sprint_only = sum(p.sprint_correct and not p.baseline_correct for p in pairs)
    baseline_only = sum(p.baseline_correct and not p.sprint_correct for p in pairs)
    neither = len(pairs) - both - sprint_only - baseline_only
    return {
        "both_correct": both,
        "sprint_only": sprint_only,
        "baseline_only": baseline_only,
        "neither": neither,
        "p_value": mcnemar_exact(sprint_only, baseline_only),
    }


def _token_block(pairs: Sequence[Pair], resamples: int, seed: int, confidence: float) -> dict:
    with_tokens = [p for p in pairs if p.sprint_tokens is not None and p.baseline_tokens is not None]
    s = np.array([p.sprint_tokens for p in with_tokens], dtype=float)
    b = np.array([p.baseline_tokens for p in with_tokens], dtype=float)
    ci = bootstrap_ci(_reduction_rows, [s, b], resamples=resamples, seed=seed, confidence=confidence)
    decoded = [p.sprint_tokens_decoded for p in with_tokens if p.sprint_tokens_decoded is not None]
    d = np.array(decoded, dtype=float) if len(decoded) == len(with_tokens) else np.array([], dtype=float)
    ci_decoded = (bootstrap_ci(_reduction_rows, [d, b], resamples=resamples, seed=seed, confidence=confidence)
                  if len(d) else None)  # same seed: the same resampled problems as `reduction_ci`
    return {
        "problems": len(pairs),
        "with_tokens": len(with_tokens),
        "mean_baseline_tokens": float(b.mean()) if len(b) else None,
        "mean_sprint_sequential": float(s.mean()) if len(s) else None,
        "mean_sprint_sequential_decoded": float(d.mean()) if len(d) else None,
        "reduction_decoded": reduction(d, b) if len(d) else None,  # tags counted on both sides
        "reduction_decoded_ci": list(ci_decoded) if ci_decoded else None,
        "reduction": reduction(s, b),
        "reduction_ci": list(ci) if ci else None,
        "sprint_accuracy": float(np.mean([p.sprint_correct for p in pairs])) if pairs else None,
        "baseline_accuracy": float(np.mean([p.baseline_correct for p in pairs])) if pairs else None,
    }


def compare(
    pairs: Sequence[Pair],
    *,
    edges: Sequence[int] = BUCKET_EDGES,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict:
    """SPRINT vs baseline over paired problems: overall and per-bucket reduction with CIs,
    McNemar on correctness, and the accuracy difference with its CI."""
    sc = np.array([p.sprint_correct for p in pairs], dtype=float)
    bc = np.array([p.baseline_correct for p in pairs], dtype=float)
    diff_ci = bootstrap_ci(_difference_rows, [sc, bc], resamples=resamples, seed=seed, confidence=confidence)
    buckets = []
    for label in bucket_labels(edges):
        block = _token_block([p for p in pairs if p.bucket == label], resamples, seed, confidence)
        buckets.append({"bucket": label, **block})
    return {
        "paired": len(pairs),
        "overall": _token_block(pairs, resamples, seed, confidence),
        "buckets": buckets,
        "mcnemar": mcnemar(pairs),
        "accuracy_difference": float(sc.mean() - bc.mean()) if len(pairs) else None,
        "accuracy_difference_ci": list(diff_ci) if diff_ci else None,
    }


# --------------------------------------------------------------------------- several seeds

SUMMARY_KEYS = (
    "accuracy", "accuracy_answered", "no_answer", "failed", "missing_text", "forced_final", "malformed",
    "mean_sequential", "median_sequential", "mean_sequential_decoded", "mean_total", "mean_planner", "mean_executor",
    "mean_phases", "mean_prompts", "mean_prompts_per_phase",
)


def aggregate_summaries(summaries: Sequence[Mapping]) -> dict:
    """Mean ± spread of each headline number over runs of one method (seeds)."""
    return {k: spread([s.get(k) for s in summaries]).as_dict() for k in SUMMARY_KEYS}


def aggregate_comparisons(comparisons: Sequence[Mapping]) -> dict:
    """Mean ± spread over seeds of the overall and per-bucket reductions, p-values, differences."""
    if not comparisons:
        return {}
    out = {
        "reduction": spread([c["overall"]["reduction"] for c in comparisons]).as_dict(),
        "reduction_decoded": spread([c["overall"].get("reduction_decoded") for c in comparisons]).as_dict(),
        "accuracy_difference": spread([c["accuracy_difference"] for c in comparisons]).as_dict(),
        "p_value": spread([c["mcnemar"]["p_value"] for c in comparisons]).as_dict(),
        "buckets": [],
    }
    for i, b in enumerate(comparisons[0]["buckets"]):
        out["buckets"].append({
            "bucket": b["bucket"],
            "problems": spread([c["buckets"][i]["problems"] for c in comparisons]).as_dict(),
            "reduction": spread([c["buckets"][i]["reduction"] for c in comparisons]).as_dict(),
            "reduction_decoded": spread([c["buckets"][i].get("reduction_decoded") for c in comparisons]).as_dict(),
            "mean_baseline_tokens": spread([c["buckets"][i]["mean_baseline_tokens"] for c in comparisons]).as_dict(),
            "mean_sprint_sequential": spread([c["buckets"][i]["mean_sprint_sequential"] for c in comparisons]).as_dict(),
            "mean_sprint_sequential_decoded": spread([c["buckets"][i].get("mean_sprint_sequential_decoded")
                                                      for c in comparisons]).as_dict(),
        })
    return out
