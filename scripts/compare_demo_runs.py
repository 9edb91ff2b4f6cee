"""Compare two `make demo` folders artefact by artefact: is a run a function of its settings and seeds?

    .venv/bin/python scripts/compare_demo_runs.py outputs/mini outputs/again

Checks, and prints one line each: the data and SFT files and the tokenizer byte for byte; every
tensor of each checkpoint; each measured run's text per held-out problem; and the accuracy and
token columns of `evaluation/table2.json` (seconds move with the machine, paths with the folder).
Stages 1-2 append records as answers come back, so their `records.jsonl` are compared as sets of
lines. Exits 1 when anything differs, 2 when a folder lacks an artefact.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.numpy import load_file

from sprint.mini.artefacts import DATA_HALF

AS_SETS = ("components/records.jsonl", "dag/records.jsonl")  # completion order; volatile keys dropped
VOLATILE = ("start", "end", "calls", "elapsed", "usage")
MODELS = ("base", "sprint", "rft", "grpo")
TEXT_KEYS = ("trajectory", "generation")
TABLE_COLUMNS = ("accuracy", "sequential_tokens", "total_tokens")


def stable_lines(path: Path) -> set[str]:
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        out.add(json.dumps({k: v for k, v in row.items() if k not in VOLATILE}, sort_keys=True))
    return out


def texts(run: Path) -> dict[str, str]:
    rows = [json.loads(line) for line in (run / "records.jsonl").read_text(encoding="utf-8").splitlines()]
    return {r["id"]: next(str(r[k]) for k in TEXT_KEYS if k in r) for r in rows}


def table_columns(folder: Path) -> dict[str, dict]:
    table = json.loads((folder / "evaluation" / "table2.json").read_text(encoding="utf-8"))
    return {r["method"]: {c: r.get(c) for c in TABLE_COLUMNS} for r in table["rows"]}


def compare(a: Path, b: Path) -> list[tuple[str, bool, str]]:
    results = [(name, (a / name).read_bytes() == (b / name).read_bytes(), "bytes") for name in DATA_HALF]
    results += [(name, stable_lines(a / name) == stable_lines(b / name), "set of records") for name in AS_SETS]
    for model in MODELS:
        name = f"{model}-model/model.safetensors"
        if not (a / name).exists() and not (b / name).exists():
            continue
        x, y = load_file(str(a / name)), load_file(str(b / name))
        unequal = [k for k in x if k not in y or x[k].shape != y[k].shape or not (x[k] == y[k]).all()]
        same = not unequal and x.keys() == y.keys()
        results.append((name, same, f"{len(x)} tensors" + ("" if same else f", {len(unequal)} differ")))
    for run in sorted(p.name for p in (a / "runs").iterdir() if (p / "records.jsonl").exists()):
        x, y = texts(a / "runs" / run), texts(b / "runs" / run)
        differ = sum(x[i] != y.get(i) for i in x) + len(y.keys() - x.keys())
        results.append((f"runs/{run}", differ == 0, f"{len(x)} texts" + (f", {differ} differ" if differ else "")))
    results.append(("evaluation/table2.json", table_columns(a) == table_columns(b), ", ".join(TABLE_COLUMNS)))
    return results


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    a, b = map(Path, argv)
    try:
        results = compare(a, b)
    except FileNotFoundError as exc:
        print(f"missing: {exc.filename} (both folders need a finished `make demo`)", file=sys.stderr)
        return 2
    for name, same, what in results:
        print(f"{'same   ' if same else 'DIFFER '} {name} ({what})")
    return 0 if all(same for _, same, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
