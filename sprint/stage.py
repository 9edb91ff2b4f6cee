"""What every LLM-calling stage shares: prompt templates, common CLI flags, and the item loop.

`run_items` is the loop: skip items the output folder already holds, process the rest with
bounded concurrency, append each record the moment it is ready (so a kill loses only in-flight
items), keep a progress bar with ok/failed counts, and leave a manifest behind even when
interrupted. Stages supply two callbacks: how to process one item, and how to record a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from tqdm import tqdm

from sprint.errors import UserError
from sprint.llm import TRANSIENT_KINDS, LLMConfig, LLMError, Sampling
from sprint.records import RunDir, estimate_cost

log = logging.getLogger(__name__)

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
DEFAULT_MODEL = "gpt-4o"
DEFAULT_SERVER_URL = "https://api.openai.com/v1"

T = TypeVar("T")


# ----------------------------------------------------------------------------------------------
# Prompt templates
# ----------------------------------------------------------------------------------------------


def load_prompt(name: str, path: str | Path | None = None) -> str:
    """A template from prompts/NAME.txt, or from `path` when the user brings their own."""
    file = Path(path).expanduser() if path else PROMPTS_DIR / f"{name}.txt"
    if not file.is_file():
        raise UserError(f"prompt template {file} not found; pass an existing file with --prompt")
    return file.read_text(encoding="utf-8")


def fill(template: str, required: Sequence[str] = (), **values: str) -> str:
    """Replace `{name}` placeholders for the given names, in one pass.

    Not `str.format`: templates show JSON and Python dicts whose braces must stay as written, and
    one pass means a question that happens to contain `{lines}` is not expanded again.
    """
    missing = [name for name in required if "{" + name + "}" not in template]
    if missing:
        raise UserError(
            f"the prompt template lacks the placeholder(s) {', '.join('{' + m + '}' for m in missing)}; add them"
        )
    if not values:
        return template
    pattern = re.compile(r"\{(" + "|".join(re.escape(name) for name in values) + r")\}")
    return pattern.sub(lambda m: values[m.group(1)], template)


# ----------------------------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------------------------


def llm_failure(exc: LLMError) -> tuple[str, str, bool]:
    """(status, error, retryable) for a call that failed after retries.

    Auth and unknown-model errors stop the run instead: every later item would fail the same way.
    """
    if exc.kind in ("auth", "not_found"):
        raise UserError(f"{exc}; check the server URL, the model name and the API key, then re-run") from None
    return f"llm_{exc.kind}", str(exc), exc.kind in TRANSIENT_KINDS


def usage_of(completion: Any | None) -> dict[str, int]:
    """Per-record token usage with a fixed shape (zeros when no answer came back)."""
    if completion is None:
        return {"prompt_tokens": 0, "completion_tokens": 0}
    return {"prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens}


async def ask(client: Any, content: str, sampling: Any, record: dict[str, Any], name: str) -> str | None:
    """One chat turn for one item, as both curation stages ask it.

    Stores the answer and its usage in `record` (`<name>_answer`, `<name>_usage`). When the call
    fails or the answer is cut off at max_tokens, sets the record's status/error and returns None.
    """
    try:
        completion = await client.chat([{"role": "user", "content": content}], sampling)
    except LLMError as exc:
        record["status"], record["error"], record["retryable"] = llm_failure(exc)
        return None
    record[f"{name}_answer"] = completion.text
    record[f"{name}_usage"] = usage_of(completion)
    if completion.finish_reason == "length":
        record["status"] = "truncated"
        record["error"] = f"the answer reached max_tokens ({sampling.max_tokens}) before it ended; raise --max-tokens"
        return None
    return completion.text


# ----------------------------------------------------------------------------------------------
# The item loop
# ----------------------------------------------------------------------------------------------


@dataclass
class StageOutcome(Generic[T]):
    """What a stage run did; `counts` covers every record in the folder, earlier runs included."""

    stage: str
    run: RunDir
    total: int  # items selected by the input and range
    skipped: int  # already in the folder
    processed: int  # written by this run
    counts: dict[str, int]
    usage: dict[str, Any] = field(default_factory=dict)
    elapsed: float = 0.0
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)  # stage-specific lines for the summary

    @property
    def failed(self) -> int:
        return sum(n for status, n in self.counts.items() if status != "ok")

    def summary(self) -> str:
        """A few lines for the terminal: counts by status, tokens, cost, where the outputs are."""
        lines = [
            f"{self.stage}: {self.total} items ({self.skipped} already done, {self.processed} processed now) "
            f"in {self.elapsed:.1f}s" + (" — interrupted" if self.interrupted else "")
        ]
        ordered = sorted(self.counts.items(), key=lambda kv: (kv[0] != "ok", kv[0]))  # ok first
        by_status = ", ".join(f"{status}: {n}" for status, n in ordered)
        lines.append(f"  records: {by_status or 'none'}")
        retryable = sum(1 for r in self.run.records() if r.get("retryable"))
        if retryable:
            lines.append(f"  {retryable} transient failures: re-run the same command to retry them")
        lines.extend(f"  {note}" for note in self.notes)
        u = self.usage
        if u:
            now = u.get("this_run", {})
            lines.append(
                f"  tokens this run: {now.get('prompt_tokens', 0):,} prompt + {now.get('completion_tokens', 0):,} "
                f"completion over {now.get('calls', 0)} calls ({now.get('cache_hits', 0)} from cache, "
                f"{now.get('retries', 0)} retries)"
            )
            total = (
                f"  tokens in all records: {u.get('prompt_tokens', 0):,} prompt + "
                f"{u.get('completion_tokens', 0):,} completion"
            )
            if u.get("estimated_cost_usd") is not None:
                total += f" (about ${u['estimated_cost_usd']:.2f} at {self.run.config.get('model')} prices)"
            lines.append(total)
        lines.append(f"  outputs: {self.run.records_path} and {self.run.manifest_path}")
        return "\n".join(lines)


ProcessFn = Callable[[T], Awaitable[dict[str, Any]]]
CrashFn = Callable[[T, BaseException], dict[str, Any]]


async def run_items(
    items: Sequence[T],
    process: ProcessFn[T],
    run: RunDir,
    *,
    workers: int,
    on_crash: CrashFn[T],
    item_id: Callable[[T], str] = lambda item: item.id,  # type: ignore[attr-defined]
    desc: str = "items",
    progress: bool = True,
) -> tuple[int, int]:
    """Process the items the folder does not hold yet; returns (skipped, processed).

    A record is appended as soon as its item finishes. An unexpected exception in `process`
    becomes the record `on_crash` builds (the run goes on); a UserError stops the whole run.
    """
    if workers < 1:
        raise UserError(f"the number of workers must be at least 1, got {workers}")
    todo = [it for it in items if not run.is_done(item_id(it))]
    skipped = len(items) - len(todo)
    queue: asyncio.Queue[T] = asyncio.Queue()
    for it in todo:
        queue.put_nowait(it)
    counts = {"ok": 0, "failed": 0}  # over the selected items, as the bar is
    for it in items:
        record = run.done.get(item_id(it))
        if record is not None:
            counts["ok" if record.get("status") == "ok" else "failed"] += 1

    def postfix() -> str:
        return f"ok={counts['ok']}, failed={counts['failed']}"

    bar = tqdm(
        total=len(items), initial=skipped, desc=desc, unit="item", postfix=postfix(),
        disable=not progress or not todo, file=sys.stderr, dynamic_ncols=True,
    )
    processed = 0

    async def worker() -> None:
        nonlocal processed
        while True:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                record = await process(item)
            except (UserError, asyncio.CancelledError):
                raise
            except Exception as exc:  # a bug or surprise in one item must not sink the others
                log.exception("item %s crashed", item_id(item))
                record = on_crash(item, exc)
            run.append(record)
            processed += 1
            counts["ok" if record.get("status") == "ok" else "failed"] += 1
            bar.set_postfix_str(postfix(), refresh=False)
            bar.update(1)

    tasks = [asyncio.create_task(worker()) for _ in range(min(workers, max(1, len(todo))))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        bar.close()
    return skipped, processed


def crash_record(base: dict[str, Any], exc: BaseException) -> dict[str, Any]:
    """An item whose processing raised: kept retryable so a fixed re-run redoes it."""
    return {**base, "status": "crashed", "error": f"{type(exc).__name__}: {exc}", "retryable": True}


def folder_usage(run: RunDir, usage_key: str, this_run: dict[str, Any]) -> dict[str, Any]:
    """Token totals over every record of the folder (earlier, resumed runs included) + this run's client stats.

    The totals are what producing the folder cost, so the manifest's cost estimate uses them.
    """
    records = run.records()
    return {
        "prompt_tokens": sum((r.get(usage_key) or {}).get("prompt_tokens", 0) for r in records),
        "completion_tokens": sum((r.get(usage_key) or {}).get("completion_tokens", 0) for r in records),
        "this_run": this_run,
    }


# Loggers that report every HTTP request at INFO; with a progress bar they would bury it.


async def run_stage(
    stage: str,
    items: Sequence[T],
    process: ProcessFn[T],
    run: RunDir,
    *,
    workers: int,
    on_crash: CrashFn[T],
    usage: Callable[[], dict[str, Any]],
    usage_key: str,
    manifest: Callable[[dict[str, Any]], None],
    progress: bool = True,
) -> StageOutcome[T]:
    """`run_items` plus the bookkeeping: timing, token totals, and a manifest even on interruption.

    `usage` gives this run's client statistics, `usage_key` names the per-record usage field,
    `manifest` writes the manifest given the usage dict.
    """
    started = time.monotonic()
    skipped, processed, interrupted = 0, 0, True
    try:
        skipped, processed = await run_items(
            items, process, run, workers=workers, on_crash=on_crash, desc=stage, progress=progress
        )
        interrupted = False
    finally:
        used = folder_usage(run, usage_key, usage())
        manifest(used)
    model = run.config.get("model")
    if model:
        cost = estimate_cost(str(model), used["prompt_tokens"], used["completion_tokens"])
        if cost is not None:
            used["estimated_cost_usd"] = cost
    return StageOutcome(
        stage=stage,
        run=run,
        total=len(items),
        skipped=skipped,
        processed=processed,
        counts=run.counts(),
        usage=used,
        elapsed=time.monotonic() - started,
        interrupted=interrupted,
    )


# ----------------------------------------------------------------------------------------------
# Common CLI flags and settings
# ----------------------------------------------------------------------------------------------


def add_input_args(parser: argparse.ArgumentParser, what: str) -> None:
    add = parser.add_argument
    add("--input", "-i", required=True, help=what)
    add("--out-dir", "-o", required=True, help="output folder (records.jsonl + manifest.json); resumed if it exists")
    add("--split", default="train", help="dataset split (hub datasets, files with a split column); default: train")
    add("--subset", default=None, help="dataset configuration name (hub datasets)")
    add("--range", dest="range_spec", default=None, metavar="START:END", help="rows to process, e.g. 0:100 (default: all)")
    add("--overwrite", action="store_true", help="discard an existing output folder made with a different configuration")
    add("--no-progress", dest="progress", action="store_false", help="no progress bar")


def add_llm_args(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    add = parser.add_argument
    add("--model", default=DEFAULT_MODEL, help=f"model name (default: {DEFAULT_MODEL})")
    add("--server-url", default=DEFAULT_SERVER_URL,
        help=f"OpenAI-compatible base URL (default: {DEFAULT_SERVER_URL}); the key comes from OPENAI_API_KEY")
    add("--num-workers", type=int, default=8, help="concurrent requests (default: 8)")
    add("--max-tokens", type=int, default=max_tokens, help=f"answer length limit (default: {max_tokens})")
    add("--temperature", type=float, default=0.0, help="sampling temperature (default: 0, as in the paper)")
    add("--timeout", type=float, default=600.0, help="seconds per request attempt (default: 600)")
    add("--max-retries", type=int, default=3, help="retries of transient failures per request (default: 3)")
    add("--cache-dir", default=None, help="response cache folder (default: OUT_DIR/llm_cache)")
    add("--no-cache", dest="use_cache", action="store_false", help="do not read or write the response cache")
    add("--prompt", dest="prompt_file", default=None, help="use this prompt template instead of the packaged one")
    add("--no-check", dest="check_server", action="store_false", help="skip the GET /models check before starting")


def resolve_cache_dir(out_dir: Path, cache_dir: str | Path | None, use_cache: bool) -> Path | None:
    if not use_cache:
        return None
    return Path(cache_dir).expanduser() if cache_dir else out_dir / "llm_cache"


def sampling_for(max_tokens: int, temperature: float) -> Sampling:
    """The stage's sampling settings, refused as a user error (not a traceback) when out of range."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise UserError(f"--max-tokens must be a positive integer, got {max_tokens!r}")
    if not temperature >= 0:
        raise UserError(f"--temperature must be >= 0, got {temperature!r}")
    return Sampling(max_tokens=max_tokens, temperature=temperature)


def llm_config(
    *, server_url: str, model: str, num_workers: int, timeout: float, max_retries: int, cache_dir: Path | None
) -> LLMConfig:
    if not server_url:
        raise UserError("no server URL; pass --server-url (e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1)")
    if not server_url.startswith(("http://", "https://")):
        raise UserError(
            f"server URL {server_url!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000/v1 or https://api.openai.com/v1"
        )
    if not model:
        raise UserError("no model name; pass --model")
    if num_workers < 1:
        raise UserError(f"--num-workers must be at least 1, got {num_workers}")
    if not timeout > 0:
        raise UserError(f"--timeout must be a positive number of seconds, got {timeout}")
    if max_retries < 0:
        raise UserError(f"--max-retries must be 0 or more, got {max_retries}")
    return LLMConfig(
        base_url=server_url.rstrip("/"),
        model=model,
        max_concurrency=num_workers,
        timeout=timeout,
        max_retries=max_retries,
        cache_dir=cache_dir,
    )


def input_identity(source: str) -> str:
    """The input as recorded in the run's identity: an absolute path for local files."""
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source
