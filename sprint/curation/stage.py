"""The LLM-stage runner of the curation stages (1-2): one run body, online and batch alike.

`run_llm_stage` is the datatrove shape: it owns the template, the config, the client, the output
folder, the item loop (`sprint.core.items.run_items`), the manifest and the usage; a stage
(`LLMStage`) adds its prompt, its record shape and one async function from an item to its record.
`ItemBody` binds that function to the run's template, sampling and options (e.g. --strict): it is
the only per-item body, so batch mode (`sprint.curation.batch`, which only brings answers into the
response cache) and an online run write the same records and the same manifest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from sprint.core.data import Item, fingerprint, load_items
from sprint.core.errors import failed_items_exit
from sprint.core.items import CrashFn, ProcessFn, crash_record, resolve_cache_dir, row_hash, run_items
from sprint.core.options import add_options, config_from, flag_name
from sprint.core.records import RunDir
from sprint.core.manifest import estimate_cost, price_usage, text_hash
from sprint.core.files import atomic_write
from sprint.curation.batch import BATCH_DIR, BatchMode, batch_answers, check_batch_options
from sprint.curation.stage_config import (
    CHARS_PER_TOKEN, TOO_LONG, LLMStageConfig, input_identity, llm_config, sampling_for,
)
from sprint.curation.templates import fill, load_prompt
from sprint.llm.client import LLMClient, LLMConfig, Sampling

T = TypeVar("T")


# ----------------------------------------------------------------------------------------------
# A stage run's outcome and bookkeeping
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
            items, process, run, workers=workers, on_crash=on_crash, desc=stage, progress=progress,
            input_hash=lambda it: row_hash(it.row),
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
# The stage and its runner
# ----------------------------------------------------------------------------------------------


# The datatrove shape: `run_llm_stage` owns everything around the items (template, config,
# client, output folder, worker pool, manifest, usage); a stage brings an `LLMStage` whose
# `process` turns one item into one record.

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
    description: str = ""  # the paragraph of `sprint NAME --help`

    def run(self, input: str, out_dir: str | Path, **settings: Any) -> StageOutcome:
        """The stage from Python: `settings` are fields of `config_cls`."""
        return asyncio.run(run_llm_stage(self, self.config_cls(input=input, out_dir=str(out_dir), **settings)))

    def register(self, parser: argparse.ArgumentParser) -> None:
        """The subcommand's parser (made by sprint.cli, whose table holds the one-line help): flags, defaults
        and help all come from `config_cls`."""
        parser.description = self.description
        add_options(parser, self.config_cls)

    def handle(self, args: argparse.Namespace) -> int:
        """The subcommand's work: run, print the summary; exit 3 when some items failed (sprint.core.errors)."""
        outcome = asyncio.run(run_llm_stage(self, config_from(self.config_cls, args)))
        print(outcome.summary())
        failed, retryable = outcome.failures()
        hint = None
        if TOO_LONG in failed:
            hint = ("re-run with --allow-long (ALLOW_LONG=1) to send the too_long items; for any others fix the cause, "
                    "then re-run with --overwrite")
        return failed_items_exit(failed, retryable, argv=getattr(args, "argv", None), retry_hint=hint)


@dataclass(frozen=True)
class ItemBody:
    """One item -> one record, the same on every path of a run: online, batch collection and the
    batch's final pass. Binds the stage's work to the run's template, sampling and options (so
    `--batch --strict` judges as strictly as `--strict`), and records the items screened out as
    too long (`screen_sizes`) without a call."""

    stage: LLMStage
    template: str
    sampling: Sampling
    options: Mapping[str, Any] = field(default_factory=dict)  # keyword arguments of `stage.process`
    too_long: Mapping[str, int] = field(default_factory=dict)  # item id -> estimated prompt tokens
    limit: int = 0  # the --max-input-tokens those items are over

    @classmethod
    def for_run(cls, stage: LLMStage, cfg: LLMStageConfig, template: str, sampling: Sampling,
                too_long: Mapping[str, int]) -> ItemBody:
        options = stage.process_options(cfg) if stage.process_options else {}
        return cls(stage, template, sampling, options, too_long, cfg.max_input_tokens)

    def needs_llm(self, item: Item) -> bool:
        return item.id not in self.too_long and self.stage.needs_llm(item)

    async def __call__(self, item: Item, client: Any) -> dict[str, Any]:
        if item.id in self.too_long:
            return {**self.stage.base_record(item), "status": TOO_LONG, "retryable": False,
                    "error": f"the prompt is estimated at {self.too_long[item.id]:,} tokens, over --max-input-tokens "
                             f"{self.limit}; raise it or pass --allow-long to send it"}
        return await self.stage.process(item, client, self.template, self.sampling, **self.options)

    def crash(self, item: Item, exc: BaseException) -> dict[str, Any]:
        return crash_record(self.stage.base_record(item), exc)


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
    batch_mode = check_batch_options(cfg)
    run = RunDir(out, stage.name, config, overwrite=cfg.overwrite)  # after the checks: a refused run leaves no folder
    try:
        too_long = screen_sizes(stage, cfg, run, items, template)  # the estimate, before any call
        body = ItemBody.for_run(stage, cfg, template, sampling, too_long)
        return await _run_in(body, cfg, run, llm, items, batch_mode)
    finally:
        run.close()  # the lock; and the folder, if this run made it and wrote nothing


async def _run_in(body: ItemBody, cfg: LLMStageConfig, run: RunDir, llm: LLMConfig, items: list[Item],
                  batch_mode: BatchMode | None) -> StageOutcome:
    """`run_llm_stage` once its folder is open: get the answers (online: check the server; batch: into the
    cache), run `body` over the items, write the manifest. One path for both modes from here on."""
    stage = body.stage
    inputs = {"source": cfg.input, "rows": len(items), "fingerprint": fingerprint(cfg.input, items)}
    prompts = {stage.prompt_name: body.template}
    run.manifest_fields = {"inputs": inputs, "prompts": prompts}
    notes: list[str] = []
    async with LLMClient(llm) as client:
        pending = [it for it in items if not run.is_done(it.id)]
        if batch_mode is None:
            if cfg.check_server and any(body.needs_llm(it) for it in pending):
                await client.check()
            runnable = items
        else:
            answered, notes = await batch_answers(body, cfg, run.path / BATCH_DIR, client, pending, batch_mode)
            ready = {it.id for it in answered}
            runnable = [it for it in items if run.is_done(it.id) or it.id in ready]  # the rest waits for its answers
        outcome = await run_stage(
            stage.name,
            runnable,
            lambda item: body(item, client),
            run,
            workers=cfg.num_workers,
            on_crash=body.crash,
            usage=client.usage.as_dict,
            usage_key=f"{stage.name}_usage",
            manifest=lambda used: run.write_manifest(inputs=inputs, prompts=prompts, usage=used,
                                                     extra=stage.manifest_extra(run) if stage.manifest_extra else None),
            progress=cfg.progress,
        )
    outcome.total = len(items)
    outcome.item_ids = [it.id for it in items]
    outcome.notes.extend(notes)
    if stage.notes is not None:
        outcome.notes.extend(stage.notes(run))
    return outcome


# ----------------------------------------------------------------------------------------------
# Sizes: what a run is about to send, before any call
# ----------------------------------------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    """A prompt's size without a tokenizer (characters / CHARS_PER_TOKEN, rounded up)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def screen_sizes(stage: LLMStage, cfg: LLMStageConfig, run: RunDir, items: list[Item], template: str) -> dict[str, int]:
    """Print what the run is about to send (items, estimated tokens and cost) before any call, and set
    aside items over `cfg.max_input_tokens` as `too_long` unless `cfg.allow_long`.

    Returns the items set aside (id -> estimated prompt tokens): `ItemBody` records them as too_long
    without a call.
    """
    if cfg.allow_long:
        _redo_too_long(run)
    todo = [it for it in items if not run.is_done(it.id) and stage.needs_llm(it)]
    if not todo:
        return {}

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
        return {}
    biggest = max(long.values())
    if cfg.allow_long:
        print(f"{stage.name}: {len(long)} item(s) over {flag_name(type(cfg), 'max_input_tokens')} {limit} "
              f"(largest about {biggest:,} tokens) are sent anyway (--allow-long)", file=sys.stderr)
        return {}
    extra = cost_line(cfg.model, sum(long.values()), len(long) * cfg.max_tokens, cfg.batch)
    print(f"{stage.name}: {len(long)} item(s) over {flag_name(type(cfg), 'max_input_tokens')} {limit} (largest about "
          f"{biggest:,} tokens) are skipped as {TOO_LONG} (sending them would add {extra}); pass --allow-long "
          "(ALLOW_LONG=1) to send them", file=sys.stderr)
    return long


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
