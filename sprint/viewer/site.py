"""`sprint view`: a static HTML viewer of SPRINT runs — a problem table, phases, call timelines.

Reading a run as raw `.txt` trajectories and a markdown report hides where the time goes. The
viewer writes a self-contained folder (no server, no network, no CDN: it opens from `file://`):

- `index.html`: the evaluation's headline numbers and plots, then one row per problem (id,
  correct, phases, prompts, sequential tokens — tags excluded, and as decoded when the evaluation
  gives it — baseline tokens, reduction, time, warnings), sortable and filterable by a few lines
  of plain JavaScript (`#q=…&show=wrong&sort=seq&desc=1` in the URL sets them);
- `problems/<id>.html`: the question, each phase's plan (prompts highlighted and numbered) beside
  its executions, the answer and gold, and a Gantt chart of every model call with the critical
  path highlighted (`sprint.viewer.timeline`), the baseline's one call below it, several runs (barrier
  vs stream) on one time scale. Runs without recorded call times get a timeline modelled from
  token counts by `sprint.timing.latency`, and say so.

Numbers come from `sprint.evaluation.evaluate` (run into OUT/evaluation, or an existing evaluation passed with
`--evaluation`), texts from its run loader, trajectories from `sprint.format.trajectory`. Model text is
untrusted: everything rendered is HTML-escaped.

    python -m sprint view RUN [RUN ...] [--baseline RUN] [--gold CSV] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any, Iterable

from sprint.viewer import timeline as TL
from sprint.core.data import safe_id
from sprint.core.errors import UserError
from sprint.timing.latency import SCHEDULES, LatencyModel
from sprint.core.options import HelpFormatter, add_options, config_from, option
from sprint.evaluation.report import FIGURES
from sprint.evaluation.runs import load_gold, load_run
from sprint.tasks.registry import TaskChoices, get_task
from sprint.format.trajectory import Trajectory, parse

log = logging.getLogger(__name__)

DEFAULT_TOKENIZER = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"  # SPRINT's base model, as evaluate counts
DECODED_KEY = "sequential_decoded"  # evaluate's sequential tokens as decoded (tags included), when it gives them


@dataclass
class ViewConfig:
    """What to show and where; the flags of `sprint view`."""

    runs: list[str] = option(default_factory=list, help="SPRINT run folders (several: seeds or schedules, "
                             "shown side by side) or folders of the authors' trajectory .txt files", cli=False)
    baseline: list[str] = option(default_factory=list, help="sequential-baseline run folder(s)", cli=False)
    gold: str | None = option(None, "gold answers: CSV with id,answer or a dataset file (as for evaluate)")
    task: str | None = option(None, "grading rule (default: from the run's manifest, else math)", choices=TaskChoices())
    planner_tokenizer: str = option(DEFAULT_TOKENIZER, "tokenizer for token counts (hub id or local folder)")
    executor_tokenizer: str | None = option(None, "executor tokenizer (default: the planner's)")
    out: str | None = option(None, "site folder (default: <first run>/view)")
    evaluation: str | None = option(None, "reuse this evaluation folder (metrics.json + plots) instead of "
                                    "evaluating again into OUT/evaluation")
    time_scale: float = option(1.0, "recorded call times are divided by this: a replay server run with "
                               "--time-scale 0.1 then reads in simulated seconds")
    bootstrap: int = option(1000, "bootstrap resamples of the evaluation's CIs (fewer = faster; 0 = none)")
    plots: bool = option(True, "skip the evaluation's PNG figures", flags=("--no-plots",))
    timing: str | None = option(None, "a `sprint time-replay` output folder: its measured calls are drawn "
                                "as extra timelines (seconds on a real engine)")


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


@dataclass
class ViewResult:
    index: Path
    pages: int
    seconds: float
    bytes: int
    steps: dict[str, float] = field(default_factory=dict)  # seconds per step: evaluation, timelines, pages


# --------------------------------------------------------------------------- loading


def _read_calls(folder: Path) -> dict[str, dict]:
    """{safe id: record} of a run folder's records.jsonl (the last record of an id wins), for call times."""
    path = folder / "records.jsonl"
    out: dict[str, dict] = {}
    if not path.is_file():
        return out
    with open(path, "rb") as f:
        for raw in f:
            try:
                rec = json.loads(raw.decode("utf-8", errors="replace"))
            except json.JSONDecodeError:
                continue  # a half-written last line
            if isinstance(rec, dict) and "id" in rec and isinstance(rec.get("calls"), list):
                out[safe_id(rec["id"])] = rec
    return out


def _schedule(manifest: dict) -> str | None:
    cfg = manifest.get("config") if isinstance(manifest, dict) else None
    value = cfg.get("schedule") if isinstance(cfg, dict) else None
    return value if value in SCHEDULES else None


def evaluation_of(cfg: ViewConfig, out: Path) -> tuple[dict, Path]:
    """The metrics dict and the folder holding its plots: reused, or computed into OUT/evaluation."""
    if cfg.evaluation:
        folder = Path(cfg.evaluation)
        if not (folder / "metrics.json").is_file():
            raise UserError(f"{folder} holds no metrics.json; pass an evaluation folder or leave out --evaluation")
        from sprint.evaluation.report import load_metrics

        return load_metrics(folder), folder
    from sprint.evaluation.evaluate import evaluate

    ev = evaluate(cfg.runs, cfg.baseline or None, gold=cfg.gold, task=cfg.task,
                  planner_tokenizer=cfg.planner_tokenizer, executor_tokenizer=cfg.executor_tokenizer,
                  out_dir=str(out / "evaluation"), resamples=cfg.bootstrap, plots=cfg.plots)
    for line in ev.warnings:
        log.warning("%s", line)
    return ev.metrics, out / "evaluation"


# --------------------------------------------------------------------------- building


def build(cfg: ViewConfig) -> ViewResult:
    """Write the site; returns where, how many pages, how long it took and its size."""
    t0 = time.perf_counter()
    if not cfg.runs:
        raise UserError("no run to view; pass at least one run folder")
    if cfg.time_scale <= 0:
        raise UserError(f"--time-scale must be above 0, got {cfg.time_scale}")
    loaded = [r for p in cfg.runs for r in load_run(p)]
    sprint_runs = [r for r in loaded if r.mode == "sprint"]
    base_runs = [r for p in cfg.baseline for r in load_run(p)] + [r for r in loaded if r.mode == "baseline"]
    if not sprint_runs:
        raise UserError(f"{', '.join(cfg.runs)} holds no SPRINT trajectories; pass a SPRINT run folder")
    out = Path(cfg.out) if cfg.out else sprint_runs[0].path / "view"
    out.mkdir(parents=True, exist_ok=True)
    _static(out)
    steps = {"loading": time.perf_counter() - t0}
    metrics, eval_dir = evaluation_of(cfg, out)
    steps["evaluation"] = time.perf_counter() - t0 - sum(steps.values())
    if cfg.gold:  # the evaluation read the gold file for its own copy of the runs; the pages show it too
        gold = load_gold(cfg.gold, get_task(metrics.get("task") or "math"))
        for run in sprint_runs:
            for prob in run.problems:
                prob.gold = gold.get(prob.id, prob.gold)
    model = LatencyModel()
    views = _views(cfg, sprint_runs, metrics, model)
    base_rows = {r["id"]: r for r in metrics["baselines"][0]["problems"]} if metrics.get("baselines") else {}
    _add_baseline(cfg, views, base_rows, _read_calls(base_runs[0].path) if base_runs else {}, model)
    measured = TL.from_timing(cfg.timing) if cfg.timing else {}
    for pv in views[0]:  # on the first run's part of each page: one clock for all measured schedules
        pv.timelines += measured.get(pv.id, [])
    steps["timelines"] = time.perf_counter() - t0 - sum(steps.values())

    (out / "problems").mkdir(exist_ok=True)
    for stale in (out / "problems").glob("*.html"):
        stale.unlink()
    _assets(out, eval_dir, metrics)
    base_texts = {p.id: p.text for p in (base_runs[0].problems if base_runs else [])}
    pages = _page_names([pv.id for vs in views for pv in vs])
    ids = list(pages)
    by_id: dict[str, list[ProblemView]] = {}
    for pv in (pv for vs in views for pv in vs):
        by_id.setdefault(pv.id, []).append(pv)
    for k, pid in enumerate(ids):
        nav = (pages[ids[k - 1]] if k else None, pages[ids[k + 1]] if k + 1 < len(ids) else None)
        html = problem_page(by_id[pid], base_rows.get(pid), base_texts.get(pid), nav, model)
        (out / "problems" / pages[pid]).write_text(html, encoding="utf-8")
    index = out / "index.html"
    index.write_text(index_page(metrics, views, pages, cfg, out), encoding="utf-8")
    steps["pages"] = time.perf_counter() - t0 - sum(steps.values())
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return ViewResult(index, len(ids), time.perf_counter() - t0, size, {k: round(v, 3) for k, v in steps.items()})


def _views(cfg: ViewConfig, sprint_runs: list, metrics: dict, model: LatencyModel) -> list[list[ProblemView]]:
    """Per SPRINT run, its problems with their evaluation rows and timelines (recorded, else modelled)."""
    entries = metrics.get("runs") or []
    views: list[list[ProblemView]] = []
    need_model: list[tuple[ProblemView, Trajectory]] = []
    for ri, run in enumerate(sprint_runs):
        records = _read_calls(run.path)
        schedule = _schedule(run.manifest)
        label = entries[ri]["label"] if ri < len(entries) else run.label
        rows = {r["id"]: r for r in entries[ri]["problems"]} if ri < len(entries) else {}
        run_views = []
        for prob in run.problems:
            traj = parse(prob.text, strict=False) if prob.text else None
            rec = records.get(prob.id)
            question = (traj.question if traj else "") or str((rec or {}).get("question") or "")
            pv = ProblemView(prob.id, label, traj, prob.text, rows.get(prob.id, {"id": prob.id}), question=question,
                             gold=prob.gold)
            if rec and rec["calls"]:
                start = rec.get("start") if isinstance(rec.get("start"), (int, float)) else None
                name = f"{label} — recorded" + (f", {schedule} schedule" if schedule else "")
                pv.timelines.append(TL.from_calls(rec["calls"], name, origin=start, schedule=schedule,
                                                  time_scale=cfg.time_scale))
            elif traj is not None and traj.phases:
                need_model.append((pv, traj))
            run_views.append(pv)
        views.append(run_views)
    if need_model:
        paths = TL.modelled_paths([t for _, t in need_model], cfg.planner_tokenizer, model)
        for (pv, _), by_schedule in zip(need_model, paths):
            pv.timelines = [TL.from_path(by_schedule[s], f"{pv.run} — modelled, {s} schedule") for s in SCHEDULES]
    return views


def _add_baseline(cfg: ViewConfig, views: list[list[ProblemView]], base_rows: dict, base_calls: dict,
                  model: LatencyModel) -> None:
    """The baseline's one call as a reference bar under every timeline of its problem."""
    if not base_rows:
        return
    q_tokens = _question_tokens(cfg.planner_tokenizer, [pv for vs in views for pv in vs])
    for pv in (pv for vs in views for pv in vs):
        seconds, how = _baseline_seconds(pv, base_rows, base_calls, model, q_tokens, cfg.time_scale)
        pv.timelines = [TL.with_baseline(t, seconds, (base_rows.get(pv.id) or {}).get("sequential"))
                        for t in pv.timelines]
        for t in pv.timelines:
            t.baseline_source = how
            t.label += f" · baseline {how}" if how else ""


def _question_tokens(tokenizer: str, views: list[ProblemView]) -> dict[str, int]:
    from sprint.evaluation.evaluate import batch_counts

    table = batch_counts(tokenizer, [pv.question for pv in views if pv.question])
    return {pv.id: table.get(pv.question, 0) for pv in views}


def _baseline_seconds(pv: ProblemView, base_rows: dict, base_calls: dict, model: LatencyModel,
                      q_tokens: dict[str, int], time_scale: float) -> tuple[float | None, str]:
    """The baseline's time for this problem: its recorded call, else the latency model on its tokens."""
    rec = base_calls.get(pv.id)
    calls = [c for c in (rec or {}).get("calls", []) if isinstance(c, dict) and not c.get("error")
             and isinstance(c.get("start"), (int, float)) and isinstance(c.get("end"), (int, float))]
    recorded = any(t.source == "recorded" for t in pv.timelines)
    if calls and recorded:
        c = calls[-1]
        return (c["end"] - c["start"]) / time_scale, "recorded"
    tokens = (base_rows.get(pv.id) or {}).get("sequential")
    if isinstance(tokens, int):
        return model.sequential_time(tokens, q_tokens.get(pv.id, 0)), "modelled"
    return None, ""


def _page_names(ids: Iterable[str]) -> dict[str, str]:
    """A distinct file name per id (case-insensitive file systems included)."""
    names: dict[str, str] = {}
    used: set[str] = set()
    for pid in ids:
        if pid in names:
            continue
        base = safe_id(pid)
        name, n = f"{base}.html", 1
        while name.lower() in used:
            n += 1
            name = f"{base}-{n}.html"
        used.add(name.lower())
        names[pid] = name
    return names


def _static(out: Path) -> None:
    """The stylesheet and the script (written first: they also mark the folder as a viewer's)."""
    (out / "assets").mkdir(parents=True, exist_ok=True)
    (out / "assets" / "view.css").write_text(CSS, encoding="utf-8")
    (out / "assets" / "view.js").write_text(JS, encoding="utf-8")


def viewer_link(eval_dir: str | Path, runs: Iterable[str | Path] = ()) -> str | None:
    """Where an evaluation's report should link to see the runs: a viewer built around it
    (`sprint view` evaluates into OUT/evaluation), else the default viewer of its first run
    (`<run>/view/index.html`); None when there is none. A path relative to `eval_dir`."""
    eval_dir = Path(eval_dir)
    if (eval_dir.parent / "assets" / "view.js").is_file() and eval_dir.name == "evaluation":
        return "../index.html"
    first = next(iter(runs), None)
    if first is not None:
        index = Path(first) / "view" / "index.html"
        if index.is_file():
            return Path(os.path.relpath(index.resolve(), eval_dir.resolve())).as_posix()
    return None


def _assets(out: Path, eval_dir: Path, metrics: dict) -> None:
    """The evaluation's figures, copied in so the folder stands alone."""
    target = out / "evaluation"
    if eval_dir.resolve() != target.resolve():
        target.mkdir(exist_ok=True)
        for png in eval_dir.glob("*.png"):
            shutil.copyfile(png, target / png.name)


# --------------------------------------------------------------------------- HTML pieces


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


def index_page(metrics: dict, views: list[list[ProblemView]], pages: dict[str, str], cfg: ViewConfig,
               out: Path) -> str:
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
                "by <code>sprint.timing.latency</code> (default latency model), not measured.</p>")
    sources = ", ".join(escape(r) for r in cfg.runs) + (f"; baseline {', '.join(escape(b) for b in cfg.baseline)}"
                                                         if cfg.baseline else "")
    body = (f"<header><h1>SPRINT runs</h1><p class=\"sub\">{sources} · task {_e(metrics.get('task'))} · "
            f"tokens: {_e((metrics.get('tokenizers') or {}).get('planner'))}</p></header>"
            + _headline(metrics, views, figure_files)
            + '<section><h2>Problems</h2><div class="controls"><input id="q" type="search" '
              'placeholder="filter rows (id, warning, …)" aria-label="filter rows">'
              '<select id="show" aria-label="show"><option value="all">all</option><option value="correct">correct'
              '</option><option value="wrong">wrong</option><option value="warn">with warnings</option></select>'
              '<span id="count"></span></div>' + note + "".join(tables) + "</section>")
    return _page("SPRINT runs", body, "")


def plan_html(phase: Any) -> str:
    """A plan with its prompts highlighted and numbered (offsets from the trajectory model)."""
    parts, pos = [], 0
    plan = phase.plan
    for pr in phase.prompts:
        start = plan.rfind(f"<prompt_{pr.name}>", 0, pr.end)
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
                     f"timeline is <b>modelled from token counts</b> by <code>sprint.timing.latency</code> "
                     f"({model.s_per_token * 1000:g} ms per token, prefill {model.ttft_base_s * 1000:g} ms + "
                     f"{model.ttft_per_prompt_token_s * 1000:g} ms per prompt token), not measured.</p>")
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


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1200px;padding:12px 20px;color:#222}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:22px 0 8px;border-bottom:1px solid #ddd}h3{font-size:15px}
.sub,.note,figcaption{color:#555}.note{background:#fff8e1;padding:6px 10px;border-left:3px solid #f0b400}
table{border-collapse:collapse;margin:6px 0}th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th:first-child,td:first-child,td:last-child,th:last-child{text-align:left}
table.problems th{cursor:pointer;user-select:none;background:#f4f6f8;position:sticky;top:0}
th[aria-sort=ascending]::after{content:" ▲"}th[aria-sort=descending]::after{content:" ▼"}
tr:hover td{background:#f7fbff}.ok{color:#1a7f37;font-weight:bold}.bad{color:#c0392b;font-weight:bold}
.controls{display:flex;gap:10px;align-items:center;margin:6px 0}#q{width:320px;padding:4px}
.figures{display:grid;grid-template-columns:repeat(5,1fr);gap:8px}.figures img{width:100%;border:1px solid #ddd}
figure{margin:0}
pre.text{white-space:pre-wrap;word-break:break-word;background:#fafafa;border:1px solid #eee;padding:8px;margin:4px 0;
max-height:480px;overflow:auto;font:12.5px/1.4 ui-monospace,Menlo,Consolas,monospace}
.prompt{background:#fff0c2;border:1px solid #e3c35a;border-radius:3px;padding:0 2px}
.pnum{background:#b07d00;color:#fff;border-radius:3px;padding:0 4px;margin-right:3px;font-weight:bold}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:12px}details{margin:6px 0}summary{cursor:pointer;font-weight:600}
details.phase{border:1px solid #e3e3e3;border-radius:4px;padding:4px 8px}h4{margin:4px 0;color:#666}
svg text{font:11px system-ui,sans-serif;fill:#333}svg .lane{text-anchor:end}svg .ticklabel{text-anchor:middle;fill:#777}
svg .tick{stroke:#e5e5e5}svg .stripe{fill:#f6f7f9}
.bar{stroke:none;opacity:.8}.bar.planner,.key.planner{fill:#4a6fa5;background:#4a6fa5}
.bar.executor,.key.executor{fill:#e39b3b;background:#e39b3b}.bar.final,.key.final{fill:#3f9a5b;background:#3f9a5b}
.bar.baseline,.key.baseline,.len.baseline{fill:#8a8f98;background:#8a8f98}.len.sprint{fill:#4a6fa5}.len.total{fill:#b9c7dd}
.bar.crit{opacity:1;stroke:#c0392b;stroke-width:1.6}.key.crit{background:#fff;border:2px solid #c0392b}
.bar.discarded,.key.discarded{opacity:.22;stroke:#555;stroke-dasharray:2 2;background:#ccc}
.critline{fill:none;stroke:#c0392b;stroke-width:1;stroke-dasharray:3 2;opacity:.7}
.key{display:inline-block;width:14px;height:10px;margin:0 4px 0 12px;vertical-align:middle}
figure.tl{margin:8px 0}.diff{font-weight:bold}nav a{margin-right:14px}
"""

JS = """
(function () {
  "use strict";
  var tables = Array.prototype.slice.call(document.querySelectorAll("table.problems"));
  var q = document.getElementById("q"), show = document.getElementById("show"), count = document.getElementById("count");
  if (!tables.length || !q) return;
  function rows(t) { return Array.prototype.slice.call(t.tBodies[0].rows); }
  function apply() {
    var needle = q.value.trim().toLowerCase(), mode = show.value, shown = 0, total = 0;
    tables.forEach(function (t) {
      rows(t).forEach(function (tr) {
        var ok = (!needle || tr.textContent.toLowerCase().indexOf(needle) >= 0) && (mode === "all" || tr.getAttribute("data-" + mode) === "1");
        tr.hidden = !ok; total += 1; if (ok) shown += 1;
      });
    });
    count.textContent = shown + " of " + total + " rows shown";
  }
  function sortBy(t, col, desc) {
    var th = t.tHead.rows[0].cells[col], num = th.getAttribute("data-type") === "num";
    var list = rows(t).map(function (tr, i) { return [tr.cells[col].getAttribute("data-v"), i, tr]; });
    list.sort(function (a, b) {
      var x = a[0], y = b[0];
      if (x === "" && y !== "") return 1; if (y === "" && x !== "") return -1;
      var c = num ? (+x) - (+y) : x.localeCompare(y, undefined, {numeric: true});
      return (desc ? -c : c) || a[1] - b[1];
    });
    list.forEach(function (e) { t.tBodies[0].appendChild(e[2]); });
    Array.prototype.forEach.call(t.tHead.rows[0].cells, function (c) { c.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", desc ? "descending" : "ascending");
  }
  function sortKey(key, desc) {
    tables.forEach(function (t) {
      Array.prototype.forEach.call(t.tHead.rows[0].cells, function (c, i) { if (c.getAttribute("data-key") === key) sortBy(t, i, desc); });
    });
  }
  tables.forEach(function (t) {
    Array.prototype.forEach.call(t.tHead.rows[0].cells, function (th) {
      th.addEventListener("click", function () { sortKey(th.getAttribute("data-key"), th.getAttribute("aria-sort") === "ascending"); });
    });
  });
  q.addEventListener("input", apply); show.addEventListener("change", apply);
  var hash = {};
  location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
    var i = kv.indexOf("="); if (i > 0) hash[decodeURIComponent(kv.slice(0, i))] = decodeURIComponent(kv.slice(i + 1));
  });
  if (hash.q) q.value = hash.q;
  if (hash.show) show.value = hash.show;
  if (hash.sort) sortKey(hash.sort, hash.desc === "1");
  apply();
})();
"""


# --------------------------------------------------------------------------- CLI


def _main(args: argparse.Namespace) -> int:
    cfg = config_from(ViewConfig, args)
    result = build(cfg)
    print(f"{result.pages} problem pages, {result.bytes / 1e6:.1f} MB, in {result.seconds:.1f} s")
    print(f"open {result.index.resolve().as_uri()}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "view", formatter_class=HelpFormatter,
        help="write a static HTML viewer of runs: problem table, phases, call timelines",
        description=__doc__.split("\n\n")[0] + "\n\nThe folder opens from file:// with no server and no network.",
    )
    fields = {f.name: f for f in ViewConfig.__dataclass_fields__.values()}
    p.add_argument("runs", nargs="+", metavar="RUN", help=fields["runs"].metadata["help"])
    p.add_argument("--baseline", nargs="+", default=[], metavar="RUN", help=fields["baseline"].metadata["help"])
    add_options(p, ViewConfig)
    p.set_defaults(func=_main)
