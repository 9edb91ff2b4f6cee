"""Rendering of Figure 6 by quartile (metrics.json `by_quartile`) and of the plan shapes (`plan_shapes`):
report.md's tables, the viewer's (the same plain-text cells, escaped for HTML there) and the PNG.

Why apart from `report`: the cells are computed once here and shown in two places, as Table 2's
are (`table2.cells`), so the report and the viewer can never disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sprint.evaluation.plotting import figure, save
from sprint.evaluation.table2 import md_text

TITLE = "Figure 6 in miniature: by quartile of the baseline's length"
SHAPES_TITLE = "Plan shapes: phases and prompts per phase"
FIGURE = ("ratio_by_quartile", "SPRINT / baseline sequential tokens by quartile of the baseline's length")
HEADERS = ("Method", "Quartile", "Baseline tokens", "Problems", "Mean baseline tokens", "Mean SPRINT sequential tokens",
           "Sequential tokens SPRINT / baseline [95% CI]", "Measured seconds SPRINT / baseline [95% CI] (n)",
           "Modelled seconds SPRINT / baseline [95% CI] (n)")
SHAPE_HEADERS = ("Method", "Problems", "Phases with prompts: problems", "Largest phase width: problems",
                 "Distinct shapes", "Commonest shape (widths per phase): share")


def edge(x: float) -> str:
    """A token edge: whole numbers as such, else one decimal (quantiles interpolate)."""
    text = f"{x:,.1f}"
    return text[:-2] if text.endswith(".0") else text


def token_range(entry: dict) -> str:
    """`[lo, hi]` for the first quartile and for all problems, `(lo, hi]` above: upper edges are inclusive."""
    closed = entry.get("quartile") in ("all", "Q1")
    return f"{'[' if closed else '('}{edge(entry['lower'])}, {edge(entry['upper'])}]"


def ratio_cell(m: dict | None, *, with_n: bool = False) -> str:
    """`0.59 [0.55–0.63]`, `(n=12)` for seconds (only some problems may have them); `–` when none."""
    if not m or m.get("value") is None:
        return "–"
    ci = m.get("ci")
    text = f"{m['value']:.2f}" + (f" [{ci[0]:.2f}–{ci[1]:.2f}]" if ci else "")
    return text + (f" (n={m.get('n')})" if with_n else "")


def _mean(m: dict | None, side: str) -> str:
    return "–" if not m or m.get(side) is None else f"{m[side]:,.0f}"


def rows(block: dict | None) -> list[list[str]]:
    """One row per SPRINT method and quartile (its `all` row first), as plain text; skipped methods have none."""
    out = []
    for c in (block or {}).get("comparisons") or []:
        if c.get("skipped"):
            continue
        name = f"{c['run']} / {c['baseline']}"
        for entry in [c["overall"], *c["quartiles"]]:
            tokens = entry.get("tokens")
            out.append([name, entry["quartile"], token_range(entry), str(entry["problems"]), _mean(tokens, "baseline"),
                        _mean(tokens, "sprint"), ratio_cell(tokens), ratio_cell(entry.get("measured_seconds"), with_n=True),
                        ratio_cell(entry.get("modelled_seconds"), with_n=True)])
    return out


def notes(block: dict | None, modelled: str | None = None) -> list[str]:
    """What a reader needs beside the table: the edges, how cells are read, and any method skipped."""
    if not block:
        return []
    if block.get("skipped"):
        return [f"Skipped: {block['skipped']}."]
    e = block["edges"]
    lines = [f"Quartiles of the baseline's ({block['baseline']}) own length in sequential tokens over its "
             f"{block['baseline_problems']} problems: min {edge(e[0])}, Q1 {edge(e[1])}, median {edge(e[2])}, "
             f"Q3 {edge(e[3])}, max {edge(e[4])}; a problem falls in the first quartile whose upper edge it does not "
             "pass. A ratio is SPRINT's mean over the baseline's on the same problems (below 1: SPRINT is shorter or "
             "faster); measured seconds only on the n problems both runs timed alone, modelled seconds "
             f"({modelled or 'the latency model'}) under the SPRINT run's schedule."]
    for c in block.get("comparisons") or []:
        if c.get("skipped"):
            lines.append(f"{c['run']} / {c['baseline']}: skipped, {c['skipped']}.")
    return lines


def markdown_lines(block: dict | None, modelled: str | None = None) -> list[str]:
    """report.md's section body (without its heading); [] without a baseline."""
    if not block:
        return []
    table = rows(block)
    lines = []
    if table:
        lines = ["| " + " | ".join(HEADERS) + " |", "|---|---|---|" + "---:|" * (len(HEADERS) - 3)]
        lines += ["| " + " | ".join(md_text(c) for c in r) + " |" for r in table]
        lines.append("")
    return lines + [md_text(n) for n in notes(block, modelled)]


def _counts(dist: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in dist.items()) or "–"


def shape_rows(shapes: list[dict] | None) -> list[list[str]]:
    """One row per SPRINT run: the two distributions (value: problems), distinct shapes, the commonest one."""
    out = []
    for s in shapes or []:
        common = s.get("commonest_shape")
        common_text = "–" if not common else f"{common['shape']}: {100 * common['share']:.1f}% ({common['problems']})"
        out.append([s["run"], str(s["problems"]), _counts(s["phases_with_prompts"]), _counts(s["largest_phase_width"]),
                    str(s["distinct_shapes"]), common_text])
    return out


SHAPES_NOTE = ("Over the problems with a trajectory. A phase counts when it holds at least one prompt; a shape is "
               "the list of those phases' widths in order ([3, 1]: three prompts, then one).")


def shape_markdown_lines(shapes: list[dict] | None) -> list[str]:
    """report.md's plan-shape table; [] without SPRINT runs."""
    table = shape_rows(shapes)
    if not table:
        return []
    return (["| " + " | ".join(SHAPE_HEADERS) + " |", "|---|---:|---|---|---:|---|"]
            + ["| " + " | ".join(md_text(c) for c in r) + " |" for r in table] + ["", SHAPES_NOTE])


def plot_ratio_by_quartile(metrics: dict, path: Path) -> bool:
    """Bars of SPRINT / baseline sequential tokens per quartile (one bar per SPRINT method), CI whiskers, 1.0 marked."""
    block = metrics.get("by_quartile") or {}
    comps = [c for c in block.get("comparisons") or [] if not c.get("skipped")]
    if not comps:
        return False
    fig, ax = figure(6.8, 4.2)
    labels = ["all"] + [q["quartile"] for q in comps[0]["quartiles"]]
    width = 0.8 / len(comps)
    for j, c in enumerate(comps):
        entries = [c["overall"], *c["quartiles"]]
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(entries))]
        values, lo, hi = [], [], []
        for e in entries:
            t = e.get("tokens") or {}
            v, ci = t.get("value"), t.get("ci")
            values.append(0.0 if v is None else v)
            lo.append(0.0 if v is None or not ci else max(0.0, v - ci[0]))
            hi.append(0.0 if v is None or not ci else max(0.0, ci[1] - v))
        ax.bar(xs, values, width=width * 0.95, yerr=[lo, hi], capsize=3, label=str(c["run"]))
        for x, e in zip(xs, entries):  # at the foot of the bar, clear of the whiskers
            ax.annotate(f"n={e['problems']}", (x, 0), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=6,
                        color="white")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ticks = [f"{lab}\n{token_range(e)}" for lab, e in zip(labels, [comps[0]["overall"], *comps[0]["quartiles"]])]
    ax.set_xticks(list(range(len(labels))), ticks, fontsize=7)
    ax.set_xlabel(f"quartile of the baseline's ({block.get('baseline')}) length, tokens")
    ax.set_ylabel("SPRINT / baseline sequential tokens")
    ax.set_title("Sequential tokens by quartile of the baseline's length")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    save(fig, path)
    return True


def viewer_sections(metrics: dict) -> list[tuple[str, list[str], list[list[str]], list[str]]]:
    """(title, headers, rows, notes) of each table the viewer's index shows, plain text (escape them for HTML)."""
    out: list[tuple[str, list[str], list[list[str]], list[str]]] = []
    block = metrics.get("by_quartile")
    modelled: Any = (metrics.get("modelled") or {}).get("label")
    if block:
        out.append((TITLE, list(HEADERS), rows(block), notes(block, modelled)))
    shapes = shape_rows(metrics.get("plan_shapes"))
    if shapes:
        out.append((SHAPES_TITLE, list(SHAPE_HEADERS), shapes, [SHAPES_NOTE]))
    return out
