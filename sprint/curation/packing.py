"""Stage 3: pack components + DAG into SPRINT trajectories, filter them, write the SFT dataset.

Each input record (from stage 2) carries the components of one reasoning trace and the parent
dictionary between them. Packing turns that into the interleaved plan/execution text the model
is fine-tuned on (DESIGN.md, "Exact rendering rules"):

1. merge: an execution spanning `end - start < 3` lines is folded into its plan (plan-only);
2. phases: 1 without parents, else max over parents of phase(parent) + (parent has execution);
3. prompt names `p.k` for the components with an execution, in component order per phase;
4. plans carry `-----` breaks and `Based on …:` heads (and, with `comments="observe"`,
   `Observation about execution_x.y:` lines and plan-only comments);
5. filters: too many phases, too little parallelism, too many prompts in one plan.

The defaults reproduce the authors' released training data byte for byte: merged executions join
their plan on a new line, comments are dropped (their parser never captured one), and
`**Final Answer**` is removed from the SFT assistant turn only, never from the trajectory.

Steps 1-4 live in `sprint.curation.phases` (one trace -> one trajectory); this module is the stage around
them (filters, SFT examples, split, streaming I/O). The tags are written by `sprint.format.trajectory`.

Whitespace choices the rules leave open (fixed here, reproduced by the worked example):
- a merged execution is appended to its plan text on a new line (`MERGE_SEP`, as released);
- a component's tail (its `<prompt_p.k>`, or the comment of a plan-only component) follows its
  plan text after a blank line (`TAIL_SEP`);
- a component's block is: its observation lines, `-----` (if any), a blank line, then
  `Based on …:` + newline (if any) and its plan text; blocks follow each other on the next line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from sprint.core.data import (QUESTION_COLUMNS, Item, check_stage_input, fingerprint, iter_jsonl, iter_rows, load_items,
                               parse_range, resolve_local, short_reason, to_item)
from sprint.core.errors import UserError, failed_items_exit
from sprint.core.options import add_options, config_from, flag_name, option
from sprint.curation.phases import (COMMENT_MODES, DEFAULT_AGENT_PROMPT, DEFAULT_COMMENTS, DEFAULT_MAX_PHASES, DEFAULT_SEED,
                           DEFAULT_TEST_FRAC, DEFAULT_THRESHOLD, F_DAG, F_SOLUTION, F_STATUS, F_WARNINGS,
                           FINAL_ANSWER_HEADING, MAX_PROMPTS_PER_PLAN, MERGE_SPAN, PackedComponent, PackError,
                           build_trajectory, final_answer_from_solution, packed_components)
from sprint.curation.sft_rows import (DEFAULT_EXECUTOR_ROWS, EXECUTOR_ROW_MODES, SEQUENTIAL_PREFIX, ExtraRows,
                                     format_extra_summary)
from sprint.format.prompt_format import sft_user_content
from sprint.core.records import RunDir
from sprint.core.manifest import text_hash
from sprint.core.files import atomic_write
from sprint.format.tags import THINK, THINK_END
from sprint.format.trajectory import TAG_RE, Trajectory, render_question


# ------------------------------------------------------------------------------------------
# One record -> result; SFT examples; split.


@dataclass
class PackSettings:
    max_phases: int = DEFAULT_MAX_PHASES
    parallelization_threshold: float = DEFAULT_THRESHOLD
    max_prompts_per_plan: int = MAX_PROMPTS_PER_PLAN
    comments: str = DEFAULT_COMMENTS


@dataclass
class PackResult:
    id: str
    status: str                     # "ok" (kept) or "dropped"
    reason: str | None = None       # short code when dropped
    error: str | None = None        # readable explanation when dropped
    trajectory: Trajectory | None = None
    phases: int | None = None
    prompts: int | None = None      # components with an execution
    ratio: float | None = None
    max_prompts_in_plan: int | None = None
    body: str | None = None         # trajectory.render_body(), rendered once
    warnings: list[str] = field(default_factory=list)  # stage 1's warning kinds for this trace

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "reason": self.reason,
            "error": self.error,
            "phases": self.phases,
            "prompts": self.prompts,
            "ratio": None if self.ratio is None else round(self.ratio, 4),
            "max_prompts_in_plan": self.max_prompts_in_plan,
            "warnings": self.warnings,
            "trajectory": render_question(self.trajectory.question) + "\n\n" + self.body if self.trajectory else None,
        }


def _tag_in_text(question: str, components: list[PackedComponent], final: str, comments: bool = True) -> str | None:
    """Where a rendered text holds one of the format's tags (which would break parsing), else None."""
    for where, text in [("question", question), ("final answer", final)] + [
        (f"component {c.number}", t) for c in components
        for t in (c.plan, c.prompt, c.execution, c.comment if comments else None) if t
    ]:
        m = TAG_RE.search(text)
        if m:
            return f"the {where} contains the tag {m.group(0)!r}, which would break the trajectory format"
    return None


def pack_record(item_id: str, question: str, row: dict[str, Any], settings: PackSettings | None = None) -> PackResult:
    """Pack one trace and apply the filters; never raises for bad data, says why instead."""
    s = settings or PackSettings()
    status = row.get(F_STATUS)
    if status not in (None, "ok"):
        return PackResult(item_id, "dropped", "upstream_failed", f"input record has status {status!r}")
    res = _pack_checked(item_id, question, row, s)
    res.warnings = _warning_kinds(row.get(F_WARNINGS))
    return res


def _warning_kinds(raw: Any) -> list[str]:
    """The kinds of stage 1's `warnings` (a list of {kind, component, message}); anything else: none."""
    if not isinstance(raw, list):
        return []
    return [str(w["kind"]) for w in raw if isinstance(w, dict) and w.get("kind")]


def _pack_checked(item_id: str, question: str, row: dict[str, Any], s: PackSettings) -> PackResult:
    """`pack_record` for a record whose upstream stages succeeded."""
    if not question.strip():
        return PackResult(item_id, "dropped", "no_question", "record has no question")
    try:
        components = packed_components(row)
    except PackError as exc:
        return PackResult(item_id, "dropped", exc.reason, str(exc))
    final = final_answer_from_solution(row.get(F_SOLUTION))
    if final is None:
        return PackResult(item_id, "dropped", "no_boxed", "reference solution has no \\boxed{} answer")
    tagged = _tag_in_text(question, components, final, comments=s.comments == "observe")
    if tagged:  # the trajectory would not parse back: the model would learn a broken format
        return PackResult(item_id, "dropped", "tag_in_text", tagged)
    traj = build_trajectory(question, components, final, s.comments)
    n_phases = len(traj.phases)
    n_exec = sum(1 for c in components if c.execution is not None)
    per_plan = max((len(p.executions) for p in traj.phases), default=0)
    res = PackResult(item_id, "ok", trajectory=traj, phases=n_phases, prompts=n_exec,
                     ratio=n_exec / n_phases if n_phases else 0.0, max_prompts_in_plan=per_plan,
                     body=traj.render_body())
    if n_phases > s.max_phases - 1:
        res.status, res.reason = "dropped", "too_many_phases"
        res.error = f"{n_phases} phases, more than MAX_PHASES-1 = {s.max_phases - 1}"
    elif res.ratio < s.parallelization_threshold:
        res.status, res.reason = "dropped", "low_parallelization"
        res.error = f"{n_exec} executions / {n_phases} phases = {res.ratio:.2f} < {s.parallelization_threshold}"
    elif per_plan > s.max_prompts_per_plan:
        res.status, res.reason = "dropped", "too_many_prompts_in_plan"
        res.error = f"a plan has {per_plan} prompts, more than {s.max_prompts_per_plan}"
    return res


def sft_assistant_content(traj: Trajectory, body: str | None = None) -> str:
    """The assistant turn: the whole trajectory after the question, inside `<think>`, without
    `**Final Answer**\n` (removed here only, as in the released data; the trajectory keeps it)."""
    text = traj.render_body() if body is None else body
    return f"{THINK}\n" + text.replace(FINAL_ANSWER_HEADING, "") + f"\n{THINK_END}"


def sft_example(agent_prompt: str, item_id: str, traj: Trajectory, body: str | None = None) -> dict[str, Any]:
    """One training row in the `messages` layout ms-swift (and HF chat templates) read."""
    return {
        "messages": [
            {"role": "user", "content": sft_user_content(agent_prompt, traj.question)},
            {"role": "assistant", "content": sft_assistant_content(traj, body)},
        ],
        "id": item_id,
    }


def n_test_rows(n: int, test_frac: float) -> int:
    """Rows in the test split: ceil(test_frac * n), exactly as scikit-learn's `train_test_split` (which
    the authors used) computes it, so 5 kept traces at 0.1 give 1 test row, not 0. Train keeps at least one row; one trace stays in train."""
    if n < 2 or test_frac <= 0:
        return 0
    return min(n - 1, math.ceil(test_frac * n))


def split_ids(ids: list[str], test_frac: float, seed: int) -> tuple[set[str], set[str]]:
    """A reproducible train/test split: the same ids, fraction and seed give the same split."""
    if not 0 <= test_frac < 1:
        raise UserError(f"test fraction {test_frac} must be in [0, 1); e.g. 0.1 for a 90/10 split")
    order = sorted(ids)
    random.Random(seed).shuffle(order)
    n_test = n_test_rows(len(order), test_frac)
    return set(order[n_test:]), set(order[:n_test])


# ------------------------------------------------------------------------------------------
# The stage.


def _summary(results: list[PackResult], n_train: int, n_test: int) -> dict[str, Any]:
    kept = [r for r in results if r.status == "ok"]
    dropped = Counter(r.reason for r in results if r.status != "ok")

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 3) if xs else None

    def by_kind(rs: list[PackResult]) -> dict[str, int]:
        counts = Counter(k for r in rs for k in r.warnings)
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    return {
        "input": len(results),
        "kept": len(kept),
        "train": n_train,
        "test": n_test,
        "dropped": dict(sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0]))),
        "warnings": by_kind(results),  # stage 1's warnings of the input traces, per kind
        "kept_warnings": by_kind(kept),
        "kept_mean_phases": mean([r.phases for r in kept]),
        "kept_mean_prompts": mean([r.prompts for r in kept]),
        "kept_mean_ratio": mean([r.ratio for r in kept]),
        "kept_max_phases": max((r.phases for r in kept), default=None),
    }


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"packed {summary['input']} traces: kept {summary['kept']} "
             f"(train {summary['train']}, test {summary['test']}), dropped {summary['input'] - summary['kept']}"]
    for reason, n in summary["dropped"].items():
        lines.append(f"  dropped {n:>6}  {reason}")
    if summary["kept"]:
        lines.append(f"  kept: mean phases {summary['kept_mean_phases']}, mean prompts {summary['kept_mean_prompts']}, "
                     f"mean prompts/phase {summary['kept_mean_ratio']}")
    if summary.get("kept_warnings"):
        kinds = ", ".join(f"{k} {n}" for k, n in summary["kept_warnings"].items())
        lines.append(f"  kept traces carry stage-1 warnings: {kinds} (see `warnings` in the input records)")
    if summary.get("comments"):
        lines.append(f"  comments: {summary['comments']}")
    lines.extend(format_extra_summary(summary))
    if summary["kept"] and not summary["test"] and summary.get("test_frac"):
        lines.append(f"  warning: the test set is empty ({summary['kept']} kept trace{'s' if summary['kept'] != 1 else ''}; "
                     "a split needs at least 2)")
    return "\n".join(lines)


def push_dataset(train: list[dict], test: list[dict], repo: str) -> None:
    """Upload train/test as one DatasetDict; any failure becomes a clear UserError."""
    try:
        import datasets  # here, not at the top: importing it costs a second of every `pack` start

        dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(train), "test": datasets.Dataset.from_list(test)})
        dd.push_to_hub(repo)
    except Exception as exc:  # auth, network, bad repo id
        raise UserError(
            f"push to the Hugging Face hub ({repo!r}) failed: {short_reason(exc)}; "
            "check `huggingface-cli login` and the repo id, or drop --push-to-hub (the local files are written)"
        ) from None


def input_fingerprint(source: str, items: list) -> str:
    """What was read, for the manifest: the bytes of a local file (a stage folder's records.jsonl).

    Hashing the file is ~5x cheaper than re-serialising every row (`data.fingerprint`, used for
    hub datasets), which matters at thousands of 70 kB records.
    """
    path = resolve_local(source) or Path(source).expanduser()
    if path.is_dir():
        path = path / "records.jsonl"
    if not path.is_file():
        return fingerprint(source, items)
    h = hashlib.sha256(source.encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()[:16]


@dataclass
class PackConfig:
    """`sprint pack` settings; every default is the paper's recipe unless its help says otherwise."""

    data: str = option(help="stage-2 output folder (its ok records), a .jsonl/.json/.parquet file or a hub id",
                       flags=("--input", "-i", "--data"), metavar="SOURCE", var="DATA")
    out_dir: str = option(help="output folder (train/test/records/summary/manifest)", flags=("--out-dir", "-o"),
                          var="OUT_DIR")
    split: str | None = option("train", "dataset split (hub datasets, files with a split column)", var="SPLIT")
    subset: str | None = option(None, "dataset configuration name (hub datasets)", var="SUBSET")
    max_phases: int = option(DEFAULT_MAX_PHASES, "traces with more than MAX_PHASES-1 phases are dropped", var="MAX_PHASES")
    parallelization_threshold: float = option(DEFAULT_THRESHOLD, "drop traces whose executions/phases is below this",
                                              var="PARALLELIZATION_THRESHOLD")
    max_prompts_per_plan: int = option(MAX_PROMPTS_PER_PLAN, "drop traces with a plan holding more prompts than this",
                                       var="MAX_PROMPTS_PER_PLAN")
    test_frac: float = option(DEFAULT_TEST_FRAC, "test split fraction (a 90/10 split)", var="TEST_FRAC")
    seed: int = option(DEFAULT_SEED, "split seed", var="SEED")
    agent_prompt: str = option(str(DEFAULT_AGENT_PROMPT), "agent prompt template (the system text of every example; none: no agent prompt)",
                               var="AGENT_PROMPT")
    range_spec: str | None = option(None, "rows to pack, e.g. 0:100 (default: all)", flags=("--range",),
                                    metavar="START:END", var="RANGE")
    push_to_hub: str | None = option(None, "also push train/test to this hub dataset repo", metavar="REPO",
                                     var="OUTPUT_HUB_PATH")
    overwrite: bool = option(False, "replace an output folder written with another configuration")
    comments: str = option(DEFAULT_COMMENTS,
                           "drop: no comments, as in the authors' released training data (their parser never "
                           "captured one); observe: `Observation about execution_x.y:` lines and plan-only "
                           "comments, as the paper describes", choices=COMMENT_MODES, var="COMMENTS")
    executor_rows: str = option(DEFAULT_EXECUTOR_ROWS,
                                "also train each executor's view (train split only, ids `ID#exec_p.k@SCHEDULE`): "
                                "per executed prompt one row continuing what `orchestrate` sends that executor "
                                "under the barrier and/or stream schedule, the loss on its execution only; distinct: both schedules' "
                                "views, each once and none the packed row holds verbatim; none: the released layout only",
                                choices=EXECUTOR_ROW_MODES, var="EXECUTOR_ROWS")
    sequential: bool = option(False, "also write sequential_train.jsonl / sequential_test.jsonl: the same kept "
                              "traces and split in sequential form (thought, then the solution), the RFT baseline's data",
                              var="SEQUENTIAL")


def pack(input: str, out_dir: str | Path, **settings: Any) -> dict[str, Any]:
    """Pack every input trace; write records.jsonl, train.jsonl, test.jsonl, summary.json, manifest.json.

    Keyword arguments are the fields of `PackConfig`. Packing is deterministic and cheap, so a
    re-run recomputes everything instead of resuming. Returns the summary (also printed and saved).
    """
    return pack_with(PackConfig(data=input, out_dir=str(out_dir), **settings))


def pack_with(cfg: PackConfig) -> dict[str, Any]:
    """`pack` for a built config (the CLI's path)."""
    if cfg.max_phases < 2:
        raise UserError(f"max phases {cfg.max_phases} leaves no room for a trace; use at least 2 (default {DEFAULT_MAX_PHASES})")
    prompt_path: Path | None = None
    agent_prompt = ""  # `none`: no agent prompt, as `orchestrate --agent-prompt none` sends
    if cfg.agent_prompt.strip().lower() != "none":
        prompt_path = Path(cfg.agent_prompt)
        if not prompt_path.is_file():
            raise UserError(f"agent prompt {prompt_path} does not exist; pass --agent-prompt PATH (or none)")
        agent_prompt = prompt_path.read_text(encoding="utf-8")
    split_ids([], cfg.test_frac, cfg.seed)  # a bad --test-frac fails now, before the folder is touched
    started = time.monotonic()
    source = PackInput.open(cfg)
    config = {
        "data": cfg.data,
        "split": cfg.split,
        "subset": cfg.subset,
        "out_dir": str(cfg.out_dir),
        "range": cfg.range_spec,
        "overwrite": cfg.overwrite,
        "max_phases": cfg.max_phases,
        "parallelization_threshold": cfg.parallelization_threshold,
        "max_prompts_per_plan": cfg.max_prompts_per_plan,
        "test_frac": cfg.test_frac,
        "seed": cfg.seed,
        "agent_prompt": str(prompt_path) if prompt_path else "none",
        "agent_prompt_hash": text_hash(agent_prompt),
        "merge_span": MERGE_SPAN,
        "comments": cfg.comments,
        "executor_rows": cfg.executor_rows,
        "sequential": cfg.sequential,
    }
    # every record is written anew, so the folder's old records are never read (60k traces: GBs)
    with RunDir(Path(cfg.out_dir), "pack", config, overwrite=cfg.overwrite, load_done=False) as run:
        return _pack_into(run, cfg, source, agent_prompt, started)


class PackInput:
    """The input traces, read one at a time from a local JSONL file or a stage folder's records.jsonl
    (what stage 2 writes: 6,000 traces are ~400 MB, OpenThoughts-size inputs ten times that), so
    packing holds one trace at a time. Other sources (hub ids, parquet, .json, a negative --range,
    a file with a split column) are loaded whole by `load_items`, as every stage does."""

    def __init__(self, cfg: PackConfig, path: Path | None, stage: bool, selected: range | None) -> None:
        self.cfg, self.path, self.stage, self.selected = cfg, path, stage, selected
        self.loaded: list | None = None  # the items, when loaded whole
        self.rows = self.eligible = self.items = self.with_question = 0
        self.columns: list[str] = []

    @classmethod
    def open(cls, cfg: PackConfig) -> PackInput:
        check_stage_input(cfg.data, "dag", "pack", F_DAG, flag_name(PackConfig, "data"))
        path = resolve_local(cfg.data) or Path(cfg.data).expanduser()
        stage = path.is_dir() and (path / "records.jsonl").is_file()
        file = path / "records.jsonl" if stage else path
        spec = (cfg.range_spec or "").strip()
        streamable = (stage or (path.is_file() and path.suffix.lower() == ".jsonl")) and "-" not in spec
        if streamable and not stage and cfg.split:
            first = next(iter_jsonl(file), None)
            streamable = first is not None and "split" not in first  # a split column filters the rows: load whole
        if not streamable:
            inp = cls(cfg, None, False, None)
            # a stage folder through its records.jsonl: its failed records too (`upstream_failed`)
            inp.loaded = load_items(str(file) if stage else cfg.data, split=cfg.split, subset=cfg.subset, range_spec=cfg.range_spec,
                                    flag=flag_name(PackConfig, "data"))
            inp.items = len(inp.loaded)
            return inp
        return cls(cfg, file, stage, parse_range(cfg.range_spec, sys.maxsize))

    def __iter__(self) -> Iterator[Item]:
        if self.loaded is not None:
            yield from self.loaded
            return
        assert self.path is not None and self.selected is not None
        taken: set[str] = set()
        for row in iter_rows(self.path):  # a stage's records in input order, whatever order they finished in
            self.rows += 1
            if not self.columns:
                self.columns = sorted(row)
            # a stage folder's failed records are read too: packing counts them (`upstream_failed`)
            index = self.eligible
            self.eligible += 1
            if index < self.selected.start:
                continue
            if index >= self.selected.stop:
                break
            item = to_item(row, index)
            if item.id in taken:  # duplicate ids would collide in the outputs (as `load_items` renames them)
                n = 1
                while f"{item.id}_{n}" in taken:
                    n += 1
                item.id = f"{item.id}_{n}"
            taken.add(item.id)
            self.items += 1
            self.with_question += bool(item.question.strip())
            yield item

    def check(self) -> None:
        """After the pass: the input errors `load_items` raises before one (the outputs are not yet in place)."""
        if self.loaded is not None:
            return
        source = self.cfg.data
        if not self.eligible:
            raise UserError(f"input {source!r} (split {self.cfg.split!r}) has no rows")
        if not self.items:
            raise UserError(f"range {self.cfg.range_spec!r} selects no rows of {source!r}, which has {self.eligible}; "
                            f"pass START:END within 0:{self.eligible}")
        if not self.with_question:
            if set(QUESTION_COLUMNS) & set(self.columns):
                raise UserError(f"input {source!r}: the question is empty in all {self.items} selected rows; "
                                "check the data file (and --range)")
            raise UserError(f"input {source!r} has no question column (columns: {', '.join(self.columns)}); "
                            "see README for the accepted layouts")


# Working files of one run (`*.tmp`: a killed run's are cleared by the next, see RunDir.clear).
_RECORDS_PART = "pack-records.tmp"
_KEPT_PART = "pack-kept.tmp"


def _pack_into(run: RunDir, cfg: PackConfig, source: PackInput, agent_prompt: str, started: float) -> dict[str, Any]:
    """`pack_with` once the folder is open (and locked), in bounded memory.

    Pass 1 packs trace by trace, appending each record and each kept trace's SFT row to working
    files and keeping only ids and summary numbers. The split needs the number of kept traces
    (ceil(test_frac * kept) test rows), so it is decided after pass 1 from the kept ids alone, by
    `split_ids` as before. Pass 2 copies the working files into records.jsonl (adding each
    record's split), train.jsonl and test.jsonl, line by line, without parsing them again; each
    appears whole at the end (written as NAME.tmp, then renamed).
    """
    settings = PackSettings(cfg.max_phases, cfg.parallelization_threshold, cfg.max_prompts_per_plan, cfg.comments)
    results: list[PackResult] = []  # without their trajectories: the summary's numbers only
    record_ids: list[str] = []
    kept_ids: list[str] = []
    records_part, kept_part = run.path / _RECORDS_PART, run.path / _KEPT_PART
    extras = ExtraRows(run.path, agent_prompt, cfg.executor_rows, cfg.sequential, cfg.max_prompts_per_plan)
    try:
        with open(records_part, "w", encoding="utf-8") as rec_f, open(kept_part, "w", encoding="utf-8") as kept_f, extras:
            for it in source:
                r = pack_record(it.id, it.question, it.row, settings)
                rec_f.write(json.dumps(r.record(), ensure_ascii=False) + "\n")
                record_ids.append(r.id)
                if r.status == "ok":
                    row = sft_example(agent_prompt, r.id, r.trajectory, r.body)
                    kept_f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    kept_ids.append(r.id)
                    extras.add(r.id, r.trajectory, it.thought, it.solution, row["messages"][1]["content"])
                r.trajectory = r.body = None
                results.append(r)
        source.check()
        train_ids, test_ids = split_ids(kept_ids, cfg.test_frac, cfg.seed)
        n_train, n_test, n_exec = _write_split(run.path, kept_part, kept_ids, test_ids,
                                               train_extra=(extras.executor_part, extras.executor_ids))
        n_seq = (_write_split(run.path, extras.sequential_part, extras.sequential_ids, test_ids, SEQUENTIAL_PREFIX)
                 if cfg.sequential else (0, 0, 0))
        split_of = {i: "test" for i in test_ids}
        split_of.update((i, "train") for i in train_ids)
        _write_records(run.records_path, records_part, record_ids, split_of)
    finally:
        for part in (records_part, kept_part):
            part.unlink(missing_ok=True)
        extras.remove_parts()
    run.done = {r.id: {"status": r.status} for r in results}  # what the manifest counts
    summary = _summary(results, n_train, n_test)
    summary.update(comments=cfg.comments, test_frac=cfg.test_frac)
    summary.update(extras.summary(n_exec, n_seq[0], n_seq[1]))
    summary["seconds"] = round(time.monotonic() - started, 2)
    atomic_write(run.path / "summary.json", json.dumps(summary, indent=2) + "\n")
    pushed = None
    if cfg.push_to_hub:
        push_dataset(_read_rows(run.path / "train.jsonl"), _read_rows(run.path / "test.jsonl"), cfg.push_to_hub)
        pushed = cfg.push_to_hub
    run.write_manifest(
        inputs={"source": cfg.data, "rows": source.items,
                "fingerprint": input_fingerprint(cfg.data, source.loaded or [])},
        prompts={"agent": agent_prompt},
        extra={"summary": summary, "files": ["records.jsonl", "train.jsonl", "test.jsonl", "summary.json"]
               + ([f"{SEQUENTIAL_PREFIX}train.jsonl", f"{SEQUENTIAL_PREFIX}test.jsonl"] if cfg.sequential else []),
               "pushed_to_hub": pushed},
    )
    print(format_summary(summary))
    more = f" + {n_exec} executor rows" if n_exec else ""
    seq = f", {SEQUENTIAL_PREFIX}train.jsonl ({n_seq[0]}), {SEQUENTIAL_PREFIX}test.jsonl ({n_seq[1]})" if cfg.sequential else ""
    print(f"wrote {run.path}/train.jsonl ({n_train}{more}), test.jsonl ({n_test}){seq}, records.jsonl, summary.json")
    if pushed:
        print(f"pushed train/test to the hub as {pushed}")
    return summary


def _write_split(folder: Path, kept_part: Path, kept_ids: list[str], test_ids: set[str], prefix: str = "",
                 train_extra: tuple[Path, list[str]] | None = None) -> tuple[int, int, int]:
    """PREFIXtrain.jsonl and PREFIXtest.jsonl from the kept rows (line i is kept_ids[i]), in input order;
    train starts with the `train_extra` rows (line i of its file belongs to trace ids[i]) of its traces.
    Returns the train, test and extra row counts.

    Extra rows first: executor rows carry a `loss` key on their messages, the main rows none, and
    `datasets` (which ms-swift loads JSONL with) settles a file's schema on its first 10 MB; a key
    first seen after that fails the load (`Couldn't cast array of type struct<role, content, loss>`)."""
    n_train = n_test = n_extra = 0
    train_tmp, test_tmp = folder / f"{prefix}train.jsonl.tmp", folder / f"{prefix}test.jsonl.tmp"
    with open(kept_part, "rb") as src, open(train_tmp, "wb") as train_f, open(test_tmp, "wb") as test_f:
        if train_extra is not None:
            extra_part, extra_ids = train_extra
            with open(extra_part, "rb") as extra:
                for item_id, line in zip(extra_ids, extra):
                    if item_id not in test_ids:
                        train_f.write(line)
                        n_extra += 1
        for item_id, line in zip(kept_ids, src):
            if item_id in test_ids:
                test_f.write(line)
                n_test += 1
            else:
                train_f.write(line)
                n_train += 1
    os.replace(train_tmp, folder / f"{prefix}train.jsonl")
    os.replace(test_tmp, folder / f"{prefix}test.jsonl")
    return n_train, n_test, n_extra


def _write_records(path: Path, records_part: Path, record_ids: list[str], split_of: dict[str, str]) -> None:
    """records.jsonl: each record line with `"split"` added as its last key (the line ends in `}`)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(records_part, "rb") as src, open(tmp, "wb") as out:
        for item_id, line in zip(record_ids, src):
            split = split_of.get(item_id)
            out.write(line.rstrip(b"\n")[:-1] + b', "split": ' + json.dumps(split).encode() + b"}\n")
    os.replace(tmp, path)


def _read_rows(path: Path) -> list[dict]:
    """A written JSONL file back (only for --push-to-hub, which uploads the whole dataset anyway)."""
    return list(iter_jsonl(path))


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Pack each trace's components and DAG into a SPRINT trajectory (merge short "
                          "executions, assign phases, render plans), filter by phases and parallelism, and write "
                          "train.jsonl / test.jsonl (messages layout) plus records.jsonl, summary.json, manifest.json.")
    add_options(parser, PackConfig)


# Drops that are the recipe's filters (phases, parallelism, prompts per plan, a reference solution
# without a boxed final answer) or an upstream stage's failure (reported there): exit 0. Any other
# drop is an input trace that could not be packed (broken components or DAG, no question, a tag
# inside the text): the run finishes and exits 3 (sprint.core.errors).
FILTER_REASONS = frozenset({"too_many_phases", "low_parallelization", "too_many_prompts_in_plan", "no_boxed",
                            "upstream_failed"})


def handle(args: argparse.Namespace) -> int:
    summary = pack_with(config_from(PackConfig, args))
    broken = {reason: n for reason, n in summary["dropped"].items() if reason not in FILTER_REASONS}
    return failed_items_exit(broken, 0, what="traces", argv=getattr(args, "argv", None),
                             retry_hint="their input is broken (`reason`, `error` in records.jsonl); fix it and re-run "
                             "(train/test hold the other traces)")
