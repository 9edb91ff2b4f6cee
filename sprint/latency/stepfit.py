"""Fitting the latency model's terms to a table of measured step costs, with the standard library only.

Why stdlib: the probe (`sprint.latency.probe`) runs where only PyTorch is installed and writes its
fitted terms beside the raw grid, and `sprint.latency.model` fits a raw table on load; both use
this one fit. Least squares on *relative* errors (every cell counts alike, short and long
contexts), with every term kept non-negative: when the free fit makes a term negative the best
fit without it is taken (an exhaustive search over the few subsets of terms).

- decode: `ms = base + per_seq × k + per_context × k × L` over cells of k sequences each at context L
  (a step reads the weights once and every sequence's KV cache);
- prefill: `ms = per_token × new + per_pair × new × (cached + new / 2)` (a new token's matmuls, and
  its attention over the cached prefix and the new tokens before it), fitted on the compute-bound
  cells only: those at least twice the fastest prefill, the rest being launch overhead. The floor
  of a prefill is one decode step of one sequence, as under the CUDA graphs vLLM captures.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

Row = Sequence[float]


@dataclass
class TermFit:
    """Fitted coefficients (in the table's units) and the per-cell relative errors they leave."""

    coef: list[float]
    errors: list[float]  # (fitted - measured) / measured, per cell in the table's order

    @property
    def max_error(self) -> float:
        return max((abs(e) for e in self.errors), default=0.0)

    @property
    def mean_error(self) -> float:
        return sum(abs(e) for e in self.errors) / len(self.errors) if self.errors else 0.0


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when the system is singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def _relative_lstsq(columns: list[list[float]], y: list[float]) -> list[float] | None:
    """min Σ ((X c − y) / y)² through the normal equations (a handful of columns, well scaled)."""
    scale = [max(abs(v) for v in col) or 1.0 for col in columns]
    x = [[col[i] / s / y[i] for col, s in zip(columns, scale)] for i in range(len(y))]
    k = len(columns)
    ata = [[sum(r[i] * r[j] for r in x) for j in range(k)] for i in range(k)]
    atb = [sum(r[i] for r in x) for i in range(k)]
    c = _solve(ata, atb)
    return None if c is None else [ci / s for ci, s in zip(c, scale)]


def nonnegative_fit(columns: list[list[float]], y: list[float]) -> TermFit:
    """The best relative least-squares fit of y by the columns with every coefficient ≥ 0."""
    if not y or any(v <= 0 for v in y):
        raise ValueError("need at least one measured cell, every time > 0")
    best: TermFit | None = None
    for size in range(len(columns), 0, -1):
        for keep in itertools.combinations(range(len(columns)), size):
            c = _relative_lstsq([columns[i] for i in keep], y)
            if c is None or any(v < 0 for v in c):
                continue
            coef = [0.0] * len(columns)
            for i, v in zip(keep, c):
                coef[i] = v
            fitted = [sum(coef[j] * columns[j][i] for j in range(len(columns))) for i in range(len(y))]
            fit = TermFit(coef, [(f - m) / m for f, m in zip(fitted, y)])
            if best is None or sum(e * e for e in fit.errors) < sum(e * e for e in best.errors) - 1e-15:
                best = fit
    if best is None:
        raise ValueError("no non-negative fit exists for these cells")
    return best


def decode_columns(rows: Sequence[dict[str, Any]]) -> tuple[list[list[float]], list[float]]:
    """The decode design: [1, k, k·L] per cell, and the measured ms."""
    k = [float(r["k"]) for r in rows]
    ctx = [float(r["k"]) * float(r["L"]) for r in rows]
    return [[1.0] * len(rows), k, ctx], [float(r["step_ms"]) for r in rows]


def prefill_columns(rows: Sequence[dict[str, Any]]) -> tuple[list[list[float]], list[float]]:
    """The prefill design: [new, new·(cached + new/2)] per cell, and the measured ms."""
    new = [float(r["new"]) for r in rows]
    pairs = [float(r["new"]) * (float(r["cached"]) + float(r["new"]) / 2) for r in rows]
    return [new, pairs], [float(r["ms"]) for r in rows]


def compute_bound(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prefill cells at least twice the fastest one: where the GPU's work, not launches, sets the time."""
    if not rows:
        return []
    floor = min(float(r["ms"]) for r in rows)
    return [r for r in rows if float(r["ms"]) >= 2 * floor]


def fit_step_table(table: dict[str, Any]) -> dict[str, Any]:
    """The latency model's terms (in seconds) fitted to a step-cost table, with the fit's errors.

    `table`: the probe's file (or the H200 table): `decode` cells {k, L, step_ms}, optional
    `prefill` cells {cached, new, ms}. Returns {"terms": LatencyModel field -> value, "decode": ...,
    "prefill": ...} where the two blocks give the per-cell errors and their max and mean.
    """
    rows = [r for r in table.get("decode") or [] if r.get("step_ms")]
    if not rows:
        raise ValueError("the table has no decode cells (k, L, step_ms)")
    columns, y = decode_columns(rows)
    dec = nonnegative_fit(columns, y)
    base, per_seq, per_ctx = (c / 1000 for c in dec.coef)
    terms: dict[str, float] = {"step_base_s": base, "step_per_seq_s": per_seq, "step_per_context_s": per_ctx,
                               "prefill_base_s": 0.0, "prefill_floor_s": base + per_seq,
                               "prefill_per_token_s": 0.0, "prefill_per_pair_s": 0.0}
    out: dict[str, Any] = {"terms": terms, "decode": _errors(dec, rows, ("k", "L"))}
    pre_rows = compute_bound([r for r in table.get("prefill") or [] if r.get("ms")])
    if pre_rows:
        columns, y = prefill_columns(pre_rows)
        pre = nonnegative_fit(columns, y)
        terms["prefill_per_token_s"], terms["prefill_per_pair_s"] = (c / 1000 for c in pre.coef)
        out["prefill"] = _errors(pre, pre_rows, ("cached", "new"))
    return out


def _errors(fit: TermFit, rows: Sequence[dict[str, Any]], keys: tuple[str, str]) -> dict[str, Any]:
    return {"cells": len(rows), "max_error": fit.max_error, "mean_error": fit.mean_error,
            "per_cell": [{keys[0]: r[keys[0]], keys[1]: r[keys[1]], "error": round(e, 5)}
                         for r, e in zip(rows, fit.errors)]}


def table_errors(rows: Sequence[dict[str, Any]], step_ms: Callable[[int, int], float]) -> list[float]:
    """Relative error per decode cell of any step-cost function (ms for k sequences at context L)."""
    return [(step_ms(int(r["k"]), int(r["L"])) - float(r["step_ms"])) / float(r["step_ms"]) for r in rows]
