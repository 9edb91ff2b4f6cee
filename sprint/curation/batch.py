"""Batch mode for the curation stages (1-2): the OpenAI Batch API, or vLLM's offline `run_batch`.

A batch costs half the online price (OpenAI) or needs no server at all (vLLM reads the same JSONL
with `python -m vllm.entrypoints.openai.run_batch -i in.jsonl -o out.jsonl --model M`). The stage's
own code stays the one source of truth for prompts and records; batch mode only changes how the
answers arrive:

1. collect: each pending item runs through the run's per-item body (the one the online path runs,
   with the same options, e.g. --strict) with a client that answers from the response cache and
   notes the first request it cannot answer (the item stops there); those requests become the
   batch, one line per item (`custom_id` = the item id);
2. answers: `--batch` uploads the JSONL (files API), creates the batch, polls it with progress
   and downloads its output and error files (OUT_DIR/batch/state.json names a submitted batch,
   so a re-run resumes polling it instead of paying twice); `--batch-file-only` writes the JSONL
   and stops; `--batch-results FILE` reads an output file (OpenAI's or `run_batch`'s);
3. ingest: every answer goes into the response cache under the exact key the online path uses;
4. records: `sprint.curation.stage` then runs the same body over the items whose answers are all
   cached (`batch_answers` returns them), so their records and the manifest are exactly the online
   ones, and a later re-run (any mode) costs nothing.

An item whose request failed in the batch, or whose stage asks a follow-up question, is collected
again: `--batch` submits up to MAX_ROUNDS batches, then asks what is left online; the file modes
write the next requests file (requests-N.jsonl) and say so.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sprint.core.data import Item
from sprint.core.errors import UserError
from sprint.core.files import atomic_write
from sprint.curation.stage_config import LLMStageConfig
from sprint.llm.client import Completion, LLMClient, Sampling

BATCH_DIR = "batch"  # under the stage's output folder
STATE_FILE = "state.json"  # the submitted batch a re-run resumes
MAX_ROUNDS = 3  # batches per run before the rest goes online (failed requests, follow-up questions)
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
FINAL_STATUSES = ("completed", "failed", "expired", "cancelled")

# One item through the run's per-item body (`sprint.curation.stage.ItemBody`) with the given client.
RunItem = Callable[[Item, Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class BatchMode:
    """How the answers of a batch-mode run arrive (`check_batch_options`)."""

    kind: str  # "submit" | "file" | "results"
    results: Path | None = None


def check_batch_options(cfg: LLMStageConfig) -> BatchMode | None:
    """The batch mode the flags ask for (None: online); contradictions fail before any work."""
    chosen = [flag for flag, on in (("--batch", cfg.batch), ("--batch-file-only", cfg.batch_file_only),
                                    ("--batch-results", cfg.batch_results)) if on]
    if len(chosen) > 1:
        raise UserError(f"{' and '.join(chosen)} exclude each other; pass one (BATCH=1 in the scripts is --batch)")
    if not chosen:
        return None
    if not cfg.use_cache:
        raise UserError("batch mode hands the answers to the stage through the response cache; drop --no-cache")
    if not cfg.batch_poll > 0:
        raise UserError(f"--batch-poll must be a positive number of seconds, got {cfg.batch_poll}")
    if cfg.batch_results:
        path = Path(cfg.batch_results).expanduser()
        if not path.is_file():
            raise UserError(f"--batch-results {cfg.batch_results}: no such file; pass the output JSONL of the batch")
        return BatchMode("results", path)
    return BatchMode("submit" if cfg.batch else "file")


# ------------------------------------------------------------------------------------------ requests


class Deferred(Exception):
    """The item needs an answer that is not cached yet."""


@dataclass
class Request:
    """The one uncached request an item is waiting for: what the online path would send."""

    kind: str  # "chat" | "completions"
    payload: Any  # messages or prompt
    sampling: Sampling


class CollectingClient:
    """Stands in for `LLMClient` in `process`: answers from the cache, else notes the request and stops the item."""

    def __init__(self, client: LLMClient) -> None:
        self.client = client
        self.usage = client.usage
        self.request: Request | None = None

    async def chat(self, messages: list[dict], sampling: Sampling, on_text: Any = None) -> Completion:
        return self._answer("chat", messages, sampling)

    async def complete(self, prompt: str, sampling: Sampling, on_text: Any = None) -> Completion:
        return self._answer("completions", prompt, sampling)

    def _answer(self, kind: str, payload: Any, sampling: Sampling) -> Completion:
        hit = self.client.cached(kind, payload, sampling)
        if hit is not None:
            return hit
        self.request = Request(kind, payload, sampling)
        raise Deferred


async def collect(body: RunItem, items: list[Item], client: LLMClient) -> tuple[dict[str, Request], list[Item]]:
    """(the uncached request of each item that needs one, the items whose answers are all cached).

    `body` is the run's per-item body, so an item asks here exactly what it asks online.
    """
    requests: dict[str, Request] = {}
    ready: list[Item] = []
    for item in items:
        stand_in = CollectingClient(client)
        try:
            await body(item, stand_in)
        except Deferred:
            assert stand_in.request is not None
            requests[item.id] = stand_in.request
            continue
        except Exception:  # noqa: BLE001 - the real run records the crash
            pass
        ready.append(item)
    return requests, ready


def request_line(custom_id: str, model: str, request: Request) -> dict[str, Any]:
    """One line of a Batch API input file (vLLM's `run_batch` reads the same)."""
    body: dict[str, Any] = {"model": model, **request.sampling.body(), **dict(request.sampling.extra)}
    body["messages" if request.kind == "chat" else "prompt"] = request.payload
    return {"custom_id": custom_id, "method": "POST", "url": ENDPOINTS[request.kind], "body": body}


def requests_text(model: str, requests: dict[str, Request]) -> str:
    """A Batch API input file: one line per request, `custom_id` = the item id."""
    return "".join(json.dumps(request_line(i, model, r), ensure_ascii=False) + "\n" for i, r in requests.items())


def write_requests(folder: Path, text: str) -> Path:
    """OUT_DIR/batch/requests-N.jsonl (the next free N: earlier rounds' files are kept for the record)."""
    folder.mkdir(parents=True, exist_ok=True)
    n = 1
    while (folder / f"requests-{n}.jsonl").exists():
        n += 1
    path = folder / f"requests-{n}.jsonl"
    atomic_write(path, text)
    return path


# ------------------------------------------------------------------------------------------ results


@dataclass
class Results:
    """A batch output, by custom id: a response body, or why there is none."""

    bodies: dict[str, dict] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def parse_results(text: str, source: str) -> Results:
    """Output (and error) lines of OpenAI's Batch API or vLLM's `run_batch`: `custom_id`, `response`
    {`status_code`, `body`}, `error`."""
    out = Results()
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
            custom_id = str(line["custom_id"])
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{source}: line {lineno} is not a batch output line (JSON with a custom_id); "
                            "pass the output file of the batch") from None
        response = line.get("response") or {}
        status = response.get("status_code")
        body = response.get("body")
        if line.get("error") or status != 200 or not isinstance(body, dict):
            error = line.get("error") or (body.get("error") if isinstance(body, dict) else None)
            message = error.get("message") if isinstance(error, dict) else error
            out.errors[custom_id] = str(message or f"HTTP {status}")[:300]
            continue
        out.bodies[custom_id] = body
    return out


def completion_of(kind: str, body: dict) -> Completion | None:
    """A cacheable completion from a response body; None when it holds no answer."""
    choices = body.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    text = (choice.get("message") or {}).get("content") if kind == "chat" else choice.get("text")
    usage = body.get("usage") or {}
    stop_reason = choice.get("stop_reason")
    return Completion(text=text or "", finish_reason=choice.get("finish_reason"),
                      stop_reason=stop_reason if isinstance(stop_reason, str) else None,
                      prompt_tokens=int(usage.get("prompt_tokens") or 0),
                      completion_tokens=int(usage.get("completion_tokens") or 0),
                      cached=False, start=0.0, end=0.0, attempts=1)


def ingest(client: LLMClient, requests: dict[str, Request], results: Results) -> tuple[int, dict[str, str]]:
    """Cache every answer of `results` for the request it answers; (answered, {id: why not})."""
    answered, failed = 0, {}
    for item_id, request in requests.items():
        body = results.bodies.get(item_id)
        done = completion_of(request.kind, body) if body is not None else None
        if done is None:
            failed[item_id] = results.errors.get(item_id, "no answer in the batch output")
            continue
        client.store(request.kind, request.payload, request.sampling, done)
        client.usage.prompt_tokens += done.prompt_tokens
        client.usage.completion_tokens += done.completion_tokens
        answered += 1
    return answered, failed


# ------------------------------------------------------------------------------------------ the API


async def submit_and_wait(client: LLMClient, folder: Path, text: str, poll: float) -> Results:
    """Upload the requests, create the batch (or resume the one state.json names), poll, download."""
    api = client.api()
    state_path = folder / STATE_FILE
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    state = _read_state(state_path)
    if state is not None and state.get("requests_hash") == digest:
        print(f"batch: resuming batch {state['batch_id']} submitted earlier", file=sys.stderr)
    else:
        path = write_requests(folder, text)
        uploaded = await api.files.create(file=(path.name, text.encode()), purpose="batch")
        endpoint = json.loads(text.splitlines()[0])["url"]
        batch = await api.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")
        state = {"batch_id": batch.id, "input_file_id": uploaded.id, "requests_file": path.name, "requests_hash": digest}
        atomic_write(state_path, json.dumps(state, indent=2) + "\n")
        print(f"batch: submitted {len(text.splitlines())} requests as batch {batch.id} ({path})", file=sys.stderr)
    last = ""
    while True:
        batch = await api.batches.retrieve(state["batch_id"])
        counts = batch.request_counts
        line = (f"batch {batch.id}: {batch.status}" + (f", {counts.completed}/{counts.total} done, {counts.failed} failed"
                                                        if counts is not None else ""))
        if line != last:
            print(line, file=sys.stderr)
            last = line
        if batch.status in FINAL_STATUSES:
            break
        await asyncio.sleep(poll)
    results = Results()
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            content = await api.files.content(file_id)
            part = parse_results(content.text, f"batch {batch.id} file {file_id}")
            results.bodies.update(part.bodies)
            results.errors.update(part.errors)
    if batch.status == "failed" and not results.bodies:
        errors = getattr(getattr(batch, "errors", None), "data", None) or []
        why = "; ".join(str(getattr(e, "message", e)) for e in errors[:3]) or "no reason given"
        state_path.unlink(missing_ok=True)
        raise UserError(f"batch {batch.id} failed: {why}; fix the cause and re-run (the requests are in {folder})")
    state_path.unlink(missing_ok=True)  # its answers are cached now: a re-run must not resume it
    return results


def _read_state(path: Path) -> dict | None:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and state.get("batch_id") else None


# ------------------------------------------------------------------------------------------ the answers


async def batch_answers(body: RunItem, cfg: LLMStageConfig, folder: Path, client: LLMClient, pending: list[Item],
                        mode: BatchMode) -> tuple[list[Item], list[str]]:
    """Bring the answers the pending items need into the response cache by the mode's route.

    Returns (the items to run now: those whose answers are all cached, plus, after MAX_ROUNDS
    batches, those left to ask online; lines for the summary). The caller runs them through the
    same `body` as an online run, so batch mode writes the online records and manifest.
    """
    model = client.config.model
    notes: list[str] = []
    requests, ready = await collect(body, pending, client)
    online: list[Item] = []
    failed: dict[str, str] = {}
    if mode.kind == "results":
        assert mode.results is not None
        results = parse_results(mode.results.read_text(encoding="utf-8"), str(mode.results))
        answered, failed = ingest(client, requests, results)
        notes.append(f"batch: ingested {answered} answers from {mode.results}"
                     + (f"; {len(failed)} requests without one" if failed else ""))
        requests, ready = await collect(body, pending, client)
    elif mode.kind == "submit":
        if requests and cfg.check_server:
            await client.check()
        rounds = 0
        while requests and rounds < MAX_ROUNDS:
            rounds += 1
            results = await submit_and_wait(client, folder, requests_text(model, requests), cfg.batch_poll)
            answered, failed = ingest(client, requests, results)
            notes.append(f"batch round {rounds}: {answered} answered, {len(failed)} failed")
            requests, ready = await collect(body, pending, client)
        online = [it for it in pending if it.id in requests]  # still unanswered: ask them online
        if online:
            notes.append(f"batch: {len(online)} items asked online after {rounds} batches")
    if mode.kind in ("file", "results") and requests:
        path = write_requests(folder, requests_text(model, requests))
        notes.append(f"batch: {len(requests)} requests written to {path}; run them (e.g. `python -m "
                     f"vllm.entrypoints.openai.run_batch -i {path} -o OUT.jsonl --model MODEL`), then re-run "
                     "with --batch-results OUT.jsonl")
    for item_id, why in list(failed.items())[:3]:
        notes.append(f"  {item_id}: {why}")
    return ready + online, notes
