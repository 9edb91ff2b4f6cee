"""The mini experiment's closing summary (`sprint mini-summary`, end of `make demo`): Table 2 and
what the SPRINT model learned.

Reads OUT/evaluation/table2.json (written by `sprint evaluate`) and the runs' records; prints the
table, then the learned behaviour on the held-out problems (well-formed trajectories, phases with
parallel prompts, where the wrong answers went wrong) and the paper's claims as ratios from this
one run. It reports; the demo's targets are printed beside the figures, never assumed.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from sprint.core.data import iter_jsonl
from sprint.core.errors import UserError
from sprint.core.options import add_options, config_from, option
from sprint.evaluation.metrics import mean_with_ci
from sprint.format.tokencount import load_counter
from sprint.format.trajectory import TrajectoryError, count_tokens, parse
from sprint.mini.countdown import RECHECK
from sprint.mini.departure import departures, format_departures
from sprint.mini.diagnosis import arithmetic, diagnose, format_diagnosis
from sprint.mini.figures import MINIATURE, SUMMARY_DIR, arithmetic_sections
from sprint.mini.grpo import CURVE, grpo_curve
from sprint.mini.problems import TASKS

GRPO_ROW = "SPRINT+GRPO stream"  # the label scripts/mini_demo.sh gives the run after GRPO


def behaviour(run: Path) -> dict[str, float]:
    """Share of problems whose trajectory parses strictly, and of those with a phase of >= 2 prompts."""
    rows = list(iter_jsonl(run / "records.jsonl"))
    formed = parallel = prompts = 0
    for row in rows:
        try:
            traj = parse(row.get("trajectory") or "", strict=True)
        except TrajectoryError:
            continue
        if traj.final_answer is None:
            continue
        formed += 1
        counts = [len(ph.prompts) for ph in traj.phases]
        prompts += sum(counts)
        parallel += any(c >= 2 for c in counts)
    n = len(rows) or 1
    return {"problems": len(rows), "well_formed": formed / n, "parallel": parallel / max(formed, 1),
            "prompts_per_problem": prompts / max(formed, 1)}


RUNS = {"SPRINT barrier": "sprint-barrier", "SPRINT stream": "sprint-stream", GRPO_ROW: "sprint-grpo-stream"}


def grpo_summary(root: Path, rows: dict[str, dict]) -> None:
    """The GRPO run's curve (drawn to OUT/grpo/curve.png) and SPRINT stream before and after it."""
    logs = sorted((root / "grpo-train").glob("v*/logging.jsonl"))
    if not logs:
        return
    steps = grpo_curve(logs[-1], root / "grpo" / "curve.png")
    k = max(1, min(5, len(steps) // 4))

    def mean(key: str, part: list[dict]) -> float:
        return sum(float(s.get(key) or 0) for s in part) / len(part)

    print(f"\nlatency-aware GRPO: {len(steps)} steps; first {k} steps -> last {k} (sampled rollouts):")
    for key, label in CURVE:
        print(f"  {label}: {mean(key, steps[:k]):.3f} -> {mean(key, steps[-k:]):.3f}")
    print(f"  curve: {root / 'grpo' / 'curve.png'}")
    before, after = rows.get("SPRINT stream"), rows.get(GRPO_ROW)
    if before and after:
        print("  held-out, greedy: accuracy {} -> {}; sequential tokens {} -> {}".format(
            cell(percent(before["accuracy"]), ".1f"), cell(percent(after["accuracy"]), ".1f"),
            cell(before["sequential_tokens"], ".1f"), cell(after["sequential_tokens"], ".1f")))
    sampled_before, sampled_after = (sampled(root, name) for name in ("sprint", "grpo"))
    if sampled_before and sampled_after:
        print(f"  held-out, sampled as GRPO samples ({sampled_before.draws} draws per problem): "
              f"{format_sampled(sampled_before, sampled_after)}")


@dataclass
class Sampled:
    """One model's sampled runs on the held-out problems (runs/sampled/NAME-seedK): per problem, the
    mean over its draws of correctness, critical path and checking twice (the habit GRPO can drop)."""

    draws: int
    correct: dict[str, float]
    critical_path: dict[str, float]
    twice: dict[str, float]


def sampled(root: Path, name: str) -> Sampled | None:
    runs = sorted((root / "runs" / "sampled").glob(f"{name}-seed*/records.jsonl"))
    if not runs:
        return None
    count = load_counter(str(root / "tokenizer"))
    per: dict[str, list[tuple[bool, int, bool]]] = {}
    for path in runs:
        for row in iter_jsonl(path):
            text = row.get("trajectory") or ""
            per.setdefault(row["id"], []).append(
                (bool(row.get("correct")), count_tokens(parse(text, strict=False), count.count).sequential, RECHECK[0] in text))
    means = {key: {i: sum(d[k] for d in draws) / len(draws) for i, draws in per.items()}
             for k, key in enumerate(("correct", "critical_path", "twice"))}
    return Sampled(len(runs), **means)


def format_sampled(before: Sampled, after: Sampled) -> str:
    """Before -> after with CIs, and the paired change of the critical path (bootstrap over problems)."""
    ids = sorted(set(before.correct) & set(after.correct))

    def measure(s: Sampled, key: str, scale: float = 1.0) -> dict | None:
        return mean_with_ci([getattr(s, key)[i] * scale for i in ids])

    # the problems are resampled as pairs: the interval of the mean change is the paired one
    change = mean_with_ci([after.critical_path[i] - before.critical_path[i] for i in ids])
    return ("accuracy {} -> {} %; critical path {} -> {} tokens (change {}; target: lower after); "
            "checks twice {} -> {} %").format(
        cell(measure(before, "correct", 100), ".1f"), cell(measure(after, "correct", 100), ".1f"),
        cell(measure(before, "critical_path"), ".1f"), cell(measure(after, "critical_path"), ".1f"),
        cell(change, "+.1f"), cell(measure(before, "twice", 100), ".1f"), cell(measure(after, "twice", 100), ".1f"))


def percent(measure: dict) -> dict:
    return dict(measure, value=measure["value"] * 100, ci=[c * 100 for c in measure["ci"]] if measure.get("ci") else None)


def cell(measure: dict | None, fmt: str) -> str:
    if not measure or measure.get("value") is None:
        return "–"
    ci = measure.get("ci")
    text = format(measure["value"], fmt)
    return f"{text} [{format(ci[0], fmt)}, {format(ci[1], fmt)}]" if ci else text


def print_summary(out: str, task: str) -> int:
    root = Path(out)
    table = json.loads((root / "evaluation" / "table2.json").read_text())
    rows = {r["method"]: r for r in table["rows"]}
    print(f"Table 2, in miniature (held-out {task} problems; mean [95% CI])")
    print(f"{'method':<20} {'accuracy':<22} {'sequential tokens':<24} {'total tokens':<24} {'seconds/problem':<20}")
    for name, r in rows.items():
        seconds = r["seconds_per_problem"]
        timed = f" ({seconds['n']} run alone)" if seconds and seconds.get("n", r["problems"]) < r["problems"] else ""
        print(f"{name:<20} {cell(percent(r['accuracy']), '.1f') + ' %':<22} {cell(r['sequential_tokens'], '.1f'):<24} "
              f"{cell(r['total_tokens'], '.1f'):<24} {cell(seconds, '.2f') + timed:<20}")
    rft = rows.get("RFT")
    for name, folder in RUNS.items():
        run = root / "runs" / folder
        if not (run / "records.jsonl").exists():
            continue
        b = behaviour(run)
        print(f"\n{name}: {b['well_formed']:.1%} well-formed (target >= 95%), {b['parallel']:.1%} of them with a phase "
              f"of >= 2 parallel prompts (target >= 80%), {b['prompts_per_problem']:.2f} prompts per problem")
        if rft and name in rows:
            r = rows[name]
            diff = (r["accuracy"]["value"] - rft["accuracy"]["value"]) * 100
            ratio = r["sequential_tokens"]["value"] / rft["sequential_tokens"]["value"]
            secs = r["seconds_per_problem"]["value"], rft["seconds_per_problem"]["value"]
            speed = f"{secs[0] / secs[1]:.2f}" if None not in secs else "–"
            print(f"  accuracy {diff:+.1f} points vs RFT (target >= -5; RFT {rft['accuracy']['value']:.1%}, target >= 60%); "
                  f"sequential tokens {ratio:.2f} x RFT's (target <= {0.7 if task == 'arithmetic' else 0.6}); "
                  f"seconds per problem {speed} x RFT's (target < 1)")
        if task != "countdown":
            continue
        steps = arithmetic(run)
        print("  where the answers went:\n" + "\n".join("    " + line for line in format_diagnosis(diagnose(run))))
        print(f"    executors' single steps right: {steps.right} of {steps.steps} ({steps.share:.1%}; chance {steps.chance:.1%})")
    if task == "arithmetic":
        if (root / "runs" / "rft" / "records.jsonl").is_file():
            print("\nRFT: where each output first leaves the trace the generator would write")
            print("\n".join("  " + line for line in format_departures(departures(root / "runs" / "rft"))))
        sections = arithmetic_sections(root)
        miniature = root / SUMMARY_DIR / MINIATURE  # written even when no SPRINT run gives a section
        miniature.parent.mkdir(exist_ok=True)
        miniature.write_text("# The miniature's own figures\n\n" + "\n".join(sections) + "\n")
        print("\n" + "\n".join(sections))
        print(f"\nthe miniature's figures: {miniature}")
    grpo_summary(root, rows)
    print(f"\nreport: {root / 'evaluation' / 'report.md'}  table: {root / 'evaluation' / 'table2.json'}  "
          f"viewer: {root / 'view' / 'index.html'}")
    models = [str(root / f"{m}-model") for m in ("base", "sprint", "rft", "grpo") if (root / f"{m}-model").is_dir()]
    print(f"tokenizer: {root / 'tokenizer'}  checkpoints: {', '.join(models)}")
    return 0


@dataclass(kw_only=True)
class MiniSummaryConfig:
    """`sprint mini-summary`: the closing summary of a mini experiment folder."""

    out: str = option("outputs/mini", "the mini experiment's folder (DEMO_DIR of scripts/mini_demo.sh)", flags=("out",))
    task: str = option("arithmetic", "the task the folder's problems are of (sprint mini-data --task)", choices=TASKS)


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_options(parser, MiniSummaryConfig)


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(MiniSummaryConfig, args)
    if not (Path(cfg.out) / "evaluation" / "table2.json").is_file():
        raise UserError(f"no evaluation/table2.json in {cfg.out}; run scripts/mini_demo.sh (make demo) first")
    return print_summary(cfg.out, cfg.task)
