"""Dataset input: hub ids, local files, previous stages' folders; column detection; ranges.

Every stage reads its input through `load_items`, so all of them accept the same sources and
report the same clear errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sprint.errors import UserError

# Known hub ids -> paths under $SPRINT_LOCAL_DATA (../shared/data in tests and CI), so the same
# scripts run on a machine without the hub. Users elsewhere just get the hub.
LOCAL_COPIES = {
    "huggingfaceh4/math-500": "math500/test.jsonl",
    "math-500": "math500/test.jsonl",
    "jiayi-pan/countdown-tasks-3to4": "countdown/countdown_3to4_uft.jsonl",
    "countdown": "countdown/countdown_3to4_uft.jsonl",
    "deepseek-ai/deepseek-r1-distill-qwen-7b": "tokenizers/deepseek-r1-distill-qwen-7b",
    "qwen/qwen2.5-7b-instruct": "tokenizers/qwen2.5-7b-instruct",
}

QUESTION_COLUMNS = ("problem", "question", "Question", "prompt")
THOUGHT_COLUMNS = ("thought", "reasoning", "deepseek_reasoning")
ID_COLUMNS = ("ProblemIdx", "unique_id", "id", "idx", "problem_id")
BEGIN_THOUGHT, END_THOUGHT = "<|begin_of_thought|>", "<|end_of_thought|>"


def resolve_local(name: str) -> Path | None:
    """The local copy of a known hub id when SPRINT_LOCAL_DATA is set, else None."""
    root = os.environ.get("SPRINT_LOCAL_DATA")
    if not root:
        return None
    rel = LOCAL_COPIES.get(name.lower())
    if rel is None:
        return None
    path = Path(root) / rel
    return path if path.exists() else None


@dataclass
class Item:
    """One input row, with the columns every stage needs found once."""

    id: str
    index: int
    question: str
    thought: str | None = None
    solution: str | None = None
    answer: str | None = None
    row: dict[str, Any] = field(default_factory=dict)


def safe_id(raw: Any) -> str:
    """A filesystem-safe id: MATH-500's `test/algebra/1.json` -> `test_algebra_1` (as the authors' logs)."""
    s = str(raw)
    if s.endswith(".json"):
        s = s[: -len(".json")]
    s = s.replace("/", "_").replace("\\", "_")
    s = re.sub(r"[^A-Za-z0-9._=+-]", "_", s).strip(".")
    return s or "item"


def parse_range(spec: str | None, n: int) -> range:
    """`start:end` (either side optional, negatives from the end) as in the authors' scripts."""
    if spec is None or spec.strip() in ("", ":", "all"):
        return range(n)
    m = re.fullmatch(r"\s*(-?\d*)\s*:\s*(-?\d*)\s*", spec)
    if not m:
        raise UserError(f"bad range {spec!r}; write START:END, e.g. 0:100, :50 or 10:")
    start = int(m.group(1)) if m.group(1) else 0
    end = int(m.group(2)) if m.group(2) else n
    return range(*slice(start, end).indices(n))


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise UserError(f"{path}: line {lineno} is not valid UTF-8; re-encode the file as UTF-8") from None
            except json.JSONDecodeError as exc:
                if not raw.endswith(b"\n") and path.name == "records.jsonl":
                    break  # a half-written last line of an interrupted stage: ignored, redone on resume
                raise UserError(f"{path}: line {lineno} is not valid JSON ({exc.msg}); fix or remove that line") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}: line {lineno} is a JSON {type(row).__name__}, expected an object per line")
            rows.append(row)
    return rows


def load_rows(source: str, split: str | None = "train", subset: str | None = None) -> list[dict]:
    """Rows of a hub dataset, a local .jsonl/.json/.parquet file, or a stage folder (its ok records)."""
    if not source:
        raise UserError("no input data given; pass a hub id, a .jsonl/.json/.parquet file or a stage folder")
    local = resolve_local(source)
    path = local or Path(source).expanduser()
    if path.is_dir():
        records = path / "records.jsonl"
        if records.is_file():
            return [r for r in _read_jsonl(records) if r.get("status", "ok") == "ok"]
        files = sorted(path.glob("*.jsonl")) + sorted(path.glob("*.parquet")) + sorted(path.glob("*.json"))
        if split:
            files = [f for f in files if f.stem.startswith(split)] or files
        if not files:
            raise UserError(f"{path} is a folder without records.jsonl or data files; pass a stage folder or a data file")
        return [row for f in files for row in load_rows(str(f), split, subset)]
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            rows = _read_jsonl(path)
        elif suffix in (".json", ".parquet"):
            rows = _load_with_datasets("json" if suffix == ".json" else "parquet", path)
        else:
            raise UserError(f"{path}: unsupported file type {suffix!r}; use .jsonl, .json or .parquet")
        if split and rows and "split" in rows[0] and any(r.get("split") == split for r in rows):
            rows = [r for r in rows if r.get("split") == split]
        return rows
    if source.startswith((".", "/", "~")) or source.endswith((".jsonl", ".json", ".parquet")):
        raise UserError(f"input {source!r} does not exist; check the path")
    return _load_hub(source, split, subset)


def _load_with_datasets(fmt: str, path: Path) -> list[dict]:
    import datasets

    try:
        ds = datasets.load_dataset(fmt, data_files=str(path), split="train")
    except Exception as exc:
        raise UserError(f"{path}: cannot be read as {fmt} ({type(exc).__name__}: {str(exc)[:200]})") from None
    return ds.to_list()


def _load_hub(source: str, split: str | None, subset: str | None) -> list[dict]:
    import datasets

    try:
        ds = datasets.load_dataset(source, subset, split=split or "train")
    except Exception as exc:
        hint = " (this machine may have no access to the Hugging Face hub; set SPRINT_LOCAL_DATA or pass a local file)"
        raise UserError(f"cannot load dataset {source!r} split {split!r}: {type(exc).__name__}: {str(exc)[:200]}{hint}") from None
    return ds.to_list()


def _first(row: dict, names: tuple[str, ...]) -> Any:
    for name in names:
        if row.get(name) not in (None, ""):
            return row[name]
    return None


def _openthoughts(row: dict) -> str | None:
    conv = row.get("conversations")
    if not isinstance(conv, list) or len(conv) < 2 or not isinstance(conv[1], dict):
        return None
    text = conv[1].get("value") or ""
    if BEGIN_THOUGHT in text:
        text = text.split(BEGIN_THOUGHT, 1)[1]
        text = text.split(END_THOUGHT, 1)[0]
    return text.strip() or None


def to_item(row: dict, index: int, question_col: str | None = None, id_col: str | None = None) -> Item:
    question = row.get(question_col) if question_col else _first(row, QUESTION_COLUMNS)
    if question is None and isinstance(row.get("conversations"), list) and row["conversations"]:
        question = row["conversations"][0].get("value")
    raw_id = row.get(id_col) if id_col else _first(row, ID_COLUMNS)
    return Item(
        id=safe_id(raw_id if raw_id is not None else index),
        index=index,
        question=str(question) if question is not None else "",
        thought=_first(row, THOUGHT_COLUMNS) or _openthoughts(row),
        solution=row.get("solution"),
        answer=None if row.get("answer") is None else str(row["answer"]),
        row=row,
    )


def load_items(
    source: str,
    split: str | None = "train",
    subset: str | None = None,
    range_spec: str | None = None,
    question_col: str | None = None,
    id_col: str | None = None,
    require: tuple[str, ...] = ("question",),
) -> list[Item]:
    """Load, slice and normalise input rows; fail early and clearly when a needed column is missing."""
    rows = load_rows(source, split, subset)
    if not rows:
        raise UserError(f"input {source!r} (split {split!r}) has no rows")
    items = [to_item(rows[i], i, question_col, id_col) for i in parse_range(range_spec, len(rows))]
    for need in require:
        missing = [it for it in items if not getattr(it, need)]
        if len(missing) == len(items) and items:
            cols = ", ".join(sorted(rows[0].keys()))
            raise UserError(f"input {source!r} has no {need} column (columns: {cols}); see README for the accepted layouts")
    seen: dict[str, int] = {}
    for it in items:  # duplicate ids would collide in resumable outputs
        if it.id in seen:
            seen[it.id] += 1
            it.id = f"{it.id}_{seen[it.id]}"
        else:
            seen[it.id] = 0
    return items


def fingerprint(source: str, items: list[Item]) -> str:
    """A short hash of what was read, so a manifest says exactly which data a run saw."""
    h = hashlib.sha256(source.encode())
    for it in items:
        h.update(json.dumps(it.row, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]
