"""Stage 3: pack components + DAG into SPRINT trajectories, filter them, write the SFT dataset.

Each input record (from stage 2) carries the components of one reasoning trace and the parent
dictionary between them. Packing turns that into the interleaved plan/execution text the model
is fine-tuned on (DESIGN.md, "Exact rendering rules"):

1. merge: an execution spanning `end - start < 3` lines is folded into its plan (plan-only);
2. phases: 1 without parents, else max over parents of phase(parent) + (parent has execution);
3. prompt names `p.k` for the components with an execution, in component order per phase;
4. plans carry `Observation about execution_x.y:` lines, `-----` breaks and `Based on …:` heads;
5. filters: too many phases, too little parallelism, too many prompts in one plan.

The text itself is rendered by `sprint.trajectory` (the one place that knows the tags); this
module only decides what goes where.

Whitespace choices the rules leave open (fixed here, reproduced by the worked example):
- a merged execution is appended to its plan text after one space (`MERGE_SEP`);
- a component's tail (its `<prompt_p.k>`, or the comment of a plan-only component) follows its
  plan text after a blank line (`TAIL_SEP`);
- a component's block is: its observation lines, `-----` (if any), a blank line, then
  `Based on …:` + newline (if any) and its plan text; blocks follow each other on the next line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sprint.errors import UserError
from sprint.trajectory import TAG_RE, Execution, Phase, Trajectory, render_prompt, render_question


# ------------------------------------------------------------------------------------------
# Input adapter: the field names of stage-2 records. A rename upstream is a one-line change here.

F_COMPONENTS = "components"
F_DAG = "dag"
F_DESCRIPTION = "description"
F_PLAN_TEXT = "plan_text"
F_PROMPT = "prompt"
F_EXECUTION_TEXT = "execution_text"
F_COMMENT_TEXT = "comment_text"
F_EXECUTION_RANGE = "execution"  # [start, end] line numbers or None
F_SOLUTION = "solution"
F_STATUS = "status"

# ------------------------------------------------------------------------------------------
# Rules and defaults.

MERGE_SPAN = 3            # an execution with end - start < MERGE_SPAN becomes part of its plan
MERGE_SEP = " "           # between a plan and its merged execution text
TAIL_SEP = "\n\n"         # between a plan text and its prompt tag / plan-only comment
BREAK = "-----"           # between trains of thought inside one plan
DEFAULT_MAX_PHASES = 12
DEFAULT_THRESHOLD = 1.5
DEFAULT_TEST_FRAC = 0.1
DEFAULT_SEED = 42
MAX_PROMPTS_PER_PLAN = 8  # plans with more prompts than this are not used as training targets
DEFAULT_AGENT_PROMPT = Path(__file__).resolve().parents[1] / "prompts" / "agent.txt"

_FINAL_ANSWER_HEADING = re.compile(r"^[ \t]*(?:\*\*|#+[ \t]*)?Final Answer:?(?:\*\*)?:?[ \t]*$\n?", re.M | re.I)
_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# Sentence ends and the math delimiters that hide them ("$3! \times 5!$" holds no sentence end).
_MATH_ENVS = r"(?:align|equation|eqnarray|gather|multline|displaymath)\*?"
_SENTENCE_TOKENS = re.compile(
    r"\\\$|\$\$|\$|\\\[|\\\]|\\\(|\\\)|\\begin\{(" + _MATH_ENVS + r")\}|\\end\{(" + _MATH_ENVS + r")\}"
    r"|[.!?][\"')\]]*\s+|\n[ \t]*\n"
)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_CLOSER = {"$$": "$$", "$": "$", "\\[": "\\]", "\\(": "\\)"}


class PackError(ValueError):
    """A trace that cannot or must not be packed; `reason` is a short code for the summary."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Component:
    """One component after the merge rule: `execution is None` means plan-only."""

    number: int
    plan: str
    prompt: str
    execution: str | None
    comment: str | None
    parents: list[int] = field(default_factory=list)
    merged: bool = False


def _text(value: Any) -> str:
    """A component text field, cleaned: None/"not found" -> "", `**Final Answer**` lines dropped."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PackError("invalid_components", f"expected a text field, got {type(value).__name__}")
    text = value.strip()
    if len(text) == 9 and text.lower() == "not found":
        return ""
    if ("nswer" in text or "NSWER" in text) and _FINAL_ANSWER_HEADING.search(text):
        text = re.sub(r"\n{3,}", "\n\n", _FINAL_ANSWER_HEADING.sub("", text)).strip()
    return text


def _span(value: Any, number: int) -> int | None:
    """end - start of a [start, end] range (or "start:end"), None when absent."""
    if value is None or value == "" or (isinstance(value, str) and value.strip().lower() == "not found"):
        return None
    try:
        if isinstance(value, str):
            start, end = (int(x) for x in value.split(":" if ":" in value else "-"))
        else:
            start, end = (int(x) for x in value)
    except (TypeError, ValueError):
        raise PackError("invalid_components", f"component {number}: execution range {value!r} is not [start, end]") from None
    return end - start


def parse_dag(raw: Any, n: int) -> dict[int, list[int]]:
    """Parent lists by component number; a node missing from the dict has no parents."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise PackError("invalid_dag", "dag is a string that is not JSON") from None
    if raw is None:
        raise PackError("no_dag", "record has no dag")
    if not isinstance(raw, dict):
        raise PackError("invalid_dag", f"dag must be a {{node: [parents]}} object, got {type(raw).__name__}")
    parents: dict[int, list[int]] = {i: [] for i in range(1, n + 1)}
    for key, value in raw.items():
        if value is None:  # `datasets` fills the keys other rows have with None
            continue
        try:
            node = int(key)
            plist = sorted({int(p) for p in (value or [])})
        except (TypeError, ValueError):
            raise PackError("invalid_dag", f"dag entry {key!r}: {value!r} is not a list of component numbers") from None
        if node not in parents:
            raise PackError("invalid_dag", f"dag names node {node}, but there are {n} components")
        bad = [p for p in plist if not 1 <= p < node]
        if bad:
            raise PackError("invalid_dag", f"dag node {node} has parents {bad}: parents must be earlier components")
        parents[node] = plist
    return parents


def components_from_record(row: dict[str, Any]) -> list[Component]:
    """Read a stage-2 record's components + dag and apply the merge rule."""
    raw = row.get(F_COMPONENTS)
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise PackError("invalid_components", "components is a string that is not JSON") from None
    if not raw:
        raise PackError("no_components", "record has no components")
    if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
        raise PackError("invalid_components", "components must be a list of objects")
    dag = parse_dag(row.get(F_DAG), len(raw))
    out = []
    for i, c in enumerate(raw, 1):
        plan = _text(c.get(F_PLAN_TEXT))
        execution = _text(c.get(F_EXECUTION_TEXT))
        span = _span(c.get(F_EXECUTION_RANGE), i)
        merged = bool(execution) and span is not None and span < MERGE_SPAN
        if merged:
            plan = MERGE_SEP.join(t for t in (plan, execution) if t)
        prompt = _text(c.get(F_PROMPT))
        has_execution = bool(execution) and not merged
        if has_execution and not prompt:
            raise PackError("invalid_components", f"component {i} has an execution but no prompt")
        out.append(Component(i, plan, prompt, execution if has_execution else None,
                             _text(c.get(F_COMMENT_TEXT)) or None, dag[i], merged))
    return out


# ------------------------------------------------------------------------------------------
# Phases, names, plans.


def assign_phases(components: list[Component]) -> dict[int, int]:
    """Longest-path phase of each component, in component order (parents come first)."""
    phase: dict[int, int] = {}
    by_number = {c.number: c for c in components}
    for c in components:
        phase[c.number] = max(
            (phase[p] + (1 if by_number[p].execution is not None else 0) for p in c.parents), default=1
        )
    return phase


def prompt_names(components: list[Component], phases: dict[int, int]) -> dict[int, str]:
    """`p.k` for every component with an execution, k counting in component order within phase p."""
    counts: Counter[int] = Counter()
    names = {}
    for c in components:
        if c.execution is not None:
            p = phases[c.number]
            counts[p] += 1
            names[c.number] = f"{p}.{counts[p]}"
    return names


def render_plan(members: list[Component], phases: dict[int, int], names: dict[int, str],
                by_number: dict[int, Component]) -> str:
    """The plan text of one phase (without the `<Plan_p>` tags), per DESIGN's six steps."""
    blocks: list[str] = []
    prev: Component | None = None
    prev_based: list[str] = []
    for c in members:
        sources = [by_number[p] for p in c.parents
                   if by_number[p].execution is not None and phases[p] < phases[c.number]]
        lines = [f"Observation about execution_{names[p.number]}: {p.comment}" for p in sources if p.comment]
        if prev is not None and c.number != prev.number + 1:
            lines.append(BREAK)
        lines.append("")
        based = [names[p.number] for p in sources]
        head = "Based on " + ", ".join(f"execution_{n}" for n in based) + ":\n" if based and based != prev_based else ""
        tail = render_prompt(names[c.number], c.prompt) if c.execution is not None else (c.comment or "")
        text = (head + TAIL_SEP.join(t for t in (c.plan, tail) if t)).rstrip()
        if text or len(lines) > 1:
            lines.append(text)
            blocks.append("\n".join(lines))
        prev, prev_based = c, based
    return "\n".join(blocks).strip()


def build_trajectory(question: str, components: list[Component], final_answer: str | None) -> Trajectory:
    """Components (merged, with parents) -> the trajectory model; rendering is left to it."""
    phases = assign_phases(components)
    names = prompt_names(components, phases)
    by_number = {c.number: c for c in components}
    out = []
    for p in range(1, max(phases.values(), default=0) + 1):
        members = [c for c in components if phases[c.number] == p]
        plan = render_plan(members, phases, names, by_number)
        executions = [Execution(names[c.number], c.execution) for c in members if c.execution is not None]
        out.append(Phase(p, plan, executions))
    return Trajectory(question.strip(), out, final_answer)


def final_answer_from_solution(solution: str | None) -> str | None:
    """The sentence of the reference solution holding its last `\\boxed`, and what follows it."""
    if not solution or not isinstance(solution, str):  # a number or list from a sloppy file: no usable answer
        return None
    boxes = list(_BOXED.finditer(solution))
    if not boxes:
        return None
    return _text(solution[_sentence_start(solution, boxes[-1].start()):]) or None


def _sentence_start(text: str, at: int) -> int:
    """Where the sentence holding offset `at` starts: after the last sentence end outside math.

    A display block whose content ends with a period (`… = 5.\\]Next`) ends a sentence too, and
    a blank line ends everything (LaTeX allows no blank line in math).
    """
    start = 0
    closer: str | None = None
    for m in _SENTENCE_TOKENS.finditer(text, 0, at):
        tok = m.group(0)
        if tok == "\\$":
            continue
        if "\n" in tok and _BLANK_LINE.search(tok):
            closer, start = None, m.end()
            continue
        if closer is not None:
            if tok == closer:
                display = closer != "$" and closer != "\\)"
                if display and text[max(0, m.start() - 16): m.start()].rstrip().endswith((".", "!", "?")):
                    start = m.end()
                closer = None
            continue
        if tok in _CLOSER:
            closer = _CLOSER[tok]
        elif m.group(1):
            closer = f"\\end{{{m.group(1)}}}"
        elif tok[0] in ".!?":
            start = m.end()
    return start


# ------------------------------------------------------------------------------------------
# One record -> result; SFT examples; split.


@dataclass
class PackSettings:
    max_phases: int = DEFAULT_MAX_PHASES
    parallelization_threshold: float = DEFAULT_THRESHOLD
    max_prompts_per_plan: int = MAX_PROMPTS_PER_PLAN


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
            "trajectory": render_question(self.trajectory.question) + "\n\n" + self.body if self.trajectory else None,
        }


def _tag_in_text(question: str, components: list[Component], final: str) -> str | None:
    """Where a text holds one of the format's tags (which would break parsing), else None."""
    for where, text in [("question", question), ("final answer", final)] + [
        (f"component {c.number}", t) for c in components for t in (c.plan, c.prompt, c.execution, c.comment) if t
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
    if not question.strip():
        return PackResult(item_id, "dropped", "no_question", "record has no question")
    try:
        components = components_from_record(row)
    except PackError as exc:
        return PackResult(item_id, "dropped", exc.reason, str(exc))
    final = final_answer_from_solution(row.get(F_SOLUTION))
    if final is None:
        return PackResult(item_id, "dropped", "no_boxed", "reference solution has no \\boxed{} answer")
    tagged = _tag_in_text(question, components, final)
    if tagged:  # the trajectory would not parse back: the model would learn a broken format
        return PackResult(item_id, "dropped", "tag_in_text", tagged)
    traj = build_trajectory(question, components, final)
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


def sft_user_content(agent_prompt: str, question: str) -> str:
    """The user turn of training (and of inference): agent prompt, then the question block."""
    return agent_prompt.rstrip() + "\n\n" + render_question(question) + "\n\n"


def sft_assistant_content(traj: Trajectory, body: str | None = None) -> str:
    """The assistant turn: the whole trajectory after the question, inside `<think>`."""
    return "<think>\n" + (traj.render_body() if body is None else body) + "\n</think>"


def sft_example(agent_prompt: str, item_id: str, traj: Trajectory, body: str | None = None) -> dict[str, Any]:
    """One training row in the `messages` layout ms-swift (and HF chat templates) read."""
    return {
        "messages": [
            {"role": "user", "content": sft_user_content(agent_prompt, traj.question)},
            {"role": "assistant", "content": sft_assistant_content(traj, body)},
        ],
        "id": item_id,
    }


def split_ids(ids: list[str], test_frac: float, seed: int) -> tuple[set[str], set[str]]:
    """A reproducible train/test split: the same ids, fraction and seed give the same split."""
    if not 0 <= test_frac < 1:
        raise UserError(f"test fraction {test_frac} must be in [0, 1); e.g. 0.1 for a 90/10 split")
    order = sorted(ids)
    random.Random(seed).shuffle(order)
    n_test = round(len(order) * test_frac)
    return set(order[n_test:]), set(order[:n_test])


# ------------------------------------------------------------------------------------------
# The stage.


def _summary(results: list[PackResult], n_train: int, n_test: int) -> dict[str, Any]:
    kept = [r for r in results if r.status == "ok"]
    dropped = Counter(r.reason for r in results if r.status != "ok")

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 3) if xs else None

    return {
        "input": len(results),
        "kept": len(kept),
        "train": n_train,
        "test": n_test,
        "dropped": dict(sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0]))),
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
    return "\n".join(lines)


def push_dataset(train: list[dict], test: list[dict], repo: str) -> None:
    """Upload train/test as one DatasetDict; any failure becomes a clear UserError."""
    try:
        import datasets

        dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(train), "test": datasets.Dataset.from_list(test)})
        dd.push_to_hub(repo)
    except Exception as exc:  # auth, network, bad repo id
        raise UserError(
            f"push to the Hugging Face hub ({repo!r}) failed: {type(exc).__name__}: {str(exc)[:300]}; "
            "check `huggingface-cli login` and the repo id, or drop --push-to-hub (the local files are written)"
        ) from None


def input_fingerprint(source: str, items: list) -> str:
    """What was read, for the manifest: the bytes of a local file (a stage folder's records.jsonl).

    Hashing the file is ~5x cheaper than re-serialising every row (`data.fingerprint`, used for
    hub datasets), which matters at thousands of 70 kB records.
    """
    from sprint.data import fingerprint, resolve_local

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


def pack(
    input: str,
    out_dir: str | Path,
    *,
    max_phases: int = DEFAULT_MAX_PHASES,
    parallelization_threshold: float = DEFAULT_THRESHOLD,
    test_frac: float = DEFAULT_TEST_FRAC,
    seed: int = DEFAULT_SEED,
    agent_prompt_path: str | Path = DEFAULT_AGENT_PROMPT,
    max_prompts_per_plan: int = MAX_PROMPTS_PER_PLAN,
    push_to_hub: str | None = None,
    overwrite: bool = False,
    range_spec: str | None = None,
    split: str | None = "train",
    subset: str | None = None,
) -> dict[str, Any]:
    """Pack every input trace; write records.jsonl, train.jsonl, test.jsonl, summary.json, manifest.json.

    Packing is deterministic and cheap, so a re-run recomputes everything instead of resuming.
    Returns the summary (also printed and saved).
    """
    from sprint.data import load_items
    from sprint.records import RunDir, text_hash, write_jsonl

    if max_phases < 2:
        raise UserError(f"max phases {max_phases} leaves no room for a trace; use at least 2 (default 12)")
    prompt_path = Path(agent_prompt_path)
    if not prompt_path.is_file():
        raise UserError(f"agent prompt {prompt_path} does not exist; pass --agent-prompt PATH")
    agent_prompt = prompt_path.read_text(encoding="utf-8")
    started = time.monotonic()
    items = load_items(input, split=split, subset=subset, range_spec=range_spec)
    config = {
        "data": input,
        "split": split,
        "subset": subset,
        "out_dir": str(out_dir),
        "range": range_spec,
        "overwrite": overwrite,
        "max_phases": max_phases,
        "parallelization_threshold": parallelization_threshold,
        "max_prompts_per_plan": max_prompts_per_plan,
        "test_frac": test_frac,
        "seed": seed,
        "agent_prompt": str(prompt_path),
        "agent_prompt_hash": text_hash(agent_prompt),
        "merge_span": MERGE_SPAN,
    }
    run = RunDir(Path(out_dir), "pack", config, overwrite=overwrite)
    settings = PackSettings(max_phases, parallelization_threshold, max_prompts_per_plan)
    results = [pack_record(it.id, it.question, it.row, settings) for it in items]
    kept = [r for r in results if r.status == "ok"]
    train_ids, test_ids = split_ids([r.id for r in kept], test_frac, seed)
    train = [sft_example(agent_prompt, r.id, r.trajectory, r.body) for r in kept if r.id in train_ids]
    test = [sft_example(agent_prompt, r.id, r.trajectory, r.body) for r in kept if r.id in test_ids]

    records = []
    for r in results:
        rec = r.record()
        rec["split"] = "train" if r.id in train_ids else "test" if r.id in test_ids else None
        records.append(rec)
    write_jsonl(run.records_path, records)
    run.done = {rec["id"]: rec for rec in records}
    write_jsonl(run.path / "train.jsonl", train)
    write_jsonl(run.path / "test.jsonl", test)
    summary = _summary(results, len(train), len(test))
    summary["seconds"] = round(time.monotonic() - started, 2)
    (run.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    pushed = None
    if push_to_hub:
        push_dataset(train, test, push_to_hub)
        pushed = push_to_hub
    run.write_manifest(
        inputs={"source": input, "rows": len(items), "fingerprint": input_fingerprint(input, items)},
        prompts={"agent": agent_prompt},
        extra={"summary": summary, "files": ["records.jsonl", "train.jsonl", "test.jsonl", "summary.json"],
               "pushed_to_hub": pushed},
    )
    print(format_summary(summary))
    print(f"wrote {run.path}/train.jsonl ({len(train)}), test.jsonl ({len(test)}), records.jsonl, summary.json")
    if pushed:
        print(f"pushed train/test to the hub as {pushed}")
    return summary


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "pack",
        help="stage 3: pack components + DAGs into trajectories and write the SFT dataset",
        description="Pack each trace's components and DAG into a SPRINT trajectory (merge short "
        "executions, assign phases, render plans), filter by phases and parallelism, and write "
        "train.jsonl / test.jsonl (messages layout) plus records.jsonl, summary.json, manifest.json.",
    )
    p.add_argument("--input", "-i", "--data", dest="data", required=True, metavar="SOURCE",
                   help="stage-2 output folder (its ok records), a .jsonl/.json/.parquet file or a hub id")
    p.add_argument("--out-dir", "-o", required=True, help="output folder (train/test/records/summary/manifest)")
    p.add_argument("--split", default="train", help="dataset split (hub datasets, files with a split column); default: train")
    p.add_argument("--subset", default=None, help="dataset configuration name (hub datasets)")
    p.add_argument("--max-phases", type=int, default=DEFAULT_MAX_PHASES,
                   help="traces with more than MAX_PHASES-1 phases are dropped (default %(default)s)")
    p.add_argument("--parallelization-threshold", type=float, default=DEFAULT_THRESHOLD,
                   help="drop traces whose executions/phases is below this (default %(default)s)")
    p.add_argument("--max-prompts-per-plan", type=int, default=MAX_PROMPTS_PER_PLAN,
                   help="drop traces with a plan holding more prompts than this (default %(default)s)")
    p.add_argument("--test-frac", type=float, default=DEFAULT_TEST_FRAC, help="test split fraction (default %(default)s)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="split seed (default %(default)s)")
    p.add_argument("--agent-prompt", default=str(DEFAULT_AGENT_PROMPT), help="agent prompt template (default prompts/agent.txt)")
    p.add_argument("--range", dest="range_spec", default=None, metavar="START:END", help="rows to pack, e.g. 0:100 (default: all)")
    p.add_argument("--push-to-hub", default=None, metavar="REPO", help="also push train/test to this hub dataset repo")
    p.add_argument("--overwrite", action="store_true", help="replace an output folder written with another configuration")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    pack(
        args.data,
        args.out_dir,
        max_phases=args.max_phases,
        parallelization_threshold=args.parallelization_threshold,
        test_frac=args.test_frac,
        seed=args.seed,
        agent_prompt_path=args.agent_prompt,
        max_prompts_per_plan=args.max_prompts_per_plan,
        push_to_hub=args.push_to_hub,
        overwrite=args.overwrite,
        range_spec=args.range_spec,
        split=args.split,
        subset=args.subset,
    )
    return 0
