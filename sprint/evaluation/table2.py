"""The paper's Table 2, in its shape: one row per method (the sequential baseline, SPRINT barrier,
SPRINT stream, SPRINT after GRPO, ...), with accuracy, sequential tokens, total tokens and measured
seconds per problem, each with its bootstrap confidence interval.

Why a module of its own: the row mixes three sources (the grades, the token counts, the recorded
call times) and is shown in three places (table2.json for scripts, the top of report.md, the
viewer's index). It is computed once here into a plain dict, stored in metrics.json as `table2`,
and every rendering reads that dict, so the three can never disagree. A measure nobody recorded
is None (null), never a stand-in number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from sprint.core.calls import CallRecord
from sprint.evaluation import metrics as M
from sprint.evaluation.modelled import seconds_block
from sprint.evaluation.runs import RawProblem

TITLE = "Table 2 (shape of the paper's)"
MEASURES = ("accuracy", "sequential_tokens", "total_tokens", "seconds_per_problem", "modelled_seconds")
HEADERS = ("Method", "Problems", "Accuracy", "Sequential tokens", "Total tokens", "Seconds per problem",
           "Modelled seconds")

DEFINITIONS = {
    "method": "the run's label: its folder name, or LABEL when the run was passed as FOLDER=LABEL",
    "problems": "problems in the run, failed ones included",
    "accuracy": "share of all problems graded correct; a problem without a final answer counts as wrong",
    "sequential_tokens": "mean over problems with a text of the critical path in tokens (per phase the longest "
                         "prompt branch, final answer as planner tokens, tags excluded); for a sequential model "
                         "its output length",
    "total_tokens": "mean over problems with a text of every generated token, tags included; for a sequential "
                    "model its output length",
    "seconds_per_problem": "mean over problems of the wall-clock from the start of the problem's first recorded "
                           "model call to the end of its last (records.jsonl `calls`, retries included, on the "
                           "clock as recorded: a replay server's time scale is not undone); when some problems "
                           "ran alone (no other problem in flight: the run's --timed-problems) and others did "
                           "not, only those that ran alone; problems without call times, or with a call "
                           "answered from the on-disk response cache, are left out; null when no problem has "
                           "measured times",
    "modelled_seconds": "mean over problems with a text of the seconds the latency model gives the text on one GPU "
                        "with no other problem on it (table2.json's `modelled`: the GPU; the run's schedule, barrier "
                        "when its manifest names none; the agent prompt already in the prefix cache); "
                        "`modelled_seconds_by_bucket`: the same per length bucket of the baseline's output",
    "value": "the mean (accuracy: the share) over the measure's `n` problems",
    "ci": "percentile bootstrap interval over the run's problems ({resamples} resamples, seed {seed}, "
          "{confidence:.0%}); null without resamples",
}


@dataclass
class MethodRun:
    """What one row is computed from: a run's graded results and its problems as read (their calls)."""

    label: str
    mode: str  # sprint | baseline
    path: str
    results: Sequence[M.ProblemResult]
    problems: Sequence[RawProblem]
    summary: dict
    manifest: dict = field(default_factory=dict)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _timed_calls(calls: Iterable[dict]) -> list[CallRecord] | None:
    """A problem's calls with times; None when none has times or one came from the response cache
    (its recorded time is a disk read, not the model's, so the problem would look faster than it ran)."""
    timed = [CallRecord.from_dict(c) for c in calls
             if isinstance(c, dict) and _finite(c.get("start")) and _finite(c.get("end"))]
    if not timed or any(c.cached for c in timed):
        return None
    return timed


def problem_seconds(calls: Iterable[dict]) -> float | None:
    """Wall-clock seconds of one problem: first call's start to last call's end (None: not measured)."""
    timed = _timed_calls(calls)
    if timed is None:
        return None
    return max(0.0, max(c.end for c in timed) - min(c.start for c in timed))


def latency_seconds(problems: Sequence[RawProblem]) -> list[float]:
    """The seconds of the problems that ran alone, when some did and others shared the server
    (`latency_by_problem`'s values, in the order the problems started)."""
    return list(latency_by_problem(problems).values())


def latency_by_problem(problems: Sequence[RawProblem]) -> dict[str, float]:
    """{problem id: seconds} of the problems that ran alone, when some did and others shared the server.

    Why: a run may time a fixed subset one problem at a time (`--timed-problems`) and answer the rest
    with several in flight; only the first are latency, what the paper's seconds are. A problem ran
    alone when no other problem's span (first call's start to last call's end) overlaps its own. A
    run where every problem ran alone, or none did (all in flight together), keeps all of them.
    In the order the problems started.
    """
    spans = []
    for p in problems:
        timed = _timed_calls(p.calls)
        if timed is not None:
            spans.append((min(c.start for c in timed), max(c.end for c in timed), p.id))
    spans.sort(key=lambda span: (span[0], span[1]))
    every = {pid: max(0.0, end - start) for start, end, pid in spans}
    alone: dict[str, float] = {}
    latest_end = float("-inf")  # the latest end among the spans before this one
    for i, (start, end, pid) in enumerate(spans):
        next_start = spans[i + 1][0] if i + 1 < len(spans) else float("inf")
        if latest_end <= start and end <= next_start:
            alone[pid] = every[pid]
        latest_end = max(latest_end, end)
    return alone if 0 < len(alone) < len(every) else every


def _schedule(manifest: dict) -> str | None:
    """barrier | stream, from a SPRINT run's manifest (what tells two SPRINT rows apart)."""
    cfg = manifest.get("config") if isinstance(manifest, dict) else None
    value = cfg.get("schedule") if isinstance(cfg, dict) else None
    return value if isinstance(value, str) else None


def method_row(run: MethodRun, *, resamples: int = M.DEFAULT_RESAMPLES, seed: int = 0,
               confidence: float = M.DEFAULT_CONFIDENCE, reference: dict[str, float] | None = None) -> dict:
    """One row: each measure {value, ci, n}, or None where no problem has it."""
    stats = {"resamples": resamples, "seed": seed, "confidence": confidence}
    n = len(run.results)
    s = run.summary
    accuracy = None if not n or s.get("accuracy") is None else {
        "value": s["accuracy"], "ci": s.get("accuracy_ci"), "n": n}  # the summary's own bootstrap (same seed)
    counted = [r for r in run.results if r.has_text]
    seconds = latency_seconds(run.problems)
    return {
        "method": run.label,
        "mode": run.mode,
        "schedule": _schedule(run.manifest) if run.mode == "sprint" else None,
        "path": run.path,
        "problems": n,
        "accuracy": accuracy,
        "sequential_tokens": M.mean_with_ci([r.sequential for r in counted if r.sequential is not None], **stats),
        "total_tokens": M.mean_with_ci([r.total for r in counted if r.total is not None], **stats),
        "seconds_per_problem": M.mean_with_ci(seconds, **stats),
        **_modelled_cells(run, reference, stats),
    }


def _modelled_cells(run: MethodRun, reference: dict[str, float] | None, stats: dict) -> dict:
    """The modelled seconds, overall and by the baseline's length bucket (`sprint.evaluation.modelled`)."""
    values = {r.id: r.modelled_seconds for r in run.results if r.modelled_seconds is not None}
    block = seconds_block(values, reference, stats)
    return {"modelled_seconds": block["overall"], "modelled_seconds_by_bucket": block["buckets"]}


def build_table(runs: Sequence[MethodRun], *, resamples: int = M.DEFAULT_RESAMPLES, seed: int = 0,
                confidence: float = M.DEFAULT_CONFIDENCE, modelled: str | None = None,
                reference: dict[str, float] | None = None) -> dict:
    """The table: sequential baselines first (the paper's RFT row), then the SPRINT runs in the order given.

    `modelled`: the label of the modelled seconds ("modelled: <GPU>, one problem at a time"; None: none were
    modelled); `reference`: the baseline's length per problem, which buckets them."""
    stats = {"resamples": resamples, "seed": seed, "confidence": confidence}
    ordered = [r for r in runs if r.mode == "baseline"] + [r for r in runs if r.mode != "baseline"]
    definitions = {k: v.format(**stats) for k, v in DEFINITIONS.items()}
    return {"rows": [method_row(r, reference=reference, **stats) for r in ordered], "definitions": definitions,
            "bootstrap": stats, "modelled": modelled}


# --------------------------------------------------------------------------- rendering (plain text cells)


def _fmt(measure: str, x: float) -> str:
    if measure == "accuracy":
        return f"{100 * x:.1f}%"
    if measure in ("seconds_per_problem", "modelled_seconds"):
        return f"{x:,.2f}"
    return f"{x:,.0f}"


def cell(row: dict, measure: str) -> str:
    """`value [lo–hi]`, with `(n/N)` when only some problems have the measure; `–` when none has it."""
    m = row.get(measure)
    if not m or m.get("value") is None:
        return "–"
    text = _fmt(measure, m["value"])
    ci = m.get("ci")
    if ci:  # one unit per interval: 37.5–87.5%, not 37.5%–87.5%
        text += f" [{_fmt(measure, ci[0]).rstrip('%')}–{_fmt(measure, ci[1])}]"
    if m.get("n") is not None and m["n"] < row.get("problems", 0):
        text += f" ({m['n']}/{row['problems']})"
    return text


def headers(table: dict) -> list[str]:
    """The column names, each measure with its interval's level when there are intervals."""
    stats = table.get("bootstrap") or {}
    suffix = f" [{(stats.get('confidence') or M.DEFAULT_CONFIDENCE):.0%} CI]" if stats.get("resamples") else ""
    names = list(HEADERS[2:])
    if table.get("modelled"):  # say which GPU, every time the column is shown
        names[-1] = f"Seconds per problem ({table['modelled']})"
    return [HEADERS[0], HEADERS[1]] + [h + suffix for h in names]


def cells(row: dict) -> list[str]:
    """One row's cells as plain text (escape them for the output format)."""
    return [str(row.get("method")), str(row.get("problems"))] + [cell(row, m) for m in MEASURES]


def md_text(text: str) -> str:
    """Text for report.md, e.g. a run label given as FOLDER=LABEL: HTML-escaped (markdown renders raw
    HTML) and pipes escaped (they would split a table cell)."""
    return escape(str(text), quote=False).replace("|", "\\|")


def markdown_lines(table: dict | None) -> list[str]:
    """The table for report.md, with a line saying what the cells mean; [] without rows."""
    rows = (table or {}).get("rows") or []
    if not rows:
        return []
    head = headers(table)
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    lines += ["| " + " | ".join(md_text(c) for c in cells(r)) + " |" for r in rows]
    return lines + ["", NOTE]


NOTE = ("Each row is one run; a cell reads mean [interval], with (n/N) when only n of its N problems have the "
        "measure, and – when none has it. Seconds per problem are measured: first call's start to last call's "
        "end as recorded (problems answered from the response cache left out); modelled seconds are the latency "
        "model's for the texts, one problem alone on the GPU named. Definitions: table2.json.")
