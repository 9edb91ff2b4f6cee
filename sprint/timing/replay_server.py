"""Replay server: an OpenAI-compatible endpoint that answers from recorded trajectories.

It lets the orchestrator (or any client) run against *recorded* SPRINT trajectories with the
timing of a real GPU server, so schedules can be compared in seconds rather than tokens:

- which recording answers a request is `sprint.timing.replay`'s business (`resolve`);
- generation follows `sprint.latency.model.LatencyModel`: prefill, then one decode step per token,
  each step priced by the sequences decoding at that moment and their contexts (prompt + tokens so
  far), at most `capacity` sequences at once (the others wait in a queue ordered by vLLM's
  per-request `priority`, then arrival: `slots.PrioritySlots`); the server keeps no prefix cache,
  so a prompt is prefilled whole;
  `time_scale` multiplies every delay so tests and benchmarks can run faster than real time;
- `stop`, `max_tokens`, streaming (SSE, token by token) and `usage` behave as in vLLM
  (`sprint.timing.wire`, shared with the scripted test server);
- a `sprint.timing.faults.FaultPlan` injects 5xx, 429, stalls, resets, dropped streams, empty and
  garbage answers, deterministically by request number.

The HTTP/1.1 server is a small asyncio one of our own (`sprint.timing.http_server`: keep-alive,
chunked SSE): one event loop holds hundreds of concurrent streams on a couple of cores, and no web
framework is needed. Each answered request is kept as a `ServedCall` around its `CallRecord`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sprint.core.calls import CallRecord
from sprint.timing import faults as fault_names
from sprint.timing import wire
from sprint.core.errors import UserError
from sprint.timing.http_server import Dropped, HttpServer, http_json
from sprint.timing.faults import FaultPlan
from sprint.latency.model import DEFAULT_LATENCY, PRESETS, LatencyModel, resolve_latency
from sprint.timing.slots import PrioritySlots
from sprint.core.options import add_options, check_range, config_from, option
from sprint.timing.replay import ReplayLibrary, ReplayRequestError, load_library, prompt_text, resolve
from sprint.timing.wire import Generation, Splitter

log = logging.getLogger(__name__)

DEFAULT_MODEL = "sprint-replay"
DEFAULT_BASELINE_MODEL = "sprint-replay-baseline"
DEFAULT_TOKENIZER = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"  # SPRINT's base model


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 9)


@dataclass
class ReplayConfig:
    """How the replay server listens, names its models, times and breaks its answers.

    The latency model is a preset or a latency file (`--latency-from`, default the H200 one); each
    timing flag given replaces its part, in the units a person types (ms). Python callers may
    pass `latency` / `faults` objects instead.
    """

    host: str = option("127.0.0.1", "address to listen on (loopback: reachable from this machine only)")
    port: int = option(8000, "port to listen on (vLLM's default, so clients need no change); 0 = any free port")
    model: str = option(DEFAULT_MODEL, "served model name: answers with recorded plans and executions")
    baseline_model: str = option(DEFAULT_BASELINE_MODEL, "model name that answers with recorded sequential outputs")
    latency_from: str | None = option(
        None, f"latency model: a preset ({', '.join(PRESETS)}) or a latency file (`sprint gpu-probe`'s, "
        f"`sprint fit-latency`'s latency.json, a step-cost table); default {DEFAULT_LATENCY}", metavar="FILE",
    )
    ttft_base: float | None = option(None, "fixed time before every prefill (default: the latency model's)",
                                     metavar="SECONDS")
    ttft_per_token: float | None = option(None, "prefill ms per prompt token (default: the latency model's)",
                                          metavar="MS")
    ms_per_token: float | None = option(
        None, "decode ms per token of one sequence at no context (default: the latency model's)", metavar="MS")
    batch_slowdown: float | None = option(
        None, "relative slowdown of a step per extra decoding sequence (default: the latency model's)")
    ms_per_context_token: float | None = option(
        None, "decode ms per step per context token of each decoding sequence, its KV read (default: the "
        "latency model's)", metavar="MS")
    capacity: int | None = option(
        None, "max sequences served at once; more wait, lowest `priority` (vLLM's per-request "
        "field) first, then in arrival order (default: unlimited)"
    )
    time_scale: float = option(1.0, "multiply every delay (0.1 = 10x faster than real time; 0 = no waiting)")
    fault_spec: str | None = option(
        None, "fault plan, e.g. 5xx=0.1,truncated=0.05,timeout=0.02,seed=1 (default: none)", flags=("--faults",),
        metavar="SPEC",
    )
    tokenizer: str = option(
        DEFAULT_TOKENIZER, f"tokenizer for usage and streaming (local dir or hub id), or '{wire.WORDS}'"
    )
    # Streams wake at most this often; tokens due sooner go out together (fewer writes, same schedule).
    tick_s: float = option(0.002, "seconds between a stream's wake-ups at the most", cli=False)
    latency: LatencyModel | None = option(None, "the latency model itself; None: built from the timing flags", cli=False)
    # Fault delays (stalls, Retry-After) are not scaled; set to None on a running server to stop faults.
    faults: FaultPlan | None = option(None, "the fault plan itself; None: parsed from --faults", cli=False)

    def __post_init__(self) -> None:
        check_range(ReplayConfig, "time_scale", self.time_scale, 0)
        if self.latency is None:
            try:
                self.latency = with_flags(resolve_latency(self.latency_from), self)
            except ValueError as exc:
                raise UserError(f"bad latency model: {exc}") from None
        if self.faults is None and self.fault_spec:
            self.faults = FaultPlan.from_spec(self.fault_spec)


def with_flags(model: LatencyModel, cfg: ReplayConfig) -> LatencyModel:
    """`model` with the parts the timing flags give replaced, and the flags' capacity."""
    changes: dict[str, Any] = {"capacity": cfg.capacity}
    if cfg.ttft_base is not None:
        changes["prefill_base_s"] = cfg.ttft_base
    if cfg.ttft_per_token is not None:
        changes.update(prefill_per_token_s=cfg.ttft_per_token / 1000, prefill_per_pair_s=0.0, prefill_floor_s=0.0)
    if cfg.ms_per_token is not None or cfg.batch_slowdown is not None:
        s = cfg.ms_per_token / 1000 if cfg.ms_per_token is not None else model.s_per_token
        slowdown = cfg.batch_slowdown if cfg.batch_slowdown is not None else model.step_per_seq_s / max(s, 1e-12)
        changes.update(step_base_s=s * (1 - slowdown), step_per_seq_s=s * slowdown)
    if cfg.ms_per_context_token is not None:
        changes["step_per_context_s"] = cfg.ms_per_context_token / 1000
    return replace(model, **changes)


@dataclass
class ServedCall:
    """One answered completion: its call record (times from time.monotonic(): `start` is its arrival)
    and what only the server knows of it."""

    call: CallRecord
    recording: str  # the recording that answered (file stem or record id)
    stream: bool
    admitted: float  # got a capacity slot
    fault: str | None = None
    priority: int = 0  # vLLM's per-request priority (lower: admitted earlier)

    @property
    def arrival(self) -> float:
        return self.call.start


@dataclass
class ReplayStats:
    requests: int = 0  # completion requests received
    answered: Tally = field(default_factory=Tally)  # by CallRecord.kind: planner | executor | final | baseline
    errors: Tally = field(default_factory=Tally)  # HTTP status of refused requests
    faults: Tally = field(default_factory=Tally)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_running: int = 0  # sequences holding a capacity slot at once
    max_decoding: int = 0
    max_lateness_s: float = 0.0  # worst delay of a response's end behind the model's schedule
    abandoned: int = 0  # generations stopped because the client hung up
    calls: list[ServedCall] = field(default_factory=list)

    def summary(self) -> dict:
        """JSON-ready counters (served at GET /replay/stats)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = {str(k): v for k, v in value.items()} if isinstance(value, dict) else value
        out["calls"] = len(self.calls)
        return out


class ReplayServer(HttpServer):
    """The replay server; run it in a background thread (`with ReplayServer(...)`) or in the
    caller's event loop (`async with ReplayServer(...)`)."""

    thread_name = "replay-server"

    def __init__(self, library: ReplayLibrary, config: ReplayConfig) -> None:
        super().__init__(config.host, config.port)
        self.library = library
        self.config = config
        assert config.latency is not None  # ReplayConfig.__post_init__ builds it from the flags
        self.latency = config.latency
        self.splitter = Splitter(self.config.tokenizer)
        self._lock = threading.Lock()  # guards _stats: the loop writes, any thread reads
        self._stats = ReplayStats()
        self._counter = 0
        self._running = 0
        self._decoding = 0
        self._context = 0  # the decoding sequences' contexts, summed (each step reads their KV caches)
        self._capacity: PrioritySlots | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}/v1"

    def started(self) -> None:
        capacity = self.latency.capacity
        self._capacity = PrioritySlots(capacity) if capacity else None

    def refused(self, status: int) -> None:
        with self._lock:
            self._stats.errors[status] += 1

    async def __aenter__(self) -> ReplayServer:
        await self.astart()
        return self

    def __enter__(self) -> ReplayServer:
        self.start()
        return self

    def stats(self) -> ReplayStats:
        """A consistent copy of the counters and call records so far."""
        with self._lock:
            copy = ReplayStats(**{k: getattr(self._stats, k) for k in ReplayStats.__dataclass_fields__})
            copy.answered, copy.errors, copy.faults = Tally(copy.answered), Tally(copy.errors), Tally(copy.faults)
            copy.calls = list(copy.calls)
            return copy

    # --- routes -------------------------------------------------------------------------

    async def route(
        self, method: str, path: str, body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        endpoint = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}.get(path)
        if method == "GET" and path == "/v1/models":
            names = [self.config.model] + ([self.config.baseline_model] if self.library.baselines else [])
            data = [{"id": n, "object": "model", "created": 0, "owned_by": "sprint-replay"} for n in names]
            await self.send_json(writer, 200, {"object": "list", "data": data})
        elif method == "GET" and path in ("/health", "/replay/stats"):
            await self.send_json(writer, 200, self.stats().summary() if path == "/replay/stats" else {"status": "ok"})
        elif endpoint is None:
            # a probe of a route we do not serve (e.g. a client asking whether this is a vllm-router,
            # GET /list_workers) is answered 404 but is not a refused call: it is not counted in `errors`
            message = f"no route {method} {path}; replay serves /v1/completions, /v1/chat/completions, /v1/models"
            await self.send_json(writer, 404, wire.error_body(404, message))
        elif method != "POST":
            await self.send_error(writer, 405, f"{path} takes POST")
        else:
            try:
                request = json.loads(body or b"{}")
                if not isinstance(request, dict):
                    raise ValueError
            except ValueError:
                await self.send_error(writer, 400, "the request body is not a JSON object")
                return True
            return await self._complete(request, endpoint, reader, writer)
        return True

    # --- completions ----------------------------------------------------------------------

    async def _complete(
        self, request: dict, endpoint: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one completion; False when the connection must be closed."""
        arrival = time.monotonic()
        counter = self._counter
        self._counter += 1
        plan = self.config.faults
        fault = plan.decide(counter) if plan is not None else None
        with self._lock:
            self._stats.requests += 1
            if fault:
                self._stats.faults[fault] += 1
        if fault == fault_names.SERVER_ERROR:
            await self.send_error(writer, 500, "injected server error (replay fault plan)")
            return True
        if fault == fault_names.RATE_LIMIT:
            await self.send_error(
                writer, 429, "injected rate limit (replay fault plan)", {"Retry-After": f"{plan.retry_after:g}"}
            )
            return True
        if fault == fault_names.RESET:
            writer.transport.abort()
            return False
        if fault == fault_names.TIMEOUT:
            await asyncio.sleep(plan.timeout_delay)
            if reader.at_eof():  # the client gave up, as it should
                return False

        model = request.get("model")
        served = {self.config.model, self.config.baseline_model if self.library.baselines else self.config.model}
        try:
            if model not in served:
                raise ReplayRequestError(
                    404, f"The model `{model}` does not exist; this replay server serves {sorted(served)}."
                )
            if request.get("n") not in (None, 1):
                raise ReplayRequestError(400, "replay answers n=1 only (a recording has one continuation)")
            priority = request.get("priority", 0)
            if priority is None:
                priority = 0
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise ReplayRequestError(400, f"priority must be an integer, got {priority!r}")
            too_many = wire.stop_error(request)
            if too_many:
                raise ReplayRequestError(400, too_many)
            text = prompt_text(request, endpoint)
            resolved = resolve(self.library, text, baseline=model == self.config.baseline_model)
        except ReplayRequestError as exc:
            await self.send_error(writer, exc.status, exc.message)
            return True

        continuation = plan.garbage(counter, words=40) if fault == fault_names.GARBAGE else resolved.continuation
        gen, prompt_tokens = await asyncio.to_thread(self._tokenize, continuation, request, endpoint, text)
        if fault == fault_names.EMPTY:
            gen = wire.empty_generation()
        stream = bool(request.get("stream"))
        call = CallRecord(resolved.role, resolved.phase or 0, resolved.prompt, prompt_tokens, gen.tokens,
                          gen.finish_reason, start=arrival, end=arrival)
        record = ServedCall(call, resolved.name, stream, arrival, fault, priority)
        respond = _Responder(writer, wire.Wire.for_request(endpoint, f"replay-{counter}", request, int(time.time())), record)
        drop_after = gen.tokens // 2 if fault == fault_names.TRUNCATED else None
        if stream:
            await respond.open_stream()
        # Each outcome is recorded before its last bytes go out, so a client that has its answer
        # sees it in stats().
        try:
            await self._run(gen, record, respond if stream else None, drop_after, reader)
        except Dropped:
            self._finish(record)
            await respond.drop(gen)
            return False
        usage = wire.usage(prompt_tokens, gen.tokens)
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        if stream and call.first_token is None and gen.tokens:
            call.first_token = time.monotonic()
        self._finish(record)
        if drop_after is not None and not stream:  # half a body, then hang up
            await respond.truncated_body(gen, usage)
            return False
        await respond.finish(gen, usage, include_usage)
        return True

    def _tokenize(self, continuation: str, request: dict, endpoint: str, text: str) -> tuple[Generation, int]:
        return wire.generate(continuation, request, endpoint, self.splitter), self.splitter.count(text)

    def _finish(self, record: ServedCall) -> None:
        call = record.call
        call.end = time.monotonic()
        with self._lock:
            self._stats.answered[call.kind] += 1  # planner | executor | final | baseline
            self._stats.prompt_tokens += call.prompt_tokens
            self._stats.completion_tokens += call.completion_tokens
            self._stats.calls.append(record)

    async def _run(
        self,
        gen: Generation,
        record: ServedCall,
        respond: _Responder | None,
        drop_after: int | None,
        reader: asyncio.StreamReader,
    ) -> None:
        """Wait for a slot, prefill, then decode token by token on the model's schedule.

        A client that hangs up (e.g. its timeout) stops its generation, as vLLM aborts such
        requests, so it no longer slows the others down."""

        def check() -> None:
            if reader.at_eof():  # the request was read whole: EOF here means the client left
                with self._lock:
                    self._stats.abandoned += 1
                raise ConnectionResetError("client went away")

        latency, scale = self.latency, self.config.time_scale
        slots = self._capacity
        slot = slots.slot(record.priority) if slots is not None else contextlib.nullcontext()
        queued = slots is not None and slots.busy()
        async with slot:
            loop = asyncio.get_running_loop()  # loop.time() is time.monotonic()
            record.admitted = time.monotonic()
            self._running += 1
            try:
                with self._lock:
                    self._stats.max_running = max(self._stats.max_running, self._running)
                # Prefill runs from arrival (our own tokenizing overlaps it) or from admission.
                begin = record.admitted if queued else record.arrival
                await asyncio.sleep(max(0.0, begin + latency.prefill(record.call.prompt_tokens) * scale - loop.time()))
                check()
                self._decoding += 1
                context = record.call.prompt_tokens
                self._context += context
                with self._lock:
                    self._stats.max_decoding = max(self._stats.max_decoding, self._decoding)
                try:
                    deadline = loop.time()
                    sent = 0
                    n = gen.tokens
                    for i in range(n):
                        deadline += latency.step(self._decoding, self._context) * scale
                        self._context += 1
                        context += 1
                        if drop_after is not None and respond is not None and i >= drop_after:
                            await respond.send(gen.pieces[sent:i])
                            raise Dropped
                        wait = deadline - loop.time()
                        if wait > self.config.tick_s or (i == n - 1 and wait > 0):
                            if respond is not None and i > sent:
                                await respond.send(gen.pieces[sent:i])
                                sent = i
                            await asyncio.sleep(wait)
                            check()
                    if respond is not None and n > sent:
                        await respond.send(gen.pieces[sent:n])
                    lateness = loop.time() - deadline
                    with self._lock:
                        self._stats.max_lateness_s = max(self._stats.max_lateness_s, lateness)
                finally:
                    self._decoding -= 1
                    self._context -= context
            finally:
                self._running -= 1


class _Responder:
    """Writes one completion: a JSON body, or SSE events in HTTP chunks."""

    def __init__(self, writer: asyncio.StreamWriter, form: wire.Wire, record: ServedCall) -> None:
        self.writer, self.form, self.record = writer, form, record

    async def _events(self, payloads: list[Any]) -> None:
        data = wire.sse(payloads)
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def open_stream(self) -> None:
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        self.writer.write(head.encode())
        await self.writer.drain()
        await self._events(self.form.opening())

    async def send(self, pieces: list[str]) -> None:
        """Stream tokens that are due; a token with no visible text sends nothing."""
        if not pieces:
            return
        if self.record.call.first_token is None:
            self.record.call.first_token = time.monotonic()
        if self.form.stream:
            await self._events([self.form.chunk(p) for p in pieces if p])

    async def finish(self, gen: Generation, usage: dict, include_usage: bool) -> None:
        """The end of the answer; usage goes in every response (on the finishing chunk unless asked apart)."""
        if not self.form.stream:
            self.writer.write(http_json(200, self.form.body(gen, usage)))
            await self.writer.drain()
            return
        await self._events(self.form.closing(gen, usage, separate_usage=include_usage))
        self.writer.write(wire.LAST_HTTP_CHUNK)
        await self.writer.drain()

    async def truncated_body(self, gen: Generation, usage: dict) -> None:
        whole = http_json(200, self.form.body(gen, usage))
        body_at = whole.index(b"\r\n\r\n") + 4
        self.writer.write(whole[: body_at + (len(whole) - body_at) // 2])
        await self.writer.drain()
        self.writer.close()

    async def drop(self, gen: Generation) -> None:
        """A stream cut half way: no finish_reason, no terminating chunk, connection closed."""
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()
        self.writer.close()


@contextlib.contextmanager
def replay_server(
    sources: Sequence[str | Path] | ReplayLibrary,
    latency: LatencyModel | None = None,
    *,
    time_scale: float = 1.0,
    faults: FaultPlan | None = None,
    tokenizer: str = DEFAULT_TOKENIZER,
    model: str = DEFAULT_MODEL,
    baseline_model: str = DEFAULT_BASELINE_MODEL,
    port: int = 0,  # in-process servers (tests, benchmarks) take any free port
) -> Iterator[ReplayServer]:
    """Run a replay server in a background thread: `with replay_server([dir]) as srv: srv.base_url`."""
    library = sources if isinstance(sources, ReplayLibrary) else load_library(sources)
    config = ReplayConfig(port=port, model=model, baseline_model=baseline_model, time_scale=time_scale,
                          tokenizer=tokenizer, latency=latency, faults=faults)
    with ReplayServer(library, config) as server:
        yield server


# ---------------------------------------------------------------------------------------------
# CLI.


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Answer planner / executor requests with recorded plans and executions, timed by a latency model: "
        "a prefill of the prompt, then one decode step per token, each step priced by the sequences decoding "
        "at that moment and their contexts. Default: a 7B model in bf16 on one H200 (the measured step costs "
        "of README 'Modelled seconds'); --latency-from a preset or a latency file, the timing flags to change a part."
    )
    p.add_argument(
        "sources",
        nargs="+",
        metavar="TRAJ_DIR",
        help="folders of trajectory .txt files, run folders, .txt or .jsonl files",
    )
    add_options(p, ReplayConfig)


def handle(args: argparse.Namespace) -> int:
    config = config_from(ReplayConfig, args)
    library = load_library(args.sources)
    for reason in library.skipped[:5]:
        log.warning("skipped %s", reason)
    server = ReplayServer(library, config)

    async def serve() -> None:
        async with server:
            print(
                f"replay server at {server.base_url} (model {config.model}; {library.describe()}); Ctrl-C stops it",
                flush=True,
            )
            await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        stats = server.stats()
        print(f"stopped after {stats.requests} requests ({dict(stats.answered)})")
    return 0
