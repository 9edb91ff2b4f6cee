"""Check an SFT dataset before paying for GPUs: `python -m sprint check-sft`.

ms-swift accepts a malformed row silently or drops an over-long one without saying how many; on a
cluster that surfaces hours later as a crash or a smaller-than-planned run. This check reads the
train.jsonl / test.jsonl that packing writes and reports, per split: rows, rows with bad roles or
empty content (errors), token lengths as ms-swift's `deepseek_r1` template will encode them, how
many rows `--max_length` would drop (ms-swift's default `--truncation_strategy delete`), and how
many test questions also appear in train. It runs in the pipeline's .venv (tokenizer only, no torch).

An assistant turn may be split into consecutive assistant messages, each with its own `"loss"`
flag (executor rows: the context with `"loss": false`, then the execution): ms-swift 4.6 joins
them into one response with nothing between and masks each part by its flag, so the check joins
them too. Such a flag must come early enough in the file for `datasets` to load it (see
`schema_problem`).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sprint.core.errors import UserError
from sprint.core.options import add_options, config_from, option
from sprint.core.files import atomic_write
from sprint.format.tags import THINK, THINK_END, last_tag
from sprint.format.trajectory import load_tokenizer as _load_tokenizer

DEFAULT_MAX_LENGTH = 7168  # the authors' ms-swift run; configs/finetune_*.yaml use the same
DEFAULT_TEMPLATE = "deepseek_r1"
MAX_LISTED_ERRORS = 10
# `datasets` (ms-swift's JSONL loader) reads a file in chunks of this many bytes (JsonConfig.chunksize)
# and settles its schema on the first one.
DATASETS_CHUNK_BYTES = 10 << 20

# ms-swift 4.6's `deepseek_r1` template (DeepseekV2_5TemplateMeta): BOS + system, then
# `<｜User｜>{query}<｜Assistant｜>`, the response, and EOS after it. Every boundary is a special
# token, so tokenizing the joined text gives the same ids as ms-swift's piecewise encoding
# (tests/test_sft_check.py checks this against ms-swift itself).
R1_USER, R1_ASSISTANT = "<｜User｜>", "<｜Assistant｜>"


@dataclass
class SplitReport:
    """What one file holds and what training will actually see of it."""

    name: str
    path: str
    rows: int = 0
    invalid: int = 0  # unreadable JSON, bad roles, empty content: ms-swift would crash or train on junk
    too_long: int = 0  # valid rows longer than max_length: dropped by ms-swift
    no_think: int = 0  # valid rows in none of the layouts of `answer_layout` (not SPRINT's format)
    executor_rows: int = 0  # `<think>` … `</execution_p.k>`: executor-view rows (`pack --executor-rows`)
    sequential_rows: int = 0  # `<think>` … `</think>` + solution: sequential rows (`pack --sequential`)
    masked_rows: int = 0  # valid rows with a part of the assistant turn not trained (`"loss": false`)
    unmasked_executor_rows: int = 0  # executor-view rows that train their whole context (the planner too)
    load_error: str | None = None  # why `datasets` cannot load the file (ms-swift would fail before step 1)
    lengths: list[int] = field(default_factory=list, repr=False)  # token length of each valid row
    errors: list[str] = field(default_factory=list)  # the first MAX_LISTED_ERRORS problems, with line numbers

    @property
    def kept(self) -> int:
        return self.rows - self.invalid - self.too_long

    def length_stats(self) -> dict[str, float]:
        if not self.lengths:
            return {}
        ordered = sorted(self.lengths)
        return {
            "min": ordered[0],
            "median": statistics.median(ordered),
            "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
            "max": ordered[-1],
        }

    def summary(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "lengths"}
        data.update(kept=self.kept, token_lengths=self.length_stats())
        return data


@dataclass
class SftCheckReport:
    tokenizer: str
    max_length: int
    train: SplitReport
    test: SplitReport | None
    test_in_train: int = 0  # test user prompts that also occur in train (leakage)

    @property
    def ok(self) -> bool:
        """Fit to train on: no broken rows, a file ms-swift can load, something left to train on, and
        to evaluate on if given."""
        splits = [self.train] + ([self.test] if self.test else [])
        return all(s.invalid == 0 and s.load_error is None and s.kept > 0 for s in splits)

    def summary(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "tokenizer": self.tokenizer,
            "max_length": self.max_length,
            "train": self.train.summary(),
            "test": self.test.summary() if self.test else None,
            "test_in_train": self.test_in_train,
        }

    def format(self) -> str:
        lines = [f"SFT data check (tokenizer {self.tokenizer}, max_length {self.max_length})"]
        for split in (self.train, self.test):
            if split is None:
                lines.append("  test: none given (ms-swift will not evaluate, so no best checkpoint by eval loss)")
                continue
            stats = split.length_stats()
            lengths = ", ".join(f"{k} {v:g}" for k, v in stats.items()) if stats else "no valid rows"
            lines.append(
                f"  {split.name}: {split.rows} rows in {split.path}: {split.invalid} invalid, "
                f"{split.too_long} longer than {self.max_length} tokens (dropped by ms-swift), "
                f"{split.kept} kept"
            )
            lines.append(f"    tokens per row: {lengths}")
            if split.executor_rows or split.sequential_rows:
                lines.append(f"    {split.executor_rows} executor-view rows (ending at </execution_p.k>), "
                             f"{split.sequential_rows} sequential rows (<think> … </think> then the solution)")
            if split.masked_rows:
                lines.append(f"    {split.masked_rows} rows train only part of their assistant turn "
                             "(\"loss\": false on the context)")
            if split.unmasked_executor_rows:
                lines.append(f"    warning: {split.unmasked_executor_rows} executor-view rows train their context too, "
                             "teaching the planner the cut plans of their view; pack them again")
            if split.load_error:
                lines.append(f"    cannot be loaded: {split.load_error}")
            if split.no_think:
                lines.append(f"    {split.no_think} assistant turns are not wrapped in <think> … </think>")
            lines.extend(f"    {e}" for e in split.errors)
            if split.invalid > len(split.errors):
                lines.append(f"    … and {split.invalid - len(split.errors)} more invalid rows")
        if self.test_in_train:
            lines.append(f"  warning: {self.test_in_train} test prompts also occur in train")
        lines.append("  OK" if self.ok else "  NOT OK: fix the data before training")
        return "\n".join(lines)


def validate_messages(row: Any) -> list[dict[str, Any]]:
    """The row's messages if ms-swift can train on them, else ValueError saying why.

    Accepted: an optional system turn, then user/assistant turns alternating, ending with an
    assistant turn (the training target); every content a non-empty string. An assistant turn may
    be several consecutive assistant messages; a `"loss"` flag (true/false, or 1/0) on an assistant message
    says whether that part is trained, and the row's last message must be trained.
    """
    if not isinstance(row, dict):
        raise ValueError("row is not a JSON object")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("no 'messages' list")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ValueError(f"message {i} has no 'role'")
        content = msg.get("content")
        if not isinstance(content, str):
            raise ValueError(f"message {i} ({msg['role']}) content is not a string")
        if not content.strip():
            raise ValueError(f"message {i} ({msg['role']}) has empty content")
        if msg.get("loss") is not None and (msg["role"] != "assistant" or msg["loss"] not in (True, False)):
            raise ValueError(f"message {i} ({msg['role']}) has \"loss\": {msg['loss']!r}; "
                             "only assistant messages take a loss flag, true or false")
    if _untrained(messages[-1]):
        raise ValueError("the last message has \"loss\": false: the row's target would not be trained")
    roles = [m["role"] for m in join_turns(messages)]
    body = roles[1:] if roles[0] == "system" else roles
    expected = ["user", "assistant"] * (len(body) // 2 + 1)
    if not body or body != expected[: len(body)] or body[-1] != "assistant":
        raise ValueError(f"roles {roles}: expected [system,] user, assistant[, user, assistant …] ending with assistant")
    return messages


def join_turns(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The turns the model sees: consecutive assistant messages joined with nothing between (as
    ms-swift 4.6's `Template._swift_prepare_inputs` joins them), each turn only a role and a content."""
    turns: list[dict[str, str]] = []
    for msg in messages:
        if turns and msg["role"] == turns[-1]["role"] == "assistant":
            turns[-1]["content"] += msg["content"]
        else:
            turns.append({"role": msg["role"], "content": msg["content"]})
    return turns


def masked(messages: list[dict[str, Any]]) -> bool:
    """Whether part of the row's assistant text is not trained (`"loss": false`)."""
    return any(_untrained(m) for m in messages)


def _untrained(message: dict[str, Any]) -> bool:
    """`"loss": false` (or 0, which ms-swift reads the same way)."""
    return message.get("loss") is not None and not message["loss"]


def _message_keys(line: str) -> set[frozenset[str]] | None:
    """The key sets of a JSONL line's messages (None: not a row with a messages list)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list):
        return None
    return {frozenset(m) for m in messages if isinstance(m, dict)}


def schema_problem(path: Path) -> str | None:
    """Why `datasets` cannot load this JSONL file, if it is the key sets of its messages, else None.

    `datasets` reads a JSONL file in chunks of DATASETS_CHUNK_BYTES. When the messages of the first
    chunk do not all have the same keys it stores them as JSON and any later message loads; when
    they do, their keys become the schema, and a message with another key in a later chunk fails the
    whole load ("Couldn't cast array of type struct<role, content, loss>"; checked with ms-swift 4.6's
    datasets 4.8). `pack` writes its executor rows (`"loss"` flags) first for this reason.
    """
    first: set[frozenset[str]] = set()
    read = 0
    in_first = True
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            keys = _message_keys(raw.decode("utf-8", errors="replace"))
            if in_first:
                first |= keys or set()
                read += len(raw)
                # the chunk: DATASETS_CHUNK_BYTES, then up to the next line end (one more line if it ends on one)
                in_first = read <= DATASETS_CHUNK_BYTES
                continue
            if len(first) != 1:
                return None  # mixed (or no) messages in the first chunk: stored as JSON, anything loads
            extra = sorted(set().union(*(keys or set())) - next(iter(first)))
            if extra:
                return (f"line {lineno}: its messages have the key(s) {', '.join(extra)}, which no "
                        f"message of the first {DATASETS_CHUNK_BYTES >> 20} MB has: `datasets` fixes the schema "
                        "there and fails on this line; put the rows with these keys first (as pack does)")
    return None


def answer_layout(answer: str) -> str | None:
    """The SFT layout of an assistant turn: "trajectory" (`<think>` … `</think>`), "executor" (`<think>` …
    `</execution_p.k>`, an executor's view), "sequential" (`<think>` … `</think>`, then the solution), else None."""
    if not answer.startswith(THINK):
        return None
    if answer.endswith(THINK_END):
        return "trajectory"
    last = last_tag(answer)
    if last is not None and last.closing and last.name == "execution" and answer.endswith(last.text):
        return "executor"
    return "sequential" if THINK_END in answer else None


def render_deepseek_r1(messages: list[dict[str, str]], bos: str, eos: str) -> str:
    """The text ms-swift's deepseek_r1 template trains on (every turn kept, as in single-turn SFT);
    `messages` are turns (`join_turns`)."""
    parts = [bos]
    for msg in messages:
        if msg["role"] == "system":
            parts.append(msg["content"])
        elif msg["role"] == "user":
            parts.append(R1_USER + msg["content"] + R1_ASSISTANT)
        else:
            parts.append(msg["content"] + eos)
    return "".join(parts)


def load_tokenizer(name: str) -> Any:
    """The model's chat tokenizer (`sprint.format.trajectory.load_tokenizer`, cached there)."""
    return _load_tokenizer(name, chat=True)


def check_split(path: Path, name: str, tokenizer: Any, max_length: int, template: str = DEFAULT_TEMPLATE) -> SplitReport:
    """Validate every row of one JSONL file and measure its encoded length."""
    if not path.is_file():
        raise UserError(f"{name} data {path} does not exist; run the packing stage or pass the right path")
    report = SplitReport(name=name, path=str(path))
    texts: list[str] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            report.rows += 1
            try:
                messages = validate_messages(json.loads(line))
            except (json.JSONDecodeError, ValueError) as exc:
                report.invalid += 1
                if len(report.errors) < MAX_LISTED_ERRORS:
                    report.errors.append(f"line {lineno}: {exc}")
                continue
            turns = join_turns(messages)
            layout = answer_layout(turns[-1]["content"].strip())
            report.no_think += layout is None
            report.executor_rows += layout == "executor"
            report.sequential_rows += layout == "sequential"
            report.masked_rows += masked(messages)
            report.unmasked_executor_rows += layout == "executor" and not masked(messages)
            texts.append(_render(turns, tokenizer, template))
    report.load_error = schema_problem(path)
    if texts:
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        report.lengths = [len(ids) for ids in encoded]
        report.too_long = sum(n > max_length for n in report.lengths)
    return report


def _render(messages: list[dict[str, str]], tokenizer: Any, template: str) -> str:
    if template == "deepseek_r1":
        return render_deepseek_r1(messages, tokenizer.bos_token or "", tokenizer.eos_token or "")
    # Another template: the tokenizer's own chat template is the best estimate we have.
    return tokenizer.apply_chat_template(messages, tokenize=False)


def _user_prompts(path: Path) -> set[str]:
    prompts = set()
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                messages = validate_messages(json.loads(line))
            except (json.JSONDecodeError, ValueError):
                continue
            prompts.add("\n".join(m["content"] for m in messages if m["role"] == "user"))
    return prompts


def check_sft(
    train: str | Path,
    test: str | Path | None,
    tokenizer: str,
    max_length: int = DEFAULT_MAX_LENGTH,
    template: str = DEFAULT_TEMPLATE,
) -> SftCheckReport:
    """Check train (and test) JSONL files against the model's tokenizer and `max_length`."""
    if max_length <= 0:
        raise UserError(f"--max-length must be positive, got {max_length}")
    tok = load_tokenizer(tokenizer)
    train_path = Path(train)
    train_report = check_split(train_path, "train", tok, max_length, template)
    test_report = check_split(Path(test), "test", tok, max_length, template) if test else None
    overlap = len(_user_prompts(train_path) & _user_prompts(Path(test))) if test else 0
    return SftCheckReport(tokenizer, max_length, train_report, test_report, overlap)


def resolve_data(data: str | Path, test: str | Path | None) -> tuple[Path, Path | None]:
    """A packing output folder (train.jsonl + test.jsonl) or a train file (+ optional test file)."""
    path = Path(data)
    if path.is_dir():
        train_path = path / "train.jsonl"
        if test is None and (path / "test.jsonl").is_file():
            test = path / "test.jsonl"
    else:
        train_path = path
    if not train_path.is_file():
        raise UserError(f"no training data at {train_path}; pass the packing output folder or a train .jsonl file")
    return train_path, Path(test) if test else None


@dataclass
class CheckSftConfig:
    """`sprint check-sft` settings."""

    data: str = option(help="packing output folder (train.jsonl, test.jsonl) or a train .jsonl file", flags=("data",))
    tokenizer: str = option(help="the model's folder or hub id (its tokenizer counts the tokens)", var="TOKENIZER")
    test: str | None = option(None, "test/validation .jsonl (default: test.jsonl in the data folder)")
    max_length: int = option(DEFAULT_MAX_LENGTH, "ms-swift --max_length; longer rows are dropped", var="MAX_LENGTH")
    template: str = option(DEFAULT_TEMPLATE, "ms-swift template the training uses (others use the tokenizer's chat template)",
                           var="TEMPLATE")
    json: str | None = option(None, "also write the report as JSON here", metavar="PATH")


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_options(parser, CheckSftConfig)


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(CheckSftConfig, args)
    train, test = resolve_data(cfg.data, cfg.test)
    report = check_sft(train, test, cfg.tokenizer, cfg.max_length, cfg.template)
    print(report.format())
    if cfg.json:
        atomic_write(cfg.json, json.dumps(report.summary(), indent=2) + "\n")
    return 0 if report.ok else 1
