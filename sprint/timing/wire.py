"""The OpenAI wire format as vLLM speaks it, and how vLLM cuts a generation.

Both servers that stand in for vLLM use this module, so they cannot drift apart: the replay
server (`sprint.timing.replay_server`, answers from recordings) and the scripted test server
(`tests/fake_server.py`, answers from a test's handler). Each only decides *what* text the model
would go on to write; `generate` applies the request's `stop` / `max_tokens` to it exactly as vLLM
applies them while sampling, and `Wire` writes the JSON bodies and SSE chunks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sprint.format.trajectory import load_tokenizer

WORDS = "words"  # tokenizer name of the cheap whitespace splitter
MAX_STOP = 4  # vLLM >= 0.32 rejects more stop strings with HTTP 400
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's default on /v1/completions (chat has none)
LAST_HTTP_CHUNK = b"0\r\n\r\n"  # ends a chunked (streaming) response
_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 429: "RateLimitError"}


class Splitter:
    """Splits text into per-token pieces that join back to the text exactly.

    `pieces(text)` has one entry per token; an entry may be "" when a token holds only part
    of a character (byte-level BPE), so the time of every token is still spent. The default,
    `words`, makes a token of each whitespace-separated word (with the whitespace before it).
    """

    def __init__(self, name: str = WORDS) -> None:
        self.name = name
        # The trajectory model's loader: local dir, SPRINT_LOCAL_DATA copy, or hub id.
        self._tokenizer = None if name == WORDS else load_tokenizer(name)

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
        consumed = sum(len(p) for p in out)
        if consumed < len(text):  # trailing whitespace (words) or unmapped bytes (BPE)
            out[-1] += text[consumed:]
        return out


@dataclass
class Generation:
    """What one request generated: the text the response carries and one piece per token."""

    text: str
    finish_reason: str  # "stop" | "length"
    stop_reason: str | None  # the stop string that matched, as vLLM reports it
    pieces: list[str] = field(default_factory=list)  # visible text per token ("" for stop-string tokens)

    @property
    def tokens(self) -> int:
        """completion_tokens: every generated token, those of a matched stop string included."""
        return len(self.pieces)


def empty_generation() -> Generation:
    """An empty answer cut by length (the `empty` fault): no text, no tokens."""
    return Generation("", "length", None, [])


def generate(continuation: str, request: dict, endpoint: str, splitter: Splitter) -> Generation:
    """Cut `continuation` (what the model would write) where vLLM would stop it.

    The rule, vLLM's: the model generates tokens until one completes a stop string (the one that
    ends first in the text; on a tie the one listed first), or until `max_tokens` (default 16 on
    /v1/completions). The response text ends *before* the stop
    string (unless `include_stop_str_in_output`), but `completion_tokens` counts every token
    generated up to and including the one that completed the stop string: those tokens were
    decoded and cost time. When the budget runs out before the stop string is complete,
    finish_reason is "length" (no stop_reason) and exactly `max_tokens` tokens count; when the
    last token allowed completes the stop string, the stop wins, as in vLLM.
    """
    stops = request.get("stop") or []
    if isinstance(stops, str):
        stops = [stops]
    # vLLM stops at the stop string that is *completed* first (ties: the one listed first).
    hits = [
        (continuation.find(s) + len(s), i, s)
        for i, s in enumerate(stops)
        if isinstance(s, str) and s and s in continuation
    ]
    stop_reason = None
    generated = continuation
    visible = len(continuation)
    if hits:
        end, _, stop_reason = min(hits)
        generated = continuation[:end]
        visible = end if request.get("include_stop_str_in_output") else end - len(stop_reason)
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


def stop_error(request: dict) -> str | None:
    """vLLM's refusal of too many stop strings (HTTP 400), or None."""
    stops = request.get("stop")
    if isinstance(stops, list) and len(stops) > MAX_STOP:
        return f"at most {MAX_STOP} stop sequences are supported, got {len(stops)}"
    return None


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(status: int, message: str) -> dict:
    """An OpenAI-style error body; the `openai` client maps `status` to its exception class."""
    kind = _ERROR_TYPES.get(status, "ServerError")
    return {"error": {"object": "error", "message": message, "type": kind, "param": None, "code": status}}


def sse(payloads: Sequence[Any]) -> bytes:
    """Server-sent events (`data: …`) in one HTTP chunk; b"" when there is nothing to send."""
    data = b"".join(b"data: " + (p if isinstance(p, bytes) else json.dumps(p).encode()) + b"\n\n" for p in payloads)
    return f"{len(data):x}\r\n".encode() + data + b"\r\n" if data else b""


@dataclass
class Wire:
    """The JSON of one completion: a whole body, or the chunks of a stream."""

    endpoint: str  # "completions" | "chat"
    ident: str  # e.g. cmpl-7
    model: Any  # echoed from the request
    stream: bool
    created: int

    @classmethod
    def for_request(cls, endpoint: str, tag: str, request: dict, created: int) -> Wire:
        ident = f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-{tag}"
        return cls(endpoint, ident, request.get("model"), bool(request.get("stream")), created)

    @property
    def object(self) -> str:
        if self.endpoint != "chat":
            return "text_completion"
        return "chat.completion.chunk" if self.stream else "chat.completion"

    def _envelope(self, choices: list, **extra: Any) -> dict:
        return {"id": self.ident, "object": self.object, "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def chunk(self, piece: str | None, finish: str | None = None, stop_reason: str | None = None, first: bool = False) -> dict:
        """One streamed event: a piece of text (chat: a delta; the first one carries the role)."""
        if self.endpoint == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if piece is not None:
                delta["content"] = piece
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None}
        choice.update(finish_reason=finish, stop_reason=stop_reason)
        return self._envelope([choice])

    def opening(self) -> list[dict]:
        """The events before the first token: chat announces the assistant role."""
        return [self.chunk("", first=True)] if self.endpoint == "chat" else []

    def closing(self, gen: Generation, usage_block: dict | None, separate_usage: bool) -> list[Any]:
        """The events after the last token: the finish chunk, usage, `[DONE]`.

        `separate_usage` (the client's `stream_options.include_usage`): usage goes in a last chunk
        with no choices, the OpenAI way; otherwise it rides on the finishing chunk (vLLM's
        continuous usage). No usage block, no usage anywhere.
        """
        last = self.chunk(None if self.endpoint == "chat" else "", gen.finish_reason, gen.stop_reason)
        events: list[Any] = [last]
        if usage_block is not None and separate_usage:
            events.append(self._envelope([], usage=usage_block))
        elif usage_block is not None:
            last["usage"] = usage_block
        return [*events, b"[DONE]"]

    def body(self, gen: Generation, usage_block: dict | None) -> dict:
        """A non-streaming response."""
        if self.endpoint == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": gen.text}}
        else:
            choice = {"index": 0, "text": gen.text, "logprobs": None}
        choice.update(finish_reason=gen.finish_reason, stop_reason=gen.stop_reason)
        extra = {"usage": usage_block} if usage_block is not None else {}
        return self._envelope([choice], **extra)
