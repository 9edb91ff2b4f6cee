"""A scripted OpenAI-compatible HTTP server for tests.

It speaks real HTTP on 127.0.0.1 so the real `openai` client (timeouts, streaming, errors) is
exercised end to end, while the answers come from a Python handler the test writes:

    def test_x(scripted_server: ScriptedServer) -> None:   # the conftest.py fixture
        srv = scripted_server(lambda request, endpoint: "4")  # stopped when the test ends
        ... LLMConfig(base_url=srv.base_url, model="test-model") ...
        assert srv.requests[0][1]["prompt"] == "2+2="

(`with FakeServer(handler) as srv:` is for a server a test stops or restarts itself.)

It behaves like vLLM where tests care, through `sprint.timing.wire` (shared with the replay server):
`max_tokens` (default 16 on /v1/completions) and `stop` (at most 4 strings, HTTP 400 otherwise)
are applied to the scripted text by `wire.generate`, `stop_reason` names the stop string that
matched, and tokens are whitespace-separated words; completion tokens include those of a matched
stop string, as in vLLM (see `wire.generate`). Faults come either
from the handler (`Reply(status=500)`, `Reply(reset=True)`, ...) or from a seeded `FaultPlan`
applied before the handler.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from sprint.llm.serve import free_port
from sprint.timing import faults, wire
from sprint.timing.faults import FaultPlan
from sprint.timing.wire import Generation, Splitter

DEFAULT_MODEL = "test-model"


@dataclass
class Reply:
    """What the server does with one request; a plain string from a handler means Reply(text=...)."""

    text: str = ""
    status: int = 200  # non-200: a JSON error body with `error` as its message
    error: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering
    drop_stream_after: int | None = None  # streaming: close after this many chars, no finish_reason
    empty: bool = False  # empty text, finish_reason "length", 0 completion tokens
    reset: bool = False  # close the connection without answering
    truncate_body: bool = False  # non-streaming: send half the body, then close
    finish_reason: str | None = None  # override the computed one
    prompt_tokens: int | None = None  # override the word counts
    completion_tokens: int | None = None
    usage: bool = True  # include `usage` (streaming: only if the client asked for it)
    body: Any = None  # send this JSON (or str) verbatim instead of a completion


Handler = Callable[[dict, str], "str | Reply"]


def scripted(*replies: str | Reply, then: str | Reply | None = None) -> Handler:
    """A handler answering with `replies` in order, then `then` (default: the last reply) forever."""
    queue = list(replies)
    lock = threading.Lock()
    fallback = then if then is not None else (replies[-1] if replies else "")

    def handler(request: dict, endpoint: str) -> str | Reply:
        with lock:
            return queue.pop(0) if queue else fallback

    return handler


WORD_TOKENS = Splitter()  # scripted answers are counted in whitespace-separated words


def count_words(text: str) -> int:
    return len(text.split())


def prompt_words(request: dict, endpoint: str) -> int:
    if endpoint == "chat":
        total = 0
        for message in request.get("messages") or []:
            content = message.get("content")
            if isinstance(content, str):
                total += count_words(content)
            elif isinstance(content, list):
                total += sum(count_words(str(part.get("text", ""))) for part in content)
        return total
    prompt = request.get("prompt")
    return count_words(prompt) if isinstance(prompt, str) else 0


class TokenBudget:
    """A tokens-per-minute limit as OpenAI-style APIs enforce one: a bucket refilled at `tpm / 60`
    tokens per second that holds at most `window_s` seconds' worth. A request is charged its prompt
    plus `max_tokens` on arrival (HTTP 429 with Retry-After when the bucket lacks them) and refunded
    what it did not generate. `served` counts the tokens of answered requests (prompt + completion)."""

    def __init__(self, tpm: int, window_s: float = 1.0) -> None:
        self.rate = tpm / 60.0
        self.capacity = self.rate * window_s
        self.level = self.capacity
        self.last = time.monotonic()
        self.served = 0
        self.refused = 0
        self.first: float | None = None  # monotonic time of the first admission / the last answer
        self.end: float | None = None
        self._lock = threading.Lock()

    def admit(self, cost: float) -> float | None:
        """None: admitted and charged; else the seconds until the bucket holds the cost."""
        with self._lock:
            now = time.monotonic()
            self.level = min(self.capacity, self.level + (now - self.last) * self.rate)
            self.last = now
            need = min(cost, self.capacity)  # a request larger than the window waits for a full bucket
            if self.level < need:
                self.refused += 1
                return (need - self.level) / self.rate
            self.level -= cost
            self.first = now if self.first is None else self.first
            return None

    def settle(self, cost: float, used: int) -> None:
        with self._lock:
            self.level = min(self.capacity, self.level + cost - used)
            self.served += used
            self.end = time.monotonic()

    def used_fraction(self) -> float:
        """Served tokens over the most the limit allowed between the first admission and the last answer."""
        if self.first is None or self.end is None:
            return 0.0
        return self.served / (self.capacity + self.rate * (self.end - self.first))


class BatchStore:
    """The server side of the Batch API: uploaded files, and batches worked off in a thread.

    Each request line goes to the handler like an online request; a handler's `Reply(status=...)`
    lands in the error file, as OpenAI's batches report a failed request. `line_delay` seconds per
    line let a test see `in_progress`; `created` counts batches (a resumed run must create none)."""

    def __init__(self, line_delay: float = 0.0) -> None:
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict] = {}
        self.line_delay = line_delay
        self.created = 0
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def add_file(self, content: bytes, name: str) -> dict:
        with self._lock:
            file_id = f"file-{next(self._ids)}"
            self.files[file_id] = content
        return {"id": file_id, "object": "file", "bytes": len(content), "created_at": int(time.time()),
                "filename": name, "purpose": "batch"}

    def create(self, input_file_id: str, endpoint: str, owner: FakeServer) -> dict:
        lines = [json.loads(x) for x in self.files[input_file_id].decode().splitlines() if x.strip()]
        with self._lock:
            batch_id = f"batch_{next(self._ids)}"
            self.created += 1
            self.batches[batch_id] = {
                "id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None,
                "input_file_id": input_file_id, "completion_window": "24h", "status": "validating",
                "output_file_id": None, "error_file_id": None, "created_at": int(time.time()),
                "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
            }
        threading.Thread(target=self._work, args=(batch_id, lines, owner), daemon=True).start()
        return self.view(batch_id)

    def view(self, batch_id: str) -> dict:
        with self._lock:
            return json.loads(json.dumps(self.batches[batch_id]))

    def _work(self, batch_id: str, lines: list[dict], owner: FakeServer) -> None:
        batch = self.batches[batch_id]
        with self._lock:
            batch["status"] = "in_progress"
        out, err = [], []
        for n, line in enumerate(lines):
            if owner._sleep(self.line_delay):
                return
            body, endpoint = line["body"], "chat" if line["url"].endswith("chat/completions") else "completions"
            owner._record(endpoint, body, {})
            reply = owner.handler(body, endpoint)
            reply = Reply(text=reply) if isinstance(reply, str) else reply
            entry: dict[str, Any] = {"id": f"batch_req_{n}", "custom_id": line["custom_id"], "error": None}
            if reply.status != 200:
                entry["response"] = {"status_code": reply.status, "body": wire.error_body(reply.status, reply.error or "failed")}
                err.append(entry)
            else:
                gen = wire.generate(reply.text, body, endpoint, WORD_TOKENS)
                usage = wire.usage(prompt_words(body, endpoint), gen.tokens)
                form = wire.Wire.for_request(endpoint, f"b{n}", body, int(time.time()))
                entry["response"] = {"status_code": 200, "request_id": f"req_{n}", "body": form.body(gen, usage)}
                out.append(entry)
            with self._lock:
                batch["request_counts"]["completed" if reply.status == 200 else "failed"] += 1
        with self._lock:
            for key, entries in (("output_file_id", out), ("error_file_id", err)):
                if entries:
                    file_id = f"file-{next(self._ids)}"
                    self.files[file_id] = "".join(json.dumps(e) + "\n" for e in entries).encode()
                    batch[key] = file_id
            batch["status"] = "completed"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, owner: FakeServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", owner.bind_port), _RequestHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that time out and hang up are expected, not failures


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # idle keep-alive connections give up eventually
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without this Nagle adds ~40 ms a request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.owner._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        self.server.owner._track(self.connection, False)

    # --- plumbing -------------------------------------------------------------------------

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._send_json(status, wire.error_body(status, message), headers)

    def _hang_up(self) -> None:
        """Close the connection without (the rest of) a response."""
        self.close_connection = True
        try:
            self.wfile.flush()
        except OSError:
            pass
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _header_dict(self) -> dict[str, str]:
        return {key.lower(): value for key, value in self.headers.items()}

    def _authorised(self) -> bool:
        key = self.server.owner.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send_error(401, "Incorrect API key provided.")
        return False

    # --- endpoints ------------------------------------------------------------------------

    def do_GET(self) -> None:
        owner = self.server.owner
        if self.path.startswith(("/v1/files/", "/v1/batches/")):
            owner.batch_calls.append(("GET", self.path))
            if self._authorised():
                self._batch_get(self.path.rstrip("/"))
            return
        if self.path.rstrip("/") != "/v1/models":
            self._send_error(404, f"no route {self.path}")
            return
        owner._record("models", {}, self._header_dict())
        if not self._authorised():
            return
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in owner.models]
        self._send_json(200, {"object": "list", "data": data})

    def do_POST(self) -> None:
        owner = self.server.owner
        route = self.path.rstrip("/")
        endpoint = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}.get(route)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if route in ("/v1/files", "/v1/batches"):
            owner.batch_calls.append(("POST", route))
            if self._authorised():
                self._batch_post(route, raw)
            return
        if endpoint is None:
            self._send_error(404, f"no route {self.path}")
            return
        try:
            request = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send_error(400, "body is not JSON")
            return
        counter = owner._record(endpoint, request, self._header_dict())
        owner._enter()
        self._working = True
        try:
            if self._authorised():
                self._answer(request, endpoint, counter)
        except OSError:
            self.close_connection = True  # the client went away
        finally:
            self._stop_working()

    def _stop_working(self) -> None:
        """Leave the in-flight count before the answer is written, so a client that sends its
        next request as soon as it has read this answer is never counted twice."""
        if getattr(self, "_working", False):
            self._working = False
            self.server.owner._leave()

    # --- files and batches (the OpenAI Batch API, small: upload, create, poll, download) ------

    def _batch_post(self, route: str, raw: bytes) -> None:
        owner = self.server.owner
        if route == "/v1/files":  # multipart/form-data: `purpose` and `file`
            message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                b"Content-Type: " + self.headers.get("Content-Type", "").encode() + b"\r\n\r\n" + raw)
            parts = {p.get_param("name", header="content-disposition"): p for p in message.iter_parts()}
            if "file" not in parts:
                self._send_error(400, "no file in the upload")
                return
            content = parts["file"].get_payload(decode=True) or b""
            name = parts["file"].get_filename() or "upload.jsonl"
            self._send_json(200, owner.batches.add_file(content, name))
            return
        try:
            body = json.loads(raw or b"{}")
            batch = owner.batches.create(body["input_file_id"], body["endpoint"], owner)
        except (ValueError, KeyError) as exc:
            self._send_error(400, f"bad batch request: {exc}")
            return
        self._send_json(200, batch)

    def _batch_get(self, path: str) -> None:
        owner = self.server.owner
        parts = path.split("/")  # '', 'v1', 'files'|'batches', id[, 'content']
        if parts[2] == "files" and len(parts) == 5 and parts[4] == "content":
            content = owner.batches.files.get(parts[3])
            if content is None:
                self._send_error(404, f"no file {parts[3]}")
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)
            return
        if parts[2] == "batches" and len(parts) == 4 and parts[3] in owner.batches.batches:
            self._send_json(200, owner.batches.view(parts[3]))
            return
        self._send_error(404, f"no route {path}")

    def _answer(self, request: dict, endpoint: str, counter: int) -> None:
        owner = self.server.owner
        fault = owner.faults.decide(counter) if owner.faults else None
        owner._note_fault(fault)
        plan = owner.faults
        if fault == faults.SERVER_ERROR:
            self._send_error(500, "injected server error")
            return
        if fault == faults.RATE_LIMIT:
            self._send_error(429, "injected rate limit", {"Retry-After": f"{plan.retry_after:g}"})
            return
        if fault == faults.RESET:
            self._hang_up()
            return
        if fault == faults.TIMEOUT and owner._sleep(plan.timeout_delay):
            return

        too_many = wire.stop_error(request)
        if too_many:
            self._send_error(400, too_many)
            return
        if request.get("model") not in owner.models:
            self._send_error(404, f"The model `{request.get('model')}` does not exist.")
            return

        cost = 0.0
        if owner.budget is not None:
            max_tokens = request.get("max_tokens") or request.get("max_completion_tokens") or 16
            cost = prompt_words(request, endpoint) + int(max_tokens)
            wait = owner.budget.admit(cost)
            if wait is not None:
                self._send_error(429, "Rate limit reached for tokens per min (TPM).",
                                 {"Retry-After": f"{max(1, round(wait))}", "retry-after-ms": f"{int(wait * 1000) + 1}"})
                return

        try:
            reply = owner.handler(request, endpoint)
        except Exception as exc:  # surfaced to the test through srv.errors
            owner.errors.append(exc)
            self._send_error(500, f"handler raised {type(exc).__name__}")
            return
        if isinstance(reply, str):
            reply = Reply(text=reply)
        if fault == faults.EMPTY:
            reply = Reply(empty=True)
        elif fault == faults.GARBAGE:
            reply = Reply(text=plan.garbage(counter))
        elif fault == faults.TRUNCATED:
            if request.get("stream"):
                reply.drop_stream_after = len(reply.text) // 2
            else:
                reply.truncate_body = True

        if owner.budget is not None and (reply.status != 200 or reply.reset or reply.body is not None):
            owner.budget.settle(cost, 0)  # no completion: nothing used
        if reply.delay and owner._sleep(reply.delay):
            return
        self._stop_working()
        if reply.reset:
            self._hang_up()
            return
        if reply.status != 200:
            self._send_error(reply.status, reply.error or f"scripted HTTP {reply.status}", reply.headers)
            return
        if reply.body is not None:
            data = reply.body.encode() if isinstance(reply.body, str) else json.dumps(reply.body).encode()
            self._send_json(200, data, reply.headers)
            return

        gen = wire.empty_generation() if reply.empty else wire.generate(reply.text, request, endpoint, WORD_TOKENS)
        if reply.finish_reason is not None:
            gen.finish_reason = reply.finish_reason
        completion_tokens = reply.completion_tokens if reply.completion_tokens is not None else gen.tokens
        prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else prompt_words(request, endpoint)
        usage = wire.usage(prompt_tokens, completion_tokens)
        if owner.budget is not None:
            owner.budget.settle(cost, prompt_tokens + completion_tokens)
        form = wire.Wire.for_request(endpoint, str(counter), request, int(time.time()))
        if form.stream:
            include_usage = bool((request.get("stream_options") or {}).get("include_usage")) and reply.usage
            self._stream(form, gen, usage if include_usage else None, reply)
            return

        data = json.dumps(form.body(gen, usage if reply.usage else None)).encode()
        if not reply.truncate_body:
            self._send_json(200, data, reply.headers)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self._hang_up()

    def _stream(self, form: wire.Wire, gen: Generation, usage: dict | None, reply: Reply) -> None:
        owner = self.server.owner
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for key, value in reply.headers.items():
            self.send_header(key, value)
        self.end_headers()

        def events(payloads: list) -> None:
            self.wfile.write(wire.sse(payloads))
            self.wfile.flush()

        events(form.opening())
        sent = 0
        for piece in gen.pieces:
            if not piece:  # a token with no visible text (a stop string's) sends nothing
                continue
            if reply.drop_stream_after is not None and sent >= reply.drop_stream_after:
                break
            events([form.chunk(piece)])
            sent += len(piece)
            if owner.chunk_delay and owner._sleep(owner.chunk_delay):
                return
        if reply.drop_stream_after is not None:
            self._hang_up()
            return
        for event in form.closing(gen, usage, separate_usage=True):
            events([event])
        self.wfile.write(wire.LAST_HTTP_CHUNK)
        self.wfile.flush()


class FakeServer:
    """Context manager running the scripted server on a free port in a background thread."""

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        models: Iterable[str] = (DEFAULT_MODEL,),
        faults: FaultPlan | None = None,
        api_key: str | None = None,
        chunk_delay: float = 0.0,
        tpm: int | None = None,
        tpm_window_s: float = 1.0,
        port: int = 0,
    ) -> None:
        self.bind_port = port  # 0: any free port; a fixed one brings a stopped server back at its old URL
        self.handler: Handler = handler or (lambda request, endpoint: "hello from the fake server")
        self.models = list(models)
        self.faults = faults
        self.api_key = api_key  # when set, requests must carry `Authorization: Bearer <key>`
        self.chunk_delay = chunk_delay  # seconds between streamed chunks
        self.budget = TokenBudget(tpm, tpm_window_s) if tpm else None  # a TPM limit answered with 429s
        self.batches = BatchStore()  # /v1/files and /v1/batches
        self.batch_calls: list[tuple[str, str]] = []  # (method, path) of the files/batches calls
        self.requests: list[tuple[str, dict]] = []  # (endpoint, body) in arrival order
        self.headers: list[dict[str, str]] = []  # the matching request headers, names lower-cased
        self.arrivals: list[float] = []  # time.time() at each arrival
        self.faults_seen: list[str | None] = []  # FaultPlan decision per completion request
        self.errors: list[Exception] = []  # exceptions raised by the handler
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def completion_requests(self) -> list[tuple[str, dict]]:
        return [r for r in self.requests if r[0] != "models"]

    def start(self) -> FakeServer:
        self._stopping.clear()
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, wake sleeping handlers and close open connections."""
        if self._server is None:
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            open_connections = list(self._connections)
        for conn in open_connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- used by the request handler ------------------------------------------------------

    def _record(self, endpoint: str, body: dict, headers: dict[str, str]) -> int:
        """Store a request; returns its index among completion requests (the fault counter)."""
        with self._lock:
            self.requests.append((endpoint, body))
            self.headers.append(headers)
            self.arrivals.append(time.time())
            return next(self._counter) if endpoint != "models" else -1

    def _note_fault(self, fault: str | None) -> None:
        with self._lock:
            self.faults_seen.append(fault)

    def _enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _sleep(self, seconds: float) -> bool:
        """Wait; True when the server is stopping (the handler should give up)."""
        return self._stopping.wait(seconds)

    def _track(self, conn: socket.socket, opened: bool) -> None:
        with self._lock:
            if opened:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)


class ScriptedServer(Protocol):
    """The `scripted_server` fixture (conftest.py): starts a FakeServer stopped when the test ends."""

    def __call__(self, handler: Handler | None = None, **options: Any) -> FakeServer: ...


def dead_url() -> str:
    """A base URL where nothing listens (a port that was free a moment ago)."""
    return f"http://127.0.0.1:{free_port()}/v1"  # below the ephemeral range: no bind(0) takes it meanwhile
