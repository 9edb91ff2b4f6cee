"""Dataset input: hub ids, local files, previous stages' folders; column detection; ranges.

Every stage reads its input through `load_items`, so all of them accept the same sources and
report the same clear errors.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import logging
import os
import re
import threading
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from sprint.core.errors import UserError
from sprint.core.options import env_switch

log = logging.getLogger(__name__)

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
RECORDS_FILE = "records.jsonl"  # a stage folder's records (sprint.core.records), read in input order


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


MAX_ID_CHARS = 120  # ids name files (trajectories/<id>.txt); most filesystems allow 255 bytes


def safe_id(raw: Any) -> str:
    """A filesystem-safe id: MATH-500's `test/algebra/1.json` -> `test_algebra_1` (as the authors' logs).

    Over-long ids are cut and given a hash of the whole id, so they stay distinct and usable as file names.
    """
    s = str(raw)
    if s.endswith(".json"):
        s = s[: -len(".json")]
    s = s.replace("/", "_").replace("\\", "_")
    s = re.sub(r"[^A-Za-z0-9._=+-]", "_", s).strip(".")
    if len(s) > MAX_ID_CHARS:
        s = s[: MAX_ID_CHARS - 17] + "-" + hashlib.sha256(str(raw).encode()).hexdigest()[:16]
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
    return list(iter_rows(path))


def iter_rows(path: Path) -> Iterator[dict]:
    """The rows of a JSONL file as a stage should read them: a stage's records.jsonl in its input's
    order (`iter_records`), any other file in file order."""
    return iter_records(path) if path.name == RECORDS_FILE else iter_jsonl(path)


def _jsonl_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(byte offset, row) of each row of a JSONL file, with one clear error for a broken line."""
    with open(path, "rb") as f:
        offset = 0
        for lineno, raw in enumerate(f, 1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise UserError(f"{path}: line {lineno} is not valid UTF-8; re-encode the file as UTF-8") from None
            except json.JSONDecodeError as exc:
                if not raw.endswith(b"\n") and path.name == RECORDS_FILE:
                    break  # a half-written last line of an interrupted stage: ignored, redone on resume
                raise UserError(f"{path}: line {lineno} is not valid JSON ({exc.msg}); fix or remove that line") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}: line {lineno} is a JSON {type(row).__name__}, expected an object per line")
            yield start, row


def iter_jsonl(path: Path) -> Iterator[dict]:
    """The rows of a JSONL file one at a time, in file order."""
    for _, row in _jsonl_lines(path):
        yield row


def iter_records(path: Path) -> Iterator[dict]:
    """A stage's records.jsonl in its input's order (each record's `index`), one record at a time.

    Why: a stage appends a record when its item finishes, so with concurrent workers the file's
    order is the order the answers came back, which changes from run to run (and with a resume).
    Everything downstream (the next stage, packing, the SFT files and every seeded batch drawn from
    them) must follow the input instead. One pass notes each line's index and offset, a second reads
    the lines in that order, so a 60k-trace folder is never held whole. Records without an integer
    `index` (files of other tools) are read in file order.
    """
    spans: list[tuple[int, int]] = []
    for offset, row in _jsonl_lines(path):
        index = row.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            yield from iter_jsonl(path)
            return
        spans.append((index, offset))
    spans.sort()  # (index, offset): ties keep the file's order
    with open(path, "rb") as f:
        for _, offset in spans:
            f.seek(offset)
            yield json.loads(f.readline().decode("utf-8"))


def load_rows(source: str, split: str | None = "train", subset: str | None = None, *,
              flag: str | None = None) -> list[dict]:
    """Rows of a hub dataset, a local .jsonl/.json/.parquet file, or a stage folder (its ok records).

    `flag` names the option (and script variable) the source came from, for the error messages.
    """
    if not source:
        raise UserError(f"no input data given; set {flag or 'the input'} to a hub id, a .jsonl/.json/.parquet "
                        "file or a stage folder")
    local = resolve_local(source)
    path = local or Path(source).expanduser()
    if path.is_dir():
        records = path / RECORDS_FILE
        if records.is_file():
            everything = _read_jsonl(records)
            ok = [r for r in everything if r.get("status", "ok") == "ok"]
            if everything and not ok:
                statuses = sorted({str(r.get("status")) for r in everything})
                raise UserError(
                    f"{records} holds {len(everything)} records but none with status ok "
                    f"(statuses: {', '.join(statuses)}); re-run the stage that wrote {path} (see the errors in its records)"
                )
            return ok
        files = sorted(path.glob("*.jsonl")) + sorted(path.glob("*.parquet")) + sorted(path.glob("*.json"))
        files = [f for f in files if f.name != "manifest.json"]
        if split:
            files = [f for f in files if f.stem.startswith(split)] or files
        if not files:
            raise UserError(f"{path} is a folder without records.jsonl or data files; pass a stage folder or a data file")
        return [row for f in files for row in load_rows(str(f), split, subset)]
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            rows = _read_jsonl(path)
        elif suffix == ".json":
            rows = _read_json(path)
        elif suffix == ".parquet":
            rows = _load_with_datasets("parquet", path)
        else:
            raise UserError(f"{path}: unsupported file type {suffix!r}; use .jsonl, .json or .parquet")
        if split and rows and "split" in rows[0] and any(r.get("split") == split for r in rows):
            rows = [r for r in rows if r.get("split") == split]
        return rows
    if looks_like_path(source):
        raise UserError(missing_path_message(source, flag))
    return _load_hub(source, split, subset)


# Endings that name a file, never a hub dataset id ("org/name").
FILE_ENDINGS = (".jsonl", ".json", ".parquet", ".csv", ".tsv", ".txt", ".arrow", ".gz", ".zip", ".jsonl.gz")

# The folders the scripts write by default -> what writes them, so a missing one says what to run.
PRODUCERS = {
    "component_separation": "run_component_separation.sh (`sprint components`)",
    "dag_creation": "run_dag_creation.sh (`sprint dag`)",
    "finetuning_data": "run_finetuning_data_preparation.sh (`sprint pack`)",
    "finetune": "run_finetune.sh (`sprint finetune`)",
    "orchestration": "run_agent_orchestration.sh (`sprint orchestrate`)",
    "baseline": "run_baseline_evaluation.sh (`sprint baseline`)",
    "time_replay": "run_time_replay.sh (`sprint time-replay`)",
}


def looks_like_path(source: str) -> bool:
    """Whether `source` names a local file or folder rather than a hub id (`org/name`).

    A hub id has exactly one slash and no file ending; anything starting like a path, ending like
    a file, with a backslash or several slashes, or whose first part is an existing local folder
    (`outputs/componets`: a typo of a folder under `outputs/`) is a path, and a missing one is
    reported as such instead of being looked up on the hub.
    """
    s = str(source)
    if s.startswith(("./", "../", "/", "~", ".")) or "\\" in s or s.lower().endswith(FILE_ENDINGS):
        return True
    if s.count("/") != 1:
        return s.count("/") > 1
    first = s.split("/", 1)[0]
    # the scripts' default folders (`outputs/dag_creation` before stage 2 ran) are never hub ids
    return first == "outputs" or (bool(first) and Path(first).expanduser().is_dir())


def missing_path_message(source: str, flag: str | None = None) -> str:
    """One line for a path that does not exist: the near miss beside it, what writes it, what to set."""
    path = Path(source).expanduser()
    parent = path.parent
    near: list[str] = []
    if parent.is_dir():
        try:
            near = difflib.get_close_matches(path.name, [p.name for p in parent.iterdir()], n=1, cutoff=0.6)
        except OSError:
            pass
    name = near[0] if near else path.name
    known = (PRODUCERS.get(name) or PRODUCERS.get(parent.name)
             or PRODUCERS.get(next(iter(difflib.get_close_matches(name, list(PRODUCERS), n=1)), "")))
    text = f"{source!r} does not exist"
    if near:
        text += f" (did you mean {str(parent / near[0])!r}?)"
    elif known:
        text += f"; it is written by {known}: run that first"
    if flag:
        lead = "or " if known and not near else "check the path, or "
        return text + f"; {lead}set {flag} to an existing file or folder"
    return text if known and not near else text + "; check the path"


STAGE_COMMANDS = {"components": "component_separation", "dag": "dag_creation", "pack": "finetuning_data",
                  "orchestrate": "orchestration", "baseline": "baseline"}


def check_stage_input(source: str, expected: str, command: str, key: str, flag: str | None = None) -> None:
    """Refuse, before any work, an input that is not the output of stage `expected`.

    A stage folder says which stage wrote it (manifest.json); a folder without one and a JSONL file
    must hold `key` in their first row. Other sources (hub ids, parquet) are checked per row later.
    """
    path = resolve_local(source) or Path(source).expanduser()
    script = PRODUCERS.get(STAGE_COMMANDS.get(expected, ""), "").split(" ")[0]
    wants = f"`sprint {command}` reads the output folder of `sprint {expected}`" + (f" ({script})" if script else "")
    where = f"set {flag or 'the input'} to such a folder"
    manifest = path / "manifest.json"
    if path.is_dir() and manifest.is_file():
        try:
            stage = json.loads(manifest.read_text(encoding="utf-8")).get("stage")
        except (OSError, ValueError, AttributeError):
            stage = None
        if stage and stage != expected:
            raise UserError(f"{source!r} is the output of `sprint {stage}`, not of `sprint {expected}`; {wants}; {where}")
        if stage == expected:
            return
    first_file = path / RECORDS_FILE if path.is_dir() else path
    if not (first_file.is_file() and first_file.suffix.lower() == ".jsonl"):
        return
    first = next(iter_jsonl(first_file), None)
    if first is not None and key not in first:
        cols = ", ".join(sorted(first)[:12])
        raise UserError(f"{source!r} has no {key}: its first row has no {key!r} field (it has: {cols}); {wants}; {where}")


# --- the hub: only for ids; unreachable or offline reported in one line, at once ----------------

HUB_PROBE_SECONDS = 2.0  # a reachable hub answers a TCP connect in milliseconds; 2 s keeps the error under 3 s
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
HUB_LOGGERS = ("huggingface_hub", "datasets", "fsspec", "filelock", "urllib3", "transformers")


def hub_problem(repo_id: str | None = None, kind: str = "datasets", timeout: float = HUB_PROBE_SECONDS) -> str | None:
    """Why the Hugging Face hub cannot give `repo_id` now (offline mode, no route, no answer, no such
    repo, HTTP errors), as the end of a sentence; None when it can (or when no repo is asked about
    and the hub answers at all).

    One HTTP request to the hub's API (through the usual proxy variables), name lookup included,
    bounded by `timeout`. The hub clients' own retries take 25-50 s and print a warning per attempt
    before giving up; this says the same in one line at once.
    """
    for var in OFFLINE_VARS:
        if env_switch(os.environ.get(var)):
            return f"the Hugging Face hub cannot be used ({var}={os.environ[var]} is set: offline mode)"
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    host = urlsplit(endpoint).netloc or endpoint
    what = f"{kind[:-1]} {repo_id!r}"
    url = f"{endpoint}/api/{kind}/{repo_id}" if repo_id else f"{endpoint}/api/{kind}?limit=1"
    headers = {}
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    result: list[str | None] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout).close()
            result.append(None)
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and repo_id:
                result.append(f"the Hugging Face hub has no {what} (HTTP 404 from {host}); check the id")
            elif exc.code in (401, 403) and repo_id:
                result.append(f"the Hugging Face hub refuses {what} (HTTP {exc.code} from {host}): it does not exist, "
                              "or it is private or gated; check the id, or set HF_TOKEN")
            elif exc.code >= 500:
                result.append(f"the Hugging Face hub cannot be used (HTTP {exc.code} from {host})")
            else:  # 429 and the like: the hub is there; its client waits and retries
                result.append(None)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            reason = getattr(reason, "strerror", None) or reason
            result.append(f"the Hugging Face hub cannot be used ({host}: {reason})")

    worker = threading.Thread(target=probe, daemon=True)  # name lookup ignores socket timeouts; a thread bounds it
    worker.start()
    worker.join(timeout + 0.2)
    if not result:
        return f"the Hugging Face hub cannot be used ({host} did not answer within {timeout:g} s)"
    return result[0]


def short_reason(exc: BaseException, limit: int = 300) -> str:
    """An exception as `Type: text` on one line, shortened at a space (never inside a URL or path)."""
    text = " ".join(str(exc).split())
    if len(text) > limit:
        cut = text.rfind(" ", 0, limit)
        text = text[: cut if cut > limit // 2 else limit] + " …"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def source_problem(name: str, flag: str | None = None) -> str | None:
    """Why a hub client must not be given `name` (a missing local path, an unreachable hub), else None."""
    if Path(name).expanduser().exists() or resolve_local(name) is not None:
        return None
    if looks_like_path(name):
        return missing_path_message(name, flag)
    problem = hub_problem(name, "models")
    return None if problem is None else f"not a local path, and {problem}"


class _ToDebug(logging.Handler):
    """Hands a hub client's log records (retry warnings, ...) to our logger at DEBUG level."""

    def emit(self, record: logging.LogRecord) -> None:
        log.debug("%s: %s", record.name, record.getMessage())


@contextlib.contextmanager
def quiet_hub():
    """Keep the hub clients' retries, warnings and progress bars off the screen (debug log instead)."""
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "5")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
    saved = []
    handler = _ToDebug()
    for name in HUB_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers[:] = [handler]
        logger.propagate = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        for w in caught:
            log.debug("warning: %s", w.message)
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers[:] = handlers
            logger.propagate = propagate


def _read_json(path: Path) -> list[dict]:
    """A .json file: a list of row objects read directly; other layouts (columns, nested) via `datasets`."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{path} is not valid UTF-8; re-encode the file as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); fix the file") from None
    if isinstance(data, list):
        bad = next((i for i, row in enumerate(data) if not isinstance(row, dict)), None)
        if bad is not None:
            raise UserError(
                f"{path} is a JSON list whose item {bad} is a {type(data[bad]).__name__}, not an object; "
                "a data file must hold one object per row (a JSON list of objects, or JSON Lines)"
            )
        return data
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        return _load_with_datasets("json", path)  # columns: {"question": [...], "thought": [...]}
    raise UserError(
        f"{path} holds a JSON {type(data).__name__}, not rows; a data file must hold one object per row "
        "(a JSON list of objects, or JSON Lines)"
    )


def _load_with_datasets(fmt: str, path: Path) -> list[dict]:
    import datasets  # here, not at the top: `datasets` costs about a second of every start (jsonl/json need none)

    try:
        ds = datasets.load_dataset(fmt, data_files=str(path), split="train")
    except Exception as exc:
        raise UserError(f"{path}: cannot be read as {fmt} ({short_reason(exc)})") from None
    return ds.to_list()


def _load_hub(source: str, split: str | None, subset: str | None) -> list[dict]:
    problem = hub_problem(source, "datasets")
    if problem is not None:
        raise UserError(f"cannot load dataset {source!r}: it is not a local file or folder, and {problem}; pass a "
                        "local file or folder, or set SPRINT_LOCAL_DATA to a folder holding a local copy")
    import datasets  # here, not at the top: see _load_with_datasets

    try:
        with quiet_hub():
            datasets.disable_progress_bars()
            ds = datasets.load_dataset(source, subset, split=split or "train")
    except Exception as exc:
        raise UserError(f"cannot load dataset {source!r} split {split!r} from the hub: {short_reason(exc)}; "
                        "check the id (and --subset/--split), or pass a local file") from None
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
    if not isinstance(text, str):
        return None
    if BEGIN_THOUGHT in text:
        text = text.split(BEGIN_THOUGHT, 1)[1]
        text = text.split(END_THOUGHT, 1)[0]
    return text.strip() or None


def to_item(row: dict, index: int, question_col: str | None = None, id_col: str | None = None) -> Item:
    question = row.get(question_col) if question_col else _first(row, QUESTION_COLUMNS)
    conv = row.get("conversations")
    if question is None and isinstance(conv, list) and conv and isinstance(conv[0], dict):
        question = conv[0].get("value")
    raw_id = row.get(id_col) if id_col else _first(row, ID_COLUMNS)
    thought = _first(row, THOUGHT_COLUMNS) or _openthoughts(row)
    solution = row.get("solution")
    return Item(
        id=safe_id(raw_id if raw_id is not None else index),
        index=index,
        question=str(question) if question is not None else "",
        thought=_as_text(thought),
        solution=_as_text(solution),
        answer=None if row.get("answer") is None else str(row["answer"]),
        row=row,
    )


def _as_text(value: Any) -> str | None:
    """A text field as a string: numbers are written out, other types (lists, objects) count as absent."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def load_items(
    source: str,
    split: str | None = "train",
    subset: str | None = None,
    range_spec: str | None = None,
    question_col: str | None = None,
    id_col: str | None = None,
    require: tuple[str, ...] = ("question",),
    flag: str | None = None,
) -> list[Item]:
    """Load, slice and normalise input rows; fail early and clearly when a needed column is missing.

    `flag`: the option (and script variable) the source came from, e.g. `--input (DATA)`, named
    in the error for a missing path.
    """
    rows = load_rows(source, split, subset, flag=flag)
    if not rows:
        raise UserError(f"input {source!r} (split {split!r}) has no rows")
    selected = parse_range(range_spec, len(rows))
    if not selected:
        raise UserError(
            f"range {range_spec!r} selects no rows of {source!r}, which has {len(rows)}; "
            f"pass START:END within 0:{len(rows)}"
        )
    items = [to_item(rows[i], i, question_col, id_col) for i in selected]
    for need in require:
        missing = [it for it in items if not str(getattr(it, need) or "").strip()]
        if len(missing) == len(items) and items:
            columns = {key for row in rows[:1000] for key in row}
            if _has_column(need, columns, question_col):
                raise UserError(
                    f"input {source!r}: the {need} is empty in all {len(items)} selected rows; "
                    "check the data file (and --range)"
                )
            cols = ", ".join(sorted(rows[0].keys()))
            raise UserError(f"input {source!r} has no {need} column (columns: {cols}); see README for the accepted layouts")
    taken: set[str] = set()
    for it in items:  # duplicate ids would collide in resumable outputs
        if it.id in taken:
            n = 1
            while f"{it.id}_{n}" in taken:
                n += 1
            it.id = f"{it.id}_{n}"
        taken.add(it.id)
    return items


def _has_column(need: str, columns: set[str], question_col: str | None) -> bool:
    """Whether the rows hold a column for `need` at all (as opposed to holding it empty)."""
    names = {
        "question": {question_col} if question_col else set(QUESTION_COLUMNS) | {"conversations"},
        "thought": set(THOUGHT_COLUMNS) | {"conversations"},
    }.get(need, {need})
    return bool(names & columns)


def fingerprint(source: str, items: list[Item]) -> str:
    """A short hash of what was read, so a manifest says exactly which data a run saw."""
    h = hashlib.sha256(source.encode())
    for it in items:
        h.update(json.dumps(it.row, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]
