"""Check the demo's hand-offs and print where each artifact is; exit 1 when one is missing.

Ends with what the replay pass shows: prompts per problem, the sequential-token reduction, and
simulated seconds per problem for SPRINT (barrier, stream) and the sequential baseline.

    python scripts/check_demo.py OUT_DIR CHECKPOINT [TIME_SCALE]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def simulated_seconds(run: Path, time_scale: float) -> float | None:
    """Mean seconds per problem from its start to its last model call's end, in simulated time."""
    spans = []
    for line in (run / "records.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line) if line.strip() else {}
        ends = [c["end"] for c in record.get("calls") or [] if isinstance(c.get("end"), (int, float))]
        if record.get("status") == "ok" and ends:
            spans.append((max(ends) - record["start"]) / time_scale)
    return sum(spans) / len(spans) if spans else None


def replay_summary(out: Path, time_scale: float, need) -> list[str]:
    """The closing lines about the replay pass (steps 7-8)."""
    metrics_path = out / "view" / "evaluation" / "metrics.json"
    index = out / "view" / "index.html"
    need(metrics_path.is_file(), f"no evaluation of the replay at {metrics_path}")
    need(index.is_file(), f"no viewer at {index}")
    if not metrics_path.is_file():
        return []
    metrics = json.loads(metrics_path.read_text())
    runs = {r["label"]: r["summary"] for r in metrics["runs"]}
    prompts = [s.get("mean_prompts") or 0 for s in runs.values()]
    need(bool(prompts) and min(prompts) > 0, "the replayed SPRINT runs have no prompt: nothing ran in parallel")
    lines = [f"SPRINT replay:  {len(metrics['runs'])} runs (barrier, stream) of "
             f"{next(iter(runs.values()))['problems']} packed demo trajectories vs their sequential traces"]
    for label, summary in runs.items():
        lines.append(f"  {label}: {summary.get('mean_prompts') or 0:.1f} prompts per problem over "
                     f"{summary.get('mean_phases') or 0:.1f} phases, accuracy {100 * (summary.get('accuracy') or 0):.0f}%")
    for comp in metrics.get("comparisons") or []:
        red = comp["overall"].get("reduction")
        lines.append(f"  sequential-token reduction ({comp['run']} vs {comp['baseline']}): "
                     + ("n/a" if red is None else f"{100 * red:.1f}%"))
    times = {name: simulated_seconds(out / "replay" / folder, time_scale)
             for name, folder in (("SPRINT barrier", "sprint-barrier"), ("SPRINT stream", "sprint-stream"),
                                  ("sequential", "baseline"))}
    need(all(t is not None for t in times.values()), "a replayed run recorded no call times")
    lines.append("  simulated seconds per problem (latency model, mean): "
                 + ", ".join(f"{name} {t:.1f} s" for name, t in times.items() if t is not None))
    lines.append("  (seconds count every call's prefill and the tags SPRINT writes, which sequential tokens leave out; "
                 "on short traces like these they weigh against the saved tokens, the paper's savings grow with length)")
    lines.append(f"viewer:         {index.resolve()}  (open it in a browser; no server needed)")
    return lines


def main(out: Path, ckpt: Path, time_scale: float = 1.0) -> int:
    problems: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    sft = json.loads((out / "sft" / "summary.json").read_text())
    need(sft.get("kept", 0) > 0, "packing kept no trajectory")
    need((ckpt / "config.json").is_file(), f"checkpoint {ckpt} has no config.json")
    losses = [
        json.loads(line)["loss"]
        for log in (out / "finetune").rglob("logging.jsonl")
        for line in log.read_text().splitlines()
        if line.strip() and "loss" in json.loads(line)
    ]
    need(bool(losses), "no training loss logged")
    served = {}
    for run in ("orchestration", "baseline"):
        manifest = json.loads((out / run / "manifest.json").read_text())
        served[run] = (manifest.get("model_path"), manifest["config"].get("planner_model") or manifest["config"].get("model"))
        need(Path(str(manifest.get("model_path"))).resolve() == ckpt.resolve(), f"{run} was not served from {ckpt}")
        need(manifest["counts"].get("ok", 0) + sum(v for k, v in manifest["counts"].items() if k != "ok") == 3,
             f"{run} does not hold 3 records")
    report = out / "evaluation" / "report.md"
    need(report.is_file(), "no evaluation report")

    print(f"curation:       {out / 'components'}  {out / 'dag'}")
    print(f"SFT dataset:    {out / 'sft'} (kept {sft.get('kept')}, dropped {sft.get('dropped')})")
    print(f"checkpoint:     {ckpt}")
    print(f"training loss:  {', '.join(f'{x:.3f}' for x in losses)}")
    for run, (path, name) in served.items():
        print(f"{run + ':':15} {out / run} (vLLM served {name!r} from {path})")
    print(f"report:         {report}")
    if report.is_file():
        print("\n" + "\n".join(report.read_text().splitlines()[:24]) + "\n")
    for line in replay_summary(out, time_scale, need):
        print(line)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) == 4 else 1.0))
