"""Inputs of the demo's replay pass: the packed SPRINT trajectories and their original sequential traces.

The tiny random model of `make demo-sample` writes no plan, so its SPRINT run never runs anything in
parallel. The replay pass shows the method working instead: the replay server answers the real
orchestrator with the trajectories packing made from the bundled traces, and the sequential
baseline with the traces they were made from (thought, `</think>`, then the reference solution),
both timed by the latency model. This script writes what the server and the orchestrator read:

    OUT/replay/recorded/planner_trajectory_<id>.txt    packed trajectories (kept by packing)
    OUT/replay/recorded/base_model_trajectory_<id>.txt question + the original sequential trace
    OUT/replay/problems.jsonl                          problem / answer / unique_id, for orchestrate

    python scripts/demo_replay.py OUT [TRACES]   (TRACES default: examples/demo/traces.jsonl)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sprint.core.data import safe_id
from sprint.format.trajectory import render_question


def main(out: Path, traces: Path) -> int:
    packed = {}
    for line in (out / "sft" / "records.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line) if line.strip() else {}
        if row.get("status") == "ok" and isinstance(row.get("trajectory"), str):
            packed[str(row["id"])] = row["trajectory"]
    if not packed:
        sys.exit(f"error: {out / 'sft' / 'records.jsonl'} holds no packed trajectory; run the packing step first")
    folder = out / "replay" / "recorded"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.txt"):
        old.unlink()
    problems = []
    for line in traces.read_text(encoding="utf-8").splitlines():
        trace = json.loads(line) if line.strip() else {}
        pid = str(trace.get("id", ""))
        if pid not in packed:
            continue  # dropped by packing: nothing to replay
        name = safe_id(pid)
        (folder / f"planner_trajectory_{name}.txt").write_text(packed[pid], encoding="utf-8")
        sequential = f"{trace['thought'].strip()}\n</think>\n\n{trace['solution'].strip()}"
        (folder / f"base_model_trajectory_{name}.txt").write_text(
            render_question(trace["problem"]) + "\n\n" + sequential, encoding="utf-8")
        problems.append({"problem": trace["problem"], "answer": str(trace["answer"]), "unique_id": pid})
    data = out / "replay" / "problems.jsonl"
    data.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in problems), encoding="utf-8")
    print(f"{len(problems)} packed trajectories and their sequential traces in {folder}; problems in {data}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) == 3 else "examples/demo/traces.jsonl")))
