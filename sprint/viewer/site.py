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
  token counts by `sprint.latency`, and say so.

The runs are read once (`sprint.evaluation.runs`), handed to `sprint.evaluation.evaluate` (run into
OUT/evaluation, or an existing evaluation passed with `--evaluation`), and the pages are built on what
it returns: its metrics, the runs with their calls, and each trajectory as it parsed it. This module
assembles the site; `sprint.viewer.pages` writes the HTML (everything rendered is escaped) and
`assets/` holds the stylesheet and the script, shipped as package data.

    python -m sprint view RUN [RUN ...] [--baseline RUN] [--gold CSV] [--out DIR]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Iterable

from sprint.core.data import safe_id
from sprint.core.errors import UserError
from sprint.core.options import add_options, config_from, option
from sprint.evaluation import modelled as MS
from sprint.evaluation.evaluate import EvaluateConfig, run_evaluation
from sprint.evaluation.report import VIEW_FOLDER, load_metrics
from sprint.evaluation.runs import Key, LoadedRun, Parsed, load_gold, load_runs, parse_runs
from sprint.format.tokencount import batch_counts
from sprint.format.trajectory import Trajectory
from sprint.tasks.registry import TaskChoices, get_task
from sprint.latency.model import LatencyModel
from sprint.latency.simulate import SCHEDULES
from sprint.viewer import timeline as TL
from sprint.viewer.pages import ProblemView, index_page, problem_page

log = logging.getLogger(__name__)

DEFAULT_TOKENIZER = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"  # SPRINT's base model, as evaluate counts
ASSETS = ("view.css", "view.js")  # sprint/viewer/assets, copied to <site>/assets


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
    latency: str | None = option(None, "GPU the timelines of runs without call times are modelled on: a preset "
                                 "(h200, h100) or a latency file (sprint gpu-probe, sprint fit-latency); default h200")


@dataclass
class ViewResult:
    index: Path
    pages: int
    seconds: float
    bytes: int
    steps: dict[str, float] = field(default_factory=dict)  # seconds per step: evaluation, timelines, pages


@dataclass
class Evaluated:
    """What the pages are built on: the evaluation's numbers, the folder holding its figures, and the
    runs as read with each SPRINT text parsed once (keyed by index in SPRINT runs + baselines)."""

    metrics: dict
    folder: Path
    sprint_runs: list[LoadedRun]
    base_runs: list[LoadedRun]
    parsed: dict[Key, Parsed]


# --------------------------------------------------------------------------- the evaluation


def _schedule(manifest: dict) -> str | None:
    cfg = manifest.get("config") if isinstance(manifest, dict) else None
    value = cfg.get("schedule") if isinstance(cfg, dict) else None
    return value if value in SCHEDULES else None


def evaluation_of(cfg: ViewConfig, out: Path, sprint_runs: list[LoadedRun], base_runs: list[LoadedRun]) -> Evaluated:
    """The runs' evaluation: reused from `--evaluation`, or computed into OUT/evaluation on the runs
    already read (the evaluation reads nothing again, and its parsed trajectories come back)."""
    if cfg.evaluation:
        folder = Path(cfg.evaluation)
        if not (folder / "metrics.json").is_file():
            raise UserError(f"{folder} holds no metrics.json; pass an evaluation folder or leave out --evaluation")
        metrics = load_metrics(folder)
        if cfg.gold:  # no evaluation attached the gold file's answers: the pages show them
            gold = load_gold(cfg.gold, get_task(metrics.get("task") or "math"))
            for prob in (p for run in sprint_runs + base_runs for p in run.problems):
                prob.gold = gold.get(prob.id, prob.gold)
        return Evaluated(metrics, folder, sprint_runs, base_runs, parse_runs(sprint_runs + base_runs))
    ecfg = EvaluateConfig(runs=list(cfg.runs), baseline=list(cfg.baseline) or None, gold=cfg.gold, task=cfg.task,
                          planner_tokenizer=cfg.planner_tokenizer, executor_tokenizer=cfg.executor_tokenizer,
                          out_dir=str(out / "evaluation"), resamples=cfg.bootstrap, plots=cfg.plots,
                          latency=cfg.latency)
    ev = run_evaluation(ecfg, loaded=(sprint_runs, base_runs))
    for line in ev.warnings:
        log.warning("%s", line)
    return Evaluated(ev.metrics, out / "evaluation", sprint_runs, base_runs, ev.parsed)


# --------------------------------------------------------------------------- building


def build(cfg: ViewConfig) -> ViewResult:
    """Write the site; returns where, how many pages, how long it took and its size."""
    t0 = time.perf_counter()
    if not cfg.runs:
        raise UserError("no run to view; pass at least one run folder")
    if cfg.time_scale <= 0:
        raise UserError(f"--time-scale must be above 0, got {cfg.time_scale}")
    sprint_runs, base_runs = load_runs([Path(p) for p in cfg.runs], [Path(p) for p in cfg.baseline])
    if not sprint_runs:
        raise UserError(f"{', '.join(cfg.runs)} holds no SPRINT trajectories; pass a SPRINT run folder")
    out = Path(cfg.out) if cfg.out else sprint_runs[0].path / VIEW_FOLDER
    out.mkdir(parents=True, exist_ok=True)
    _static(out)  # first: it also marks the folder as a viewer's, so the evaluation's report links back
    steps = {"loading": time.perf_counter() - t0}
    ev = evaluation_of(cfg, out, sprint_runs, base_runs)
    metrics = ev.metrics
    steps["evaluation"] = time.perf_counter() - t0 - sum(steps.values())
    chosen = MS.setting(cfg.latency, cfg.planner_tokenizer) or MS.setting(None, cfg.planner_tokenizer)
    assert chosen is not None  # the default model when --latency is none: a timeline needs one
    model = chosen.model
    views = _views(cfg, ev, chosen)
    base_rows = {r["id"]: r for r in metrics["baselines"][0]["problems"]} if metrics.get("baselines") else {}
    base_problems = base_runs[0].problems if base_runs else []
    _add_baseline(cfg, views, base_rows, {p.id: p.calls for p in base_problems}, model)
    measured = TL.from_timing(cfg.timing) if cfg.timing else {}
    for pv in views[0]:  # on the first run's part of each page: one clock for all measured schedules
        pv.timelines += measured.get(pv.id, [])
    steps["timelines"] = time.perf_counter() - t0 - sum(steps.values())

    (out / "problems").mkdir(exist_ok=True)
    for stale in (out / "problems").glob("*.html"):
        stale.unlink()
    _assets(out, ev.folder, metrics)
    base_texts = {p.id: p.text for p in base_problems}
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
    index.write_text(index_page(metrics, views, pages, cfg.runs, cfg.baseline, out), encoding="utf-8")
    steps["pages"] = time.perf_counter() - t0 - sum(steps.values())
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return ViewResult(index, len(ids), time.perf_counter() - t0, size, {k: round(v, 3) for k, v in steps.items()})


def _views(cfg: ViewConfig, ev: Evaluated, chosen: MS.ModelledSetting) -> list[list[ProblemView]]:
    """Per SPRINT run, its problems with their evaluation rows and timelines (recorded, else modelled)."""
    entries = ev.metrics.get("runs") or []
    views: list[list[ProblemView]] = []
    need_model: list[tuple[ProblemView, Trajectory]] = []
    for ri, run in enumerate(ev.sprint_runs):
        schedule = _schedule(run.manifest)
        label = entries[ri]["label"] if ri < len(entries) else run.label
        rows = {r["id"]: r for r in entries[ri]["problems"]} if ri < len(entries) else {}
        run_views = []
        for pi, prob in enumerate(run.problems):
            got = ev.parsed.get((ri, pi))  # SPRINT runs come first in the evaluation's keys
            traj = got.traj if got is not None else None
            question = (traj.question if traj else "") or (prob.question or "")
            pv = ProblemView(prob.id, label, traj, prob.text, rows.get(prob.id, {"id": prob.id}), question=question,
                             gold=prob.gold)
            if prob.calls:
                name = f"{label} — recorded" + (f", {schedule} schedule" if schedule else "")
                pv.timelines.append(TL.from_calls(prob.calls, name, origin=prob.start, schedule=schedule,
                                                  time_scale=cfg.time_scale))
            elif traj is not None and traj.phases:
                need_model.append((pv, traj))
            run_views.append(pv)
        views.append(run_views)
    if need_model:
        paths = TL.modelled_paths([t for _, t in need_model], cfg.planner_tokenizer, chosen.model,
                                  prompt_overhead_tokens=chosen.overhead_tokens, overhead_cached=True)
        for (pv, _), by_schedule in zip(need_model, paths):
            pv.timelines = [TL.from_path(by_schedule[s], f"{pv.run} — {chosen.label}, {s} schedule")
                            for s in SCHEDULES]
    return views


def _add_baseline(cfg: ViewConfig, views: list[list[ProblemView]], base_rows: dict, base_calls: dict[str, list[dict]],
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
    table = batch_counts(tokenizer, [pv.question for pv in views if pv.question])
    return {pv.id: table.get(pv.question, 0) for pv in views}


def _baseline_seconds(pv: ProblemView, base_rows: dict, base_calls: dict[str, list[dict]], model: LatencyModel,
                      q_tokens: dict[str, int], time_scale: float) -> tuple[float | None, str]:
    """The baseline's time for this problem: its recorded call, else the latency model on its tokens."""
    calls = [c for c in base_calls.get(pv.id, []) if not c.get("error")
             and isinstance(c.get("start"), (int, float)) and isinstance(c.get("end"), (int, float))]
    recorded = any(t.source == "recorded" for t in pv.timelines)
    if calls and recorded:
        c = calls[-1]
        return (c["end"] - c["start"]) / time_scale, "recorded"
    row = base_rows.get(pv.id) or {}
    if isinstance(row.get("modelled_seconds"), (int, float)):  # the evaluation's own figure
        return row["modelled_seconds"], "modelled"
    tokens = row.get("sequential")
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
    """The stylesheet and the script, copied from the package's assets."""
    (out / "assets").mkdir(parents=True, exist_ok=True)
    shipped = files("sprint.viewer") / "assets"
    for name in ASSETS:
        (out / "assets" / name).write_text((shipped / name).read_text(encoding="utf-8"), encoding="utf-8")


def _assets(out: Path, eval_dir: Path, metrics: dict) -> None:
    """The evaluation's figures, copied in so the folder stands alone."""
    target = out / "evaluation"
    if eval_dir.resolve() != target.resolve():
        target.mkdir(exist_ok=True)
        for png in eval_dir.glob("*.png"):
            shutil.copyfile(png, target / png.name)


# --------------------------------------------------------------------------- CLI


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(ViewConfig, args)
    result = build(cfg)
    print(f"{result.pages} problem pages, {result.bytes / 1e6:.1f} MB, in {result.seconds:.1f} s")
    print(f"open {result.index.resolve().as_uri()}")
    return 0


def register(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.split("\n\n")[0] + "\n\nThe folder opens from file:// with no server and no network."
    fields = {f.name: f for f in ViewConfig.__dataclass_fields__.values()}
    p.add_argument("runs", nargs="+", metavar="RUN", help=fields["runs"].metadata["help"])
    p.add_argument("--baseline", nargs="+", default=[], metavar="RUN", help=fields["baseline"].metadata["help"])
    add_options(p, ViewConfig)
