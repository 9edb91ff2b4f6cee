"""Several servers for one role: each problem sticks to one replica, chosen by consistent hashing.

Why not round robin: SPRINT's calls of one problem share a long prefix (question, past phases,
the plan), and a server only reuses it from its own prefix cache. So every call of a problem goes
to the replica that owns the problem's id on a hash ring (`HashRing`, virtual nodes so the load
evens out and adding a replica moves only about 1/n of the problems). A replica whose calls fail
to connect is taken out: its problems move, whole, to the next replica on the ring (the same one
for every call of the problem) and come back when it answers its health check (GET /models)
again. Each request also carries an affinity header (`X-Session-Id: <problem id>` by default), so
a router in front of the servers (vllm-router, SGLang's gateway, production-stack) can keep the
same affinity. The per-replica circuit breaker is off: the run stops starting problems only when
no replica answers (unless `max_connection_failures` is 0, which switches the breaker off).

With one URL the pool is a thin wrapper over one `LLMClient`, which behaves exactly as before.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sprint.core.errors import UserError
from sprint.core.items import RUN_STOP
from sprint.llm.client import Completion, LLMClient, LLMConfig, OnText, Sampling, Usage
from sprint.llm.failures import LLMError

log = logging.getLogger(__name__)

AFFINITY_HEADER = "X-Session-Id"  # what vLLM production-stack's session router and most gateways key on
VNODES = 160  # points per replica on the ring: with 2-8 replicas the load is within ~10% of even
PROBE_INTERVAL = 2.0  # seconds between health checks of a replica that is out


def split_urls(text: str | Sequence[str], what: str = "server URL") -> list[str]:
    """`http://a/v1,http://b/v1` (or a list) -> the URLs, in order, without blanks or repeats."""
    parts = text.split(",") if isinstance(text, str) else [p for item in text for p in str(item).split(",")]
    urls: list[str] = []
    for part in parts:
        url = part.strip().rstrip("/")
        if url and url not in urls:
            urls.append(url)
    if not urls:
        raise UserError(f"no {what} given; pass one base URL or a comma-separated list, e.g. http://host:8000/v1")
    return urls


def _point(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


class HashRing:
    """Consistent hashing of keys onto nodes; a node's points depend only on its own name."""

    def __init__(self, nodes: Sequence[str], vnodes: int = VNODES) -> None:
        if not nodes or vnodes < 1:
            raise ValueError("a hash ring needs at least one node and one point per node")
        self.nodes = list(nodes)
        points = sorted((_point(f"{node}#{v}"), i) for i, node in enumerate(self.nodes) for v in range(vnodes))
        self._hashes = [h for h, _ in points]
        self._owners = [i for _, i in points]

    def order(self, key: str) -> list[int]:
        """Node indices in the order a key tries them: its owner first, then clockwise."""
        start = bisect.bisect(self._hashes, _point(key))
        seen: list[int] = []
        n = len(self._owners)
        for step in range(n):
            owner = self._owners[(start + step) % n]
            if owner not in seen:
                seen.append(owner)
                if len(seen) == len(self.nodes):
                    break
        return seen

    def owner(self, key: str) -> str:
        return self.nodes[self.order(key)[0]]


def session_id(key: str) -> str:
    """The affinity header's value: the problem id when it is a plain header value, else a hash of it."""
    if key and len(key) <= 200 and key.isascii() and key.isprintable():
        return key
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


@dataclass
class Replica:
    """One server of a role, and whether it is in."""

    url: str
    client: LLMClient
    out_since: float | None = None  # time.time() it was taken out; None: in
    reason: str | None = None
    next_probe: float = 0.0  # time.monotonic() of the next health check while out
    answered: int = 0  # calls it answered
    taken_out: int = 0  # times it was taken out

    def stats(self) -> dict[str, Any]:
        return {"answered": self.answered, "taken_out": self.taken_out, "in": self.out_since is None,
                "reason": self.reason}


class ReplicaPool:
    """The replicas of one role behind the LLMClient call interface, plus a routing key per call."""

    def __init__(self, config: LLMConfig, urls: Sequence[str] | str | None = None, *,
                 affinity_header: str | None = AFFINITY_HEADER, probe_interval: float = PROBE_INTERVAL) -> None:
        urls = split_urls(urls if urls is not None else config.base_url)
        self.config = config
        self.affinity_header = affinity_header or None
        self.probe_interval = probe_interval
        single = len(urls) == 1
        # With several replicas a dead one must not stop the run: the pool decides (no replica answers).
        self.replicas = [
            Replica(url, LLMClient(dataclasses.replace(config, base_url=url) if single else
                                   dataclasses.replace(config, base_url=url, max_connection_failures=0)))
            for url in urls
        ]
        self.ring = HashRing(urls)
        self.failovers = 0  # calls that moved to another replica after a connection failure
        self._probes: dict[int, asyncio.Task] = {}

    def __repr__(self) -> str:
        return f"ReplicaPool({[r.url for r in self.replicas]!r}, model={self.config.model!r})"

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    # --- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        for task in self._probes.values():
            task.cancel()
        await asyncio.gather(*self._probes.values(), return_exceptions=True)
        self._probes.clear()
        for replica in self.replicas:
            await replica.client.aclose()

    async def __aenter__(self) -> ReplicaPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def check(self) -> list[str]:
        """Check every replica (model served); those that do not answer start out. UserError when none does."""
        results = await asyncio.gather(*(r.client.check() for r in self.replicas), return_exceptions=True)
        for result in results:
            if not isinstance(result, (list, UserError)):
                raise result  # a bug, not a server's answer
        if all(isinstance(r, UserError) for r in results):
            raise results[0]
        for replica, result in zip(self.replicas, results):
            if isinstance(result, UserError):
                log.warning("replica %s is out from the start: %s", replica.url, result)
                self._take_out(replica, str(result))
        return next(r for r in results if isinstance(r, list))

    # --- usage ----------------------------------------------------------------------------

    @property
    def usage(self) -> Usage:
        """The replicas' usage added up (the manifest's per-role usage)."""
        if len(self.replicas) == 1:
            return self.replicas[0].client.usage
        total = Usage()
        for f in dataclasses.fields(Usage):
            values = [getattr(r.client.usage, f.name) for r in self.replicas]
            if all(isinstance(v, int) for v in values):
                setattr(total, f.name, sum(values))
            elif all(isinstance(v, dict) and all(isinstance(n, int) for n in v.values()) for v in values):
                merged: dict[str, int] = {}
                for v in values:
                    for kind, n in v.items():
                        merged[kind] = merged.get(kind, 0) + n
                setattr(total, f.name, merged)
            elif any(v is not None for v in values):  # anything else: per replica
                setattr(total, f.name, {r.url: v for r, v in zip(self.replicas, values)})
        return total

    def stats(self) -> dict[str, Any]:
        """Per-replica counters for the manifest."""
        return {"failovers": self.failovers, "replicas": {r.url: r.stats() for r in self.replicas}}

    # --- calls ----------------------------------------------------------------------------

    async def complete(self, prompt: str, sampling: Sampling, on_text: OnText | None = None, *, key: str = "",
                       headers: dict[str, str] | None = None, body: dict[str, Any] | None = None) -> Completion:
        return await self.call("completions", prompt, sampling, on_text, key=key, headers=headers, body=body)

    async def chat(self, messages: list[dict], sampling: Sampling, on_text: OnText | None = None, *, key: str = "",
                   headers: dict[str, str] | None = None, body: dict[str, Any] | None = None) -> Completion:
        return await self.call("chat", messages, sampling, on_text, key=key, headers=headers, body=body)

    async def call(self, endpoint: str, payload: Any, sampling: Sampling, on_text: OnText | None = None, *,
                   key: str = "", headers: dict[str, str] | None = None, body: dict[str, Any] | None = None) -> Completion:
        """One call on the replica that owns `key` (the next one in while it is out)."""
        headers = dict(headers or {})
        if self.affinity_header and key:
            headers.setdefault(self.affinity_header, session_id(key))
        failed: set[int] = set()
        while True:
            index = await self._choose(key, failed)
            replica = self.replicas[index]
            client = replica.client
            send = client.complete if endpoint == "completions" else client.chat
            try:
                done = await send(payload, sampling, on_text, headers=headers or None, body=body)
            except LLMError as exc:
                if exc.kind != "connection" or len(self.replicas) == 1:
                    raise
                self._take_out(replica, str(exc))
                failed.add(index)
                self.failovers += 1
                log.warning("replica %s failed (%s); its problems move to the next replica", replica.url, exc)
                continue
            if not done.cached:
                replica.answered += 1
            return done

    def route(self, key: str) -> str:
        """The URL a key's calls go to now (its owner, or the next replica in)."""
        for index in self.ring.order(key):
            if self.replicas[index].out_since is None:
                return self.replicas[index].url
        return self.replicas[self.ring.order(key)[0]].url

    async def _choose(self, key: str, failed: set[int]) -> int:
        """The first replica in the key's ring order that is in (and did not just fail this call);
        replicas out ahead of it get a health check when one is due, so the key returns to its owner."""
        order = self.ring.order(key)
        if len(order) == 1:
            return order[0]
        for index in order:
            replica = self.replicas[index]
            if replica.out_since is None and index not in failed:
                return index
            if replica.out_since is not None:
                self._probe_soon(index)
        # None is in: check them all now, once; then fail (the run stops starting problems).
        await asyncio.gather(*(self._probe(i) for i in order if self.replicas[i].out_since is not None),
                             return_exceptions=True)
        for index in order:
            if self.replicas[index].out_since is None and index not in failed:
                return index
        reason = f"no replica answers ({', '.join(self.urls)})"
        if not self.config.max_connection_failures:  # the breaker is off: a plain, retryable failure
            raise LLMError("connection", reason)
        stop = RUN_STOP.get()
        if stop is not None:
            stop.trip(reason)
        raise LLMError("connection", reason, stopped=True)

    def _take_out(self, replica: Replica, reason: str) -> None:
        if replica.out_since is None:
            replica.out_since = time.time()
            replica.taken_out += 1
        replica.reason = reason
        replica.next_probe = time.monotonic() + self.probe_interval

    def _probe_soon(self, index: int) -> None:
        replica = self.replicas[index]
        if index in self._probes or time.monotonic() < replica.next_probe:
            return
        task = asyncio.ensure_future(self._probe(index))
        self._probes[index] = task
        task.add_done_callback(lambda _t, i=index: self._probes.pop(i, None))

    async def _probe(self, index: int) -> None:
        """Health check (GET /models, model served): back in when it answers."""
        replica = self.replicas[index]
        replica.next_probe = time.monotonic() + self.probe_interval
        try:
            await replica.client.check()
        except UserError as exc:
            replica.reason = str(exc)
            return
        if replica.out_since is not None:
            log.warning("replica %s answers again; its problems come back", replica.url)
            replica.out_since = None
            replica.reason = None
