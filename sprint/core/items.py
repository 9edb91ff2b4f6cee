"""The item loop of the pipeline: every stage that turns input items into records runs through it.

`run_items` skips items the output folder already holds, processes the rest with bounded
concurrency, appends each record the moment it is ready (so a kill loses only in-flight items) and
keeps a progress bar with live counts. Curation stages, orchestration and the baseline all use it,
so it lives at the bottom layer: it knows run folders (`RunDir`), not LLM clients. A client reaches
it only through `RUN_STOP`, the signal its circuit breaker trips.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from sprint.core.errors import ServerStopped, UserError
from sprint.core.records import RunDir

log = logging.getLogger(__name__)

T = TypeVar("T")
INPUT_HASH = "input_hash"  # the record key of `row_hash` (of the row the record was made from)

ProcessFn = Callable[[T], Awaitable[dict[str, Any]]]
CrashFn = Callable[[T, BaseException], dict[str, Any]]


@dataclass
class RunStop:
    """Why the current run should start no more items (set by a client whose circuit breaker tripped)."""

    reason: str | None = None

    def trip(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


# The stop signal of the item loop running in this context (`run_items` sets it; the tasks it creates
# inherit it, and an LLM client in them trips it). Not a global: each run, and each asyncio context,
# has its own.
RUN_STOP: contextvars.ContextVar[RunStop | None] = contextvars.ContextVar("sprint_run_stop", default=None)


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


def row_hash(row: Any) -> str:
    """A short hash of what one item was made from (its input row), stored in its record."""
    return hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:16]


def refuse_changed_inputs(items: Sequence[T], run: RunDir, item_id: Callable[[T], str],
                          input_hash: Callable[[T], str]) -> None:
    """A folder's records are kept on a re-run by id; when the input row behind an id has changed
    since (regenerated data, an edited file), its old record would pass for the new row's answer.
    Refuse before any call, naming the folder and the way out. Records without the hash (older
    runs) are taken as they are."""
    changed = []
    for it in items:
        record = run.done.get(item_id(it))
        if record is not None and INPUT_HASH in record and record[INPUT_HASH] != input_hash(it):
            changed.append(item_id(it))
    if changed:
        raise UserError(
            f"{run.path} holds records made from other input rows than the ones now given for {len(changed)} "
            f"id(s) (e.g. {changed[0]}): the data changed since that run. Pass --overwrite to start over, or "
            "use another output folder"
        )


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
    input_hash: Callable[[T], str] | None = None,
) -> tuple[int, int]:
    """Process the items the folder does not hold yet; returns (skipped, processed).

    The one worker pool of the pipeline (curation stages, orchestration, the baseline). A record is
    appended as soon as its item finishes. An unexpected exception in `process` becomes the record
    `on_crash` builds and the run goes on (one warning line; the traceback at debug level); a
    UserError, or an exception in `on_crash` itself, stops the run: the other workers are cancelled.
    When an LLM client's circuit breaker trips (its server stopped answering, `RUN_STOP`), no further
    item starts, the items in flight end (their calls fail at once, as retryable records) and
    `ServerStopped` is raised: a re-run of the same command continues.
    """
    if workers < 1:
        raise UserError(f"the number of workers must be at least 1, got {workers}")
    if input_hash is not None:
        refuse_changed_inputs(items, run, item_id, input_hash)
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
            if input_hash is not None:
                record[INPUT_HASH] = input_hash(item)
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


def resolve_cache_dir(out_dir: Path, cache_dir: str | Path | None, use_cache: bool) -> Path | None:
    """Where a run's response cache lives: `--cache-dir`, else OUT_DIR/llm_cache (so `--overwrite`,
    which clears the folder's outputs, clears it too); None with --no-cache."""
    if not use_cache:
        return None
    return Path(cache_dir).expanduser() if cache_dir else out_dir / "llm_cache"
