"""Replay server: an OpenAI-compatible endpoint that answers from recorded trajectories.

It lets the orchestrator (or any client) run against *recorded* SPRINT trajectories with the
timing of a real GPU server, so schedules can be compared in seconds rather than tokens:

- a planner request for phase p gets the recorded plan of phase p (or the recorded final
  answer once the phases run out), an executor request for prompt p.k the recorded
  `<execution_p.k>`, a baseline request (to the baseline model name) the recorded sequential
  output; requests are identified from the prompt itself: the `<Question>` block, then the
  last tag of the format before the point where generation starts;
- generation follows `sprint.latency.LatencyModel`: prefill, then one decode step per token,
  slower with the number of sequences decoding at once, at most `capacity` sequences at once;
  `time_scale` multiplies every delay so tests and benchmarks can run faster than real time;
- `stop`, `max_tokens`, streaming (SSE, token by token) and `usage` behave as in vLLM;
- a `sprint.faults.FaultPlan` injects 5xx, 429, stalls, resets, dropped streams, empty and
  garbage answers, deterministically by request number.

The HTTP/1.1 server is a small asyncio one of our own (keep-alive, chunked SSE): one event loop
holds hundreds of concurrent streams on a couple of cores, and no web framework is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import socket
import threading
import time
from collections import Counter as Tally
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sprint import faults as fault_names
from sprint.errors import UserError
from sprint.faults import FaultPlan
from sprint.latency import LatencyModel
from sprint.trajectory import TAG_RE, Trajectory, TrajectoryError, parse, render_question

log = logging.getLogger(__name__)

DEFAULT_MODEL = "sprint-replay"
DEFAULT_BASELINE_MODEL = "sprint-replay-baseline"
DEFAULT_TOKENIZER = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"  # SPRINT's base model
WORDS = "words"  # tokenizer name of the cheap whitespace splitter
MAX_STOP = 4  # vLLM >= 0.32 rejects more stop strings
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's default on /v1/completions


def question_key(question: str) -> str:
    """Questions are matched with whitespace collapsed: chat templates and stripping vary."""
    return " ".join(question.split())


# ---------------------------------------------------------------------------------------------
# Tokens: counting for usage and timing, pieces for streaming.


class Splitter:
    """Splits text into per-token pieces that join back to the text exactly.

    `pieces(text)` has one entry per token; an entry may be "" when a token holds only part
    of a character (byte-level BPE), so the time of every token is still spent.
    """

    def __init__(self, name: str = WORDS) -> None:
        self.name = name
        self._tokenizer = None
        if name != WORDS:
            # The trajectory model's cached loader: local dir, SPRINT_LOCAL_DATA copy, or hub id.
            from sprint.trajectory import load_tokenizer

            self._tokenizer = load_tokenizer(name)

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self._tokenizer is None:
            return len(re.findall(r"\S+", text)) or 1
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def pieces(self, text: str) -> list[str]:
        if not text:
            return []
        if self._tokenizer is None:
            out = re.findall(r"\s*\S+", text) or [text]
        else:
            enc = self._tokenizer.encode(text, add_special_tokens=False)
            out, pos = [], 0
            for _, end in enc.offsets:
                end = max(end, pos)
                out.append(text[pos:end])
                pos = end
            if not out:
                out = [text]
                pos = len(text)
        consumed = sum(len(p) for p in out)
        if consumed < len(text):  # trailing whitespace (words) or unmapped bytes (BPE)
            out[-1] += text[consumed:]
        return out


# ---------------------------------------------------------------------------------------------
# The recorded trajectories.


@dataclass
class ReplayLibrary:
    """Recorded answers by normalised question: SPRINT trajectories and sequential outputs."""

    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    baselines: dict[str, str] = field(default_factory=dict)  # the output after the question
    names: dict[str, str] = field(default_factory=dict)  # question key -> file / record id
    baseline_names: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # inputs that held nothing usable, with why
    duplicates: int = 0

    def add_text(self, text: str, name: str, question: str | None = None) -> None:
        """Add one recorded text: a trajectory if it has phases or an answer, else a baseline."""
        try:
            traj = parse(text, strict=True)
        except TrajectoryError:
            traj = parse(text, strict=False)
        if not traj.question and question:
            traj.question = question.strip()
            text = render_question(question) + "\n\n" + text
        if not traj.question:
            self.skipped.append(f"{name}: no <Question> block")
            return
        key = question_key(traj.question)
        if traj.phases or traj.final_answer is not None:
            target: dict = self.trajectories
            names, value = self.names, traj
        else:
            output = text.partition("</Question>")[2].strip()
            if not output:
                self.skipped.append(f"{name}: nothing after the question")
                return
            target, names, value = self.baselines, self.baseline_names, output
        if key in target:
            self.duplicates += 1
            return
        target[key] = value
        names[key] = name

    def describe(self) -> str:
        extra = f", {len(self.baselines)} baseline outputs" if self.baselines else ""
        dup = f", {self.duplicates} duplicates ignored" if self.duplicates else ""
        return f"{len(self.trajectories)} trajectories{extra}{dup}"


def _add_records(library: ReplayLibrary, path: Path) -> None:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                library.skipped.append(f"{path}:{n}: not JSON")
                continue
            text = row.get("trajectory") if isinstance(row, dict) else None
            if not isinstance(text, str) or not text.strip():
                continue  # failed items carry no trajectory
            question = row.get("question") or row.get("problem")
            library.add_text(
                text, f"{path.parent.name}/{row.get('id', n)}", question if isinstance(question, str) else None
            )


def load_library(sources: Sequence[str | Path]) -> ReplayLibrary:
    """Read trajectory .txt files, folders of them (any names, searched recursively), run
    folders (`records.jsonl` rows with a `trajectory` field, `trajectories/*.txt`) and jsonl files."""
    library = ReplayLibrary()
    for source in sources:
        path = Path(source)
        if not path.exists():
            raise UserError(
                f"replay source {path} does not exist; pass folders of trajectory .txt files or run folders"
            )
        if path.is_file():
            files = [path]
        else:
            files = sorted(
                p for p in path.rglob("*") if p.is_file() and (p.suffix == ".txt" or p.name.endswith(".jsonl"))
            )
        for file in files:
            if file.name.endswith(".jsonl"):
                _add_records(library, file)
            elif file.suffix == ".txt":
                library.add_text(file.read_text(encoding="utf-8", errors="replace"), file.stem)
            else:
                raise UserError(f"{file} is neither a .txt trajectory nor a .jsonl run file")
    if not library.trajectories and not library.baselines:
        where = ", ".join(str(s) for s in sources)
        raise UserError(
            f"no recorded trajectories found in {where}; expected .txt files holding <Question>…</Question> "
            "and <Plan_1>… blocks, or run folders with records.jsonl rows that have a `trajectory`"
        )
    return library


# ---------------------------------------------------------------------------------------------
# Reading a request: which question, which role, which phase and prompt.


class ReplayRequestError(Exception):
    """The request cannot be answered from the recordings; `status` is the HTTP code to send."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_TAG_NAME_RE = re.compile(r"<(/?)(\w+?)(?:_(\d+)(?:\.(\d+))?)?>")


@dataclass
class RequestView:
    """What a prompt asks for, read with the trajectory model.

    role: "planner" (phase `phase`), "executor" (prompt `prompt` = "p.k") or "final".
    opened: the prompt already ends with the opening tag of what it asks for (`<Plan_p>`,
    `<execution_p.k>`, `<Final_answer>`); otherwise the model is to write it.
    """

    question: str
    role: str
    phase: int | None
    prompt: str | None
    opened: bool
    newline: bool  # the opening tag is followed by its newline already
    separator: str  # what the model writes before its own `<Plan_p>` (the format's blank line)
    past: Trajectory  # the phases written in the prompt


def read_request(text: str) -> RequestView:
    """Classify a planner / executor / final-answer prompt (raw or chat-templated).

    The question comes from the `<Question>` block; the role from the last tag of the format:
    `<Plan_p>` (planner, phase p), `</Execution_n>` / `<think>` / `</Question>` (planner of the
    next phase, writing its own `<Plan_p>`), `<execution_p.k>` (executor), `<Final_answer>`.
    """
    past = parse(text, strict=False)
    if not past.question:
        raise ReplayRequestError(
            400, "the prompt has no <Question>…</Question> block; replay identifies problems by their question"
        )
    *_, last = TAG_RE.finditer(text)  # there is one at least: the question's closing tag
    tail = text[last.end() :]
    m = _TAG_NAME_RE.fullmatch(last.group(0))
    closing, name = bool(m.group(1)), m.group(2)
    p = int(m.group(3)) if m.group(3) else None
    k = m.group(4)
    newline = tail.startswith("\n")
    view = RequestView(past.question, "planner", None, None, False, newline, "", past)
    boundary = (closing and name in ("Question", "Execution")) or (not closing and name == "think")
    if boundary:
        # The model starts a phase and writes `<Plan_p>` itself, after the newlines the format puts
        # there (one after <think>, a blank line after a block) less those the prompt already has.
        # Chat templates may put their own markers after the boundary: then nothing is added.
        view.phase = p + 1 if name == "Execution" else 1
        required = "\n" if name == "think" else "\n\n"
        view.separator = required[len(tail) :] if not tail.strip() and required.startswith(tail) else ""
        return view
    if tail.strip():
        raise ReplayRequestError(
            400,
            f"the prompt ends inside a block ({len(tail.strip())} characters after {last.group(0)}); "
            "replay answers prompts that end at a phase boundary, <Plan_p>, <execution_p.k> or <Final_answer>",
        )
    if not closing and name == "Plan":
        view.phase, view.opened = p, True
    elif not closing and name == "execution" and k is not None:
        view.role, view.phase, view.prompt, view.opened = "executor", p, f"{p}.{k}", True
    elif not closing and name == "Final_answer":
        view.role, view.opened = "final", True
    else:
        raise ReplayRequestError(
            400,
            f"cannot tell what the prompt asks for: it ends with {last.group(0)}; a planner prompt ends after "
            "</Execution_n> or with <Plan_p>, an executor prompt with <execution_p.k>, a forced answer with <Final_answer>",
        )
    return view


@dataclass
class Resolved:
    """A request matched to a recording: the text a model would go on to write from there."""

    role: str  # planner | executor | final | baseline
    name: str  # recording name (file stem or record id)
    phase: int | None
    prompt: str | None
    continuation: str


def _short(question: str) -> str:
    q = question_key(question)
    return q if len(q) <= 80 else q[:77] + "..."


def resolve(library: ReplayLibrary, text: str, baseline: bool = False) -> Resolved:
    """Match a prompt to its recording; ReplayRequestError (404/400) when it cannot be."""
    if baseline:
        question = parse(text, strict=False).question
        if not question:
            raise ReplayRequestError(
                400, "the prompt has no <Question>…</Question> block; replay identifies problems by their question"
            )
        key = question_key(question)
        output = library.baselines.get(key)
        if output is None:
            raise ReplayRequestError(
                404, f"no recorded baseline output for the question {_short(question)!r} ({library.describe()} loaded)"
            )
        if text.rstrip().endswith("<think>") and output.startswith("<think>"):
            output = output[len("<think>") :].lstrip("\n")  # the template already opened it
        return Resolved("baseline", library.baseline_names.get(key, ""), None, None, output)

    view = read_request(text)
    key = question_key(view.question)
    traj = library.trajectories.get(key)
    if traj is None:
        raise ReplayRequestError(
            404,
            f"no recorded trajectory for the question {_short(view.question)!r} ({library.describe()} loaded); "
            "serve the folder that holds its trajectory",
        )
    name = library.names.get(key, "")
    body = traj.render_body()
    phases = {ph.number: ph for ph in traj.phases}

    role, marker = view.role, ""
    if view.role == "executor":
        phase = phases.get(view.phase or 0)
        if phase is None:
            raise ReplayRequestError(
                404,
                f"recording {name!r} has no phase {view.phase} (it has {len(traj.phases)}); cannot execute prompt_{view.prompt}",
            )
        if phase.execution(view.prompt or "") is None:
            known = ", ".join(e.name for e in phase.executions) or "none"
            raise ReplayRequestError(
                404, f"recording {name!r} has no execution_{view.prompt} (phase {view.phase} has: {known})"
            )
        marker = f"<execution_{view.prompt}>"
    elif view.role == "planner" and view.phase in phases:
        marker = f"<Plan_{view.phase}>"
    else:  # a forced answer, or a planner past the recorded phases: the recorded final answer
        if traj.final_answer is None:
            if view.role == "final":
                raise ReplayRequestError(404, f"recording {name!r} has no final answer")
            raise ReplayRequestError(
                404,
                f"recording {name!r} has {len(traj.phases)} phases and no final answer; nothing to plan for phase {view.phase}",
            )
        role, marker = "final", "<Final_answer>"
    at = body.find(marker)
    if at < 0:  # render_body always writes the marker of an existing block
        raise ReplayRequestError(500, f"recording {name!r} renders without {marker}")
    opened_here = view.opened and (view.role != "planner" or marker == f"<Plan_{view.phase}>")
    if opened_here:
        start = at + len(marker)
        if view.newline and body.startswith("\n", start):
            start += 1
        continuation = body[start:]
    else:
        continuation = ("" if view.opened else view.separator) + body[at:]
    return Resolved(role, name, view.phase, view.prompt, continuation)


# ---------------------------------------------------------------------------------------------
# Generation: stop strings and max_tokens as vLLM applies them.


@dataclass
class Generation:
    text: str  # what the response carries
    finish_reason: str
    stop_reason: str | None
    pieces: list[str]  # one per generated token (stop-string tokens included, with "" text)

    @property
    def tokens(self) -> int:
        return len(self.pieces)


def generate(continuation: str, request: dict, endpoint: str, splitter: Splitter) -> Generation:
    """Cut the recorded continuation where the model would stop: first stop string, else EOS,
    or `max_tokens`. Tokens of the matched stop string are generated (and counted) but not shown,
    unless `include_stop_str_in_output`."""
    stops = request.get("stop") or []
    if isinstance(stops, str):
        stops = [stops]
    hits = [(continuation.find(s), s) for s in stops if isinstance(s, str) and s and s in continuation]
    stop_reason = None
    generated = continuation
    visible = len(continuation)
    if hits:
        at, stop_reason = min(hits)
        generated = continuation[: at + len(stop_reason)]
        visible = len(generated) if request.get("include_stop_str_in_output") else at
    pieces = splitter.pieces(generated)
    finish = "stop"
    limit = request.get("max_tokens", request.get("max_completion_tokens"))
    if limit is None and endpoint == "completions":
        limit = COMPLETIONS_DEFAULT_MAX_TOKENS
    if limit is not None and len(pieces) > int(limit):
        pieces = pieces[: int(limit)]
        visible = min(visible, sum(len(p) for p in pieces))
        finish, stop_reason = "length", None
    shown, left = [], visible
    for piece in pieces:
        shown.append(piece[: max(0, left)])
        left -= len(piece)
    return Generation(generated[:visible], finish, stop_reason, shown)


def prompt_text(request: dict, endpoint: str) -> str:
    """The text to identify and count: the prompt, or the chat messages' contents in order."""
    if endpoint == "completions":
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ReplayRequestError(400, "`prompt` must be one string (token ids and batches are not replayed)")
        return prompt
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ReplayRequestError(400, "`messages` must be a non-empty list")
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        parts.append(content if isinstance(content, str) else "")
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------
# The server.


@dataclass
class ReplayConfig:
    latency: LatencyModel = field(default_factory=LatencyModel)
    time_scale: float = 1.0  # multiplies every latency-model delay (0.01 = 100× faster than real time)
    faults: FaultPlan | None = None  # fault delays (stalls, Retry-After) are not scaled
    tokenizer: str = DEFAULT_TOKENIZER  # or "words" for a cheap whitespace splitter
    model: str = DEFAULT_MODEL
    baseline_model: str = DEFAULT_BASELINE_MODEL
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port
    tick_s: float = 0.002  # streams wake at most this often; tokens due sooner go out together

    def __post_init__(self) -> None:
        if self.time_scale < 0:
            raise UserError(f"time scale must be >= 0, got {self.time_scale}")


@dataclass
class CallRecord:
    """One answered completion, times from time.monotonic()."""

    role: str
    name: str
    phase: int | None
    prompt: str | None
    stream: bool
    arrival: float
    admitted: float  # got a capacity slot
    first_token: float | None
    end: float
    prompt_tokens: int
    completion_tokens: int
    fault: str | None = None


@dataclass
class ReplayStats:
    requests: int = 0  # completion requests received
    answered: Tally = field(default_factory=Tally)  # by role
    errors: Tally = field(default_factory=Tally)  # HTTP status of refused requests
    faults: Tally = field(default_factory=Tally)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_running: int = 0  # sequences holding a capacity slot at once
    max_decoding: int = 0
    max_lateness_s: float = 0.0  # worst delay of a response's end behind the model's schedule
    abandoned: int = 0  # generations stopped because the client hung up
    calls: list[CallRecord] = field(default_factory=list)

    def summary(self) -> dict:
        """JSON-ready counters (served at GET /replay/stats)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = {str(k): v for k, v in value.items()} if isinstance(value, dict) else value
        out["calls"] = len(self.calls)
        return out


class _Dropped(Exception):
    """The response was cut on purpose (fault plan): close the connection."""


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


class ReplayServer:
    """The replay server; run it in a background thread (`with ReplayServer(...)`) or in the
    caller's event loop (`async with ReplayServer(...)`)."""

    def __init__(self, library: ReplayLibrary, config: ReplayConfig | None = None) -> None:
        self.library = library
        self.config = config or ReplayConfig()
        self.splitter = Splitter(self.config.tokenizer)
        self._lock = threading.Lock()  # guards _stats: the loop writes, any thread reads
        self._stats = ReplayStats()
        self._counter = 0
        self._running = 0
        self._decoding = 0
        self._server: asyncio.base_events.Server | None = None
        self._capacity: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("replay server not started")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}/v1"

    async def astart(self) -> ReplayServer:
        self._loop = asyncio.get_running_loop()
        capacity = self.config.latency.capacity
        self._capacity = asyncio.Semaphore(capacity) if capacity else None
        try:
            self._server = await asyncio.start_server(
                self._connection, self.config.host, self.config.port, backlog=2048, limit=1 << 20
            )
        except OSError as exc:
            raise UserError(
                f"cannot listen on {self.config.host}:{self.config.port} ({exc.strerror}); pick another --port"
            ) from None
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def aclose(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> ReplayServer:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def start(self) -> ReplayServer:
        """Serve from a background thread with its own event loop."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self.astart())
            except BaseException as exc:  # reported to the starting thread
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.aclose())
                loop.close()

        self._thread = threading.Thread(target=run, name="replay-server", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> ReplayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> ReplayStats:
        """A consistent copy of the counters and call records so far."""
        with self._lock:
            copy = ReplayStats(**{k: getattr(self._stats, k) for k in ReplayStats.__dataclass_fields__})
            copy.answered, copy.errors, copy.faults = Tally(copy.answered), Tally(copy.errors), Tally(copy.faults)
            copy.calls = list(copy.calls)
            return copy

    # --- HTTP plumbing --------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    await self._send_error(writer, 431, "request headers too large")
                    return
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                if len(parts) != 3:
                    await self._send_error(writer, 400, "malformed request line")
                    return
                method, target, _ = parts
                headers = {}
                for line in lines[1:]:
                    key, sep, value = line.partition(":")
                    if sep:
                        headers[key.strip().lower()] = value.strip()
                try:
                    length = int(headers.get("content-length") or 0)
                    body = await reader.readexactly(length) if length else b""
                except ValueError:
                    await self._send_error(writer, 400, "bad Content-Length")
                    return
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                keep = await self._route(method, target.split("?", 1)[0].rstrip("/"), body, reader, writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, _Dropped):
            return
        except asyncio.CancelledError:
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _send_json(
        self, writer: asyncio.StreamWriter, status: int, payload: Any, headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        head = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
            "Content-Type: application/json",
            f"Content-Length: {len(data)}",
        ]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()

    async def _send_error(
        self, writer: asyncio.StreamWriter, status: int, message: str, headers: dict[str, str] | None = None
    ) -> None:
        kind = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError"}.get(status, "ServerError")
        with self._lock:
            self._stats.errors[status] += 1
        await self._send_json(
            writer,
            status,
            {"error": {"object": "error", "message": message, "type": kind, "param": None, "code": status}},
            headers,
        )

    async def _route(
        self, method: str, path: str, body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        endpoint = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}.get(path)
        if method == "GET" and path == "/v1/models":
            names = [self.config.model] + ([self.config.baseline_model] if self.library.baselines else [])
            data = [{"id": n, "object": "model", "created": 0, "owned_by": "sprint-replay"} for n in names]
            await self._send_json(writer, 200, {"object": "list", "data": data})
        elif method == "GET" and path in ("/health", "/replay/stats"):
            await self._send_json(writer, 200, self.stats().summary() if path == "/replay/stats" else {"status": "ok"})
        elif endpoint is None:
            await self._send_error(
                writer,
                404,
                f"no route {method} {path}; replay serves /v1/completions, /v1/chat/completions, /v1/models",
            )
        elif method != "POST":
            await self._send_error(writer, 405, f"{path} takes POST")
        else:
            try:
                request = json.loads(body or b"{}")
                if not isinstance(request, dict):
                    raise ValueError
            except ValueError:
                await self._send_error(writer, 400, "the request body is not a JSON object")
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
            await self._send_error(writer, 500, "injected server error (replay fault plan)")
            return True
        if fault == fault_names.RATE_LIMIT:
            await self._send_error(
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
            stops = request.get("stop")
            if isinstance(stops, list) and len(stops) > MAX_STOP:
                raise ReplayRequestError(400, f"at most {MAX_STOP} stop sequences are supported, got {len(stops)}")
            text = prompt_text(request, endpoint)
            resolved = resolve(self.library, text, baseline=model == self.config.baseline_model)
        except ReplayRequestError as exc:
            await self._send_error(writer, exc.status, exc.message)
            return True

        continuation = plan.garbage(counter, words=40) if fault == fault_names.GARBAGE else resolved.continuation
        gen, prompt_tokens = await asyncio.to_thread(self._tokenize, continuation, request, endpoint, text)
        if fault == fault_names.EMPTY:
            gen = Generation("", "length", None, [])
        stream = bool(request.get("stream"))
        record = CallRecord(
            resolved.role,
            resolved.name,
            resolved.phase,
            resolved.prompt,
            stream,
            arrival,
            arrival,
            None,
            arrival,
            prompt_tokens,
            gen.tokens,
            fault,
        )
        ident = f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-replay-{counter}"
        respond = _Responder(writer, endpoint, ident, request.get("model"), stream, record)
        drop_after = gen.tokens // 2 if fault == fault_names.TRUNCATED else None
        if stream:
            await respond.open_stream()
        # Each outcome is recorded before its last bytes go out, so a client that has its answer
        # sees it in stats().
        try:
            await self._run(gen, record, respond if stream else None, drop_after, reader)
        except _Dropped:
            self._finish(record, resolved.role)
            await respond.drop(gen)
            return False
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": gen.tokens,
            "total_tokens": prompt_tokens + gen.tokens,
        }
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        if stream and record.first_token is None and gen.tokens:
            record.first_token = time.monotonic()
        self._finish(record, resolved.role)
        if drop_after is not None and not stream:  # half a body, then hang up
            await respond.truncated_body(gen, usage)
            return False
        await respond.finish(gen, usage, include_usage)
        return True

    def _tokenize(self, continuation: str, request: dict, endpoint: str, text: str) -> tuple[Generation, int]:
        return generate(continuation, request, endpoint, self.splitter), self.splitter.count(text)

    def _finish(self, record: CallRecord, role: str) -> None:
        record.end = time.monotonic()
        with self._lock:
            self._stats.answered[role] += 1
            self._stats.prompt_tokens += record.prompt_tokens
            self._stats.completion_tokens += record.completion_tokens
            self._stats.calls.append(record)

    async def _run(
        self,
        gen: Generation,
        record: CallRecord,
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

        latency, scale = self.config.latency, self.config.time_scale
        slot = self._capacity if self._capacity is not None else contextlib.nullcontext()
        queued = self._capacity is not None and self._capacity.locked()
        async with slot:
            loop = asyncio.get_running_loop()  # loop.time() is time.monotonic()
            record.admitted = time.monotonic()
            self._running += 1
            try:
                with self._lock:
                    self._stats.max_running = max(self._stats.max_running, self._running)
                # Prefill runs from arrival (our own tokenizing overlaps it) or from admission.
                begin = record.admitted if queued else record.arrival
                await asyncio.sleep(max(0.0, begin + latency.prefill(record.prompt_tokens) * scale - loop.time()))
                check()
                self._decoding += 1
                with self._lock:
                    self._stats.max_decoding = max(self._stats.max_decoding, self._decoding)
                try:
                    deadline = loop.time()
                    sent = 0
                    n = gen.tokens
                    for i in range(n):
                        deadline += latency.step(self._decoding) * scale
                        if drop_after is not None and respond is not None and i >= drop_after:
                            await respond.send(gen.pieces[sent:i])
                            raise _Dropped
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
            finally:
                self._running -= 1


class _Responder:
    """Writes one completion: a JSON body, or SSE events in HTTP chunks."""

    def __init__(
        self, writer: asyncio.StreamWriter, endpoint: str, ident: str, model: Any, stream: bool, record: CallRecord
    ) -> None:
        self.writer, self.endpoint, self.ident, self.model = writer, endpoint, ident, model
        self.stream, self.record = stream, record
        self.created = int(time.time())
        self.object = (
            ("chat.completion.chunk" if stream else "chat.completion") if endpoint == "chat" else "text_completion"
        )

    def _chunk(
        self, piece: str | None, finish: str | None = None, stop_reason: str | None = None, first: bool = False
    ) -> dict:
        if self.endpoint == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if piece is not None:
                delta["content"] = piece
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None}
        choice.update(finish_reason=finish, stop_reason=stop_reason)
        return {
            "id": self.ident,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    async def _events(self, payloads: list[Any]) -> None:
        data = b"".join(b"data: " + (p if isinstance(p, bytes) else json.dumps(p).encode()) + b"\n\n" for p in payloads)
        if data:
            self.writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await self.writer.drain()

    async def open_stream(self) -> None:
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        self.writer.write(head.encode())
        await self.writer.drain()
        if self.endpoint == "chat":
            await self._events([self._chunk("", first=True)])

    async def send(self, pieces: list[str]) -> None:
        """Stream tokens that are due; a token with no visible text sends nothing."""
        if not pieces:
            return
        if self.record.first_token is None:
            self.record.first_token = time.monotonic()
        if self.stream:
            await self._events([self._chunk(p) for p in pieces if p])

    async def finish(self, gen: Generation, usage: dict, include_usage: bool) -> None:
        if self.stream:
            last = self._chunk(None if self.endpoint == "chat" else "", gen.finish_reason, gen.stop_reason)
            events: list[Any] = [last]
            if include_usage:  # the OpenAI way: a last chunk with no choices
                events.append(
                    {
                        "id": self.ident,
                        "object": self.object,
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            else:  # usage in every response: then on the finishing chunk (as vLLM's continuous usage)
                last["usage"] = usage
            events.append(b"[DONE]")
            await self._events(events)
            self.writer.write(b"0\r\n\r\n")
            await self.writer.drain()
            return
        await _json_response(self.writer, self._body(gen, usage))

    def _body(self, gen: Generation, usage: dict) -> dict:
        if self.endpoint == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": gen.text}}
        else:
            choice = {"index": 0, "text": gen.text, "logprobs": None}
        choice.update(finish_reason=gen.finish_reason, stop_reason=gen.stop_reason)
        return {
            "id": self.ident,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }

    async def truncated_body(self, gen: Generation, usage: dict) -> None:
        data = json.dumps(self._body(gen, usage)).encode()
        self.writer.write(
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data[: len(data) // 2]
        )
        await self.writer.drain()
        self.writer.close()

    async def drop(self, gen: Generation) -> None:
        """A stream cut half way: no finish_reason, no terminating chunk, connection closed."""
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()
        self.writer.close()


async def _json_response(writer: asyncio.StreamWriter, payload: dict) -> None:
    data = json.dumps(payload).encode()
    writer.write(
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data
    )
    await writer.drain()


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
    port: int = 0,
) -> Iterator[ReplayServer]:
    """Run a replay server in a background thread: `with replay_server([dir]) as srv: srv.base_url`."""
    library = sources if isinstance(sources, ReplayLibrary) else load_library(sources)
    config = ReplayConfig(latency or LatencyModel(), time_scale, faults, tokenizer, model, baseline_model, port=port)
    server = ReplayServer(library, config)
    with server:
        yield server


# ---------------------------------------------------------------------------------------------
# CLI.


def register(subparsers: argparse._SubParsersAction) -> None:
    d = LatencyModel()
    p = subparsers.add_parser(
        "replay-server",
        help="serve recorded trajectories over an OpenAI-compatible API with GPU-like timing",
        description=(
            "Answer planner / executor requests with recorded plans and executions, timed by a latency model: "
            "prefill = TTFT base + per-prompt-token cost, then one decode step per token, each step "
            "ms-per-token × (1 + batch-slowdown × (sequences decoding − 1)). Defaults: 7B bf16 on one H100 (vLLM)."
        ),
    )
    p.add_argument(
        "sources",
        nargs="+",
        metavar="TRAJ_DIR",
        help="folders of trajectory .txt files, run folders, .txt or .jsonl files",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=DEFAULT_MODEL, help="served model name (default: %(default)s)")
    p.add_argument(
        "--baseline-model",
        default=DEFAULT_BASELINE_MODEL,
        help="model name that answers with recorded sequential outputs",
    )
    p.add_argument(
        "--ttft-base",
        type=float,
        default=d.ttft_base_s,
        metavar="SECONDS",
        help="fixed prefill time (default: %(default)s)",
    )
    p.add_argument(
        "--ttft-per-token",
        type=float,
        default=round(d.ttft_per_prompt_token_s * 1000, 9),
        metavar="MS",
        help="prefill ms per prompt token (default: %(default)s)",
    )
    p.add_argument(
        "--ms-per-token",
        type=float,
        default=round(d.s_per_token * 1000, 9),
        metavar="MS",
        help="decode ms per token for one sequence (default: %(default)s)",
    )
    p.add_argument(
        "--batch-slowdown",
        type=float,
        default=d.batch_slowdown,
        help="relative slowdown per extra decoding sequence (default: %(default)s)",
    )
    p.add_argument(
        "--capacity", type=int, default=None, help="max sequences served at once; more queue (default: unlimited)"
    )
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply every delay (0.1 = 10x faster than real time)"
    )
    p.add_argument(
        "--faults", default="", metavar="SPEC", help="fault plan, e.g. 5xx=0.1,truncated=0.05,timeout=0.02,seed=1"
    )
    p.add_argument(
        "--tokenizer",
        default=DEFAULT_TOKENIZER,
        help=f"tokenizer for usage and streaming (local dir or hub id), or '{WORDS}'",
    )
    p.set_defaults(func=_cmd_replay_server)


def _cmd_replay_server(args: argparse.Namespace) -> int:
    try:
        latency = LatencyModel(
            args.ttft_base, args.ttft_per_token / 1000, args.ms_per_token / 1000, args.batch_slowdown, args.capacity
        )
    except ValueError as exc:
        raise UserError(f"bad latency model: {exc}") from None
    plan = FaultPlan.from_spec(args.faults) if args.faults else None
    library = load_library(args.sources)
    for reason in library.skipped[:5]:
        log.warning("skipped %s", reason)
    config = ReplayConfig(
        latency, args.time_scale, plan, args.tokenizer, args.model, args.baseline_model, args.host, args.port
    )
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
