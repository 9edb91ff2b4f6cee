"""The deterministic teacher: a stand-in for GPT-4o that answers stages 1-2 over the OpenAI protocol.

The mini experiment generates its traces, so it knows each trace's components and DAG. Curation must
still run for real (`sprint components`, `sprint dag`: the prompts, the HTTP calls, the parsers, the
validation), so a server plays the teacher: it recognises which stage a request is for (stage 1's
numbered `<Line N>` lines, stage 2's `<Component_N>` blocks) and which trace (the question, which
both prompts carry in `<Question>` tags), and answers as GPT-4o writes: stage 1 a JSON list in a
```json fence, stage 2 a parent dictionary in a ```python fence. It says what it is in its model
name, /v1/models and its startup line, so every stage manifest records a stand-in, never GPT-4o.

ANSWERS.jsonl, one row per trace: {"id", "question", "components": [{"description", "plan": "a-b",
"prompt", "execution": "a-b" | "not found", "comment": ...}, ...], "dag": {"1": [], "2": [1], ...}}.
The HTTP side is `sprint.timing.http_server`'s, the wire format `sprint.timing.wire`'s (max_tokens
and stop applied as vLLM does when a tokenizer counts the tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.core.data import iter_jsonl
from sprint.core.errors import UserError
from sprint.core.options import add_options, config_from, option
from sprint.curation.component_answer import AnswerError, parse_components
from sprint.curation.dag import DagError, parse_dag_answer, render_components, validate_dag
from sprint.curation.trace_lines import number_lines
from sprint.format import tags
from sprint.timing import wire
from sprint.timing.http_server import HttpServer, http_json
from sprint.timing.replay import ReplayRequestError, prompt_text
from sprint.timing.wire import Generation, Splitter

DEFAULT_MODEL = "standin-for-gpt-4o"
STAND_IN = "deterministic stand-in for GPT-4o"
OWNER = "sprint-teacher"
QUESTION_OPEN, QUESTION_CLOSE = tags.QUESTION + "\n", "\n" + tags.QUESTION_END  # as both stage prompts write it
COMPONENTS, DAG = "components", "dag"
# What follows the question block in each stage's prompt: the first numbered line, the first component block,
# as the stages render them.
STAGE_MARKERS = ((COMPONENTS, number_lines(["x"]).split(" x ")[0]),
                 (DAG, render_components([{"number": 1}]).split("\n")[0]))


@dataclass(frozen=True)
class TeacherAnswer:
    """The two answers the teacher gives about one trace, written as GPT-4o writes them."""

    id: str
    question: str
    components: tuple[dict[str, Any], ...]
    dag: dict[int, list[int]]

    def text(self, stage: str) -> str:
        if stage == COMPONENTS:
            return "```json\n" + json.dumps(list(self.components), indent=2, ensure_ascii=False) + "\n```"
        body = ", ".join(f"{node}: {parents}" for node, parents in sorted(self.dag.items()))
        return "```python\n{" + body + "}\n```"


def _dag_of(row: dict[str, Any], where: str, n: int) -> dict[int, list[int]]:
    raw = row.get("dag")
    if raw is None and n == 1:
        return {1: []}
    if not isinstance(raw, dict):
        raise UserError(f"{where}: `dag` must be a parent dict like {{\"1\": [], \"2\": [1]}}")
    try:
        dag = {int(k): sorted({int(p) for p in v}) for k, v in raw.items()}
    except (TypeError, ValueError):
        raise UserError(f"{where}: `dag` keys and parents must be component numbers") from None
    return dag


def answer_from_row(row: dict[str, Any], where: str) -> TeacherAnswer:
    """One ANSWERS row, checked with the stages' own parsers: the teacher never says what they cannot read."""
    question = row.get("question")
    components = row.get("components")
    if not isinstance(question, str) or not question.strip():
        raise UserError(f"{where}: no `question` text")
    if not isinstance(components, list) or not components or not all(isinstance(c, dict) for c in components):
        raise UserError(f"{where}: `components` must be a non-empty list of component objects")
    answer = TeacherAnswer(str(row.get("id", where)), question.strip(), tuple(components),
                           _dag_of(row, where, len(components)))
    try:
        parse_components(answer.text(COMPONENTS))
        _, errors = validate_dag(parse_dag_answer(answer.text(DAG)), len(components))
    except (AnswerError, DagError) as exc:
        raise UserError(f"{where}: {exc}") from None
    if errors:
        raise UserError(f"{where}: the dag is not valid: {'; '.join(errors)}")
    return answer


def load_answers(path: str | Path) -> dict[str, TeacherAnswer]:
    """ANSWERS.jsonl -> answers by question (stripped, as the prompts show it)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"answers file {path} not found; pass the ANSWERS.jsonl written with the traces")
    answers: dict[str, TeacherAnswer] = {}
    for number, row in enumerate(iter_jsonl(path), 1):
        answer = answer_from_row(row, f"{path}: row {number} (id {row.get('id')!r})")
        known = answers.get(answer.question)
        if known is not None and (known.components, known.dag) != (answer.components, answer.dag):
            raise UserError(f"{path}: rows {known.id!r} and {answer.id!r} ask the same question with different "
                            "answers; the teacher tells traces apart by their question")
        answers.setdefault(answer.question, answer)
    if not answers:
        raise UserError(f"{path} holds no answers")
    return answers


def find_answer(content: str, answers: dict[str, TeacherAnswer]) -> tuple[str, TeacherAnswer]:
    """(stage, answer) for a stage prompt; ReplayRequestError(400) when it is not one the teacher knows."""
    start = content.find(QUESTION_OPEN)
    while start >= 0:
        body = start + len(QUESTION_OPEN)
        end = content.find(QUESTION_CLOSE, body)
        while end >= 0:  # a question may itself hold the closing tag: try each one
            answer = answers.get(content[body:end])
            if answer is not None:
                rest = content[end + len(QUESTION_CLOSE):]
                for stage, marker in STAGE_MARKERS:
                    if marker in rest:
                        return stage, answer
                raise ReplayRequestError(400, f"the request about trace {answer.id!r} is neither a stage 1 prompt "
                                              "(numbered <Line N> lines) nor a stage 2 prompt (<Component_N> blocks)")
            end = content.find(QUESTION_CLOSE, end + 1)
        start = content.find(QUESTION_OPEN, start + 1)
    if QUESTION_OPEN not in content:
        raise ReplayRequestError(400, "the prompt has no <Question> block; the teacher answers stage 1-2 prompts only")
    raise ReplayRequestError(400, f"the {STAND_IN} has no answer for this question; add its trace to ANSWERS.jsonl")


@dataclass
class TeacherConfig:
    """How the teacher listens and names itself."""

    answers: str = option(help="ANSWERS.jsonl: per trace its question, components (stage 1's JSON) and dag",
                          flags=("answers",))
    host: str = option("127.0.0.1", "address to listen on (loopback: reachable from this machine only)")
    port: int = option(8000, "port to listen on; 0 = any free port")
    model: str = option(DEFAULT_MODEL, "served model name (say that it is a stand-in: manifests record it)")
    tokenizer: str | None = option(None, "count usage tokens with this tokenizer (folder or hub id) and apply "
                                   "max_tokens/stop as vLLM does; without one usage is 0 and answers are never cut")
    jitter: float = option(0.0, "answer each request after a random wait of up to this many seconds, drawn afresh "
                                "each run, so concurrent answers come back in another order each time (the test "
                                "that nothing downstream of stages 1-2 depends on that order); 0: at once")


class TeacherServer(HttpServer):
    """The teacher; `with TeacherServer(...)` serves from a background thread, `async with` in the caller's loop."""

    thread_name = "teacher-server"

    def __init__(self, answers: dict[str, TeacherAnswer], config: TeacherConfig) -> None:
        super().__init__(config.host, config.port)
        self.answers = answers
        self.config = config
        self.splitter = Splitter(config.tokenizer) if config.tokenizer else None
        self.answered: Counter[str] = Counter()  # stage -> requests answered (written by the serving loop only)
        self.refusals = 0
        self.waits = random.Random()  # unseeded on purpose: the order of answers must not repeat

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}/v1"

    def describe(self) -> str:
        usage = f"usage counted with {self.config.tokenizer}" if self.splitter else "usage 0: no --tokenizer given"
        return f"model {self.config.model}: a {STAND_IN}, answering stages 1-2 for {len(self.answers)} traces; {usage}"

    def refused(self, status: int) -> None:
        self.refusals += 1

    def __enter__(self) -> TeacherServer:
        self.start()
        return self

    async def __aenter__(self) -> TeacherServer:
        await self.astart()
        return self

    async def route(self, method: str, path: str, body: bytes, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> bool:
        endpoint = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}.get(path)
        if method == "GET" and path == "/v1/models":
            entry = {"id": self.config.model, "object": "model", "created": 0, "owned_by": OWNER,
                     "root": self.config.model, "stand_in_for": "gpt-4o", "description": self.describe()}
            await self.send_json(writer, 200, {"object": "list", "data": [entry]})
        elif method == "GET" and path == "/health":
            await self.send_json(writer, 200, {"status": "ok", "answered": dict(self.answered)})
        elif endpoint is None:
            await self.send_error(writer, 404, f"no route {method} {path}; the teacher serves /v1/chat/completions, "
                                               "/v1/completions, /v1/models")
        elif method != "POST":
            await self.send_error(writer, 405, f"{path} takes POST")
        else:
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                await self.send_error(writer, 400, "the request body is not JSON")
                return True
            try:
                await self._complete(request, endpoint, writer)
            except ReplayRequestError as exc:
                await self.send_error(writer, exc.status, exc.message)
        return True

    async def _complete(self, request: Any, endpoint: str, writer: asyncio.StreamWriter) -> None:
        if not isinstance(request, dict):
            raise ReplayRequestError(400, "the request body is not a JSON object")
        if request.get("model") != self.config.model:
            raise ReplayRequestError(404, f"The model `{request.get('model')}` does not exist; this {STAND_IN} "
                                          f"serves {self.config.model!r}.")
        if request.get("n") not in (None, 1):
            raise ReplayRequestError(400, "the teacher answers n=1 only (it has one answer per trace)")
        too_many = wire.stop_error(request)
        if too_many:
            raise ReplayRequestError(400, too_many)
        text = prompt_text(request, endpoint)
        stage, answer = find_answer(text, self.answers)
        if self.config.jitter > 0:
            await asyncio.sleep(self.waits.uniform(0, self.config.jitter))
        gen, prompt_tokens = self._generate(answer.text(stage), request, endpoint, text)
        self.answered[stage] += 1
        form = wire.Wire.for_request(endpoint, f"teacher-{sum(self.answered.values())}", request, int(time.time()))
        usage = wire.usage(prompt_tokens, gen.tokens if self.splitter else 0)
        if not request.get("stream"):
            body = form.body(gen, usage)
            body["system_fingerprint"] = OWNER
            writer.write(http_json(200, body))
        else:
            head = ("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n")
            separate = bool((request.get("stream_options") or {}).get("include_usage"))
            events = [*form.opening(), *(form.chunk(p) for p in gen.pieces if p),
                      *form.closing(gen, usage, separate_usage=separate)]
            writer.write(head.encode() + wire.sse(events) + wire.LAST_HTTP_CHUNK)
        await writer.drain()

    def _generate(self, answer: str, request: dict, endpoint: str, prompt: str) -> tuple[Generation, int]:
        """The answer cut as vLLM would cut it (with a tokenizer), and the prompt's token count (0 without)."""
        if self.splitter is None:
            return Generation(answer, "stop", None, [answer]), 0
        return wire.generate(answer, request, endpoint, self.splitter), self.splitter.count(prompt)


@contextlib.contextmanager
def teacher_server(answers: str | Path | dict[str, TeacherAnswer], *, tokenizer: str | None = None,
                   model: str = DEFAULT_MODEL, port: int = 0) -> Iterator[TeacherServer]:
    """Run the teacher in a background thread: `with teacher_server("ANSWERS.jsonl") as srv: srv.base_url`."""
    loaded = answers if isinstance(answers, dict) else load_answers(answers)
    config = TeacherConfig(answers=str(answers) if not isinstance(answers, dict) else "", port=port, model=model,
                           tokenizer=tokenizer)
    with TeacherServer(loaded, config) as server:
        yield server


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"A {STAND_IN} for the mini experiment: an OpenAI-compatible server that answers stage 1 (component "
        "separation) and stage 2 (DAG creation) prompts for the traces of ANSWERS.jsonl, recognised by their "
        "question, as GPT-4o writes its answers (a ```json list; a ```python parent dict). Point `sprint "
        "components` / `sprint dag` at it with --server-url http://HOST:PORT/v1 --model MODEL. A question it "
        "has no answer for gets HTTP 400 (that item fails, the run goes on); another model name gets 404."
    )
    add_options(parser, TeacherConfig)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def handle(args: argparse.Namespace) -> int:
    config = config_from(TeacherConfig, args)
    server = TeacherServer(load_answers(config.answers), config)

    async def serve() -> None:
        async with server:
            print(f"teacher server at {server.base_url} ({server.describe()}); Ctrl-C stops it", flush=True)
            await asyncio.Event().wait()

    # `kill` stops it like Ctrl-C, and Ctrl-C works where a script started it in the background (SIGINT ignored)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        print(f"stopped after answering {dict(server.answered)} ({server.refusals} refused)", flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    return 0
