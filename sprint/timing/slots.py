"""The replay server's admission queue: at most `capacity` sequences at once, as vLLM's scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from typing import Any


class PrioritySlots:
    """At most `capacity` sequences at once; waiting requests are admitted lowest `priority` first,
    then in arrival order: vLLM's `--scheduling-policy priority` queue (requests without a priority
    count as 0, so with none given this is first come, first served). Like vLLM's scheduler when
    its sequence limit is reached, a running request is never preempted."""

    def __init__(self, capacity: int) -> None:
        self.free = capacity
        self._waiting: list[tuple[int, int, asyncio.Future]] = []
        self._order = itertools.count()

    def busy(self) -> bool:
        return self.free <= 0

    async def acquire(self, priority: int = 0) -> None:
        if self.free > 0 and not self._waiting:
            self.free -= 1
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot was handed over just as the waiter left: pass it on
            raise

    def release(self) -> None:
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)  # the slot passes straight to the next waiter
                return
        self.free += 1

    @contextlib.asynccontextmanager
    async def slot(self, priority: int = 0) -> Any:
        await self.acquire(priority)
        try:
            yield
        finally:
            self.release()
