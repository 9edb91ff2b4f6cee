"""Evaluation stage: grade run folders, count sequential/total tokens, compare with a baseline.

Reads two layouts:
- our run folders (orchestration output): `records.jsonl` (+ `trajectories/<id>.txt`, `manifest.json`),
  with `mode` "sprint" or "baseline" per record;
- plain folders of trajectory files as the SPRINT authors released them:
  `planner_trajectory_<id>.txt` (SPRINT), `base_model_trajectory_<id>.txt` (sequential baseline),
  or `<id>.txt`, with gold answers from `--gold` (a CSV with id,answer or any dataset file).

Nothing stored is trusted: answers are re-extracted from the text and re-graded. Token counts
follow the trajectory model (`sprint.trajectory.count_tokens`); the tokenizer work is batched,
which is what makes 500 trajectories take a couple of seconds.

    python -m sprint evaluate RUN [RUN ...] --baseline BASE [BASE ...] [--gold FILE] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from sprint import __version__
from sprint import metrics as M
from sprint.data import safe_id
from sprint.errors import UserError
from sprint.records import git_commit, package_versions, text_hash
from sprint.trajectory import TokenCounts, Trajectory, TrajectoryError, count_tokens, parse, render_question

log = logging.getLogger(__name__)

DEFAULT_TOKENIZER = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
TASKS = ("math", "gpqa", "countdown")
SPRINT_PREFIX = "planner_trajectory_"
BASELINE_PREFIX = "base_model_trajectory_"
ID_COLUMNS = ("id", "unique_id", "ProblemIdx", "problem_id", "idx", "index", "Record ID")
ANSWER_COLUMNS = ("answer", "gold", "gold_answer", "target_answer")
MAX_WARNINGS = 5  # malformed trajectories named on the terminal; the rest are counted


# --------------------------------------------------------------------------- loading runs


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


@dataclass
class LoadedRun:
    label: str
    path: Path
    mode: str  # "sprint" | "baseline"
    problems: list[RawProblem]
    manifest: dict = field(default_factory=dict)


def _read_records(path: Path, default_mode: str = "sprint") -> list[dict]:
    """records.jsonl, tolerant of a half-written last line; the last record of an id (per mode) wins."""
    by_id: dict[tuple[str, str], dict] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
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


def _read_text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


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


def _from_records(folder: Path, records_path: Path) -> list[LoadedRun]:
    manifest: dict = {}
    mpath = folder / "manifest.json"
    if mpath.is_file():
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, json.JSONDecodeError):
            manifest = {}
    default_mode = "baseline" if manifest.get("stage") == "baseline" else "sprint"
    by_mode: dict[str, list[RawProblem]] = {}
    for rec in _read_records(records_path, default_mode):
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
            task=rec.get("task") if rec.get("task") in TASKS else None,
            source=source,
        ))
    if not by_mode:
        raise UserError(f"{records_path} holds no records; run the stage first or pass another folder")
    for probs in by_mode.values():  # records arrive in completion order; report in dataset order
        if all(p.index is not None for p in probs):
            probs.sort(key=lambda p: p.index)
    both = len(by_mode) > 1
    return [LoadedRun(f"{folder.name} ({mode})" if both else folder.name, folder, mode, probs, manifest)
            for mode, probs in sorted(by_mode.items(), key=lambda kv: kv[0] != "sprint")]


def baseline_generation(text: str) -> str:
    """What a sequential model generated: its text without a leading question block and the
    `<think>` the prompt pre-filled (run folders store `trajectories/<id>.txt` that way)."""
    if not text.startswith("<Question>"):
        return text
    head = render_question(parse(text, strict=False).question)
    if not text.startswith(head):
        return text
    rest = text[len(head):].lstrip("\n")
    if rest.startswith("<think>\n"):
        rest = rest[len("<think>\n"):]
    return rest


def _looks_like_sprint(text: str) -> bool:
    traj = parse(text, strict=False)
    return bool(traj.phases) or traj.final_answer is not None


def _from_text_files(folder: Path) -> list[LoadedRun]:
    groups: dict[str, list[RawProblem]] = {}
    for f in sorted(folder.glob("*.txt")):
        text = _read_text(f)
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
    return [LoadedRun(f"{folder.name} ({mode})" if both else folder.name, folder, mode, probs)
            for mode, probs in sorted(groups.items(), key=lambda kv: kv[0] != "sprint")]


def load_run(path: str | Path) -> list[LoadedRun]:
    """A run folder (records.jsonl), a records.jsonl file, or a folder of trajectory .txt files.

    One folder may hold both SPRINT and baseline outputs; they come back as two runs.
    """
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".jsonl":
        return _from_records(p.parent, p)
    if not p.is_dir():
        raise UserError(f"run {str(path)!r} does not exist; pass a run folder or a folder of trajectory .txt files")
    if (p / "records.jsonl").is_file():
        return _from_records(p, p / "records.jsonl")
    if any(p.glob("*.txt")):
        return _from_text_files(p)
    if (p / "trajectories").is_dir() and any((p / "trajectories").glob("*.txt")):
        return _from_text_files(p / "trajectories")
    raise UserError(f"{p} holds neither records.jsonl nor trajectory .txt files; pass a run folder")


# --------------------------------------------------------------------------- gold answers


def _csv_gold(path: Path, task: str) -> dict[str, Any]:
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
    if task == "countdown" and {"nums", "target"} <= set(cols):
        for r in rows:
            try:
                out[safe_id(r[id_col])] = {"nums": [int(n) for n in json.loads(r["nums"])], "target": int(r["target"])}
            except (ValueError, TypeError):
                raise UserError(f"{path}: row {r[id_col]!r}: nums must be a JSON list of integers, target an integer") from None
        return out
    ans_col = next((c for c in ANSWER_COLUMNS if c in cols), None)
    if ans_col is None:
        raise UserError(f"{path}: no answer column (columns: {', '.join(cols)}); name it `answer`" + (
            " (or give nums,target for countdown)" if task == "countdown" else ""))
    return {safe_id(r[id_col]): r[ans_col] for r in rows if r.get(ans_col) not in (None, "")}


def load_gold(source: str | Path, task: str = "math") -> dict[str, Any]:
    """Gold answers keyed by safe id: a CSV/TSV (id,answer) or any dataset the task adapter reads."""
    p = Path(str(source)).expanduser()
    if p.is_file() and p.suffix.lower() in (".csv", ".tsv"):
        return _csv_gold(p, task)
    from sprint.tasks import get_task, load_problems

    problems = load_problems(get_task(task), str(source))
    gold = {safe_id(pr.id): pr.gold for pr in problems if pr.gold is not None}
    if not gold:
        raise UserError(f"{source} holds no gold answers for task {task!r}; pass a file with an answer column")
    return gold


# --------------------------------------------------------------------------- token counting


class _Recorder:
    """A counter that only notes which texts the trajectory model wants counted."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, text: str) -> int:
        self.texts.append(text)
        return 0


# The pre-tokenizer regex of Qwen2 / DeepSeek-R1-Distill-Qwen tokenizers.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# A cut between a newline and a printable ASCII character (not a space).
_SAFE_CUT = re.compile(r"(?<=\n)(?=[!-~])")


def _splits_at_lines(tok: Any) -> bool:
    """Is count(a + b) == count(a) + count(b) whenever `a` ends with a newline and `b` starts with
    a printable non-space ASCII character?

    True for byte-level BPE with the Qwen2 pre-tokenizer: no pre-token can run past a newline into
    a non-space character (every alternative that matches a newline continues with newlines or
    whitespace only, and the regex has no look-behind), BPE works inside pre-tokens, NFC does not
    compose across a newline, and no added token strips whitespace. Any other tokenizer is counted
    whole, which is just slower. tests/test_evaluate.py checks the property on real text.
    """
    if tok.truncation or tok.padding or type(tok.model).__name__ != "BPE":
        return False
    try:
        normalizer = json.loads(tok.normalizer.__getstate__()) if tok.normalizer is not None else {"type": "NFC"}
        pre = json.loads(tok.pre_tokenizer.__getstate__()) if tok.pre_tokenizer is not None else {}
    except Exception:  # noqa: BLE001 - an exotic tokenizer: count whole texts
        return False
    if normalizer.get("type") != "NFC":
        return False
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return False
    split, byte_level = steps
    if not (split.get("type") == "Split" and (split.get("pattern") or {}).get("Regex") == _QWEN2_SPLIT
            and split.get("behavior") == "Isolated" and not split.get("invert")):
        return False
    if not (byte_level.get("type") == "ByteLevel" and not byte_level.get("add_prefix_space")
            and not byte_level.get("use_regex")):
        return False
    return not any(a.lstrip or a.rstrip or "\n" in a.content for a in tok.get_added_tokens_decoder().values())


def batch_counts(tokenizer: str, texts: Sequence[str]) -> dict[str, int]:
    """Token counts of many texts, equal to `token_counter(tokenizer)(text)` for each.

    Texts are cut into lines where that provably leaves the count unchanged (`_splits_at_lines`),
    so text shared by many prompt prefixes of a plan is encoded once; the distinct pieces are
    encoded in batches.
    """
    from sprint.trajectory import load_tokenizer

    tok = load_tokenizer(str(tokenizer))
    unique = list(dict.fromkeys(t for t in texts if t))
    out = {"": 0}
    if not unique:
        return out
    if tok.padding or tok.truncation:  # batch encoding would pad or cut; count one by one
        for t in unique:
            out[t] = len(tok.encode(t, add_special_tokens=False).ids)
        return out
    split = _splits_at_lines(tok)
    parts = {t: (_SAFE_CUT.split(t) if split else [t]) for t in unique}
    pieces = list(dict.fromkeys(p for ps in parts.values() for p in ps if p))
    table = {"": 0}
    for start in range(0, len(pieces), 8192):
        chunk = pieces[start:start + 8192]
        for piece, enc in zip(chunk, tok.encode_batch(chunk, add_special_tokens=False)):
            table[piece] = len(enc.ids)
    for t, ps in parts.items():
        out[t] = sum(table[p] for p in ps)
    return out


@dataclass
class _Counted:
    traj: Trajectory | None
    malformed: bool
    error: str | None = None  # the strict parser's complaint, for the warning


def _parse_sprint(text: str) -> _Counted:
    try:
        return _Counted(parse(text, strict=True), False)
    except TrajectoryError as exc:
        return _Counted(parse(text, strict=False), True, str(exc))


# --------------------------------------------------------------------------- the stage


@dataclass
class RunResult:
    label: str
    path: str
    mode: str
    results: list[M.ProblemResult]
    summary: dict
    manifest: dict = field(default_factory=dict)


@dataclass
class Evaluation:
    """What `evaluate` computed, and where it wrote it."""

    metrics: dict
    runs: list[RunResult]
    baselines: list[RunResult]
    out_dir: Path | None
    files: dict[str, Path]
    warnings: list[str] = field(default_factory=list)  # malformed trajectories; the CLI prints them


def _as_paths(value: str | Path | Sequence[str | Path] | None) -> list[Path]:
    if value is None:
        return []
    if isinstance(value, (str, Path)):
        return [Path(value)]
    return [Path(v) for v in value]


def _unique_labels(runs: list[LoadedRun]) -> None:
    """Runs are named by folder; clashing names (seed folders all called `sprint`) get their parent."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.label] = counts.get(r.label, 0) + 1
    for r in runs:
        if counts[r.label] > 1 and r.path.resolve().parent.name:
            r.label = f"{r.path.resolve().parent.name}/{r.label}"
    seen: dict[str, int] = {}
    for r in runs:
        if r.label in seen:
            seen[r.label] += 1
            r.label = f"{r.label}#{seen[r.label]}"
        else:
            seen[r.label] = 1


def _attach_gold(runs: list[LoadedRun], gold: dict[str, Any] | None, gold_source: Any) -> None:
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


def _task_of(runs: list[LoadedRun]) -> str:
    """The task the runs were made for (manifest config, else the records), else math."""
    for r in runs:
        cfg = r.manifest.get("config") if isinstance(r.manifest, dict) else None
        if isinstance(cfg, dict) and cfg.get("task") in TASKS:
            return cfg["task"]
    for r in runs:
        for p in r.problems:
            if p.task:
                return p.task
    return "math"


def _parse_all(runs: list[LoadedRun]) -> dict[tuple[int, int], _Counted]:
    """Parse every SPRINT text once, keyed by (run index, problem index)."""
    return {(ri, pi): _parse_sprint(prob.text)
            for ri, run in enumerate(runs) if run.mode == "sprint"
            for pi, prob in enumerate(run.problems) if prob.text is not None}


def _count_all(
    runs: list[LoadedRun], parsed: dict[tuple[int, int], _Counted], planner_tokenizer: str, executor_tokenizer: str
) -> dict[tuple[int, int], TokenCounts | int]:
    """Token counts of every problem with a text: `TokenCounts` for SPRINT, an int for a baseline.

    Two passes over the trajectory model: the first notes the texts it counts, those are encoded
    in batches per tokenizer, the second reads the counts back. The numbers are exactly
    `count_tokens(traj, token_counter(planner), token_counter(executor))`.
    """
    rec_p, rec_e = _Recorder(), _Recorder()
    for key, got in parsed.items():
        count_tokens(got.traj, rec_p, rec_e)
    for run in runs:
        if run.mode == "baseline":
            for prob in run.problems:
                if prob.text is not None:
                    rec_p(prob.text)
    if planner_tokenizer == executor_tokenizer:
        table_p = table_e = batch_counts(planner_tokenizer, rec_p.texts + rec_e.texts)
    else:
        table_p, table_e = batch_counts(planner_tokenizer, rec_p.texts), batch_counts(executor_tokenizer, rec_e.texts)
    count_p: Callable[[str], int] = table_p.__getitem__
    count_e: Callable[[str], int] = table_e.__getitem__
    out: dict[tuple[int, int], TokenCounts | int] = {k: count_tokens(got.traj, count_p, count_e) for k, got in parsed.items()}
    for ri, run in enumerate(runs):
        if run.mode == "baseline":
            for pi, prob in enumerate(run.problems):
                if prob.text is not None:
                    out[(ri, pi)] = count_p(prob.text)
    return out


def malformed_warnings(runs: list[LoadedRun], parsed: dict[tuple[int, int], _Counted],
                       limit: int = MAX_WARNINGS) -> list[str]:
    """One line per malformed SPRINT trajectory (the first `limit`, then a count).

    metrics.json only says how many were malformed; the user needs to know which file and why.
    """
    bad = [(runs[ri].problems[pi], got.error) for (ri, pi), got in sorted(parsed.items()) if got.malformed]
    lines = [f"{prob.source or prob.id}: {err}; scored leniently" for prob, err in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"… and {len(bad) - limit} more malformed trajectories (`malformed` in metrics.json)")
    return lines


def _input_files(path: Path) -> tuple[Path, list[Path]]:
    """The folder `load_run` reads for one run argument, and the files in it that it may read."""
    p = path.expanduser()
    if p.is_file():
        return p.parent, [p, *sorted((p.parent / "trajectories").glob("*.txt"))]
    if (p / "records.jsonl").is_file():
        return p, [p / "records.jsonl", *sorted((p / "trajectories").glob("*.txt"))]
    return p, sorted(p.glob("*.txt")) or sorted((p / "trajectories").glob("*.txt"))


def run_fingerprint(path: str | Path) -> dict[str, Any]:
    """A hash of the names and bytes of the files a run argument points at, so a manifest says
    exactly which outputs were scored (a resumed or edited run gets another fingerprint)."""
    root, files = _input_files(Path(path))
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return {"path": str(path), "files": len(files), "fingerprint": h.hexdigest()[:16]}


def _check_out(out: Path) -> None:
    """Refuse a report folder that holds another stage's manifest (e.g. `--out RUN`): ours would replace it."""
    try:
        stage = json.loads((out / "manifest.json").read_text(encoding="utf-8")).get("stage")
    except (OSError, ValueError, AttributeError):
        stage = "evaluate" if not (out / "manifest.json").exists() else None
    if stage != "evaluate":
        raise UserError(f"{out} holds the manifest.json of {'a ' + repr(stage) if stage else 'another'} run, which "
                        "the evaluation's manifest would replace; pass another --out folder")


def write_manifest(out: Path, config: dict[str, Any], inputs: dict[str, Any], counts: dict[str, int],
                   extra: dict[str, Any], started: float) -> Path:
    """`manifest.json` in the shape the other stages write (`RunDir.write_manifest`), without the
    records/resume machinery an evaluation has no use for."""
    from sprint.report import _atomic_write

    settings = {k: v for k, v in config.items() if k not in ("out_dir", "workers", "plots")}
    manifest = {
        "stage": "evaluate",
        "sprint_version": __version__,
        "git_commit": git_commit(),
        "packages": package_versions(),
        "config": config,
        "config_hash": text_hash(json.dumps(settings, sort_keys=True, default=str)),
        "inputs": {**inputs, "fingerprint": text_hash(json.dumps(inputs, sort_keys=True, default=str))},
        "counts": counts,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **extra,
    }
    _atomic_write(out / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False, default=str))
    return out / "manifest.json"


def _answer(prob: RawProblem, traj: Trajectory | None) -> str | None:
    """The last `\\boxed{}` of the output; failed problems have none (they never finished)."""
    from sprint.grading import last_boxed

    if prob.text is None or prob.status != "ok":
        return None
    ans = traj.answer() if traj is not None else last_boxed(prob.text)
    return ans if ans and ans.strip() else None


def evaluate(
    run_dir: str | Path | Sequence[str | Path],
    baseline: str | Path | Sequence[str | Path] | None = None,
    task: str | None = None,
    planner_tokenizer: str = DEFAULT_TOKENIZER,
    executor_tokenizer: str | None = None,
    gold: str | Path | dict[str, Any] | None = None,
    out_dir: str | Path | None = None,
    *,
    resamples: int = M.DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = M.DEFAULT_CONFIDENCE,
    workers: int | None = None,
    plots: bool = True,
    write: bool = True,
) -> Evaluation:
    """Grade and count one or more runs (seeds) and optional baseline runs; write the report.

    `run_dir`/`baseline`: folders (or lists of folders, one per seed). `gold`: a CSV/dataset path
    or an {id: gold} mapping, overriding golds stored in records. `task=None` takes the task from
    the run's manifest, else "math". Outputs go to `out_dir` (default: `<first run>/evaluation`):
    metrics.json, report.md, plots and manifest.json. Malformed trajectories are scored leniently
    and named in `Evaluation.warnings`.
    """
    from sprint.grading import grade_many

    started, started_at = time.perf_counter(), time.time()
    task_arg = task
    run_paths, base_paths = _as_paths(run_dir), _as_paths(baseline)
    if not run_paths and not base_paths:
        raise UserError("no run to evaluate; pass at least one run folder")
    loaded = [r for p in run_paths for r in load_run(p)]
    loaded_base = [r for p in base_paths for r in load_run(p)]
    for r in loaded_base:
        if r.mode != "baseline":
            log.info("%s holds SPRINT trajectories but was passed as a baseline; it is scored as a baseline", r.path)
            r.mode = "baseline"
    sprint_runs = [r for r in loaded if r.mode == "sprint"]
    base_runs = loaded_base + [r for r in loaded if r.mode == "baseline"]
    all_runs = sprint_runs + base_runs
    _unique_labels(all_runs)
    out = Path(out_dir) if out_dir else (all_runs[0].path / "evaluation")
    if write:
        _check_out(out)  # before any work
    task = task or _task_of(all_runs)
    if task not in TASKS:
        raise UserError(f"unknown task {task!r}; use one of {', '.join(TASKS)}")
    gold_map = dict(gold) if isinstance(gold, dict) else (load_gold(gold, task) if gold else None)
    _attach_gold(all_runs, {safe_id(k): v for k, v in gold_map.items()} if gold_map else None, gold)

    executor_tokenizer = executor_tokenizer or planner_tokenizer
    from sprint.trajectory import load_tokenizer

    for name in {str(planner_tokenizer), str(executor_tokenizer)}:
        load_tokenizer(name)  # a wrong tokenizer fails now, before any work starts
    parsed = _parse_all(all_runs)
    warnings = malformed_warnings(all_runs, parsed)
    preds, golds, keys = [], [], []
    for ri, run in enumerate(all_runs):
        for pi, prob in enumerate(run.problems):
            got = parsed.get((ri, pi))
            preds.append(_answer(prob, got.traj if got else None))
            golds.append(prob.gold)
            keys.append((ri, pi))

    def timed_grading() -> tuple[list[bool], float]:
        t = time.perf_counter()
        return grade_many(task, preds, golds, workers=workers), time.perf_counter() - t

    # Grading (Math-Verify, its worker processes) runs beside the tokenizer work; both are safe
    # off the main thread.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="grading") as pool:
        grading = pool.submit(timed_grading)
        t0 = time.perf_counter()
        counted = _count_all(all_runs, parsed, str(planner_tokenizer), str(executor_tokenizer))
        t_tokens = time.perf_counter() - t0
        grades, t_grading = grading.result()
    verdict = {k: (p, g) for k, p, g in zip(keys, preds, grades)}

    results_by_run: list[list[M.ProblemResult]] = []
    for ri, run in enumerate(all_runs):
        rows = []
        for pi, prob in enumerate(run.problems):
            pred, ok = verdict[(ri, pi)]
            res = M.ProblemResult(id=prob.id, correct=bool(ok), answered=pred is not None, status=prob.status,
                                  forced_final=prob.forced_final, predicted=pred,
                                  reported_tokens=prob.reported_tokens)
            tc = counted.get((ri, pi))
            if isinstance(tc, TokenCounts):
                traj = parsed[(ri, pi)].traj
                res.sequential, res.total = tc.sequential, tc.total
                res.planner, res.executor = tc.planner, tc.executor
                res.phases, res.prompts = len(traj.phases), traj.prompt_count
                res.prompts_per_phase = [len(ph.prompts) for ph in traj.phases]
                res.malformed = parsed[(ri, pi)].malformed
            elif tc is not None:
                res.sequential = res.total = int(tc)
            rows.append(res)
        results_by_run.append(rows)

    stats = dict(resamples=resamples, seed=seed, confidence=confidence)
    run_results = [RunResult(r.label, str(r.path), r.mode, res, M.summarize(res, **stats), r.manifest)
                   for r, res in zip(all_runs, results_by_run)]
    sprint_results = run_results[: len(sprint_runs)]
    base_results = run_results[len(sprint_runs):]

    reference = M.baseline_reference([b.results for b in base_results]) if base_results else None
    comparisons = []
    for i, sr in enumerate(sprint_results if base_results else []):
        br = base_results[i % len(base_results)]
        pairs = M.pair(sr.results, br.results, reference)
        if not pairs:
            raise UserError(f"{sr.path} and {br.path} share no problem id; are they runs on the same data?")
        comparisons.append({"run": sr.label, "baseline": br.label, **M.compare(pairs, **stats)})

    def run_entry(rr: RunResult) -> dict:
        rows = []
        for res in rr.results:
            row = res.as_row()
            base_tokens = reference.get(res.id) if reference is not None else None
            row["baseline_tokens"] = base_tokens  # the pairing reference (mean over baseline seeds)
            row["bucket"] = M.bucket_of(base_tokens)
            rows.append(row)
        return {"label": rr.label, "path": rr.path, "mode": rr.mode, "summary": rr.summary, "problems": rows}

    metrics = {
        "task": task,
        "tokenizers": {"planner": str(planner_tokenizer), "executor": str(executor_tokenizer)},
        "bucket_edges": list(M.BUCKET_EDGES),
        "bootstrap": stats,
        "gold": None if gold is None or isinstance(gold, dict) else str(gold),
        "runs": [run_entry(r) for r in sprint_results],
        "baselines": [run_entry(r) for r in base_results],
        "comparisons": comparisons,
        "aggregate": {
            "sprint": M.aggregate_summaries([r.summary for r in sprint_results]) if sprint_results else None,
            "baseline": M.aggregate_summaries([r.summary for r in base_results]) if base_results else None,
            "comparison": M.aggregate_comparisons(comparisons) if comparisons else None,
        },
        "timing": {"tokens_s": round(t_tokens, 3), "grading_s": round(t_grading, 3)},
    }
    files: dict[str, Path] = {}
    if write:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot write the report to {out} ({exc.strerror}); pass --out DIR") from None
        from sprint.report import write_report

        metrics["timing"]["total_s"] = round(time.perf_counter() - started, 3)
        files = write_report(metrics, out, plots=plots)
        config = {
            "runs": [str(p) for p in run_paths], "baseline": [str(p) for p in base_paths], "task": task_arg,
            "planner_tokenizer": str(planner_tokenizer), "executor_tokenizer": str(executor_tokenizer),
            "gold": f"<mapping of {len(gold)} ids>" if isinstance(gold, dict) else (None if gold is None else str(gold)),
            "out_dir": str(out), "resamples": resamples, "seed": seed, "confidence": confidence,
            "workers": workers, "plots": plots,
        }
        inputs = {
            "runs": [run_fingerprint(p) for p in run_paths],
            "baselines": [run_fingerprint(p) for p in base_paths],
            "gold": None if gold_map is None else {
                "source": config["gold"], "ids": len(gold_map),
                "fingerprint": text_hash(json.dumps(gold_map, sort_keys=True, default=str))},
        }
        problems = [p for r in all_runs for p in r.problems]
        counts = {"runs": len(sprint_results), "baselines": len(base_results), "problems": len(problems),
                  "no_text": sum(p.text is None for p in problems),
                  "malformed": sum(got.malformed for got in parsed.values())}
        files["manifest"] = write_manifest(out, config, inputs, counts, {"task": task, "warnings": warnings},
                                           started_at)
    metrics["timing"]["total_s"] = round(time.perf_counter() - started, 3)
    return Evaluation(metrics, sprint_results, base_results, out if write else None, files, warnings)


# --------------------------------------------------------------------------- CLI


def headline(metrics: dict) -> str:
    """One line per method for the terminal."""
    lines = []
    for key, name in (("runs", "SPRINT"), ("baselines", "baseline")):
        for r in metrics[key]:
            s = r["summary"]
            acc = "n/a" if s["accuracy"] is None else f"{100 * s['accuracy']:.1f}%"
            seq = "n/a" if s["mean_sequential"] is None else f"{s['mean_sequential']:.0f}"
            lines.append(f"{name} {r['label']}: accuracy {acc} ({s['no_answer']} without answer), "
                         f"mean sequential tokens {seq}")
    for c in metrics["comparisons"]:
        red = c["overall"]["reduction"]
        red_s = "n/a" if red is None else f"{100 * red:.1f}%"
        lines.append(f"{c['run']} vs {c['baseline']}: sequential-token reduction {red_s}, "
                     f"McNemar p = {c['mcnemar']['p_value']:.3g}")
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    runs = list(args.runs) + list(args.more_runs or [])
    ev = evaluate(
        runs,
        baseline=args.baseline,
        task=args.task,
        planner_tokenizer=args.planner_tokenizer,
        executor_tokenizer=args.executor_tokenizer,
        gold=args.gold,
        out_dir=args.out,
        resamples=args.bootstrap,
        seed=args.seed,
        confidence=args.confidence,
        workers=args.workers,
        plots=not args.no_plots,
    )
    for line in ev.warnings:
        print(f"warning: {line}", file=sys.stderr)
    print(headline(ev.metrics))
    for name, path in ev.files.items():
        print(f"{name}: {path}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "evaluate",
        help="grade runs, count sequential/total tokens, compare with a baseline, write report.md",
        description=(
            "Evaluate SPRINT runs (and a sequential baseline): accuracy, sequential and total tokens, "
            "reduction per baseline length bucket, McNemar test, bootstrap CIs; writes metrics.json, "
            "report.md and PNG plots. A run is a run folder (records.jsonl) or a folder of trajectory "
            ".txt files (planner_trajectory_<id>.txt / base_model_trajectory_<id>.txt)."
        ),
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="SPRINT run folder(s); several = several seeds")
    p.add_argument("--runs", dest="more_runs", nargs="+", default=[], metavar="RUN",
                   help="more SPRINT run folders (seeds of one method)")
    p.add_argument("--baseline", nargs="+", default=None, metavar="RUN",
                   help="sequential-baseline run folder(s), paired with the runs by problem id (put it after the runs)")
    p.add_argument("--task", choices=TASKS, default=None, help="grading rule (default: from the run's manifest, else math)")
    p.add_argument("--gold", default=None,
                   help="gold answers: CSV with id,answer columns or a dataset (file or hub id) with ids and answers")
    p.add_argument("--planner-tokenizer", default=DEFAULT_TOKENIZER, help="hub id or local folder with tokenizer.json")
    p.add_argument("--executor-tokenizer", default=None, help="default: the planner's")
    p.add_argument("--out", default=None, help="report folder (default: <first run>/evaluation)")
    p.add_argument("--bootstrap", type=int, default=M.DEFAULT_RESAMPLES, help="bootstrap resamples (0 = no CIs)")
    p.add_argument("--confidence", type=float, default=M.DEFAULT_CONFIDENCE, help="confidence level of the CIs")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--workers", type=int, default=None, help="grading processes (default: one per CPU)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    p.set_defaults(func=_main)
