"""The arithmetic miniature's own figures: what needs the generator (a problem's depth, size and ideal
packing), printed by `sprint mini-summary` and written to OUT/miniature/miniature.md with its PNG (a folder of the
summary's own: `evaluate` owns OUT/evaluation and replaces it whole).

- the learned plans: well-formed share, the shapes that occur, plan fidelity and copies, each beside the
  demo's target (`sprint.mini.fidelity`), and where the wrong answers went;
- the equations copied from the question by the subtask's place in its round, RFT's beside SPRINT's;
- Figure 5 in miniature: phases with prompts against the problem's depth, prompts per phase against its
  size (subtasks), each model beside the ideal packing;
- Figure 6 in miniature: `evaluate`'s ratios by quartile of RFT's length (metrics.json `by_quartile`),
  with the ideal packing's own ratio in the same quartiles beside them;
- generalisation: held-out problems one round deeper or one subtask wider than any training problem
  (reported, no target), when the demo ran them (BEYOND > 0).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.core.data import iter_jsonl
from sprint.evaluation.plotting import figure, save
from sprint.evaluation.quartiles import quartile_of
from sprint.format.tokencount import load_counter
from sprint.mini.arithmetic import copy_places, tally
from sprint.mini.departure import rft_head_copies
from sprint.mini.fidelity import VERDICTS, PlanFigures, PlanReading, plan_figures, read_run, verdict
from sprint.mini.ideal import ideal
from sprint.mini.searches import ERRORS, sequential_search_errors, tally_errors

SPRINT_RUNS = {"SPRINT barrier": "sprint-barrier", "SPRINT stream": "sprint-stream"}
BEYOND_RUN = "sprint-beyond"  # scripts/mini_demo.sh with BEYOND > 0: SPRINT stream on data/test_beyond.jsonl
SUMMARY_DIR = "miniature"  # OUT/miniature: the summary's files, beside evaluate's OUT/evaluation
FIGURE5 = "figure5.png"
MINIATURE = "miniature.md"  # the sections below


@dataclass(frozen=True)
class Target:
    label: str
    value: float | None
    goal: str
    met: bool | None  # None: reported, no target

    def line(self, fmt: str = ".1%") -> str:
        shown = "–" if self.value is None else format(self.value, fmt)
        if self.met is None:
            return f"{self.label}: {shown} (reported)"
        return f"{self.label}: {shown} (target {self.goal}: {'met' if self.met else 'NOT met'})"


def plan_targets(f: PlanFigures) -> list[Target]:
    """The demo's targets for the learned plans, each with the figure it is read from."""
    shape, share = f.top_shape
    return [
        Target("well-formed trajectories", f.well_formed, ">= 95%", f.well_formed >= 0.95),
        Target(f"distinct phase counts {sorted(f.phase_counts)}", len(f.phase_counts), ">= 3", len(f.phase_counts) >= 3),
        Target(f"distinct largest widths {sorted(f.largest_widths)}", len(f.largest_widths), ">= 3",
               len(f.largest_widths) >= 3),
        Target(f"commonest shape {list(shape)}", share, "<= 40%", share <= 0.4),
        Target("plan equals the ideal packing", f.fidelity, ">= 70%", f.fidelity >= 0.7),
        Target("prompts per phase equal the ideal packing's (whatever the prompts say)", f.shape_fidelity, "", None),
        Target(f"later phases copy earlier results right ({f.uses} uses)", f.copies, ">= 90%",
               f.copies is not None and f.copies >= 0.9),
    ]


def held_out_ideals(root: Path, problems: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """id -> (ideal SPRINT sequential tokens, ideal RFT tokens), counted with the demo's tokenizer."""
    counter = load_counter(str(root / "tokenizer"))
    out = {}
    for p in problems:
        best = ideal(p["question"], counter)
        out[str(p["id"])] = (best.sprint_sequential, best.rft_tokens)
    return out


FIGURE5_AXES = {"depth": ("phases", "ideal_phases", "phases with prompts", "depth (rounds)"),
                "size": ("prompts_per_phase", "ideal_prompts_per_phase", "prompts per phase", "size (subtasks)")}


def _by(figures: PlanFigures, key: str) -> dict[int, dict[str, float]]:
    return figures.by_depth if key == "depth" else figures.by_size


def figure5_rows(figures: dict[str, PlanFigures], key: str) -> list[list[str]]:
    """Per depth (or size): problems, then each run's mean beside the ideal packing's."""
    stat, ideal_stat, _, _ = FIGURE5_AXES[key]
    first = _by(next(iter(figures.values())), key)
    return [[str(g), str(first[g]["problems"]),
             *(f"{_by(f, key).get(g, {}).get(stat, float('nan')):.2f}" for f in figures.values()),
             f"{first[g][ideal_stat]:.2f}"] for g in sorted(first)]


def plot_figure5(figures: dict[str, PlanFigures], path: Path) -> None:
    fig, _ = figure(9.0, 3.6)
    fig.clear()
    first = next(iter(figures.values()))
    for i, (key, (stat, ideal_stat, label, axis)) in enumerate(FIGURE5_AXES.items()):
        ax = fig.add_subplot(1, 2, i + 1)
        xs = sorted(_by(first, key))
        for name, f in figures.items():
            table = _by(f, key)
            mine = sorted(table)
            ax.plot(mine, [table[x][stat] for x in mine], marker="o", linestyle="-", label=name)
        ax.plot(xs, [_by(first, key)[x][ideal_stat] for x in xs], marker="o", linestyle="--", label="ideal packing")
        ax.set_xticks(xs)
        ax.set_xlabel(f"problem {axis}")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle("Figure 5 in miniature: plans against the problem's depth and size")
    save(fig, path)


def figure6_rows(metrics: dict, ideals: dict[str, tuple[int, int]]) -> list[list[str]]:
    """evaluate's quartile ratios, each quartile with the ideal packing's ratio on the same problems."""
    block = metrics.get("by_quartile") or {}
    edges = block.get("edges")
    if not edges:
        return []
    rft_tokens = {}
    for run in metrics.get("runs", []):
        for p in run.get("problems", []):
            if p.get("baseline_tokens") is not None:
                rft_tokens[str(p["id"])] = p["baseline_tokens"]
    by_quartile: dict[str, list[str]] = {"all": [i for i in rft_tokens if i in ideals]}
    for i in by_quartile["all"]:
        by_quartile.setdefault(quartile_of(rft_tokens[i], edges) or "", []).append(i)
    ratios = {q: sum(ideals[i][0] for i in ids) / sum(ideals[i][1] for i in ids) for q, ids in by_quartile.items() if ids}
    rows = []
    for comp in block.get("comparisons", []):
        if comp.get("skipped"):
            continue
        for q in [comp["overall"], *comp["quartiles"]]:
            ideal_ratio = ratios.get(q["quartile"])
            tokens, seconds = q.get("tokens") or {}, q.get("measured_seconds") or {}
            rows.append([comp["run"], q["quartile"], f"[{q['lower']:.0f}, {q['upper']:.0f}]", str(q["problems"]),
                         _ratio(tokens), "–" if ideal_ratio is None else f"{ideal_ratio:.2f}",
                         _ratio(seconds) + (f" (n={seconds['n']})" if seconds.get("n") else "")])
    return rows


def _ratio(m: dict) -> str:
    if not m or m.get("value") is None:
        return "–"
    ci = m.get("ci")
    return f"{m['value']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def copy_section(root: Path, readings: dict[str, list[PlanReading]]) -> list[str]:
    """Equations copied from the question, wrong of written, by the subtask's place in its round: RFT's after
    each `Now` line, each SPRINT run's in each prompt and at the head of each execution."""
    columns = {}
    if (root / "runs" / "rft" / "records.jsonl").is_file():
        columns["RFT"] = rft_head_copies(root / "runs" / "rft")
    for name, rs in readings.items():
        columns[f"{name}: prompts"] = tally(p for r in rs for p in r.prompts)
        columns[f"{name}: executions"] = tally(h for r in rs for h in r.heads)
    rows = [[place, *(f"{c[place][0]} of {c[place][1]}" if place in c else "–" for c in columns.values())]
            for place in copy_places()]
    return ["## Equations copied from the question, by the subtask's place in its round", "",
            "Wrong of those written: each SPRINT prompt's equation and each execution's first one against the "
            "question's line of the name the prompt gives (a prompt that gives none is not counted), and each equation "
            "RFT writes after a `Now` line.", "",
            *_table(["place", *columns], rows), ""]


def search_section(root: Path, readings: dict[str, list[PlanReading]]) -> list[str]:
    """Each subtask's search read try by try against its own first line: wrong of searched by place, then the
    first error's kind, RFT's (each `Now` line's work) beside each SPRINT run's (each execution)."""
    columns = {}
    if (root / "runs" / "rft" / "records.jsonl").is_file():
        columns["RFT"] = sequential_search_errors(root / "runs" / "rft")
    for name, rs in readings.items():
        columns[name] = tally_errors(s for r in rs for s in r.searches)
    places = [p for p in (*copy_places(), "all") if any(p in c for c in columns.values())]
    by_place = [[place, *(f"{c[place]['wrong']} of {c[place]['searches']}" if place in c else "–"
                          for c in columns.values())] for place in places]
    by_kind = [[error, *(str(c.get("all", {}).get(error, 0)) for c in columns.values())] for error in ERRORS]
    return ["## The searches, try by try", "",
            "Each subtask's work read against its own first line (the copies are counted above): searches with an "
            "error of those written, by the subtask's place in its round, then where each first went wrong.", "",
            *_table(["place", *columns], by_place), "", *_table(["first error", *columns], by_kind), ""]


def arithmetic_sections(root: Path) -> list[str]:
    """The markdown of the miniature's own figures (also printed); writes the Figure 5 PNG to OUT/miniature."""
    readings = {name: read_run(root / "runs" / folder) for name, folder in SPRINT_RUNS.items()
                if (root / "runs" / folder / "records.jsonl").is_file()}
    if not readings:
        return []
    figures = {name: plan_figures(rs) for name, rs in readings.items()}
    lines: list[str] = ["## The learned plans (held-out problems)", ""]
    for name, rs in readings.items():
        f = figures[name]
        lines.append(f"**{name}** ({f.problems} problems)")
        lines += [f"- {t.line('.1%' if isinstance(t.value, float) else 'd')}" for t in plan_targets(f)]
        counts = Counter(verdict(r) for r in rs)
        lines.append("- answers: " + "; ".join(f"{v}: {counts[v]}" for v in VERDICTS if counts[v]))
        lines.append("")
    lines += copy_section(root, readings)
    lines += search_section(root, readings)
    names = list(figures)
    lines += ["## Figure 5 in miniature: plans against the problem's depth and size", ""]
    lines += _table(["depth (rounds)", "problems", *(f"{n}: phases with prompts" for n in names), "ideal packing"],
                    figure5_rows(figures, "depth"))
    lines.append("")
    lines += _table(["size (subtasks)", "problems", *(f"{n}: prompts per phase" for n in names), "ideal packing"],
                    figure5_rows(figures, "size"))
    (root / SUMMARY_DIR).mkdir(exist_ok=True)
    plot_figure5(figures, root / SUMMARY_DIR / FIGURE5)
    lines += ["", f"![Figure 5]({FIGURE5})", ""]
    metrics_path = root / "evaluation" / "metrics.json"
    if metrics_path.is_file():
        problems = list(iter_jsonl(root / "data" / "test.jsonl"))
        rows = figure6_rows(json.loads(metrics_path.read_text()), held_out_ideals(root, problems))
        if rows:
            lines += ["## Figure 6 in miniature: SPRINT / RFT by quartile of RFT's length", ""]
            lines += _table(["method", "quartile", "RFT tokens", "problems", "sequential tokens SPRINT / RFT",
                             "ideal packing / sequential trace", "measured seconds SPRINT / RFT"], rows)
            lines += ["", "Targets: sequential tokens <= 0.5 on the longest quartile, <= 1.1 on the shortest, "
                      "<= 0.7 overall. The ideal column is what the generator built: its packed trajectory over its "
                      "sequential trace, on the same problems.", ""]
    beyond = root / "runs" / BEYOND_RUN
    if (beyond / "records.jsonl").is_file():
        rs = read_run(beyond)
        f = plan_figures(rs)
        correct = sum(r.correct for r in rs)
        lines += ["## Generalisation: one round deeper or one subtask wider than any training problem", "",
                  f"SPRINT stream on {f.problems} such problems: {correct} right; plan equals the ideal packing on "
                  f"{f.fidelity:.1%}; phases with prompts {dict(f.phase_counts)}, largest widths "
                  f"{dict(f.largest_widths)} (reported, no target).", ""]
    return lines
