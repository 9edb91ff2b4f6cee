"""What time-replay measured, in numbers: per-method seconds, speedups, and a fitted latency model.

`summarize_timing` turns timing.json's measured calls into the figures reviewers ask for: seconds
per problem for each SPRINT schedule and the baseline, the speedup overall and per length bucket
of the baseline (bootstrap CIs over problems, `sprint.evaluation.metrics`), the share of call time spent
before the first token (prefill + queueing), and the prefix-cache hit ratio.

`fit_latency` fits every term of `sprint.latency.model.LatencyModel` to the measured calls, so the
replay server and `evaluate --latency` can simulate the user's own hardware (`--latency-from latency.json`):

- decode: a call's time after its first token, per token, is `step_base_s + step_per_seq_s × m +
  step_per_context_s × C`, where m is the time-averaged number of calls decoding during its decode
  window (itself included) and C the time-averaged sum of their contexts (prompt + tokens so far,
  growing evenly over each call's window); weighted least squares over calls (weight = its
  tokens), every term ≥ 0;
- prefill: its time to first token minus one such step is `prefill_base_s + prefill_per_token_s ×
  new + prefill_per_pair_s × new × (cached + new / 2)`, new = prompt − the prefix-cache hits the
  server reported (least squares, terms ≥ 0).

A step-cost table (`sprint gpu-probe`'s file, the H200 table) is fitted by `sprint.latency.stepfit`
instead, and the error of every cell printed.

    python -m sprint fit-latency TIMING_DIR|TABLE.json [--out latency.json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sprint.evaluation import metrics as M
from sprint.core.calls import CallRecord
from sprint.core.errors import UserError
from sprint.latency.model import FORMAT, LatencyModel, model_from_file_data
from sprint.latency.stepfit import fit_step_table
from sprint.core.options import add_options, config_from, option
from sprint.core.files import atomic_write

BASELINE = "baseline"


# ---------------------------------------------------------------------------------------------
# Summary of a timing.json


def _ok_calls(problems: list[dict]) -> list[dict]:
    return [c for p in problems for c in p["calls"] if not c.get("error")]


def _method_summary(problems: list[dict]) -> dict[str, Any]:
    seconds = [p["seconds"] for p in problems]
    calls = [c for p in problems for c in p["calls"]]
    ok = _ok_calls(problems)
    busy = sum(c["end"] - c["start"] for c in ok)
    ttft = sum(c["ttft"] for c in ok if c.get("ttft") is not None)
    prompt = sum(c["prompt_tokens"] for c in ok)
    cached = [c["cached_tokens"] for c in ok if isinstance(c.get("cached_tokens"), int)]
    return {
        "problems": len(problems),
        "mean_seconds": float(np.mean(seconds)) if seconds else None,
        "median_seconds": float(np.median(seconds)) if seconds else None,
        "calls": len(calls),
        "failed_calls": len(calls) - len(ok),
        "forced_ok": sum(1 for c in ok if c["completion_tokens"] == c["forced_tokens"]),
        "output_tokens": sum(c["forced_tokens"] for c in calls),
        "ttft_share": ttft / busy if busy > 0 else None,
        "prompt_tokens": prompt,
        "cached_tokens": sum(cached) if cached else None,
        "cache_hit_ratio": sum(cached) / prompt if cached and prompt else None,
    }


def _ratio_rows(base: np.ndarray, other: np.ndarray) -> np.ndarray:
    return base.mean(axis=-1) / other.mean(axis=-1)


def _diff_rows(base: np.ndarray, other: np.ndarray) -> np.ndarray:
    return base.mean(axis=-1) - other.mean(axis=-1)


def _speedup(base: list[float], other: list[float], resamples: int) -> dict[str, Any]:
    """base / other mean seconds (>1: `other` is faster) and seconds saved per problem, with CIs."""
    b, o = np.asarray(base, float), np.asarray(other, float)
    if len(b) == 0 or o.mean() <= 0:
        return {"problems": len(b), "speedup": None, "speedup_ci": None, "saved_seconds": None, "saved_ci": None}
    return {
        "problems": len(b),
        "base_seconds": float(b.mean()), "seconds": float(o.mean()),
        "speedup": float(b.mean() / o.mean()),
        "speedup_ci": M.bootstrap_ci(_ratio_rows, [b, o], resamples=resamples),
        "saved_seconds": float((b - o).mean()),
        "saved_ci": M.bootstrap_ci(_diff_rows, [b, o], resamples=resamples),
    }


def _compare(base: dict[str, dict], other: dict[str, dict], resamples: int) -> dict[str, Any]:
    """Paired by problem id; buckets by the baseline's output length (the paper's Table 3 buckets)."""
    ids = [i for i in other if i in base]
    result = _speedup([base[i]["seconds"] for i in ids], [other[i]["seconds"] for i in ids], resamples)
    buckets: dict[str, list[str]] = {}
    for i in ids:
        buckets.setdefault(M.bucket_of(base[i]["output_tokens"]) or "?", []).append(i)
    result["buckets"] = {
        label: _speedup([base[i]["seconds"] for i in buckets[label]], [other[i]["seconds"] for i in buckets[label]], resamples)
        for label in M.bucket_labels() if label in buckets
    }
    return result


def summarize_timing(timing: dict[str, Any], resamples: int = M.DEFAULT_RESAMPLES) -> dict[str, Any]:
    methods = timing["methods"]
    per = {m: _method_summary(v["problems"]) for m, v in methods.items()}
    by_id = {m: {p["id"]: p for p in v["problems"]} for m, v in methods.items()}
    schedules = [m for m in methods if m != BASELINE]
    summary: dict[str, Any] = {
        "methods": per,
        "calls": sum(s["calls"] for s in per.values()),
        "forced_ok": sum(s["forced_ok"] for s in per.values()),
    }
    if BASELINE in methods:
        summary["vs_baseline"] = {s: _compare(by_id[BASELINE], by_id[s], resamples) for s in schedules}
    if "barrier" in methods and "stream" in methods:
        summary["stream_vs_barrier"] = _compare(by_id["barrier"], by_id["stream"], resamples)
    return summary


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def _ci(ci: Sequence[float] | None, spec: str = ".2f") -> str:
    return "" if not ci else f" [{format(ci[0], spec)}, {format(ci[1], spec)}]"


def timing_table(timing: dict[str, Any]) -> str:
    """The terminal table: seconds per problem, forced lengths honoured, TTFT share, cache hits, speedups."""
    s = timing["summary"]
    lines = [f"time-replay on {timing['model']} at {timing['server']}: "
             f"forced lengths honoured {s['forced_ok']}/{s['calls']} calls"]
    lines.append(f"{'method':<10} {'problems':>8} {'s/problem':>10} {'median':>8} {'calls':>6} {'TTFT share':>10} {'cache hit':>9}")
    for m, row in s["methods"].items():
        lines.append(f"{m:<10} {row['problems']:>8} {_fmt(row['mean_seconds'], '.3f'):>10} "
                     f"{_fmt(row['median_seconds'], '.3f'):>8} {row['calls']:>6} {_fmt(row['ttft_share'], '.1%'):>10} "
                     f"{_fmt(row['cache_hit_ratio'], '.1%'):>9}")
    for sched, cmp in (s.get("vs_baseline") or {}).items():
        lines.append(f"speedup of {sched} over the baseline: {_fmt(cmp['speedup'])}x{_ci(cmp['speedup_ci'])}, "
                     f"saves {_fmt(cmp['saved_seconds'], '.3f')} s/problem{_ci(cmp['saved_ci'], '.3f')}")
        for label, b in cmp["buckets"].items():
            lines.append(f"  baseline {label:>9} tokens: n={b['problems']:<3} {_fmt(b['speedup'])}x{_ci(b['speedup_ci'])}")
    if s.get("stream_vs_barrier"):
        c = s["stream_vs_barrier"]
        lines.append(f"stream over barrier: {_fmt(c['speedup'], '.3f')}x{_ci(c['speedup_ci'], '.3f')}")
    return "\n".join(lines)


def timing_report(timing: dict[str, Any]) -> str:
    """report.md's section: the same figures as a Markdown table, with what they mean."""
    s = timing["summary"]
    out = ["## Seconds on a real engine", "",
           f"Forced-length replay on `{timing['model']}` ({timing['server']}), tokenizer `{timing['tokenizer']}`, "
           f"{timing['config']['concurrency']} problem(s) in flight. Every call was sent with its recorded context "
           f"and forced to its recorded length: {s['forced_ok']}/{s['calls']} calls generated exactly that many tokens.",
           "", "| method | problems | s / problem | median | calls | TTFT share | prefix-cache hits |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m, row in s["methods"].items():
        out.append(f"| {m} | {row['problems']} | {_fmt(row['mean_seconds'], '.3f')} | {_fmt(row['median_seconds'], '.3f')} "
                   f"| {row['calls']} | {_fmt(row['ttft_share'], '.1%')} | {_fmt(row['cache_hit_ratio'], '.1%')} |")
    for sched, cmp in (s.get("vs_baseline") or {}).items():
        out += ["", f"**{sched} vs the sequential baseline**: {_fmt(cmp['speedup'])}x{_ci(cmp['speedup_ci'])} "
                    f"(95% bootstrap CI), {_fmt(cmp['saved_seconds'], '.3f')} s saved per problem{_ci(cmp['saved_ci'], '.3f')}.",
                "", "| baseline length (tokens) | problems | baseline s | SPRINT s | speedup |", "| --- | ---: | ---: | ---: | ---: |"]
        for label, b in cmp["buckets"].items():
            out.append(f"| {label} | {b['problems']} | {_fmt(b.get('base_seconds'), '.3f')} | {_fmt(b.get('seconds'), '.3f')} "
                       f"| {_fmt(b['speedup'])}x{_ci(b['speedup_ci'])} |")
    if s.get("stream_vs_barrier"):
        c = s["stream_vs_barrier"]
        out += ["", f"**stream vs barrier**: {_fmt(c['speedup'], '.3f')}x{_ci(c['speedup_ci'], '.3f')}."]
    out += ["", "TTFT share: the part of the calls' time spent before their first token (queueing + prefill). "
                "Prefix-cache hits: cached / prompt tokens, as the server reported them.", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Fitting the latency model


def samples_from_timing(timing: dict[str, Any]) -> list[list[CallRecord]]:
    """The measured calls of each method that the fit can use: answered, with a first token (each
    method has its own clock, so overlaps are per method)."""
    groups = []
    for method in timing["methods"].values():
        rows = [CallRecord.from_dict(c) for c in method.get("run_calls", [])
                if not c.get("error") and c.get("first_token") is not None]
        if rows:
            groups.append(rows)
    return groups


def _first_token(call: CallRecord) -> float:
    if call.first_token is None:
        raise ValueError("the latency fit needs calls with a first-token time (samples_from_timing keeps those)")
    return call.first_token


def decode_concurrency(calls: Sequence[CallRecord]) -> np.ndarray:
    """For each call, the time-averaged number of calls decoding during its decode window (itself included)."""
    return decode_load(calls)[0]


def decode_load(calls: Sequence[CallRecord]) -> tuple[np.ndarray, np.ndarray]:
    """For each call, the time-averaged number of calls decoding during its decode window (itself
    included) and the time-averaged sum of their contexts: what its decode steps were priced by."""
    first = np.array([_first_token(c) for c in calls], float)
    end = np.array([c.end for c in calls], float)
    prompt = np.array([c.prompt_tokens for c in calls], float)
    tokens = np.array([c.completion_tokens for c in calls], float)
    width = end - first
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(width > 0, tokens / width, 0.0)[None, :]  # j's tokens per second
    busy, context = np.zeros(len(calls)), np.zeros(len(calls))
    for i0 in range(0, len(calls), 512):  # [i, j]: call i's window against call j's, 512 rows at a time
        rows = slice(i0, i0 + 512)
        lo = np.maximum(first[rows, None], first[None, :])
        hi = np.minimum(end[rows, None], end[None, :])
        overlap = np.clip(hi - lo, 0.0, None)
        grown = rate * ((hi - first[None, :]) ** 2 - (lo - first[None, :]) ** 2) / 2
        busy[rows] = overlap.sum(axis=1)
        context[rows] = np.where(overlap > 0, prompt[None, :] * overlap + grown, 0.0).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        m, c = busy / width, context / width
    alone = width <= 0
    return np.where(alone, 1.0, m), np.where(alone, prompt, c)


@dataclass
class LatencyFit:
    model: LatencyModel
    calls: int
    decode_rmse_ms: float  # per-token decode time, fitted vs measured
    ttft_rmse_ms: float
    duration_mape: float  # mean |predicted − measured| / measured of whole call durations
    concurrency_range: tuple[float, float]
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["latency_model"] = d.pop("model")
        return {"format": FORMAT, "source": "time-replay measurements", **d}


def _nonneg_lstsq(columns: list[np.ndarray], y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least squares of y on the columns with every coefficient ≥ 0 (best of the subsets that
    stay non-negative; a column that does not vary beside the others is left at 0)."""
    sw = np.sqrt(w)
    best, best_err = np.zeros(len(columns)), float(np.sum(w * y * y))
    for mask in range(1, 2 ** len(columns)):
        keep = [i for i in range(len(columns)) if mask >> i & 1]
        x = np.column_stack([columns[i] for i in keep])
        if np.linalg.matrix_rank(x * sw[:, None]) < len(keep):
            continue
        coef = np.linalg.lstsq(x * sw[:, None], sw * y, rcond=None)[0]
        if np.any(coef < 0):
            continue
        err = float(np.sum(w * (x @ coef - y) ** 2))
        if err < best_err * (1 - 1e-9):
            best, best_err = np.zeros(len(columns)), err
            best[keep] = coef
    return best


def fit_latency(groups: Sequence[Sequence[CallRecord]]) -> LatencyFit:
    """Fit the LatencyModel to measured calls (see the module docstring)."""
    calls = [c for g in groups for c in g]
    if len(calls) < 3:
        raise UserError(f"need at least 3 measured calls to fit the latency model, got {len(calls)}; run time-replay first")
    loads = [decode_load(g) for g in groups]
    m = np.concatenate([x[0] for x in loads])
    ctx = np.concatenate([x[1] for x in loads])
    n = np.array([c.completion_tokens for c in calls], float)
    prompt = np.array([c.prompt_tokens for c in calls], float)
    cached = np.array([min(c.cached_tokens or 0, c.prompt_tokens) for c in calls], float)
    ttft = np.array([_first_token(c) - c.start for c in calls], float)
    decode = np.array([c.end - _first_token(c) for c in calls], float)
    use = n > 1
    if use.sum() < 2:
        raise UserError("the measured calls generate at most one token each; nothing to fit decode speed on")
    per_token = decode[use] / (n[use] - 1)
    overlapped = np.ptp(m[use]) > 0.5
    columns = [np.ones(int(use.sum())), m[use] if overlapped else np.zeros(int(use.sum())), ctx[use]]
    base, per_seq, per_ctx = _nonneg_lstsq(columns, per_token, n[use] - 1)
    if base + per_seq <= 0:
        base = float(np.average(per_token, weights=n[use] - 1))
    note = "" if overlapped else "calls hardly overlapped: the per-sequence term is not identified (set to 0)"
    step = base + per_seq * m + per_ctx * ctx
    new = prompt - cached
    pre = _nonneg_lstsq([np.ones_like(new), new, new * (cached + new / 2)], ttft - step, np.ones_like(new))
    model = LatencyModel(step_base_s=float(base), step_per_seq_s=float(per_seq), step_per_context_s=float(per_ctx),
                         prefill_base_s=float(pre[0]), prefill_floor_s=0.0, prefill_per_token_s=float(pre[1]),
                         prefill_per_pair_s=float(pre[2]), gpu="measured by time-replay")
    prefill = np.array([model.prefill(int(a), int(b)) for a, b in zip(new, cached)])
    predicted = prefill + n * step
    measured = np.array([c.end - c.start for c in calls], float)
    return LatencyFit(
        model=model, calls=len(calls),
        decode_rmse_ms=float(np.sqrt(np.mean((per_token - step[use]) ** 2)) * 1000),
        ttft_rmse_ms=float(np.sqrt(np.mean((ttft - (prefill + step)) ** 2)) * 1000),
        duration_mape=float(np.mean(np.abs(predicted - measured) / np.maximum(measured, 1e-9))),
        concurrency_range=(float(m.min()), float(m.max())), note=note,
    )


def read_timing(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    p = p / "timing.json" if p.is_dir() else p
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{p} does not exist; pass the --out folder of a time-replay run or a step-cost table") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{p} is not valid JSON ({exc.msg}); re-run time-replay") from None


def model_lines(m: LatencyModel) -> list[str]:
    """The terms, one a line, in the units a person reads."""
    return [
        f"  step_base_s         = {m.step_base_s:.6f}   ({m.step_base_s * 1000:.3f} ms per decode step)",
        f"  step_per_seq_s      = {m.step_per_seq_s:.3e}   ({m.step_per_seq_s * 1000:.4f} ms per decoding sequence)",
        f"  step_per_context_s  = {m.step_per_context_s:.3e}   ({m.step_per_context_s * 1e6:.5f} µs per context token)",
        f"  prefill_base_s      = {m.prefill_base_s:.6f}   ({m.prefill_base_s * 1000:.2f} ms per call)",
        f"  prefill_floor_s     = {m.prefill_floor_s:.6f}   ({m.prefill_floor_s * 1000:.2f} ms at least)",
        f"  prefill_per_token_s = {m.prefill_per_token_s:.3e}   ({m.prefill_per_token_s * 1e6:.2f} µs per new token)",
        f"  prefill_per_pair_s  = {m.prefill_per_pair_s:.3e}   ({m.prefill_per_pair_s * 1e9:.3f} ns per (new, context) pair)",
    ]


def fit_text(fit: LatencyFit) -> str:
    lines = [f"fitted on {fit.calls} measured calls (decode concurrency "
             f"{fit.concurrency_range[0]:.2f}–{fit.concurrency_range[1]:.2f}):", *model_lines(fit.model),
             f"fit error: decode {fit.decode_rmse_ms:.3f} ms/token RMSE, TTFT {fit.ttft_rmse_ms:.2f} ms RMSE, "
             f"call duration {fit.duration_mape:.1%} mean absolute error"]
    if fit.note:
        lines.append(f"note: {fit.note}")
    return "\n".join(lines)


def table_fit(table: dict[str, Any], source: str) -> tuple[dict[str, Any], str]:
    """A step-cost table with its fitted model added (what the latency file holds), and the terminal text."""
    try:
        fitted = fit_step_table(table)
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{source}: cannot fit its step-cost table ({exc})") from None
    model = model_from_file_data({**table, "latency_model": fitted["terms"]}, source)
    out = {**table, "format": FORMAT, "latency_model": model.terms(),
           "fit": {k: v for k, v in fitted.items() if k != "terms"}}
    dec = fitted["decode"]
    lines = [f"fitted on {dec['cells']} decode cells of {source} ({model.gpu}):", *model_lines(model),
             f"decode: every cell within {dec['max_error']:.1%} (mean {dec['mean_error']:.1%})"]
    if fitted.get("prefill"):
        pre = fitted["prefill"]
        lines.append(f"prefill: {pre['cells']} compute-bound cells, within {pre['max_error']:.1%} "
                     f"(mean {pre['mean_error']:.1%}); the floor is one decode step, as under CUDA graphs")
    return out, "\n".join(lines)


@dataclass
class FitConfig:
    """`python -m sprint fit-latency`."""

    timing: str = option(help="time-replay output folder (or its timing.json), or a step-cost table", cli=False)
    out: str | None = option(None, "where to write the fitted model (default: TIMING_DIR/latency.json; for a "
                             "step-cost table, latency.json in the current folder)")


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(FitConfig, args)
    data = read_timing(cfg.timing)
    if isinstance(data, dict) and "decode" in data and "methods" not in data:
        result, text = table_fit(data, cfg.timing)
        out = Path(cfg.out or "latency.json")
    else:
        fit = fit_latency(samples_from_timing(data))
        result, text = fit.as_dict(), fit_text(fit)
        out = Path(cfg.out) if cfg.out else (Path(cfg.timing) if Path(cfg.timing).is_dir() else Path(cfg.timing).parent) / "latency.json"
    atomic_write(out, json.dumps(result, indent=1) + "\n")
    print(text)
    print(f"wrote {out}; use it with `sprint replay-server … --latency-from {out}` or `sprint evaluate … --latency {out}`")
    return 0


def register(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.add_argument("timing", metavar="TIMING_DIR", help="time-replay output folder (or its timing.json), or a "
                   "step-cost table (sprint gpu-probe's file)")
    add_options(p, FitConfig)
