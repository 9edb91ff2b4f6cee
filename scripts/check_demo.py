"""Check the demo's hand-offs and print where each artifact is; exit 1 when one is missing.

    python scripts/check_demo.py OUT_DIR CHECKPOINT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: Path, ckpt: Path) -> int:
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
        print("\n" + "\n".join(report.read_text().splitlines()[:24]))
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
