"""A small asyncio HTTP/1.1 server: keep-alive connections, JSON responses, a background-thread mode.

The replay server (`sprint.timing.replay_server`) is built on it. One event loop holds hundreds of
concurrent streams on a couple of cores and no web framework is needed; this module knows nothing
about completions: a subclass answers each request in `route` and may stream its response itself
(chunked SSE) on the writer it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from typing import Any

from sprint.core.errors import UserError
from sprint.timing import wire

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


class Dropped(Exception):
    """The response was cut on purpose: close the connection."""


def http_json(status: int, payload: Any, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response with a JSON body."""
    data = json.dumps(payload).encode()
    head = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
    ]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


class HttpServer:
    """Serves until closed, in the caller's event loop (`async with`) or in a background thread
    with its own loop (`with`). Subclasses implement `route` and may hook `started` / `refused`."""

    thread_name = "http-server"

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.requested_port = port
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    # --- what a subclass provides ---------------------------------------------------------

    async def route(
        self, method: str, path: str, body: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request on `writer`; False when the connection must be closed."""
        raise NotImplementedError

    def started(self) -> None:
        """Called in the serving loop once it listens (e.g. to make loop-bound objects)."""

    def refused(self, status: int) -> None:
        """Called for every error response sent (e.g. to count them)."""

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{self.thread_name} not started")
        return self._port

    async def astart(self) -> HttpServer:
        self._loop = asyncio.get_running_loop()
        self.started()
        try:
            self._server = await asyncio.start_server(
                self._connection, self.host, self.requested_port, backlog=2048, limit=1 << 20
            )
        except OSError as exc:
            raise UserError(
                f"cannot listen on {self.host}:{self.requested_port} ({exc.strerror}); pick another --port"
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

    async def __aenter__(self) -> HttpServer:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def start(self) -> HttpServer:
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

        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
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

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
                    await self.send_error(writer, 431, "request headers too large")
                    return
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                if len(parts) != 3:
                    await self.send_error(writer, 400, "malformed request line")
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
                    await self.send_error(writer, 400, "bad Content-Length")
                    return
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                keep = await self.route(method, target.split("?", 1)[0].rstrip("/"), body, reader, writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, Dropped):
            return
        except asyncio.CancelledError:
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def send_json(
        self, writer: asyncio.StreamWriter, status: int, payload: Any, headers: dict[str, str] | None = None
    ) -> None:
        writer.write(http_json(status, payload, headers))
        await writer.drain()

    async def send_error(
        self, writer: asyncio.StreamWriter, status: int, message: str, headers: dict[str, str] | None = None
    ) -> None:
        """An error in the OpenAI wire format (`sprint.timing.wire.error_body`)."""
        self.refused(status)
        await self.send_json(writer, status, wire.error_body(status, message), headers)
