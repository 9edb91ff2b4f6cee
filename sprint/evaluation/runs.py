"""Reading runs from disk: our run folders and the SPRINT authors' log layout, plus gold answers.

Two layouts:
- our run folders (orchestration output): `records.jsonl` (+ `trajectories/<id>.txt`, `manifest.json`),
  with `mode` "sprint" or "baseline" per record;
- plain folders of trajectory files as the SPRINT authors released them:
  `planner_trajectory_<id>.txt` (SPRINT), `base_model_trajectory_<id>.txt` (sequential baseline),
  or `<id>.txt`, with gold answers from `--gold` (a CSV with id,answer or any dataset file).

Each file is read once: the loader hashes the bytes it parses (`RunFiles`, the manifest's fingerprint),
and `parse_runs` reads each SPRINT text with the trajectory model once, for the evaluation and the viewer
alike. Nothing here grades or counts; `sprint.evaluation.evaluate` does that with what these functions return.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from sprint.core.data import safe_id
from sprint.core.errors import UserError
from sprint.tasks.registry import TaskAdapter, load_problems, task_names
from sprint.format.trajectory import Trajectory, TrajectoryError, baseline_generation, parse

log = logging.getLogger(__name__)

SPRINT_PREFIX = "planner_trajectory_"
BASELINE_PREFIX = "base_model_trajectory_"
ID_COLUMNS = ("id", "unique_id", "ProblemIdx", "problem_id", "idx", "index", "Record ID")

Key = tuple[int, int]  # (index of the run, index of the problem in it)


@dataclass
class RawProblem:
    """One problem as found on disk, before counting and grading."""

    id: str
    text: str | None
    gold: Any = None
    status: str = "ok"
    forced_final: bool = False
    reported_tokens: int | None = None
    index: int | None = None
    task: str | None = None
    source: str = ""  # where the text was read, for warnings: a file, or `records.jsonl (id X)`
    question: str | None = None  # the record's question (a baseline's generation does not hold it)
    calls: list[dict] = field(default_factory=list)  # the record's model calls (time-replay replays them)
    start: float | None = None  # the record's start time, the origin of its calls (the viewer's timelines)


class RunFiles:
    """One run argument's files and their fingerprint (`run_fingerprint`): a hash of the names and
    bytes of the files `load_run` may read, in `_input_files`' order.

    The loader feeds it the bytes it parses as it reads them, so a manifest fingerprints exactly
    what was scored and nothing is read twice; files the loader did not need (`trajectories/*.txt`
    beside records that hold the text) are read when the fingerprint is first asked for.
    """

    def __init__(self, path: str | Path, root: Path, files: list[Path]) -> None:
        self.path, self.root = str(path), root
        self._pending = list(files)
        self._hash = hashlib.sha256()
        self._count = len(files)
        self._result: dict[str, Any] | None = None

    def feed(self, file: Path, data: bytes) -> None:
        """Hash `file`'s bytes, read by the loader; only the next file in order may be fed."""
        if not self._pending or self._pending[0] != file:
            return  # out of order (cannot happen with `_input_files`' order): hashed from disk later
        self._pending.pop(0)
        self._hash.update(file.relative_to(self.root).as_posix().encode() + b"\0" + data + b"\0")

    def fingerprint(self) -> dict[str, Any]:
        """{path, files, fingerprint}, the files the loader did not read hashed now (once)."""
        if self._result is None:
            while self._pending:
                self.feed(self._pending[0], self._pending[0].read_bytes())
            self._result = {"path": self.path, "files": self._count, "fingerprint": self._hash.hexdigest()[:16]}
        return self._result


@dataclass
class LoadedRun:
    label: str
    path: Path
    mode: str  # "sprint" | "baseline"
    problems: list[RawProblem]
    manifest: dict = field(default_factory=dict)
    files: RunFiles | None = None  # what it was read from (one folder's SPRINT and baseline runs share it)
    named: bool = False  # the label was given as FOLDER=LABEL: kept as written, not prefixed by the parent folder


@dataclass
class Parsed:
    """A SPRINT text read by the trajectory model: strictly, else leniently (`malformed`, with the strict
    parser's complaint for the warning)."""

    traj: Trajectory
    malformed: bool
    error: str | None = None


def parse_sprint(text: str) -> Parsed:
    """One SPRINT text, scored leniently when malformed (a cut-off generation still has its phases)."""
    try:
        return Parsed(parse(text, strict=True), False)
    except TrajectoryError as exc:
        return Parsed(parse(text, strict=False), True, str(exc))


def parse_runs(runs: Sequence[LoadedRun]) -> dict[Key, Parsed]:
    """Every SPRINT text parsed once, keyed by (run index, problem index): what both the evaluation's
    counting and the viewer's pages read."""
    return {(ri, pi): parse_sprint(prob.text)
            for ri, run in enumerate(runs) if run.mode == "sprint"
            for pi, prob in enumerate(run.problems) if prob.text is not None}


def _read_records(path: Path, default_mode: str = "sprint", files: RunFiles | None = None) -> list[dict]:
    """records.jsonl, tolerant of a half-written last line; the last record of an id (per mode) wins.
    Its bytes are read once and also go to `files`' fingerprint."""
    data = path.read_bytes()
    if files is not None:
        files.feed(path, data)
    by_id: dict[tuple[str, str], dict] = {}
    for lineno, raw in enumerate(io.BytesIO(data), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8", errors="replace"))
        except json.JSONDecodeError:
            if not raw.endswith(b"\n"):
                break  # interrupted write: the stage redoes it on resume
            raise UserError(f"{path}: line {lineno} is not valid JSON; fix or remove that line") from None
        if isinstance(rec, dict) and "id" in rec:
            by_id[(_record_mode(rec, default_mode), str(rec["id"]))] = rec
    return list(by_id.values())


def _read_text(path: Path, files: RunFiles | None = None) -> str | None:
    """A text file as `Path.read_text` gives it (universal newlines), its bytes also fed to `files`."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    if files is not None:
        files.feed(path, data)
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _reported_tokens(rec: dict) -> int | None:
    if isinstance(rec.get("completion_tokens"), int):
        return rec["completion_tokens"]
    calls = rec.get("calls")
    if isinstance(calls, list) and calls:
        got = [c.get("completion_tokens") for c in calls if isinstance(c, dict)]
        got = [g for g in got if isinstance(g, int)]
        if got:
            return sum(got)
    return None


def _record_mode(rec: dict, default: str = "sprint") -> str:
    """A record's method: its `mode`, else a baseline's `generation` field, else the folder's stage."""
    mode = rec.get("mode")
    if mode in ("sprint", "baseline"):
        return mode
    if "generation" in rec:
        return "baseline"
    return "sprint" if "trajectory" in rec else default


def _from_records(folder: Path, records_path: Path, files: RunFiles | None = None) -> list[LoadedRun]:
    manifest: dict = {}
    mpath = folder / "manifest.json"
    if mpath.is_file():
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, json.JSONDecodeError):
            manifest = {}
    default_mode = "baseline" if manifest.get("stage") == "baseline" else "sprint"
    by_mode: dict[str, list[RawProblem]] = {}
    for rec in _read_records(records_path, default_mode, files):
        pid = str(rec["id"])
        mode = _record_mode(rec, default_mode)
        text = rec.get("generation") if mode == "baseline" else None
        text = text if isinstance(text, str) else rec.get("trajectory")
        source = f"{records_path} (id {pid})"
        if not isinstance(text, str) or not text.strip():
            text = None
            for name in (safe_id(pid), pid):
                text = _read_text(folder / "trajectories" / f"{name}.txt")
                if text is not None:
                    text = text[:-1] if text.endswith("\n") else text  # the writer's line end
                    source = str(folder / "trajectories" / f"{name}.txt")
                    break
        if mode == "baseline" and text is not None:
            text = baseline_generation(text)
        status = rec.get("status") or "ok"
        by_mode.setdefault(mode, []).append(RawProblem(
            id=safe_id(pid),
            text=text if text and text.strip() else None,
            gold=rec.get("gold"),
            status=str(status),
            forced_final=bool(rec.get("forced_final") or False),
            reported_tokens=_reported_tokens(rec),
            index=rec.get("index") if isinstance(rec.get("index"), int) else None,
            task=rec.get("task") if rec.get("task") in task_names() else None,
            source=source,
            question=rec.get("question") if isinstance(rec.get("question"), str) else None,
            calls=[c for c in rec.get("calls") or [] if isinstance(c, dict)] if isinstance(rec.get("calls"), list) else [],
            start=rec["start"] if isinstance(rec.get("start"), (int, float)) else None,
        ))
    if not by_mode:
        raise UserError(f"{records_path} holds no records; run the stage first or pass another folder")
    for probs in by_mode.values():  # records arrive in completion order; report in dataset order
        if all(p.index is not None for p in probs):
            probs.sort(key=lambda p: p.index)
    both = len(by_mode) > 1
    return [LoadedRun(f"{folder.name} ({mode})" if both else folder.name, folder, mode, probs, manifest, files)
            for mode, probs in sorted(by_mode.items(), key=lambda kv: kv[0] != "sprint")]


def _looks_like_sprint(text: str) -> bool:
    traj = parse(text, strict=False)
    return bool(traj.phases) or traj.final_answer is not None


def _from_text_files(folder: Path, files: RunFiles | None = None) -> list[LoadedRun]:
    groups: dict[str, list[RawProblem]] = {}
    for f in sorted(folder.glob("*.txt")):
        text = _read_text(f, files)
        if f.name.startswith(SPRINT_PREFIX):
            mode, pid = "sprint", f.stem[len(SPRINT_PREFIX):]
        elif f.name.startswith(BASELINE_PREFIX):
            mode, pid = "baseline", f.stem[len(BASELINE_PREFIX):]
        else:
            mode, pid = ("sprint" if text and _looks_like_sprint(text) else "baseline"), f.stem
        if mode == "baseline" and text:
            text = baseline_generation(text)
        groups.setdefault(mode, []).append(
            RawProblem(id=safe_id(pid), text=text if text and text.strip() else None, source=str(f)))
    both = len(groups) > 1
    return [LoadedRun(f"{folder.name} ({mode})" if both else folder.name, folder, mode, probs, files=files)
            for mode, probs in sorted(groups.items(), key=lambda kv: kv[0] != "sprint")]


def load_run(path: str | Path) -> list[LoadedRun]:
    """A run folder (records.jsonl), a records.jsonl file, or a folder of trajectory .txt files.

    One folder may hold both SPRINT and baseline outputs; they come back as two runs.
    """
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".jsonl":
        return _from_records(p.parent, p, RunFiles(path, *_input_files(p)))
    if not p.is_dir():
        raise UserError(f"run {str(path)!r} does not exist; pass a run folder or a folder of trajectory .txt files")
    if (p / "records.jsonl").is_file():
        return _from_records(p, p / "records.jsonl", RunFiles(path, *_input_files(p)))
    if any(p.glob("*.txt")):
        return _from_text_files(p, RunFiles(path, *_input_files(p)))
    if (p / "trajectories").is_dir() and any((p / "trajectories").glob("*.txt")):
        return _from_text_files(p / "trajectories", RunFiles(path, *_input_files(p)))
    raise UserError(f"{p} holds neither records.jsonl nor trajectory .txt files; pass a run folder")




def split_label(arg: str | Path) -> tuple[Path, str | None]:
    """A run argument `FOLDER=LABEL` as (folder, label), so a table can say "RFT" rather than a folder name.

    An argument that exists as written is a path, never split (a folder name may hold `=`).
    """
    text = str(arg)
    if "=" not in text or Path(text).expanduser().exists():
        return Path(text), None
    folder, _, label = text.rpartition("=")
    if not folder or not label.strip():
        return Path(text), None
    return Path(folder), label.strip()


def _load_labelled(arg: str | Path) -> list[LoadedRun]:
    """`load_run` of a run argument that may carry `=LABEL` (a folder with both methods: `LABEL (mode)`)."""
    path, label = split_label(arg)
    runs = load_run(path)
    if label is not None:
        for r in runs:
            r.label, r.named = (label if len(runs) == 1 else f"{label} ({r.mode})"), True
    return runs


def load_runs(run_paths: Sequence[Path], base_paths: Sequence[Path]) -> tuple[list[LoadedRun], list[LoadedRun]]:
    """The SPRINT runs and the baseline runs among the run arguments, with unique labels.

    Whatever a `--baseline` folder holds is scored as a baseline; a run folder may hold both methods.
    An argument `FOLDER=LABEL` names its run LABEL (`split_label`).
    """
    if not run_paths and not base_paths:
        raise UserError("no run to evaluate; pass at least one run folder")
    loaded = [r for p in run_paths for r in _load_labelled(p)]
    loaded_base = [r for p in base_paths for r in _load_labelled(p)]
    for r in loaded_base:
        if r.mode != "baseline":
            log.info("%s holds SPRINT trajectories but was passed as a baseline; it is scored as a baseline", r.path)
            r.mode = "baseline"
    sprint_runs = [r for r in loaded if r.mode == "sprint"]
    base_runs = loaded_base + [r for r in loaded if r.mode == "baseline"]
    label_runs(sprint_runs + base_runs)
    return sprint_runs, base_runs


def label_runs(runs: list[LoadedRun]) -> None:
    """Runs are named by folder; clashing names (seed folders all called `sprint`) get their parent,
    except names given as FOLDER=LABEL; names still equal get `#2`, `#3`."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.label] = counts.get(r.label, 0) + 1
    for r in runs:
        if counts[r.label] > 1 and not r.named and r.path.resolve().parent.name:
            r.label = f"{r.path.resolve().parent.name}/{r.label}"
    seen: dict[str, int] = {}
    for r in runs:
        if r.label in seen:
            seen[r.label] += 1
            r.label = f"{r.label}#{seen[r.label]}"
        else:
            seen[r.label] = 1


def attach_gold(runs: list[LoadedRun], gold: dict[str, Any] | None, gold_source: Any) -> None:
    """Set each problem's gold from `gold` (keyed by safe id) when given; every problem must end up with one."""
    if gold:
        matched = sum(p.id in gold for r in runs for p in r.problems)
        if matched == 0:
            first = next((p.id for r in runs for p in r.problems), "?")
            raise UserError(
                f"no problem id matches the gold file {gold_source} (runs use ids like {first!r}, "
                f"the gold file ids like {next(iter(gold))!r}); pass the gold file of this dataset"
            )
    for r in runs:
        for p in r.problems:
            if gold and p.id in gold:
                p.gold = gold[p.id]
        missing = [p.id for p in r.problems if p.gold in (None, "")]
        if missing:
            raise UserError(
                f"{len(missing)} problem(s) of {r.path} have no gold answer (first: {missing[0]!r}); "
                "pass --gold with a CSV (id,answer) or the dataset file"
            )


def task_of(runs: list[LoadedRun]) -> str:
    """The task the runs were made for (manifest config, else the records), else math."""
    for r in runs:
        cfg = r.manifest.get("config") if isinstance(r.manifest, dict) else None
        if isinstance(cfg, dict) and cfg.get("task") in task_names():
            return cfg["task"]
    for r in runs:
        for p in r.problems:
            if p.task:
                return p.task
    return "math"


# --------------------------------------------------------------------------- gold answers


def _csv_gold(path: Path, task: TaskAdapter) -> dict[str, Any]:
    with open(path, newline="", encoding="utf-8") as f:
        dialect = csv.excel_tab if path.suffix.lower() == ".tsv" else csv.excel
        rows = list(csv.DictReader(f, dialect=dialect))
    if not rows:
        raise UserError(f"{path} has no rows; write a header `id,answer` and one line per problem")
    cols = rows[0].keys()
    id_col = next((c for c in ID_COLUMNS if c in cols), None)
    if id_col is None:
        raise UserError(f"{path}: no id column (columns: {', '.join(cols)}); name one of {', '.join(ID_COLUMNS[:3])}")
    out: dict[str, Any] = {}
    for r in rows:
        try:
            gold = task.csv_gold(r)
        except LookupError as exc:
            raise UserError(f"{path}: {exc.args[0]}") from None
        except ValueError as exc:
            raise UserError(f"{path}: row {r[id_col]!r}: {exc}") from None
        if gold is not None:
            out[safe_id(r[id_col])] = gold
    return out


def load_gold(source: str | Path, task: TaskAdapter) -> dict[str, Any]:
    """Gold answers keyed by safe id: a CSV/TSV (id,answer) or any dataset the task adapter reads."""
    p = Path(str(source)).expanduser()
    if p.is_file() and p.suffix.lower() in (".csv", ".tsv"):
        return _csv_gold(p, task)
    problems = load_problems(task, str(source))
    gold = {safe_id(pr.id): pr.gold for pr in problems if pr.gold is not None}
    if not gold:
        raise UserError(f"{source} holds no gold answers for task {task.name!r}; pass a file with an answer column")
    return gold


def _input_files(path: Path) -> tuple[Path, list[Path]]:
    """The folder `load_run` reads for one run argument, and the files in it that it may read."""
    p = path.expanduser()
    if p.is_file():
        return p.parent, [p, *sorted((p.parent / "trajectories").glob("*.txt"))]
    if (p / "records.jsonl").is_file():
        return p, [p / "records.jsonl", *sorted((p / "trajectories").glob("*.txt"))]
    return p, sorted(p.glob("*.txt")) or sorted((p / "trajectories").glob("*.txt"))


def run_fingerprint(path: str | Path, runs: Sequence[LoadedRun] = ()) -> dict[str, Any]:
    """A hash of the names and bytes of the files a run argument points at, so a manifest says
    exactly which outputs were scored (a resumed or edited run gets another fingerprint).

    From the bytes `load_run` read when one of `runs` was loaded from `path`, else from disk."""
    read = next((r.files for r in runs if r.files is not None and r.files.path == str(path)), None)
    return (read or RunFiles(path, *_input_files(Path(path).expanduser()))).fingerprint()
