"""Evaluation stage: grade run folders, count sequential/total tokens, compare with a baseline.

Runs are read by `sprint.evaluation.runs` (our run folders or the SPRINT authors' log layout). Nothing stored
is trusted: answers are re-extracted from the text by the task adapter and re-graded. Token counts
follow the trajectory model (`sprint.format.trajectory.count_tokens`). Speed (500 + 500 real-length
trajectories, ~3 M tokens, report and plots: ~3 s on 2 cores, benchmarks/bench_evaluate.py):
every distinct text piece is counted once by the fastest exact engine (`sprint.format.tokencount`),
grading runs in a process started first, beside the counting (`sprint.evaluation.grader`), and
matplotlib is imported while the grades are awaited. Numbers come from `sprint.evaluation.metrics`,
files from `sprint.evaluation.report`. The returned `Evaluation` keeps the runs as read and their
parsed trajectories, so `sprint view` builds its pages on them without reading anything again.

    python -m sprint evaluate RUN[=LABEL] [RUN ...] --baseline BASE[=LABEL] [BASE ...] [--gold FILE] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from sprint.core.data import safe_id
from sprint.core.errors import UserError, failed_items_exit
from sprint.core.options import add_options, config_from, option
from sprint.core.records import FolderSet
from sprint.core.manifest import text_hash, write_manifest
from sprint.evaluation import metrics as M
from sprint.evaluation import modelled as MS
from sprint.evaluation.grader import GradingProcess, grade_while
from sprint.evaluation.quartiles import by_quartile
from sprint.evaluation.plotting import warm_up_figures
from sprint.evaluation.report import viewer_link, write_report
from sprint.evaluation.shapes import plan_shapes
from sprint.evaluation.table2 import MethodRun, build_table, latency_by_problem
from sprint.evaluation.runs import (Key, LoadedRun, Parsed, RawProblem, attach_gold, load_gold, load_runs,
                                    parse_runs, run_fingerprint, split_label, task_of)
from sprint.format.tokencount import batch_counts, load_counter
from sprint.format.trajectory import TokenCounts, count_tokens
from sprint.tasks.registry import TaskAdapter, TaskChoices, get_task

DEFAULT_TOKENIZER = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
MAX_WARNINGS = 5  # malformed trajectories named on the terminal; the rest are counted


@dataclass
class EvaluateConfig:
    """What `sprint evaluate` reads, how it grades and counts, where it writes (defaults written once, here)."""

    runs: list[str] = option(help="SPRINT run folder(s); several = several seeds or methods; FOLDER=LABEL names "
                             "the run in the tables", cli=False, default_factory=list)
    baseline: list[str] | None = option(
        None, "sequential-baseline run folder(s), paired with the runs by problem id (put it after the runs); "
        "FOLDER=LABEL names it (e.g. RFT)", cli=False)
    task: str | None = option(None, "grading rule (default: from the run's manifest, else math)", choices=TaskChoices())
    gold: str | None = option(
        None, "gold answers: CSV with id,answer columns or a dataset (file or hub id) with ids and answers")
    planner_tokenizer: str = option(DEFAULT_TOKENIZER, "hub id or local folder with tokenizer.json")
    executor_tokenizer: str | None = option(None, "default: the planner's")
    out_dir: str | None = option(None, "report folder (default: <first run>/evaluation)", flags=("--out",),
                                  metavar="OUT")
    resamples: int = option(M.DEFAULT_RESAMPLES, "bootstrap resamples (0 = no CIs)", flags=("--bootstrap",),
                            metavar="BOOTSTRAP")
    confidence: float = option(M.DEFAULT_CONFIDENCE, "confidence level of the CIs")
    seed: int = option(0, "bootstrap seed")
    workers: int | None = option(None, "grading processes (default: one per CPU)")
    plots: bool = option(True, "skip the PNG figures", flags=("--no-plots",))
    latency: str | None = option(
        None, "GPU the seconds per problem are modelled on: a preset (h200, h100), a latency file (sprint gpu-probe, "
        "sprint fit-latency), or none (default: h200, the measured H200 table)", metavar="MODEL")


# --------------------------------------------------------------------------- the stage


@dataclass
class RunResult:
    """One run's per-problem results and their summary."""

    label: str
    path: str
    mode: str
    results: list[M.ProblemResult]
    summary: dict
    manifest: dict = field(default_factory=dict)


@dataclass
class Evaluation:
    """What `evaluate` computed, and where it wrote it."""

    metrics: dict
    runs: list[RunResult]
    baselines: list[RunResult]
    out_dir: Path | None
    files: dict[str, Path]
    warnings: list[str] = field(default_factory=list)  # malformed trajectories; the CLI prints them
    # The runs as read (SPRINT runs first, then the baselines; gold attached) and each SPRINT text
    # parsed once, keyed by (index in `loaded`, problem index): what the viewer builds its pages on.
    loaded: list[LoadedRun] = field(default_factory=list)
    parsed: dict[Key, Parsed] = field(default_factory=dict)

    @property
    def table2(self) -> dict | None:
        """The paper-shaped table (`sprint.evaluation.table2`), as metrics.json and table2.json hold it."""
        return self.metrics.get("table2")


def evaluate(
    run_dir: str | Path | Sequence[str | Path],
    baseline: str | Path | Sequence[str | Path] | None = None,
    *,
    gold: str | Path | Mapping[str, Any] | None = None,
    write: bool = True,
    **settings: Any,
) -> Evaluation:
    """Grade and count one or more runs (seeds) and optional baseline runs; write the report.

    `run_dir`/`baseline`: folders (or lists of folders, one per seed). `gold`: a CSV/dataset path
    or an {id: gold} mapping, overriding golds stored in records. `settings`: the other fields of
    `EvaluateConfig` (task, tokenizers, out_dir, resamples, seed, confidence, workers, plots).
    Outputs go to `out_dir` (default: `<first run>/evaluation`): metrics.json, table2.json, report.md,
    plots and manifest.json. Malformed trajectories are scored leniently and named in `Evaluation.warnings`.
    """
    mapping = dict(gold) if isinstance(gold, Mapping) else None
    cfg = EvaluateConfig(
        runs=[str(p) for p in _as_paths(run_dir)],
        baseline=None if baseline is None else [str(p) for p in _as_paths(baseline)],
        gold=None if gold is None or mapping is not None else str(gold),
        **settings,
    )
    return run_evaluation(cfg, gold=mapping, write=write)


def run_evaluation(cfg: EvaluateConfig, *, gold: dict[str, Any] | None = None, write: bool = True,
                   loaded: tuple[list[LoadedRun], list[LoadedRun]] | None = None) -> Evaluation:
    """The stage: load runs, attach gold, grade and count, compute the numbers, write the report.

    `gold`: an {id: gold} mapping that replaces `cfg.gold` (from Python only). `loaded`: the SPRINT
    and baseline runs `load_runs` already read from `cfg.runs` and `cfg.baseline` (the viewer reads
    them first, to check them and name its folder), so they are not read again.
    """
    started, started_at = time.perf_counter(), time.time()
    if loaded is None:
        loaded = load_runs(_as_paths(cfg.runs), _as_paths(cfg.baseline))
    sprint_runs, base_runs = loaded
    all_runs = sprint_runs + base_runs
    out = Path(cfg.out_dir) if cfg.out_dir else (all_runs[0].path / "evaluation")
    if not write:
        return _evaluate(cfg, gold, all_runs, len(sprint_runs), None, None, started, started_at)
    _check_out(out)  # before any work
    # The report is one set: written into a temporary folder beside OUT and swapped into place, under a
    # lock (one evaluation writes OUT at a time); a kill never leaves one run's metrics beside another's report.
    target = FolderSet(out)
    folder = target.open()
    try:
        ev = _evaluate(cfg, gold, all_runs, len(sprint_runs), out, folder, started, started_at)
        target.commit()
    finally:
        target.close()
    ev.files = {name: out / path.relative_to(folder) for name, path in ev.files.items()}
    return ev


def _evaluate(cfg: EvaluateConfig, gold: dict[str, Any] | None, all_runs: list[LoadedRun], n_sprint: int,
              out: Path | None, folder: Path | None, started: float, started_at: float) -> Evaluation:
    """`run_evaluation`'s work; the files go into `folder` (None: none written), described as being in `out`."""
    # The grading process starts first: its start-up (Python, sympy, Math-Verify's parser) runs
    # while this one reads tokenizers, parses and counts.
    grader = GradingProcess.start(sum(len(r.problems) for r in all_runs), cfg.workers)
    try:
        return _evaluate_steps(cfg, gold, all_runs, n_sprint, out, folder, started, started_at, grader)
    finally:
        if grader is not None:
            grader.close()


def _evaluate_steps(cfg: EvaluateConfig, gold: dict[str, Any] | None, all_runs: list[LoadedRun], n_sprint: int,
                    out: Path | None, folder: Path | None, started: float, started_at: float,
                    grader: GradingProcess | None) -> Evaluation:
    write = folder is not None
    task = get_task(cfg.task or task_of(all_runs))
    gold_map = gold if gold is not None else (load_gold(cfg.gold, task) if cfg.gold else None)
    attach_gold(all_runs, {safe_id(k): v for k, v in gold_map.items()} if gold_map else None,
                cfg.gold if gold is None else gold)
    planner, executor = _check_tokenizers(cfg)
    parsed = parse_runs(all_runs)
    warnings = malformed_warnings(all_runs, parsed)
    answers = {(ri, pi): _answer(prob, parsed.get((ri, pi)), task)
               for ri, run in enumerate(all_runs) for pi, prob in enumerate(run.problems)}
    grades, counted, timing = _grade_and_count(all_runs, parsed, answers, task, planner, executor, cfg.workers,
                                               grader=grader, while_waiting=warm_up_figures if write and cfg.plots else None)
    stats = dict(resamples=cfg.resamples, seed=cfg.seed, confidence=cfg.confidence)
    t0 = time.perf_counter()
    chosen = MS.setting(cfg.latency, planner)
    seconds = MS.problem_seconds(all_runs, parsed, counted, planner, chosen) if chosen else {}
    timing["modelled_s"] = round(time.perf_counter() - t0, 3)
    run_results = [_run_result(ri, run, answers, grades, counted, parsed, stats, seconds)
                   for ri, run in enumerate(all_runs)]
    sprint_results, base_results = run_results[:n_sprint], run_results[n_sprint:]
    metrics = _metrics(task.name, planner, executor, cfg.gold, stats, sprint_results, base_results, timing, chosen)
    reference = M.baseline_reference([b.results for b in base_results]) if base_results else None
    metrics["table2"] = build_table([MethodRun(rr.label, rr.mode, rr.path, rr.results, run.problems, rr.summary,
                                               rr.manifest) for rr, run in zip(run_results, all_runs)],
                                    modelled=chosen.label if chosen else None, reference=reference, **stats)
    files: dict[str, Path] = {}
    if write:
        metrics["timing"]["total_s"] = round(time.perf_counter() - started, 3)
        files = _write_outputs(out, metrics, cfg, planner, executor, gold_map, gold is not None, all_runs,
                               parsed, warnings, started_at, into=folder)
    metrics["timing"]["total_s"] = round(time.perf_counter() - started, 3)
    return Evaluation(metrics, sprint_results, base_results, out if write else None, files, warnings, all_runs, parsed)


# --------------------------------------------------------------------------- the steps


def _as_paths(value: str | Path | Sequence[str | Path] | None) -> list[Path]:
    if value is None:
        return []
    if isinstance(value, (str, Path)):
        return [Path(value)]
    return [Path(v) for v in value]


def _check_out(out: Path) -> None:
    """Refuse a report folder that holds anything but an evaluation report: the new report replaces it whole.

    (`--out RUN` would otherwise replace a run folder; `--out results/` a user's other files.)
    """
    try:
        stage = json.loads((out / "manifest.json").read_text(encoding="utf-8")).get("stage")
    except (OSError, ValueError, AttributeError):
        stage = "evaluate" if not (out / "manifest.json").exists() else None
    if stage != "evaluate":
        raise UserError(f"{out} holds the manifest.json of {'a ' + repr(stage) if stage else 'another'} run, which "
                        "the evaluation's manifest would replace; pass another --out folder")
    if out.is_file():
        raise UserError(f"--out {out} is a file; pass a folder")
    others = sorted(p.name for p in out.iterdir() if not _report_file(p.name)) if out.is_dir() else []
    if others:
        raise UserError(f"{out} holds files that are not part of an evaluation report ({', '.join(others[:3])}); the "
                        "report replaces its folder as a whole, so pass a new or empty --out folder")


def _report_file(name: str) -> bool:
    """A file an evaluation writes into its folder (report.md, metrics.json, manifest.json, figures)."""
    return name in ("metrics.json", "report.md", "manifest.json", "table2.json") or name.endswith((".png", ".tmp"))


def _check_tokenizers(cfg: EvaluateConfig) -> tuple[str, str]:
    """The planner's and the executor's tokenizer names; a wrong one fails now, before any work starts."""
    planner = str(cfg.planner_tokenizer)
    executor = str(cfg.executor_tokenizer or cfg.planner_tokenizer)
    for name in {planner, executor}:
        load_counter(name)
    return planner, executor


def malformed_warnings(runs: list[LoadedRun], parsed: dict[Key, Parsed], limit: int = MAX_WARNINGS) -> list[str]:
    """One line per malformed SPRINT trajectory (the first `limit`, then a count).

    metrics.json only says how many were malformed; the user needs to know which file and why.
    """
    bad = [(runs[ri].problems[pi], got.error) for (ri, pi), got in sorted(parsed.items()) if got.malformed]
    lines = [f"{prob.source or prob.id}: {err}; scored leniently" for prob, err in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"… and {len(bad) - limit} more malformed trajectories (`malformed` in metrics.json)")
    return lines


def _answer(prob: RawProblem, got: Parsed | None, task: TaskAdapter) -> str | None:
    """The answer the output gives (the task's rule: the last `\\boxed{}`); failed problems have none."""
    if prob.text is None or prob.status != "ok":
        return None
    return task.extract(got.traj.render() if got is not None else prob.text)


def _grade_and_count(
    runs: list[LoadedRun], parsed: dict[Key, Parsed], answers: dict[Key, str | None], task: TaskAdapter,
    planner: str, executor: str, workers: int | None, *, grader: GradingProcess | None = None,
    while_waiting: Callable[[], None] | None = None,
) -> tuple[dict[Key, bool], dict[Key, TokenCounts | int], dict[str, float]]:
    """Grades and token counts of every problem, and the seconds each took.

    Grading (Math-Verify) runs beside the tokenizer work: in `grader`'s process when there is one,
    else in a thread. `while_waiting` runs after the counting, before the grades are awaited.
    """
    keys = list(answers)
    preds = [answers[k] for k in keys]
    golds = [runs[ri].problems[pi].gold for ri, pi in keys]

    def count() -> tuple[dict[Key, TokenCounts | int], float]:
        t0 = time.perf_counter()
        counted = _count_all(runs, parsed, planner, executor)
        seconds = time.perf_counter() - t0
        if while_waiting is not None:
            while_waiting()
        return counted, seconds

    grades, t_grading, (counted, t_tokens) = grade_while(task, preds, golds, workers, grader, count)
    return dict(zip(keys, grades)), counted, {"tokens_s": round(t_tokens, 3), "grading_s": round(t_grading, 3)}


class _Recorder:
    """A counter that only notes which texts the trajectory model wants counted."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, text: str) -> int:
        self.texts.append(text)
        return 0


def _count_all(
    runs: list[LoadedRun], parsed: dict[Key, Parsed], planner_tokenizer: str, executor_tokenizer: str
) -> dict[Key, TokenCounts | int]:
    """Token counts of every problem with a text: `TokenCounts` for SPRINT, an int for a baseline.

    Two passes over the trajectory model: the first notes the texts it counts, those are encoded
    in batches per tokenizer, the second reads the counts back. The numbers are exactly
    `count_tokens(traj, token_counter(planner), token_counter(executor))`.
    """
    rec_p, rec_e = _Recorder(), _Recorder()
    for key, got in parsed.items():
        count_tokens(got.traj, rec_p, rec_e)
    for run in runs:
        if run.mode == "baseline":
            for prob in run.problems:
                if prob.text is not None:
                    rec_p(prob.text)
    if planner_tokenizer == executor_tokenizer:
        table_p = table_e = batch_counts(planner_tokenizer, rec_p.texts + rec_e.texts)
    else:
        table_p, table_e = batch_counts(planner_tokenizer, rec_p.texts), batch_counts(executor_tokenizer, rec_e.texts)
    count_p: Callable[[str], int] = table_p.__getitem__
    count_e: Callable[[str], int] = table_e.__getitem__
    out: dict[Key, TokenCounts | int] = {k: count_tokens(got.traj, count_p, count_e) for k, got in parsed.items()}
    for ri, run in enumerate(runs):
        if run.mode == "baseline":
            for pi, prob in enumerate(run.problems):
                if prob.text is not None:
                    out[(ri, pi)] = count_p(prob.text)
    return out


def _problem_result(prob: RawProblem, pred: str | None, ok: bool, tc: TokenCounts | int | None,
                    got: Parsed | None, seconds: dict[str, float] | None, schedule: str) -> M.ProblemResult:
    res = M.ProblemResult(id=prob.id, correct=bool(ok), answered=pred is not None, status=prob.status,
                          forced_final=prob.forced_final, predicted=pred, reported_tokens=prob.reported_tokens)
    if seconds:
        res.modelled_by_schedule = dict(seconds)
        res.modelled_seconds = seconds.get(schedule)
    if isinstance(tc, TokenCounts) and got is not None:
        traj = got.traj
        res.sequential, res.sequential_decoded, res.total = tc.sequential, tc.sequential_decoded, tc.total
        res.planner, res.executor = tc.planner, tc.executor
        res.phases, res.prompts = len(traj.phases), traj.prompt_count
        res.prompts_per_phase = [len(ph.prompts) for ph in traj.phases]
        res.malformed = got.malformed
    elif tc is not None:  # a sequential model: every definition is its output length
        res.sequential = res.sequential_decoded = res.total = int(tc)
    return res


def _run_result(ri: int, run: LoadedRun, answers: dict[Key, str | None], grades: dict[Key, bool],
                counted: dict[Key, TokenCounts | int], parsed: dict[Key, Parsed], stats: dict,
                seconds: dict[Key, dict[str, float]]) -> RunResult:
    """One run's per-problem results and their summary (accuracy, tokens, modelled seconds, bootstrap CIs)."""
    schedule = MS.schedule_of(run.manifest) if run.mode == "sprint" else MS.SEQUENTIAL
    results = [_problem_result(prob, answers[(ri, pi)], grades[(ri, pi)], counted.get((ri, pi)), parsed.get((ri, pi)),
                               seconds.get((ri, pi)), schedule)
               for pi, prob in enumerate(run.problems)]
    measured = latency_by_problem(run.problems)
    for res in results:
        res.measured_seconds = measured.get(res.id)
    return RunResult(run.label, str(run.path), run.mode, results, M.summarize_results(results, **stats), run.manifest)


def _comparisons(sprint_results: list[RunResult], base_results: list[RunResult],
                 stats: dict) -> tuple[dict[str, float] | None, list[dict]]:
    """The per-problem baseline reference (mean over baseline seeds) and each SPRINT run's comparison."""
    reference = M.baseline_reference([b.results for b in base_results]) if base_results else None
    comparisons = []
    for i, sr in enumerate(sprint_results if base_results else []):
        br = base_results[i % len(base_results)]
        pairs = M.pair(sr.results, br.results, reference)
        if not pairs:
            raise UserError(f"{sr.path} and {br.path} share no problem id; are they runs on the same data?")
        comparisons.append({"run": sr.label, "baseline": br.label, **M.compare(pairs, **stats)})
    return reference, comparisons


def _run_entry(rr: RunResult, reference: dict[str, float] | None) -> dict:
    rows = []
    for res in rr.results:
        row = res.as_row()
        base_tokens = reference.get(res.id) if reference is not None else None
        row["baseline_tokens"] = base_tokens  # the pairing reference (mean over baseline seeds)
        row["bucket"] = M.bucket_of(base_tokens)
        rows.append(row)
    return {"label": rr.label, "path": rr.path, "mode": rr.mode, "summary": rr.summary, "problems": rows,
            "prefix_cache": (rr.manifest or {}).get("prefix_cache") or None}  # the run's hit ratios (its manifest)


def _modelled(chosen: MS.ModelledSetting | None, sprint_results: list[RunResult], base_results: list[RunResult],
              reference: dict[str, float] | None, stats: dict) -> dict | None:
    """metrics.json's `modelled`: each run's modelled seconds (overall, by bucket) and SPRINT / baseline ratios."""
    if chosen is None:
        return None

    def values(rr: RunResult, schedule: str) -> dict[str, float]:
        return {r.id: r.modelled_by_schedule[schedule] for r in rr.results if schedule in r.modelled_by_schedule}

    runs = []
    for rr in sprint_results + base_results:
        schedule = MS.schedule_of(rr.manifest) if rr.mode == "sprint" else MS.SEQUENTIAL
        by_schedule = {s: MS.seconds_block(values(rr, s), reference, stats)["overall"]
                       for s in (MS.SCHEDULES if rr.mode == "sprint" else (MS.SEQUENTIAL,))}
        runs.append({"method": rr.label, "mode": rr.mode, "schedule": schedule, "by_schedule": by_schedule,
                     **MS.seconds_block(values(rr, schedule), reference, stats)})
    comparisons = []
    for i, sr in enumerate(sprint_results if base_results else []):
        br = base_results[i % len(base_results)]
        comparisons.append({"run": sr.label, "baseline": br.label, "by_schedule": MS.comparison(
            {s: values(sr, s) for s in MS.SCHEDULES}, values(br, MS.SEQUENTIAL), reference, stats)})
    return {**chosen.describe(), "describe": chosen.model.describe(), "runs": runs, "comparisons": comparisons}


def _metrics(task: str, planner: str, executor: str, gold_source: str | None, stats: dict,
             sprint_results: list[RunResult], base_results: list[RunResult], timing: dict[str, float],
             chosen: MS.ModelledSetting | None = None) -> dict:
    """The dictionary metrics.json stores and report.md is rendered from."""
    reference, comparisons = _comparisons(sprint_results, base_results, stats)
    return {
        "task": task,
        "tokenizers": {"planner": planner, "executor": executor},
        "bucket_edges": list(M.BUCKET_EDGES),
        "bootstrap": stats,
        "gold": gold_source,
        "runs": [_run_entry(r, reference) for r in sprint_results],
        "baselines": [_run_entry(r, reference) for r in base_results],
        "comparisons": comparisons,
        "aggregate": {
            "sprint": M.aggregate_summaries([r.summary for r in sprint_results]) if sprint_results else None,
            "baseline": M.aggregate_summaries([r.summary for r in base_results]) if base_results else None,
            "comparison": M.aggregate_comparisons(comparisons) if comparisons else None,
        },
        "modelled": _modelled(chosen, sprint_results, base_results, reference, stats),
        "by_quartile": by_quartile(sprint_results, base_results, reference, stats),  # Figure 6 by the baseline's quartiles
        "plan_shapes": plan_shapes(sprint_results),
        "timing": dict(timing),
    }


def _write_outputs(
    out: Path, metrics: dict, cfg: EvaluateConfig, planner: str, executor: str, gold_map: dict[str, Any] | None,
    gold_is_mapping: bool, runs: list[LoadedRun], parsed: dict[Key, Parsed], warnings: list[str], started_at: float,
    *, into: Path | None = None,
) -> dict[str, Path]:
    """metrics.json, the figures, report.md, then manifest.json (what was read, with which settings).

    They are written into `into` (the temporary folder `run_evaluation` swaps into place as OUT)."""
    folder = into if into is not None else out
    files = write_report(metrics, folder, plots=cfg.plots, viewer=viewer_link(out, [split_label(p)[0] for p in cfg.runs]))
    run_paths, base_paths = _as_paths(cfg.runs), _as_paths(cfg.baseline)  # as given, FOLDER=LABEL included
    config = {
        "runs": [str(p) for p in run_paths], "baseline": [str(p) for p in base_paths], "task": cfg.task,
        "planner_tokenizer": planner, "executor_tokenizer": executor,
        "gold": f"<mapping of {len(gold_map or {})} ids>" if gold_is_mapping else cfg.gold,
        "out_dir": str(out), "resamples": cfg.resamples, "seed": cfg.seed, "confidence": cfg.confidence,
        "workers": cfg.workers, "plots": cfg.plots, "latency": cfg.latency,
    }
    inputs = {  # from the bytes the runs were loaded from, not read again
        "runs": [run_fingerprint(split_label(p)[0], runs) for p in run_paths],
        "baselines": [run_fingerprint(split_label(p)[0], runs) for p in base_paths],
        "gold": None if gold_map is None else {
            "source": config["gold"], "ids": len(gold_map),
            "fingerprint": text_hash(json.dumps(gold_map, sort_keys=True, default=str))},
    }
    problems = [p for r in runs for p in r.problems]
    counts = {"runs": len(metrics["runs"]), "baselines": len(metrics["baselines"]), "problems": len(problems),
              "no_text": sum(p.text is None for p in problems),
              "malformed": sum(got.malformed for got in parsed.values())}
    settings = {k: v for k, v in config.items() if k not in ("out_dir", "workers", "plots")}
    write_manifest(folder, "evaluate", config, started=started_at, counts=counts, identity=settings,
                   inputs={**inputs, "fingerprint": text_hash(json.dumps(inputs, sort_keys=True, default=str))},
                   extra={"task": metrics["task"], "warnings": warnings})
    files["manifest"] = folder / "manifest.json"
    return files


# --------------------------------------------------------------------------- CLI


def headline(metrics: dict) -> str:
    """One line per method for the terminal."""
    lines = []
    for key, name in (("runs", "SPRINT"), ("baselines", "baseline")):
        for r in metrics[key]:
            s = r["summary"]
            acc = "n/a" if s["accuracy"] is None else f"{100 * s['accuracy']:.1f}%"
            seq = "n/a" if s["mean_sequential"] is None else f"{s['mean_sequential']:.0f}"
            lines.append(f"{name} {r['label']}: accuracy {acc} ({s['no_answer']} without answer), "
                         f"mean sequential tokens {seq}")
    for c in metrics["comparisons"]:
        red = c["overall"]["reduction"]
        red_s = "n/a" if red is None else f"{100 * red:.1f}%"
        lines.append(f"{c['run']} vs {c['baseline']}: sequential-token reduction {red_s}, "
                     f"McNemar p = {c['mcnemar']['p_value']:.3g}")
    return "\n".join(lines + modelled_headline(metrics.get("modelled")))


def modelled_headline(block: dict | None) -> list[str]:
    """The terminal lines of modelled seconds: per method overall and by bucket, then SPRINT / baseline."""
    if not block:
        return []

    def sec(m: dict | None, unit: str = " s") -> str:
        if not m or m.get("value") is None:
            return "n/a"
        ci = m.get("ci")
        return f"{m['value']:.2f}{unit}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")

    lines = [f"seconds per problem ({block['label']}):"]
    for r in block["runs"]:
        buckets = ", ".join(f"{b} {sec(v)}" for b, v in (r.get("buckets") or {}).items() if v)
        lines.append(f"  {r['method']} ({r['schedule']}): {sec(r['overall'])}" + (f"; by baseline length: {buckets}"
                                                                                  if buckets else ""))
    for c in block["comparisons"]:
        for schedule, cmp in c["by_schedule"].items():
            buckets = ", ".join(f"{b} {sec(v, 'x')}" for b, v in (cmp.get("buckets") or {}).items() if v)
            lines.append(f"  {c['run']} {schedule} / {c['baseline']}: {sec(cmp['overall'], 'x')}"
                         + (f"; {buckets}" if buckets else ""))
    return lines


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(EvaluateConfig, args, runs=list(args.runs) + list(args.more_runs or []))
    ev = run_evaluation(cfg)
    for line in ev.warnings:
        print(f"warning: {line}", file=sys.stderr)
    print(headline(ev.metrics))
    for name, path in ev.files.items():
        print(f"{name}: {path}")
    return failed_items_exit(evaluation_failures(ev.metrics), 0, what="problems", argv=getattr(args, "argv", None),
                             retry_hint="the report counts them as wrong; re-run the stage that made the run "
                             "(same command: it retries its failed problems), then evaluate again")


def evaluation_failures(metrics: dict) -> dict[str, int]:
    """Problems of the evaluated runs that did not end ok in their run (counted as wrong), by status."""
    out: dict[str, int] = {}
    for entry in [*metrics["runs"], *metrics["baselines"]]:
        for row in entry["problems"]:
            status = row.get("status") or "ok"
            if status != "ok":
                out[status] = out.get(status, 0) + 1
    return out


def _field(name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(EvaluateConfig) if f.name == name)


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Evaluate SPRINT runs (and a sequential baseline): accuracy, sequential and total tokens, "
        "reduction per baseline length bucket, McNemar test, bootstrap CIs; writes metrics.json, "
        "report.md and PNG plots. A run is a run folder (records.jsonl) or a folder of trajectory "
        ".txt files (planner_trajectory_<id>.txt / base_model_trajectory_<id>.txt)."
    )
    # The run lists take several values (and one is positional), which `add_options` does not do;
    # their help still comes from the config's fields.
    p.add_argument("runs", nargs="*", metavar="RUN", help=_field("runs").metadata["help"])
    p.add_argument("--runs", dest="more_runs", nargs="+", default=None, metavar="RUN",
                   help="more SPRINT run folders (seeds of one method)")
    p.add_argument("--baseline", nargs="+", default=_field("baseline").default, metavar="RUN",
                   help=_field("baseline").metadata["help"])
    add_options(p, EvaluateConfig)
