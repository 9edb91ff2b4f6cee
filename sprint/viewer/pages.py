"""The viewer's pages: the index (headline numbers, figures, one sortable row per problem) and one
page per problem (facts, question, call timelines, lengths, phases), as HTML strings.

Everything here is a function of the evaluation's metrics and the `ProblemView`s `sprint.viewer.site`
assembles; nothing is read from disk. Model text is untrusted: everything rendered is HTML-escaped,
and the only script a page loads is the viewer's own (`assets/view.js`, beside `assets/view.css`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any, Sequence

from sprint.evaluation import quartile_report as QR
from sprint.evaluation import table2 as T2
from sprint.evaluation.report import FIGURES
from sprint.format.tags import prompt_open
from sprint.format.trajectory import Trajectory
from sprint.latency.model import LatencyModel
from sprint.viewer import timeline as TL

DECODED_KEY = "sequential_decoded"  # evaluate's sequential tokens as decoded (tags included), when it gives them


@dataclass
class ProblemView:
    """One problem of one run, with everything its page and table row need."""

    id: str
    run: str  # run label
    traj: Trajectory | None
    text: str | None
    row: dict  # evaluate's per-problem result (metrics.json `problems` entry)
    timelines: list[TL.Timeline] = field(default_factory=list)
    question: str = ""
    gold: Any = None


# --------------------------------------------------------------------------- pieces


def _e(value: Any) -> str:
    return escape("–" if value is None else str(value))


def _num(value: Any, digits: int = 0) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:,.{digits}f}"


def _pct(value: Any) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{100 * value:.1f}%"


def decoded_tokens(row: dict) -> int | None:
    """Sequential tokens as decoded (tags included), when the evaluation gives them."""
    value = row.get(DECODED_KEY)
    return value if isinstance(value, (int, float)) else None


def warnings_of(row: dict, pv: ProblemView | None = None) -> list[str]:
    out = []
    if row.get("status") not in (None, "ok"):
        out.append(f"status {row.get('status')}")
    if pv is not None and pv.text is None:
        out.append("no text")
    if row.get("malformed"):
        out.append("malformed tags")
    if row.get("forced_final"):
        out.append("forced final answer")
    if row.get("answered") is False:
        out.append("no answer")
    return out


def _page(title: str, body: str, root: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title>"
            f'<link rel="stylesheet" href="{root}assets/view.css"></head>\n<body>\n{body}\n'
            f'<script src="{root}assets/view.js"></script>\n</body></html>\n')


def _mark(correct: Any) -> str:
    if correct is True:
        return '<span class="ok" title="correct">✓</span>'
    if correct is False:
        return '<span class="bad" title="wrong">✗</span>'
    return "–"


# --------------------------------------------------------------------------- the index


def _mean_time(timelines: list[TL.Timeline], sprint: bool) -> str:
    """Mean seconds per problem: to the last SPRINT call, or the baseline's reference bar."""
    if sprint:
        values, kinds = [t.total for t in timelines], {t.source for t in timelines}
    else:
        values = [b.end for t in timelines for b in t.bars if b.role == "baseline"]
        kinds = {t.baseline_source for t in timelines if t.baseline_source}
    if not values:
        return ""
    return f"{sum(values) / len(values):.2f} s ({escape('/'.join(sorted(kinds)))})"


def _table2(metrics: dict) -> str:
    """The evaluation's paper-shaped Table 2 (metrics `table2`), the same cells as report.md; empty without one."""
    table = metrics.get("table2") or {}
    rows = table.get("rows") or []
    if not rows:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in T2.headers(table))
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in T2.cells(r)) + "</tr>" for r in rows)
    return (f'<section class="table2"><h2>{escape(T2.TITLE)}</h2><table class="summary table2"><thead><tr>{head}'
            f'</tr></thead><tbody>{body}</tbody></table><p class="note">{escape(T2.NOTE)}</p></section>')


def _by_quartile(metrics: dict) -> str:
    """Figure 6 by the baseline's quartiles and the plan shapes (metrics `by_quartile`, `plan_shapes`): the same
    cells as report.md's tables (`quartile_report`); empty without them."""
    sections = []
    for title, head, rows, notes in QR.viewer_sections(metrics):
        body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        table = (f'<table class="summary"><thead><tr>{"".join(f"<th>{escape(h)}</th>" for h in head)}</tr></thead>'
                 f"<tbody>{body}</tbody></table>") if rows else ""
        kind = "quartiles" if title == QR.TITLE else "shapes"
        sections.append(f'<section class="{kind}"><h2>{escape(title)}</h2>{table}'
                        + "".join(f'<p class="note">{escape(n)}</p>' for n in notes) + "</section>")
    return "".join(sections)


def _headline(metrics: dict, views: list[list[ProblemView]], figure_files: set[str]) -> str:
    rows = []
    for key, method in (("runs", "SPRINT"), ("baselines", "baseline")):
        for ri, entry in enumerate(metrics.get(key) or []):
            s = entry.get("summary") or {}
            seconds = ""
            if key == "runs" and ri < len(views):
                seconds = _mean_time([pv.timelines[0] for pv in views[ri] if pv.timelines], sprint=True)
            elif key == "baselines" and ri == 0 and views:
                seconds = _mean_time([pv.timelines[0] for pv in views[0] if pv.timelines], sprint=False)
            rows.append(f"<tr><td>{method}</td><td>{_e(entry.get('label'))}</td><td>{_pct(s.get('accuracy'))}</td>"
                        f"<td>{_num(s.get('mean_sequential'))}</td><td>{_num(s.get('mean_total'))}</td>"
                        f"<td>{_num(s.get('mean_phases'), 1)}</td><td>{_num(s.get('mean_prompts'), 1)}</td>"
                        f"<td>{seconds or '–'}</td></tr>")
    comps = []
    for c in metrics.get("comparisons") or []:
        o = c.get("overall") or {}
        ci = o.get("reduction_ci")
        ci_s = f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else ""
        p = (c.get("mcnemar") or {}).get("p_value")
        comps.append(f"<li>{_e(c.get('run'))} vs {_e(c.get('baseline'))}: sequential-token reduction "
                     f"<b>{_pct(o.get('reduction'))}</b>{ci_s} over {_e(c.get('paired'))} paired problems; "
                     f"McNemar p = {_num(p, 3)}</li>")
    figures = [f'<figure><a href="evaluation/{name}.png"><img src="evaluation/{name}.png" alt="{escape(caption)}" '
               f'loading="lazy"></a><figcaption>{escape(caption)}</figcaption></figure>'
               for name, caption in FIGURES.items() if name in figure_files]
    return ("<section class=\"headline\"><h2>Evaluation</h2><table class=\"summary\"><thead><tr><th>method</th>"
            "<th>run</th><th>accuracy</th><th>mean sequential tokens</th><th>mean total tokens</th><th>phases</th>"
            "<th>prompts</th><th>mean time / problem</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
            + (f"<ul class=\"comparisons\">{''.join(comps)}</ul>" if comps else "")
            + (f"<div class=\"figures\">{''.join(figures)}</div>" if figures else "") + "</section>")


COLUMNS = (  # key, header, type, title
    ("id", "id", "str", "problem id"),
    ("correct", "correct", "num", "graded answer"),
    ("phases", "phases", "num", "phases of the trajectory"),
    ("prompts", "prompts", "num", "prompts (parallel executions) over all phases"),
    ("seq", "seq. tokens", "num", "sequential tokens, tags excluded (the paper's definition)"),
    ("seqdec", "seq. as decoded", "num", "sequential tokens as decoded, tags included"),
    ("base", "baseline tokens", "num", "the sequential baseline's output tokens"),
    ("red", "reduction", "num", "1 − SPRINT sequential tokens / baseline tokens"),
    ("time", "time (s)", "num", "end of the last call: recorded, else modelled (barrier)"),
    ("warn", "status / warnings", "str", "failed calls, malformed tags, forced final answers"),
)


def _row(pv: ProblemView, page: str) -> str:
    r = pv.row
    seq, base, dec = r.get("sequential"), r.get("baseline_tokens"), decoded_tokens(r)
    red = 1 - seq / base if isinstance(seq, (int, float)) and isinstance(base, (int, float)) and base > 0 else None
    t = pv.timelines[0].total if pv.timelines else None
    warns = warnings_of(r, pv)
    correct = r.get("correct")

    def cell(v: Any, shown: str) -> str:
        return f'<td data-v="{escape("" if v is None else str(v))}">{shown}</td>'

    cells = [f'<td data-v="{escape(pv.id)}"><a href="problems/{escape(page)}">{escape(pv.id)}</a></td>',
             cell(None if correct is None else int(bool(correct)), _mark(correct)),
             cell(r.get("phases"), _num(r.get("phases"))), cell(r.get("prompts"), _num(r.get("prompts"))),
             cell(seq, _num(seq)), cell(dec, _num(dec)), cell(base, _num(base)),
             cell(None if red is None else round(red, 5), _pct(red)),
             cell(None if t is None else round(t, 4), "–" if t is None else f"{t:.2f}"),
             cell(", ".join(warns), escape(", ".join(warns)) or "ok")]
    flags = (f'data-correct="{int(correct is True)}" data-wrong="{int(correct is not True)}" '
             f'data-warn="{int(bool(warns))}"')
    return f"<tr {flags}>{''.join(cells)}</tr>"


def index_page(metrics: dict, views: list[list[ProblemView]], pages: dict[str, str], runs: Sequence[str],
               baseline: Sequence[str], out: Path) -> str:
    """The site's front page: the evaluation's Table 2, headline and figures, then one sortable table per run."""
    figure_files = {p.stem for p in (out / "evaluation").glob("*.png")}
    head = "".join(f'<th data-key="{k}" data-type="{t}" title="{escape(title)}">{escape(h)}</th>'
                   for k, h, t, title in COLUMNS)
    tables = []
    for run_views in views:
        if not run_views:
            continue
        label = run_views[0].run
        body = "".join(_row(pv, pages[pv.id]) for pv in run_views)
        tables.append(f'<h3>{escape(label)} <small>({len(run_views)} problems)</small></h3>'
                      f'<table class="problems" data-run="{escape(label)}"><thead><tr>{head}</tr></thead>'
                      f"<tbody>{body}</tbody></table>")
    note = ""
    if any(t.source == "modelled" for vs in views for pv in vs for t in pv.timelines):
        note = ('<p class="note">Some runs recorded no call times: their times are modelled from token counts '
                "by <code>sprint.latency</code> (one problem alone on the GPU), not measured.</p>")
    sources = ", ".join(escape(r) for r in runs) + (f"; baseline {', '.join(escape(b) for b in baseline)}"
                                                     if baseline else "")
    body = (f"<header><h1>SPRINT runs</h1><p class=\"sub\">{sources} · task {_e(metrics.get('task'))} · "
            f"tokens: {_e((metrics.get('tokenizers') or {}).get('planner'))}</p></header>"
            + _table2(metrics) + _headline(metrics, views, figure_files) + _by_quartile(metrics)
            + '<section><h2>Problems</h2><div class="controls"><input id="q" type="search" '
              'placeholder="filter rows (id, warning, …)" aria-label="filter rows">'
              '<select id="show" aria-label="show"><option value="all">all</option><option value="correct">correct'
              '</option><option value="wrong">wrong</option><option value="warn">with warnings</option></select>'
              '<span id="count"></span></div>' + note + "".join(tables) + "</section>")
    return _page("SPRINT runs", body, "")


# --------------------------------------------------------------------------- a problem's page


def plan_html(phase: Any) -> str:
    """A plan with its prompts highlighted and numbered (offsets from the trajectory model)."""
    parts, pos = [], 0
    plan = phase.plan
    for pr in phase.prompts:
        start = plan.rfind(prompt_open(pr.name), 0, pr.end)
        start = start if start >= pos else pos
        parts.append(escape(plan[pos:start]))
        parts.append(f'<span class="prompt" id="prompt-{escape(pr.name)}"><span class="pnum">{escape(pr.name)}</span> '
                     f"{escape(pr.text)}</span>")
        pos = pr.end
    parts.append(escape(plan[pos:]))
    return "".join(parts)


def _phases(pv: ProblemView) -> str:
    if pv.traj is None:
        return '<p class="note">No trajectory text was recorded for this problem.</p>'
    blocks = []
    for ph in pv.traj.phases:
        execs = "".join(f'<details class="exec" open><summary>execution {escape(e.name)}</summary>'
                        f'<pre class="text">{escape(e.text)}</pre></details>' for e in ph.executions)
        blocks.append(f'<details class="phase" open><summary>Phase {ph.number} · {len(ph.prompts)} prompt(s)</summary>'
                      f'<div class="cols"><div><h4>plan</h4><pre class="text plan">{plan_html(ph)}</pre></div>'
                      f"<div><h4>executions</h4>{execs or '<p class=note>No prompt to execute.</p>'}</div></div></details>")
    final = pv.traj.final_answer
    blocks.append('<h3>Final answer</h3><pre class="text final">' + (escape(final) if final else "(none)") + "</pre>")
    return "".join(blocks)


def _length_bars(views: list[ProblemView], base_row: dict | None) -> str:
    """Baseline output tokens against each run's critical path in tokens (sequential tokens)."""
    items = [(f"{pv.run}: SPRINT sequential (critical path)", pv.row.get("sequential"), "sprint") for pv in views]
    items += [(f"{pv.run}: SPRINT total generated", pv.row.get("total"), "total") for pv in views[:1]]
    if base_row:
        items.append(("baseline output (sequential)", base_row.get("sequential"), "baseline"))
    items = [(n, v, c) for n, v, c in items if isinstance(v, (int, float))]
    if not items:
        return ""
    return TL.length_svg(items)


def _timelines(views: list[ProblemView], model: LatencyModel) -> str:
    tls = [t for pv in views for t in pv.timelines]
    if not tls:
        return '<p class="note">No timeline: the trajectory has no phases and no calls were recorded.</p>'
    scale = max(t.span for t in tls) or 1.0
    parts = []
    if any(t.source == "modelled" for t in tls):
        parts.append(f'<p class="note">No call times were recorded for this run (e.g. the authors\' logs): the '
                     f"timeline is <b>modelled from token counts</b> by <code>sprint.latency</code>, one problem "
                     f"alone on the GPU ({escape(model.describe())}), not measured.</p>")
    for t in tls:
        crit = " → ".join(b.lane for b in t.critical)
        parts.append(f'<figure class="tl"><figcaption><b>{escape(t.label)}</b>: {t.total:.2f} s to the last call; '
                     f"critical path {escape(crit) or '–'}</figcaption>{TL.svg(t, scale)}</figure>")
    by_schedule = {t.schedule: t for t in tls if t.schedule and t.source == tls[0].source}
    if "barrier" in by_schedule and "stream" in by_schedule:
        b, s = by_schedule["barrier"].total, by_schedule["stream"].total
        if b > 0:
            word = "earlier" if b >= s else "later"
            parts.append(f'<p class="diff">stream ends {abs(b - s):.2f} s {word} than barrier '
                         f"({100 * abs(b - s) / b:.1f}% of barrier's {b:.2f} s)</p>")
    parts.append('<p class="legend"><span class="key planner"></span>planner <span class="key executor"></span>executor '
                 '<span class="key final"></span>forced final <span class="key baseline"></span>baseline (sequential) '
                 '<span class="key crit"></span>critical path <span class="key discarded"></span>redrawn / discarded</p>')
    return "".join(parts)


def problem_page(views: list[ProblemView], base_row: dict | None, base_text: str | None,
                 nav: tuple[str | None, str | None], model: LatencyModel) -> str:
    """One problem's page: every run's facts, question, timelines, lengths and phases; the baseline's output."""
    first = views[0]
    facts = "".join(
        f"<tr><td>{escape(pv.run)}</td><td>{_mark(pv.row.get('correct'))}</td><td>{_e(pv.row.get('predicted'))}</td>"
        f"<td>{_num(pv.row.get('phases'))}</td><td>{_num(pv.row.get('prompts'))}</td>"
        f"<td>{_num(pv.row.get('sequential'))}</td><td>{_num(decoded_tokens(pv.row))}</td>"
        f"<td>{escape(', '.join(warnings_of(pv.row, pv))) or 'ok'}</td></tr>" for pv in views)
    if base_row:
        facts += (f"<tr><td>baseline</td><td>{_mark(base_row.get('correct'))}</td><td>{_e(base_row.get('predicted'))}</td>"
                  f"<td>–</td><td>–</td><td>{_num(base_row.get('sequential'))}</td><td>–</td>"
                  f"<td>{escape(', '.join(warnings_of(base_row))) or 'ok'}</td></tr>")
    prev_a = f'<a href="{escape(nav[0])}">← previous</a>' if nav[0] else ""
    next_a = f'<a href="{escape(nav[1])}">next →</a>' if nav[1] else ""
    runs, shown = [], {}
    for k, pv in enumerate(views):  # a replay of the same recording has the same text: show it once
        body = (f'<p class="note">The same trajectory as {escape(shown[pv.text])}.</p>'
                if pv.text is not None and pv.text in shown else _phases(pv))
        shown.setdefault(pv.text, pv.run)
        runs.append(f'<details class="run" {"open" if k == 0 else ""}><summary>Phases — {escape(pv.run)}</summary>'
                    f"{body}</details>")
    baseline = ""
    if base_text is not None:
        baseline = ('<h2>Baseline output</h2><details class="baseline"><summary>the sequential model\'s generation '
                    f"({len(base_text):,} characters)</summary><pre class=\"text\">{escape(base_text)}</pre></details>")
    body = (f'<nav><a href="../index.html">↑ all problems</a> {prev_a} {next_a}</nav>'
            f"<h1>Problem {escape(first.id)}</h1>"
            '<table class="summary"><thead><tr><th>run</th><th>correct</th><th>answer</th><th>phases</th><th>prompts</th>'
            f"<th>seq. tokens</th><th>seq. as decoded</th><th>status / warnings</th></tr></thead><tbody>{facts}</tbody></table>"
            f'<p class="gold">gold answer: <code>{_e(first.gold)}</code></p>'
            f'<h2>Question</h2><pre class="text question">{escape(first.question)}</pre>'
            f"<h2>Timeline</h2>{_timelines(views, model)}"
            f"<h2>Length: baseline vs SPRINT</h2>{_length_bars(views, base_row)}"
            f"<h2>Phases</h2>{''.join(runs)}{baseline}")
    return _page(f"SPRINT problem {first.id}", body, "../")
