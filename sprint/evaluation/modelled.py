"""Modelled seconds: what each problem of a run would take on a GPU, one problem at a time.

Why: measured seconds exist only for runs timed live (and on the machine they ran on); every run
has token counts. `sprint.latency` turns a trajectory into seconds on a GPU described by a latency
model (default: the H200 one; `evaluate --latency` a preset or a latency file): a SPRINT text
under its run's schedule (barrier when the run does not say, as in the authors' logs), a
sequential model's output as one generation. Every prompt starts with the agent prompt, which
the server holds in its prefix cache (every problem shares it), so it costs only its KV reads.

This module computes the per-problem figures (`problem_seconds`) and their summaries (mean with a
bootstrap CI, overall and per length bucket of the baseline; SPRINT / baseline ratios, paired by
problem), which metrics.json (`modelled`), table2.json and report.md (`report.modelled_lines`) all read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sprint.evaluation import metrics as M
from sprint.evaluation.runs import Key, LoadedRun, Parsed
from sprint.format import tags
from sprint.format.prompt_format import load_agent_prompt
from sprint.format.trajectory import render_question
from sprint.latency.model import DEFAULT_LATENCY, LatencyModel, resolve_latency
from sprint.latency.simulate import SCHEDULES, line_counts, modelled_timelines, sequential_timeline

SEQUENTIAL = "sequential"
DEFAULT_SCHEDULE = "barrier"  # a SPRINT run whose manifest names no schedule (the authors' logs run phase by phase)
NO_MODEL = "none"


@dataclass(frozen=True)
class ModelledSetting:
    """The latency model seconds are modelled with, and the tokens every prompt starts with."""

    model: LatencyModel
    source: str  # the preset name or the latency file
    overhead_tokens: int  # the agent prompt, in the server's prefix cache

    @property
    def label(self) -> str:
        return f"modelled: {self.model.gpu}, one problem at a time"

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "gpu": self.model.gpu, "source": self.source,
                "overhead_tokens": self.overhead_tokens, "latency_model": self.model.terms()}


def setting(spec: str | None, tokenizer: str) -> ModelledSetting | None:
    """The model `evaluate --latency` names (None: the default; "none": no modelled seconds)."""
    if spec is not None and str(spec).strip().lower() == NO_MODEL:
        return None
    model = resolve_latency(spec)
    agent = load_agent_prompt()
    overhead = line_counts(tokenizer, [agent])[agent] if agent else 0
    return ModelledSetting(model, str(spec or DEFAULT_LATENCY), overhead)


def schedule_of(manifest: Mapping[str, Any] | None) -> str:
    """The schedule a SPRINT run's seconds are modelled under: its manifest's, else barrier."""
    cfg = manifest.get("config") if isinstance(manifest, Mapping) else None
    value = cfg.get("schedule") if isinstance(cfg, Mapping) else None
    return value if value in SCHEDULES else DEFAULT_SCHEDULE


def problem_seconds(runs: Sequence[LoadedRun], parsed: Mapping[Key, Parsed], counted: Mapping[Key, Any],
                    tokenizer: str, chosen: ModelledSetting) -> dict[Key, dict[str, float]]:
    """Per problem with a text: {schedule: seconds} for SPRINT (both schedules), {"sequential": seconds}
    for a baseline (its counted output length after the agent prompt, the question and `<think>`)."""
    model, overhead = chosen.model, chosen.overhead_tokens
    keys = sorted(parsed)
    timelines, _ = modelled_timelines([parsed[k].traj for k in keys], tokenizer, model,
                                      prompt_overhead_tokens=overhead, overhead_cached=True)
    out: dict[Key, dict[str, float]] = {k: {s: t.total for s, t in tl.items()} for k, tl in zip(keys, timelines)}
    questions = {runs[ri].problems[pi].id: parsed[(ri, pi)].traj.question for ri, pi in keys}
    baseline = [(ri, pi) for ri, run in enumerate(runs) if run.mode == "baseline"
                for pi, prob in enumerate(run.problems) if isinstance(counted.get((ri, pi)), int)]
    texts = {}
    for ri, pi in baseline:
        prob = runs[ri].problems[pi]
        question = prob.question or questions.get(prob.id) or ""
        texts[(ri, pi)] = render_question(question) if question else ""
    counts = line_counts(tokenizer, [t for t in texts.values() if t] + [tags.THINK])
    for key in baseline:
        prompt = overhead + (counts[texts[key]] if texts[key] else 0) + counts[tags.THINK]
        out[key] = {SEQUENTIAL: sequential_timeline(model, int(counted[key]), prompt, overhead).total}
    return out


# --------------------------------------------------------------------------- summaries


def by_bucket(values: Mapping[str, float], reference: Mapping[str, float] | None,
              stats: Mapping[str, Any]) -> dict[str, Any] | None:
    """Mean seconds with CIs per length bucket of the baseline (None without a baseline reference)."""
    if not reference:
        return None
    out: dict[str, Any] = {}
    for label in M.bucket_labels():
        vals = [v for pid, v in values.items() if M.bucket_of(reference.get(pid)) == label]
        out[label] = M.mean_with_ci(vals, **stats)
    return out


def seconds_block(values: Mapping[str, float], reference: Mapping[str, float] | None,
                  stats: Mapping[str, Any]) -> dict[str, Any]:
    """{overall, buckets}: one run's modelled seconds per problem, summarized."""
    return {"overall": M.mean_with_ci(list(values.values()), **stats), "buckets": by_bucket(values, reference, stats)}


def ratio(sprint: Mapping[str, float], base: Mapping[str, float], ids: Sequence[str],
          stats: Mapping[str, Any]) -> dict[str, Any] | None:
    """mean SPRINT seconds / mean baseline seconds over `ids` (paired), with its bootstrap CI."""
    got = M.ratio_of_means([sprint[i] for i in ids], [base[i] for i in ids], **stats)
    if got is None:
        return None
    return {"value": got["value"], "ci": got["ci"], "n": got["n"],
            "sprint_seconds": got["sprint"], "baseline_seconds": got["baseline"]}


def comparison(sprint: Mapping[str, Mapping[str, float]], base: Mapping[str, float],
               reference: Mapping[str, float] | None, stats: Mapping[str, Any]) -> dict[str, Any]:
    """SPRINT's modelled seconds over the baseline's, per schedule, overall and per bucket (<1: SPRINT is faster)."""
    out: dict[str, Any] = {}
    for schedule, values in sprint.items():
        ids = [i for i in values if i in base]
        buckets = None
        if reference:
            buckets = {label: ratio(values, base, [i for i in ids if M.bucket_of(reference.get(i)) == label], stats)
                       for label in M.bucket_labels()}
        out[schedule] = {"overall": ratio(values, base, ids, stats), "buckets": buckets}
    return out
