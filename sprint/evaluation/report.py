"""Evaluation outputs: `metrics.json`, `report.md` and PNG figures, all from the metrics dict.

Everything here is a function of the dictionary `sprint.evaluation.evaluate` builds (and `metrics.json`
stores), so a report can be re-rendered from `metrics.json` alone. Figures use matplotlib's
object API with the Agg canvas (`plotting`); Figure 6 by quartile and the plan shapes render in
`quartile_report`.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

from sprint.core.files import atomic_write
from sprint.evaluation import quartile_report as QR
from sprint.evaluation.metrics import bucket_labels
from sprint.evaluation.plotting import figure, save, thousands
from sprint.evaluation.table2 import TITLE as TABLE2_TITLE, markdown_lines as table2_lines, md_text

FIGURES = {
    "accuracy_vs_tokens": "Accuracy vs mean sequential tokens (one point per run)",
    "reduction_by_bucket": "Sequential-token reduction by baseline length bucket",
    QR.FIGURE[0]: QR.FIGURE[1],
    "tokens_scatter": "SPRINT sequential tokens vs baseline tokens, per problem",
    "phases_histogram": "Phases per problem (SPRINT)",
    "prompts_per_phase": "Prompts per phase (SPRINT)",
}

# Where `sprint view` puts a site, so that a report can link to it without the evaluation knowing the
# viewer: `<run>/view` by default, its own evaluation in `<site>/evaluation`, and a file every site has.
VIEW_FOLDER = "view"
VIEW_INDEX = "index.html"
VIEW_MARKER = "assets/view.js"


# --------------------------------------------------------------------------- formatting


def fmt_pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}%"


def fmt_ci_pct(ci: list[float] | None) -> str:
    return "" if not ci else f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def fmt_num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "–"
    return f"{x:,.{digits}f}"


def fmt_p(p: float | None) -> str:
    if p is None:
        return "–"
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def _spread_str(sp: dict | None, fmt: Callable[[float | None], str], scale_pct: bool = False) -> str:
    """`mean ± std` of a spread dict; percent figures keep the ± in percentage points."""
    if not sp or sp.get("mean") is None:
        return "–"
    std = sp.get("std") or 0.0
    pm = f"{100 * std:.1f} pp" if scale_pct else fmt(std).rstrip("%")
    return f"{fmt(sp['mean'])} ± {pm}"


# --------------------------------------------------------------------------- report.md


def _method_cell(metrics: dict, method: str, key: str, fmt: Callable, *, pct: bool = False, ci_key: str | None = None) -> str:
    """One method's figure: the run's value [CI] for one run, mean ± sd over several (seeds)."""
    runs = metrics["runs"] if method == "sprint" else metrics["baselines"]
    if not runs:
        return "–"
    if len(runs) == 1:
        s = runs[0]["summary"]
        return fmt(s.get(key)) + (fmt_ci_pct(s[ci_key]) if ci_key and s.get(ci_key) else "")
    agg = (metrics.get("aggregate") or {}).get(method) or {}
    return _spread_str(agg.get(key), fmt, scale_pct=pct)


def _comparison_cell(metrics: dict, what: str) -> str:
    comps = metrics.get("comparisons") or []
    if not comps:
        return "–"
    if len(comps) == 1:
        c = comps[0]
        if what == "reduction":
            return fmt_pct(c["overall"]["reduction"]) + fmt_ci_pct(c["overall"].get("reduction_ci"))
        if what == "difference":
            d = c["accuracy_difference"]
            return ("–" if d is None else f"{100 * d:+.1f} pp") + fmt_ci_pct(c.get("accuracy_difference_ci"))
        return fmt_p(c["mcnemar"]["p_value"])
    agg = metrics["aggregate"]["comparison"]
    if what == "reduction":
        return _spread_str(agg["reduction"], fmt_pct, scale_pct=True)
    if what == "difference":
        sp = agg["accuracy_difference"]
        return "–" if sp["mean"] is None else f"{100 * sp['mean']:+.1f} ± {100 * sp['std']:.1f} pp"
    ps = [fmt_p(v) for v in agg["p_value"]["values"]]
    return ", ".join(ps) + " (per seed)"


def _summary_table(metrics: dict) -> list[str]:
    has_s, has_b = bool(metrics["runs"]), bool(metrics["baselines"])
    cols = (["SPRINT"] if has_s else []) + (["Sequential baseline"] if has_b else [])
    methods = (["sprint"] if has_s else []) + (["baseline"] if has_b else [])
    lines = ["| | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    def num(x: float | None) -> str:
        return fmt_num(x, 0)

    def num1(x: float | None) -> str:
        return fmt_num(x, 1)

    def count(x: float | None) -> str:
        return "–" if x is None else (f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}")

    n_runs = {"sprint": len(metrics["runs"]), "baseline": len(metrics["baselines"])}
    if max(n_runs.values()) > 1:
        row("Runs (seeds)", [str(n_runs[m]) for m in methods])
    row("Problems", [", ".join(str(r["summary"]["problems"]) for r in (metrics["runs"] if m == "sprint" else metrics["baselines"]))
                     for m in methods])
    row("Accuracy (no final answer counts as wrong) [95% CI]",
        [_method_cell(metrics, m, "accuracy", fmt_pct, pct=True, ci_key="accuracy_ci") for m in methods])
    row("Accuracy over answered problems only (authors' variant)",
        [_method_cell(metrics, m, "accuracy_answered", fmt_pct, pct=True) for m in methods])
    row("Problems without a final answer", [_method_cell(metrics, m, "no_answer", count) for m in methods])
    row("Failed calls (status not ok)", [_method_cell(metrics, m, "failed", count) for m in methods])
    row("Missing trajectories (no text)", [_method_cell(metrics, m, "missing_text", count) for m in methods])
    row("Forced final answers (phase limit reached)",
        [_method_cell(metrics, m, "forced_final", count) if m == "sprint" else "–" for m in methods])
    row("Malformed trajectories (read leniently)",
        [_method_cell(metrics, m, "malformed", count) if m == "sprint" else "–" for m in methods])
    row("Mean sequential tokens", [_method_cell(metrics, m, "mean_sequential", num) for m in methods])
    row("Mean sequential tokens as decoded (tags included)",
        [_method_cell(metrics, m, "mean_sequential_decoded", num) for m in methods])
    row("Mean total tokens", [_method_cell(metrics, m, "mean_total", num) for m in methods])
    if has_s:
        row("Mean phases per problem", [_method_cell(metrics, m, "mean_phases", num1) if m == "sprint" else "–" for m in methods])
        row("Mean prompts per problem", [_method_cell(metrics, m, "mean_prompts", num1) if m == "sprint" else "–" for m in methods])
    if metrics.get("comparisons"):
        row("Sequential-token reduction vs baseline [95% CI]", [_comparison_cell(metrics, "reduction"), "–"])
        row("Accuracy difference vs baseline [95% CI]", [_comparison_cell(metrics, "difference"), "–"])
        row("McNemar exact p-value (paired correctness)", [_comparison_cell(metrics, "p"), "–"])
    return lines


def _bucket_table(metrics: dict) -> list[str]:
    comps = metrics.get("comparisons") or []
    if not comps:
        return []
    lines = [
        "| Baseline length (tokens) | Problems | Mean baseline tokens | Mean SPRINT sequential tokens | "
        "Mean SPRINT sequential tokens as decoded | Reduction [95% CI] | Reduction as decoded [95% CI] | "
        "SPRINT accuracy | Baseline accuracy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if len(comps) == 1:
        c = comps[0]
        for label, b in [("all", c["overall"])] + [(b["bucket"], b) for b in c["buckets"]]:
            lines.append(
                f"| {label} | {b['problems']} | {fmt_num(b['mean_baseline_tokens'])} | "
                f"{fmt_num(b['mean_sprint_sequential'])} | {fmt_num(b.get('mean_sprint_sequential_decoded'))} | "
                f"{fmt_pct(b['reduction'])}{fmt_ci_pct(b.get('reduction_ci'))} | "
                f"{fmt_pct(b.get('reduction_decoded'))}{fmt_ci_pct(b.get('reduction_decoded_ci'))} | "
                f"{fmt_pct(b['sprint_accuracy'])} | {fmt_pct(b['baseline_accuracy'])} |"
            )
        return lines
    agg = metrics["aggregate"]["comparison"]
    overall = [c["overall"] for c in comps]

    def mean_of(vals: list[float | None]) -> float | None:
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else None

    lines.append(
        f"| all | {fmt_num(mean_of([o['problems'] for o in overall]), 0)} | "
        f"{fmt_num(mean_of([o['mean_baseline_tokens'] for o in overall]))} | "
        f"{fmt_num(mean_of([o['mean_sprint_sequential'] for o in overall]))} | "
        f"{fmt_num(mean_of([o.get('mean_sprint_sequential_decoded') for o in overall]))} | "
        f"{_spread_str(agg['reduction'], fmt_pct, scale_pct=True)} | "
        f"{_spread_str(agg['reduction_decoded'], fmt_pct, scale_pct=True)} | "
        f"{fmt_pct(mean_of([o['sprint_accuracy'] for o in overall]))} | "
        f"{fmt_pct(mean_of([o['baseline_accuracy'] for o in overall]))} |"
    )
    for i, b in enumerate(agg["buckets"]):
        per = [c["buckets"][i] for c in comps]
        lines.append(
            f"| {b['bucket']} | {fmt_num(b['problems']['mean'], 0)} | {fmt_num(b['mean_baseline_tokens']['mean'])} | "
            f"{fmt_num(b['mean_sprint_sequential']['mean'])} | {fmt_num(b['mean_sprint_sequential_decoded']['mean'])} | "
            f"{_spread_str(b['reduction'], fmt_pct, scale_pct=True)} | "
            f"{_spread_str(b['reduction_decoded'], fmt_pct, scale_pct=True)} | "
            f"{fmt_pct(mean_of([p['sprint_accuracy'] for p in per]))} | "
            f"{fmt_pct(mean_of([p['baseline_accuracy'] for p in per]))} |"
        )
    return lines


def _mcnemar_lines(metrics: dict) -> list[str]:
    out = []
    for c in metrics.get("comparisons") or []:
        m = c["mcnemar"]
        out.append(
            f"- {md_text(c['run'])} vs {md_text(c['baseline'])}: {c['paired']} paired problems; both right {m['both_correct']}, "
            f"only SPRINT right {m['sprint_only']}, only the baseline right {m['baseline_only']}, "
            f"neither {m['neither']}; exact McNemar p = {fmt_p(m['p_value'])}."
        )
    return out


def _runs_table(metrics: dict) -> list[str]:
    entries = [("SPRINT", r) for r in metrics["runs"]] + [("baseline", r) for r in metrics["baselines"]]
    lines = [
        "| Run | Method | Problems | Accuracy | Accuracy (answered) | No answer | Mean sequential tokens | "
        "Mean sequential tokens as decoded | Mean total tokens | Folder |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, r in entries:
        s = r["summary"]
        lines.append(
            f"| {md_text(r['label'])} | {method} | {s['problems']} | {fmt_pct(s['accuracy'])} | {fmt_pct(s['accuracy_answered'])} | "
            f"{s['no_answer']} | {fmt_num(s['mean_sequential'])} | {fmt_num(s.get('mean_sequential_decoded'))} | "
            f"{fmt_num(s['mean_total'])} | `{r['path']}` |"
        )
    return lines


def _prefix_cache_lines(metrics: dict) -> list[str]:
    """Prefix-cache hit ratio per run and role, from the runs' manifests (servers that report cached_tokens)."""
    lines = []
    for r in [*metrics["runs"], *metrics["baselines"]]:
        for role, c in sorted((r.get("prefix_cache") or {}).items()):
            lines.append(f"| {md_text(r['label'])} | {role} | {c['calls']} | {fmt_num(c['prompt_tokens'])} | "
                         f"{fmt_num(c['cached_tokens'])} | {fmt_pct(c['hit_ratio'])} |")
    if not lines:
        return []
    return ["| Run | Role | Calls | Prompt tokens | Cached tokens | Hit ratio |", "|---|---|---|---|---|---|", *lines]


DEFINITIONS = """\
- **Accuracy** counts every problem; one without a final answer (no `\\boxed{{}}`, a failed call, a missing
  trajectory) is wrong. The authors' variant divides by the answered problems only.
- **Sequential tokens** (the critical path, the paper's definition and the headline): per phase, the maximum
  over its prompts of (planner tokens up to the end of that prompt + tokens of that prompt's execution), never
  less than the whole plan; plus the final answer as planner tokens. Tags excluded. For the sequential
  baseline it is its output length.
- **Sequential tokens as decoded**: the same critical path with every piece counted as the model generates
  it, tags included (the plan block from `<Plan_p>`, each `<execution_p.k>` block, the `<Final_answer>`
  block): what the GPU actually decodes on the critical path. For the sequential baseline, its output length.
- **Total tokens**: every generated token, tags included: the trajectory text after the question (every
  plan, every execution, the final answer, with their tags; the paper's Table 2 "#Total"). For the
  sequential baseline, its output length.
- **Buckets** group problems by the sequential baseline's length (mean over baseline seeds), lower edge
  inclusive. **Reduction** = 1 − mean SPRINT sequential tokens / mean baseline tokens over the paired
  problems with text on both sides; positive means SPRINT's critical path is shorter. **Reduction as
  decoded** is the same with SPRINT's sequential tokens as decoded; its interval resamples the same problems.
- **McNemar**: exact two-sided binomial test on the problems exactly one method got right.
  **CIs**: percentile bootstrap over problems ({resamples} resamples, seed {seed}, {conf:.0%}).
- Tokenizers: planner `{planner}`, executor `{executor}`. Answers were re-extracted from the texts and
  re-graded ({task})."""


def _modelled_cell(m: dict | None, unit: str = "") -> str:
    if not m or m.get("value") is None:
        return "–"
    ci = m.get("ci")
    text = f"{m['value']:,.2f}{unit}"
    return text + (f" [{ci[0]:,.2f}–{ci[1]:,.2f}]" if ci else "") + f" (n={m.get('n')})"


def modelled_lines(block: dict | None) -> list[str]:
    """report.md's section on modelled seconds (metrics.json's `modelled`); [] when none were modelled."""
    if not block:
        return []
    labels = bucket_labels()
    lines = [f"Seconds per problem **{block['label']}** (no other problem on the GPU, prefix cache on), from the token "
             f"counts: `{block['source']}`, {block['describe']}. Mean [95% bootstrap CI] (n problems), overall and by "
             "the baseline's length in tokens.", "",
             "| method | schedule | overall | " + " | ".join(labels) + " |",
             "|---|---|---:|" + "---:|" * len(labels)]
    for row in block.get("runs", []):
        buckets = row.get("buckets") or {}
        lines.append(f"| {md_text(row['method'])} | {row['schedule']} | {_modelled_cell(row.get('overall'))} | "
                     + " | ".join(_modelled_cell(buckets.get(b)) for b in labels) + " |")
    for cmp in block.get("comparisons", []):
        for schedule, c in cmp["by_schedule"].items():
            buckets = c.get("buckets") or {}
            name = f"{md_text(cmp['run'])} / {md_text(cmp['baseline'])}"
            lines.append(f"| {name} | {schedule} | {_modelled_cell(c.get('overall'), '×')} | "
                         + " | ".join(_modelled_cell(buckets.get(b), "×") for b in labels) + " |")
    return lines + ["", "A ratio row is SPRINT's mean modelled seconds over the baseline's on the same problems "
                        "(below 1: SPRINT is faster). Modelled, not measured: see README \"Modelled seconds\"."]


def render_markdown(metrics: dict, figures: dict[str, str] | None = None, viewer: str | None = None) -> str:
    """report.md: the paper-shaped Table 2 first, then the summary, buckets, significance, per-run rows, figures.

    `viewer`: a link to the HTML viewer of these runs (`sprint view`), when there is one."""
    figures = figures or {}
    parts = ["# SPRINT evaluation", ""]
    names = [md_text(r["label"]) for r in metrics["runs"]]
    bases = [md_text(r["label"]) for r in metrics["baselines"]]
    parts.append(f"Task **{metrics['task']}**. SPRINT runs: {', '.join(names) or 'none'}. "
                 f"Baseline runs: {', '.join(bases) or 'none'}.")
    if viewer:
        parts += ["", f"Every problem, its phases and a timeline of its model calls: [the run viewer]({viewer})."]
    table2 = table2_lines(metrics.get("table2"))
    if table2:
        parts += ["", f"## {TABLE2_TITLE}", ""] + table2
    parts += ["", "## Summary", ""] + _summary_table(metrics)
    if max(len(metrics["runs"]), len(metrics["baselines"])) > 1:
        parts += ["", "With several runs (seeds) a cell reads mean ± standard deviation over the runs; "
                  "brackets are 95% bootstrap intervals of a single run's problems."]
    buckets = _bucket_table(metrics)
    if buckets:
        parts += ["", "## Reduction by baseline length", ""] + buckets
        parts += ["", "## Paired correctness", ""] + _mcnemar_lines(metrics)
    quartiles = QR.markdown_lines(metrics.get("by_quartile"), (metrics.get("modelled") or {}).get("label"))
    if quartiles:
        parts += ["", f"## {QR.TITLE}", ""] + quartiles
    shapes = QR.shape_markdown_lines(metrics.get("plan_shapes"))
    if shapes:
        parts += ["", f"## {QR.SHAPES_TITLE}", ""] + shapes
    modelled = modelled_lines(metrics.get("modelled"))
    if modelled:
        parts += ["", "## Modelled seconds", ""] + modelled
    if len(metrics["runs"]) + len(metrics["baselines"]) > 1:
        parts += ["", "## Runs", ""] + _runs_table(metrics)
    cache = _prefix_cache_lines(metrics)
    if cache:
        parts += ["", "## Prefix cache", "", "Prompt tokens the servers found in their prefix cache "
                  "(vLLM's `cached_tokens`), per role:", ""] + cache
    if figures:
        parts += ["", "## Figures", ""]
        for name, file in figures.items():
            parts += [f"![{FIGURES.get(name, name)}]({file})", ""]
    b = metrics.get("bootstrap", {})
    parts += ["", "## Definitions", "", DEFINITIONS.format(
        resamples=b.get("resamples"), seed=b.get("seed"), conf=b.get("confidence") or 0.95,
        planner=metrics["tokenizers"]["planner"], executor=metrics["tokenizers"]["executor"], task=metrics["task"],
    )]
    return "\n".join(parts).rstrip() + "\n"


# --------------------------------------------------------------------------- figures


def plot_accuracy_vs_tokens(metrics: dict, path: Path) -> bool:
    points = [("SPRINT", r) for r in metrics["runs"]] + [("baseline", r) for r in metrics["baselines"]]
    points = [(m, r) for m, r in points if r["summary"]["mean_sequential"] is not None and r["summary"]["accuracy"] is not None]
    if not points:
        return False
    fig, ax = figure()
    style = {"SPRINT": ("o", "tab:blue"), "baseline": ("s", "tab:orange")}
    seen = set()
    for method, r in points:
        marker, color = style[method]
        x, y = r["summary"]["mean_sequential"], 100 * r["summary"]["accuracy"]
        ax.scatter([x], [y], marker=marker, color=color, s=50, label=None if method in seen else method)
        seen.add(method)
        ax.annotate(r["label"], (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
    ax.set_xlabel("mean sequential tokens per problem")
    ax.set_xlim(left=0, right=1.15 * max(r["summary"]["mean_sequential"] for _, r in points) or 1)
    thousands(ax.xaxis)
    ax.set_ylim(-2, 102)
    ax.set_ylabel("accuracy (%)")
    ax.set_title("Accuracy vs sequential tokens")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    save(fig, path)
    return True


def plot_reduction_by_bucket(metrics: dict, path: Path) -> bool:
    comps = metrics.get("comparisons") or []
    if not comps:
        return False
    labels = ["all"] + [b["bucket"] for b in comps[0]["buckets"]]
    values, errs_lo, errs_hi, counts = [], [], [], []
    if len(comps) == 1:
        blocks = [comps[0]["overall"]] + comps[0]["buckets"]
        for b in blocks:
            v = b["reduction"]
            values.append(0.0 if v is None else 100 * v)
            ci = b.get("reduction_ci")
            errs_lo.append(0.0 if v is None or not ci else 100 * (v - ci[0]))
            errs_hi.append(0.0 if v is None or not ci else 100 * (ci[1] - v))
            counts.append(b["problems"])
    else:
        agg = metrics["aggregate"]["comparison"]
        spreads = [agg["reduction"]] + [b["reduction"] for b in agg["buckets"]]
        for sp in spreads:
            values.append(0.0 if sp["mean"] is None else 100 * sp["mean"])
            errs_lo.append(100 * (sp["std"] or 0.0))
            errs_hi.append(100 * (sp["std"] or 0.0))
        counts = [comps[0]["overall"]["problems"]] + [b["problems"] for b in comps[0]["buckets"]]
    fig, ax = figure()
    xs = list(range(len(labels)))
    colors = ["tab:gray"] + ["tab:blue"] * (len(labels) - 1)
    ax.bar(xs, values, color=colors, yerr=[errs_lo, errs_hi], capsize=4)
    for x, v, n in zip(xs, values, counts):
        ax.annotate(f"n={n}", (x, v), textcoords="offset points", xytext=(0, 3 if v >= 0 else -10), ha="center", fontsize=7)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(xs, labels)
    ax.set_xlabel("baseline output length (tokens)")
    ax.set_ylabel("sequential-token reduction (%)")
    ax.set_title("Reduction vs baseline, by length bucket")
    ax.grid(axis="y", alpha=0.3)
    save(fig, path)
    return True


def plot_tokens_scatter(metrics: dict, path: Path) -> bool:
    if not metrics.get("comparisons") or not metrics["runs"]:
        return False
    rows = [r for r in metrics["runs"][0]["problems"] if r.get("sequential") is not None and r.get("baseline_tokens") is not None]
    if not rows:
        return False
    fig, ax = figure(5.0, 5.0)
    xs = [r["baseline_tokens"] for r in rows]
    ys = [r["sequential"] for r in rows]
    ax.scatter(xs, ys, s=8, alpha=0.5, color="tab:blue")
    top = max(max(xs), max(ys))
    ax.plot([0, top], [0, top], color="black", linewidth=0.8, linestyle="--", label="equal length")
    for edge in metrics.get("bucket_edges", []):
        ax.axvline(edge, color="tab:gray", linewidth=0.6, alpha=0.6)
    ax.set_xlabel("baseline tokens")
    ax.set_ylabel("SPRINT sequential tokens")
    thousands(ax.xaxis)
    thousands(ax.yaxis)
    ax.set_title(f"Per problem ({metrics['runs'][0]['label']})")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    save(fig, path)
    return True


def _bar_counts(ax: Any, counter: Counter) -> None:
    keys = list(range(min(counter), max(counter) + 1))
    ax.bar(keys, [counter.get(k, 0) for k in keys], color="tab:blue")
    ax.set_xticks(keys)
    ax.grid(axis="y", alpha=0.3)


def plot_phases_histogram(metrics: dict, path: Path) -> bool:
    counter = Counter(r["phases"] for run in metrics["runs"] for r in run["problems"] if r.get("phases") is not None)
    if not counter:
        return False
    fig, ax = figure()
    _bar_counts(ax, counter)
    ax.set_xlabel("phases per problem")
    ax.set_ylabel("problems")
    ax.set_title("Phases per problem" + (f" ({len(metrics['runs'])} runs pooled)" if len(metrics["runs"]) > 1 else ""))
    save(fig, path)
    return True


def plot_prompts_per_phase(metrics: dict, path: Path) -> bool:
    counter = Counter(k for run in metrics["runs"] for r in run["problems"] for k in r.get("prompts_per_phase") or [])
    if not counter:
        return False
    fig, ax = figure()
    _bar_counts(ax, counter)
    ax.set_xlabel("prompts (parallel executions) in a phase")
    ax.set_ylabel("phases")
    ax.set_title("Prompts per phase")
    save(fig, path)
    return True


PLOTTERS: dict[str, Callable[[dict, Path], bool]] = {
    "accuracy_vs_tokens": plot_accuracy_vs_tokens,
    "reduction_by_bucket": plot_reduction_by_bucket,
    QR.FIGURE[0]: QR.plot_ratio_by_quartile,
    "tokens_scatter": plot_tokens_scatter,
    "phases_histogram": plot_phases_histogram,
    "prompts_per_phase": plot_prompts_per_phase,
}


def write_figures(metrics: dict, out_dir: Path) -> dict[str, str]:
    """Draw every figure the metrics allow; returns {name: file name relative to out_dir}."""
    made = {}
    for name, plot in PLOTTERS.items():
        path = Path(out_dir) / f"{name}.png"
        if plot(metrics, path):
            made[name] = path.name
        else:
            path.unlink(missing_ok=True)  # no stale figure from an earlier evaluation
    return made


def viewer_link(eval_dir: str | Path, runs: Iterable[str | Path] = ()) -> str | None:
    """Where an evaluation's report should link to see the runs: a viewer built around it
    (`sprint view` evaluates into OUT/evaluation), else the default viewer of its first run
    (`<run>/view/index.html`); None when there is none. A path relative to `eval_dir`."""
    eval_dir = Path(eval_dir)
    if (eval_dir.parent / VIEW_MARKER).is_file() and eval_dir.name == "evaluation":
        return f"../{VIEW_INDEX}"
    first = next(iter(runs), None)
    if first is not None:
        index = Path(first) / VIEW_FOLDER / VIEW_INDEX
        if index.is_file():
            return Path(os.path.relpath(index.resolve(), eval_dir.resolve())).as_posix()
    return None


def write_report(metrics: dict, out_dir: str | Path, plots: bool = True, viewer: str | None = None) -> dict[str, Path]:
    """Write metrics.json, table2.json, the figures and report.md into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    atomic_write(out / "metrics.json", json.dumps(metrics, indent=1, ensure_ascii=False, allow_nan=False))
    files["metrics"] = out / "metrics.json"
    if metrics.get("table2") is not None:  # the same table on its own, for scripts
        atomic_write(out / "table2.json", json.dumps(metrics["table2"], indent=1, ensure_ascii=False, allow_nan=False))
        files["table2"] = out / "table2.json"
    figures = write_figures(metrics, out) if plots else {}
    for name, file in figures.items():
        files[name] = out / file
    atomic_write(out / "report.md", render_markdown(metrics, figures, viewer))
    files["report"] = out / "report.md"
    return files


def load_metrics(path: str | Path) -> dict:
    """Read a metrics.json (or the folder holding it) back, e.g. to re-render the report."""
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.json"
    return json.loads(p.read_text(encoding="utf-8"))
