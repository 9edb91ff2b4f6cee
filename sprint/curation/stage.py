"""What every LLM-calling stage shares: prompt templates, common options, the item loop, the stage runner.

`run_items` is the loop: skip items the output folder already holds, process the rest with
bounded concurrency, append each record the moment it is ready (so a kill loses only in-flight
items), keep a progress bar with ok/failed counts, and leave a manifest behind even when
interrupted. Stages supply two callbacks: how to process one item, and how to record a crash.

`run_llm_stage` is the curation stages' runner (the datatrove shape): it owns the template, the
config, the client, the output folder, the loop, the manifest and the usage; a stage (`LLMStage`)
adds its prompt, its record shape and one async function from an item to its record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from tqdm import tqdm

from sprint.core.data import Item, fingerprint, load_items
from sprint.core.errors import ServerStopped, UserError, failed_items_exit
from sprint.llm.client import DEFAULT_MAX_CONNECTION_FAILURES, RUN_STOP, TRANSIENT_KINDS, LLMClient, LLMConfig, LLMError, RunStop, Sampling
from sprint.core.options import add_command, config_from, flag_name, option, optional_int
from sprint.core.records import RunDir, atomic_write, estimate_cost, price_usage, text_hash

log = logging.getLogger(__name__)

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "prompts"

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


async def ask_checked(
    client: Any,
    content: str,
    sampling: Any,
    record: dict[str, Any],
    name: str,
    parse: Callable[[str], T],
    answer_error: type[Exception],
    problems: Callable[[T], list[str]],
) -> T | None:
    """`ask`, then read the answer with `parse` and list what is wrong with it with `problems`.

    Returns the parsed answer, or None with the record's status set: the call's failure,
    `unparseable` (`parse` raised `answer_error`) or `invalid` (the problems, joined).
    """
    answer = await ask(client, content, sampling, record, name)
    if answer is None:
        return None
    try:
        value = parse(answer)
    except answer_error as exc:
        record["status"], record["error"] = "unparseable", str(exc)
        return None
    errors = problems(value)
    if errors:
        record["status"], record["error"] = "invalid", "; ".join(errors)
        return None
    return value


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
    item_ids: list[str] = field(default_factory=list)  # the selected items (input and range)

    @property
    def failed(self) -> int:
        return sum(n for status, n in self.counts.items() if status != "ok")

    def failures(self) -> tuple[dict[str, int], int]:
        """The selected items that did not end ok: (counts by status, how many a re-run retries)."""
        by_status: dict[str, int] = {}
        retryable = 0
        for item_id in self.item_ids:
            record = self.run.done.get(item_id)
            if record is not None and record.get("status", "ok") != "ok":
                by_status[record["status"]] = by_status.get(record["status"], 0) + 1
                retryable += bool(record.get("retryable"))
        return by_status, retryable

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
                prices = "Batch API prices" if u.get("priced_as") == "batch" else "prices"
                total += f" (about ${u['estimated_cost_usd']:.2f} at {self.run.config.get('model')} {prices})"
            lines.append(total)
        lines.append(f"  outputs: {self.run.records_path} and {self.run.manifest_path}")
        return "\n".join(lines)


ProcessFn = Callable[[T], Awaitable[dict[str, Any]]]
CrashFn = Callable[[T, BaseException], dict[str, Any]]


class Tally:
    """The progress bar's live counts: ok / failed records. A stage may pass its own (orchestration
    shows accuracy so far); `add` sees every record of the selected items, resumed ones first."""

    def __init__(self) -> None:
        self.ok = 0
        self.failed = 0

    def add(self, record: dict[str, Any]) -> None:
        if record.get("status") == "ok":
            self.ok += 1
        else:
            self.failed += 1

    def text(self) -> str:
        return f"ok={self.ok}, failed={self.failed}"


async def run_items(
    items: Sequence[T],
    process: ProcessFn[T],
    run: RunDir,
    *,
    workers: int,
    on_crash: CrashFn[T],
    item_id: Callable[[T], str] = lambda item: item.id,  # type: ignore[attr-defined]
    desc: str = "items",
    unit: str = "item",
    progress: bool = True,
    tally: Tally | None = None,
) -> tuple[int, int]:
    """Process the items the folder does not hold yet; returns (skipped, processed).

    The one worker pool of the pipeline (curation stages, orchestration, the baseline). A record is
    appended as soon as its item finishes. An unexpected exception in `process` becomes the record
    `on_crash` builds and the run goes on (one warning line; the traceback at debug level); a
    UserError, or an exception in `on_crash` itself, stops the run: the other workers are cancelled.
    When an LLM client's circuit breaker trips (its server stopped answering, `sprint.llm.client.RUN_STOP`),
    no further item starts, the items in flight end (their calls fail at once, as retryable records)
    and `ServerStopped` is raised: a re-run of the same command continues.
    """
    if workers < 1:
        raise UserError(f"the number of workers must be at least 1, got {workers}")
    todo = [it for it in items if not run.is_done(item_id(it))]
    skipped = len(items) - len(todo)
    queue: asyncio.Queue[T] = asyncio.Queue()
    for it in todo:
        queue.put_nowait(it)
    counts = tally if tally is not None else Tally()  # over the selected items, as the bar is
    for it in items:
        record = run.done.get(item_id(it))
        if record is not None:
            counts.add(record)

    bar = tqdm(
        total=len(items), initial=skipped, desc=desc, unit=unit, postfix=counts.text(),
        disable=not progress or not todo, file=sys.stderr, dynamic_ncols=True,
    )
    processed = 0
    stop = RunStop()  # tripped by a client of this run whose server stopped answering
    stop_token = RUN_STOP.set(stop)  # the worker tasks inherit it

    async def worker() -> None:
        nonlocal processed
        while stop.reason is None:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                record = await process(item)
            except (UserError, asyncio.CancelledError):
                raise
            except Exception as exc:  # a bug or surprise in one item must not sink the others
                log.warning("%s %s crashed: %s: %s; recorded as crashed (retryable)", unit, item_id(item),
                            type(exc).__name__, exc)
                log.debug("traceback of the crash of %s %s", unit, item_id(item), exc_info=True)
                record = on_crash(item, exc)
            run.append(record)
            processed += 1
            counts.add(record)
            bar.set_postfix_str(counts.text(), refresh=False)
            bar.update(1)

    tasks = [asyncio.create_task(worker()) for _ in range(min(workers, max(1, len(todo))))]
    RUN_STOP.reset(stop_token)
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:  # one worker failed (or we were cancelled): stop the others too
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        bar.close()
    if stop.reason is not None:
        left = sum(1 for it in todo if (run.done.get(item_id(it)) or {}).get("status") != "ok")
        raise ServerStopped(f"{stop.reason}, {left} {unit}s not done; rerun the same command to continue")
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
        price_usage(used, str(model), bool(run.config.get("batch")))
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
        item_ids=[str(getattr(it, "id", it)) for it in items],
    )


# ----------------------------------------------------------------------------------------------
# The LLM-stage runner and its shared settings
# ----------------------------------------------------------------------------------------------


# The datatrove shape: `run_llm_stage` owns everything around the items (template, config,
# client, output folder, worker pool, manifest, usage); a stage brings an `LLMStage` whose
# `process` turns one item into one record.

DEFAULT_MODEL = "gpt-4o"  # the paper's curation model
DEFAULT_SERVER_URL = "https://api.openai.com/v1"
DEFAULT_MAX_INPUT_TOKENS = 32_000  # curation prompts of the paper's traces stay far below; a runaway trace does not
CHARS_PER_TOKEN = 4  # the usual English-text rule of thumb: a size estimate needs no tokenizer
TOO_LONG = "too_long"


@dataclass
class LLMStageConfig:
    """The settings every LLM-calling curation stage shares (one flag each; defaults written once)."""

    input: str = option(help="input dataset: a hub id, a .jsonl/.json/.parquet file or a stage folder",
                        flags=("--input", "-i"), var="DATA")
    out_dir: str = option(help="output folder (records.jsonl + manifest.json); resumed if it exists",
                          flags=("--out-dir", "-o"), var="OUT_DIR")
    split: str | None = option("train", "dataset split (hub datasets, files with a split column)", var="SPLIT")
    subset: str | None = option(None, "dataset configuration name (hub datasets)", var="SUBSET")
    range_spec: str | None = option(None, "rows to process, e.g. 0:100 (default: all)", flags=("--range",),
                                    metavar="START:END", var="RANGE")
    overwrite: bool = option(False, "discard an existing output folder made with a different configuration")
    progress: bool = option(True, "no progress bar", flags=("--no-progress",))
    model: str = option(DEFAULT_MODEL, "model name", var="MODEL")
    server_url: str = option(DEFAULT_SERVER_URL,
                             "OpenAI-compatible base URL (vLLM: http://127.0.0.1:8000/v1); the key comes from OPENAI_API_KEY",
                             var="SERVER_URL")
    num_workers: int = option(8, "concurrent requests", var="NUM_WORKERS")
    max_tokens: int = option(2048, "answer length limit", var="MAX_TOKENS")
    temperature: float = option(0.0, "sampling temperature (0, as in the paper)", var="TEMPERATURE")
    timeout: float = option(600.0, "seconds per request attempt", var="TIMEOUT")
    max_retries: int = option(3, "retries of transient failures per request", var="MAX_RETRIES")
    cache_dir: str | None = option(None, "response cache folder (default: OUT_DIR/llm_cache)", var="CACHE_DIR")
    use_cache: bool = option(True, "do not read or write the response cache", flags=("--no-cache",))
    prompt_file: str | None = option(None, "use this prompt template instead of the packaged one", flags=("--prompt",),
                                     var="PROMPT")
    check_server: bool = option(True, "skip the GET /models check before starting", flags=("--no-check",))
    max_connection_failures: int = option(
        DEFAULT_MAX_CONNECTION_FAILURES,
        "stop the run after this many failed connections in a row to the server (0: never); re-run to continue",
        var="MAX_CONNECTION_FAILURES")
    max_input_tokens: int = option(
        DEFAULT_MAX_INPUT_TOKENS, "an item whose prompt is estimated (characters / 4) over this many tokens is skipped "
        "as too_long before any call (0: no limit)", var="MAX_INPUT_TOKENS")
    allow_long: bool = option(False, "send items over --max-input-tokens anyway (also redoes items marked too_long)",
                              var="ALLOW_LONG")
    tpm: int | None = option(None, "tokens-per-minute budget: requests are paced to stay within it (prompt + max_tokens "
                             "estimated, corrected by the usage the API returns); default: no limit", type=optional_int,
                             var="TPM")
    rpm: int | None = option(None, "requests-per-minute budget; default: no limit", type=optional_int, var="RPM")
    batch: bool = option(False, "send the requests through the OpenAI Batch API (half price; results within 24 h): "
                         "upload, poll, ingest; a re-run resumes a submitted batch", var="BATCH")
    batch_file_only: bool = option(False, "write the requests as a Batch API JSONL (OUT_DIR/batch/) and stop, e.g. "
                                   "for vLLM's offline `run_batch`; ingest its output with --batch-results")
    batch_results: str | None = option(None, "ingest this Batch API output JSONL (OpenAI's or vLLM run_batch's) into "
                                       "the response cache and the records", metavar="FILE")
    batch_poll: float = option(30.0, "seconds between polls of a submitted batch")


ItemFn = Callable[[Item, LLMClient, str, Sampling], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class LLMStage:
    """What one curation stage adds to the shared runner: its prompt, its records, its per-item work."""

    name: str  # the command and the manifest's stage
    prompt_name: str  # prompts/<name>.txt
    placeholders: tuple[str, ...]  # the template must hold these
    require: tuple[str, ...]  # input columns `load_items` must find
    base_record: Callable[[Item], dict[str, Any]]  # a record with every key present (also for crashes)
    process: ItemFn  # one item -> one record
    needs_llm: Callable[[Item], bool] = lambda item: True  # False: `process` answers without a call
    config_keys: tuple[str, ...] = ()  # stage-specific config fields kept in the manifest
    check_items: Callable[[str, list[Item]], None] | None = None  # refuse an unusable input up front
    notes: Callable[[RunDir], list[str]] | None = None  # extra summary lines
    manifest_extra: Callable[[RunDir], dict[str, Any]] | None = None  # extra manifest keys (e.g. warning counts)
    process_options: Callable[[Any], dict[str, Any]] | None = None  # config -> keyword arguments of `process`
    config_cls: type = LLMStageConfig  # the stage's options (a subclass of LLMStageConfig)
    prompt_text: Callable[[Item, str], str] | None = None  # item + template -> what is sent (size estimate)
    help: str = ""  # one line for `sprint --help`
    description: str = ""  # the paragraph of `sprint NAME --help`

    def run(self, input: str, out_dir: str | Path, **settings: Any) -> StageOutcome:
        """The stage from Python: `settings` are fields of `config_cls`."""
        return asyncio.run(run_llm_stage(self, self.config_cls(input=input, out_dir=str(out_dir), **settings)))

    def add_parser(self, subparsers: argparse._SubParsersAction, handler: Callable[[argparse.Namespace], int]) -> None:
        """The subcommand: flags, defaults and help all come from `config_cls`."""
        add_command(subparsers, self.name, handler, self.config_cls, help=self.help, description=self.description)

    def main(self, args: argparse.Namespace) -> int:
        """The subcommand's work: run, print the summary; exit 3 when some items failed (sprint.core.errors)."""
        outcome = asyncio.run(run_llm_stage(self, config_from(self.config_cls, args)))
        print(outcome.summary())
        failed, retryable = outcome.failures()
        hint = None
        if TOO_LONG in failed:
            hint = ("re-run with --allow-long (ALLOW_LONG=1) to send the too_long items; for any others fix the cause, "
                    "then re-run with --overwrite")
        return failed_items_exit(failed, retryable, argv=getattr(args, "argv", None), retry_hint=hint)


async def run_llm_stage(stage: LLMStage, cfg: LLMStageConfig) -> StageOutcome:
    """Run `stage` over `cfg.input` into `cfg.out_dir`, resuming what the folder already holds.

    Every check that can fail without the server runs before the folder is made, so a refused
    run leaves nothing behind.
    """
    out = Path(cfg.out_dir).expanduser()
    template = load_prompt(stage.prompt_name, cfg.prompt_file)
    fill(template, stage.placeholders)  # fail now, not per item, on a bad template
    items = load_items(cfg.input, cfg.split, cfg.subset, cfg.range_spec, getattr(cfg, "question_col", None),
                       getattr(cfg, "id_col", None), require=stage.require, flag=flag_name(type(cfg), "input"))
    if stage.check_items is not None:
        stage.check_items(cfg.input, items)
    sampling = sampling_for(cfg.max_tokens, cfg.temperature)
    config = {
        "stage": stage.name,
        "input": input_identity(cfg.input),
        "split": cfg.split,
        "subset": cfg.subset,
        **{key: getattr(cfg, key) for key in stage.config_keys},
        "model": cfg.model,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "prompt_hash": text_hash(template),
        "range": cfg.range_spec,
        "num_workers": cfg.num_workers,
        "server_url": cfg.server_url,
        "timeout": cfg.timeout,
        "max_retries": cfg.max_retries,
        "cache_dir": str(cfg.cache_dir) if cfg.cache_dir else None,
        "batch": cfg.batch,  # prices the manifest's cost estimate (not part of the identity)
    }
    llm = llm_config(
        server_url=cfg.server_url, model=cfg.model, num_workers=cfg.num_workers, timeout=cfg.timeout,
        max_retries=cfg.max_retries, cache_dir=resolve_cache_dir(out, cfg.cache_dir, cfg.use_cache),
        max_connection_failures=cfg.max_connection_failures, tpm=cfg.tpm, rpm=cfg.rpm,
    )
    # sprint.curation.batch builds on this module (run_stage, crash_record): imported here, not at the top
    from sprint.curation.batch import check_batch_options, run_batch_stage

    batch_mode = check_batch_options(cfg)
    run = RunDir(out, stage.name, config, overwrite=cfg.overwrite)  # after the checks: a refused run leaves no folder
    try:
        stage = screen_sizes(stage, cfg, run, items, template)  # the estimate, before any call; too_long set aside
        if batch_mode:
            return await run_batch_stage(stage, cfg, run, llm, items, template, sampling, batch_mode)
        return await _run_in(stage, cfg, run, llm, items, template, sampling)
    finally:
        run.close()  # the lock; and the folder, if this run made it and wrote nothing


async def _run_in(stage: LLMStage, cfg: LLMStageConfig, run: RunDir, llm: LLMConfig, items: list[Item],
                  template: str, sampling: Sampling) -> StageOutcome:
    """`run_llm_stage` once its folder is open: check the server, run the items, write the manifest."""
    inputs = {"source": cfg.input, "rows": len(items), "fingerprint": fingerprint(cfg.input, items)}
    run.manifest_fields = {"inputs": inputs, "prompts": {stage.prompt_name: template}}
    options = stage.process_options(cfg) if stage.process_options else {}
    async with LLMClient(llm) as client:
        if cfg.check_server and any(not run.is_done(it.id) and stage.needs_llm(it) for it in items):
            await client.check()
        outcome = await run_stage(
            stage.name,
            items,
            lambda item: stage.process(item, client, template, sampling, **options),
            run,
            workers=cfg.num_workers,
            on_crash=lambda item, exc: crash_record(stage.base_record(item), exc),
            usage=client.usage.as_dict,
            usage_key=f"{stage.name}_usage",
            manifest=lambda used: run.write_manifest(inputs=inputs, prompts={stage.prompt_name: template}, usage=used,
                                                     extra=stage.manifest_extra(run) if stage.manifest_extra else None),
            progress=cfg.progress,
        )
    if stage.notes is not None:
        outcome.notes.extend(stage.notes(run))
    return outcome


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def screen_sizes(stage: LLMStage, cfg: LLMStageConfig, run: RunDir, items: list[Item], template: str) -> LLMStage:
    """Print what the run is about to send (items, estimated tokens and cost) before any call, and set
    aside items over `cfg.max_input_tokens` as `too_long` unless `cfg.allow_long`.

    Returns the stage to run: `stage` itself, or one whose per-item work records those items as
    too_long without a call.
    """
    if cfg.allow_long:
        _redo_too_long(run)
    todo = [it for it in items if not run.is_done(it.id) and stage.needs_llm(it)]
    if not todo:
        return stage

    def text_of(item: Item) -> str:
        if stage.prompt_text is not None:
            return stage.prompt_text(item, template)
        return template + item.question + (item.thought or "")

    sizes = {it.id: estimate_tokens(text_of(it)) for it in todo}
    limit = cfg.max_input_tokens
    long = {key: n for key, n in sizes.items() if limit and n > limit}
    sent = [n for key, n in sizes.items() if cfg.allow_long or key not in long]
    print(f"{stage.name}: {len(sent)} item(s) to send: "
          f"{cost_line(cfg.model, sum(sent), len(sent) * cfg.max_tokens, cfg.batch)}", file=sys.stderr)
    if not long:
        return stage
    biggest = max(long.values())
    if cfg.allow_long:
        print(f"{stage.name}: {len(long)} item(s) over {flag_name(type(cfg), 'max_input_tokens')} {limit} "
              f"(largest about {biggest:,} tokens) are sent anyway (--allow-long)", file=sys.stderr)
        return stage
    extra = cost_line(cfg.model, sum(long.values()), len(long) * cfg.max_tokens, cfg.batch)
    print(f"{stage.name}: {len(long)} item(s) over {flag_name(type(cfg), 'max_input_tokens')} {limit} (largest about "
          f"{biggest:,} tokens) are skipped as {TOO_LONG} (sending them would add {extra}); pass --allow-long "
          "(ALLOW_LONG=1) to send them", file=sys.stderr)
    inner = stage.process

    async def process(item: Item, client: LLMClient, template: str, sampling: Sampling, **kw: Any) -> dict[str, Any]:
        if item.id in long:
            return {**stage.base_record(item), "status": TOO_LONG, "retryable": False,
                    "error": f"the prompt is estimated at {long[item.id]:,} tokens, over --max-input-tokens {limit}; "
                             "raise it or pass --allow-long to send it"}
        return await inner(item, client, template, sampling, **kw)

    return replace(stage, process=process, needs_llm=lambda item: item.id not in long and stage.needs_llm(item))


def cost_line(model: str, prompt_tokens: int, max_answer_tokens: int, batch: bool = False) -> str:
    """`about P prompt tokens (characters / 4) + at most A answer tokens, at most about $X at MODEL prices`."""
    cost = estimate_cost(model, prompt_tokens, max_answer_tokens, batch)
    prices = f"{model} Batch API prices (half the online price)" if batch else f"{model} prices"
    price = f", at most about ${cost:,.2f} at {prices}" if cost is not None else ""
    return f"about {prompt_tokens:,} prompt tokens (characters / 4) + at most {max_answer_tokens:,} answer tokens{price}"


def _redo_too_long(run: RunDir) -> None:
    """Forget the records of items skipped as too_long, so this run (with --allow-long) sends them;
    rewritten atomically so the folder never holds two records for one id."""
    stale = [key for key, record in run.done.items() if record.get("status") == TOO_LONG]
    if not stale:
        return
    for key in stale:
        del run.done[key]
    atomic_write(run.records_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in run.done.values()))


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
    *, server_url: str, model: str, num_workers: int, timeout: float, max_retries: int, cache_dir: Path | None,
    max_connection_failures: int = DEFAULT_MAX_CONNECTION_FAILURES, tpm: int | None = None, rpm: int | None = None,
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
        max_connection_failures=max_connection_failures,
        tpm=tpm,
        rpm=rpm,
    )


def input_identity(source: str) -> str:
    """The input as recorded in the run's identity: an absolute path for local files."""
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source
