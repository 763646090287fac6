"""Micro-batching: questions from concurrent requests answered by one batched ``search`` call.

A request's questions join a FIFO queue, each with the index that was served when it arrived. One asyncio task
forms batches: while more requests are on their way (accepted, their bodies still being read and checked) it
gathers for up to ``max_wait_ms`` after the first waiting question, or until ``max_batch`` questions wait; with
nothing else arriving it starts at once, so a lone client pays no wait. The batch runs on one worker thread,
while the next one gathers (the questions that arrive during a search form the next batch). A
batch is cut into groups of the same (index, k), one ``search`` each, so every question gets exactly what it
would get alone at its own k, from the index it was queued on: a hot swap never answers a queued question
from the other index, and the old index is released once its last question is done.

The queue is bounded (``max_queue`` questions): :meth:`MicroBatcher.submit` raises :class:`QueueFull` past it,
which the app answers with 503 and ``Retry-After``, so memory cannot grow without bound.

Written here rather than taken from a serving library: the batch is one ``search`` of a method's own
retriever in this process (no model server, no GPU workers, no separate processes to feed), and the
equivalence rule above (group by index and k) is the part that matters; LitServe's batching runs in worker
processes that would each hold a copy of the index.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable


class QueueFull(RuntimeError):
    """More questions are waiting than ``max_queue`` allows."""


@dataclass
class _Item:
    question: str
    k: int
    index: Any
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class BatchStats:
    """What one batch took: sizes and seconds, for the metrics."""

    size: int
    groups: int
    queue_wait_s: list[float]
    search_s: float


class MicroBatcher:
    """Gathers questions into batches and runs ``search(index, questions, k)`` on one worker thread."""

    def __init__(self, search: Callable[[Any, list[str], int], list[Any]], max_batch: int, max_wait_ms: float,
                 max_queue: int, on_batch: Callable[[BatchStats], None] | None = None,
                 arriving: Callable[[], int] = lambda: 0) -> None:
        self.search, self.max_batch, self.max_wait_s, self.max_queue = search, max_batch, max_wait_ms / 1000, max_queue
        self.arriving = arriving  # requests accepted but not yet queued: worth waiting for
        self.on_batch = on_batch or (lambda stats: None)
        self._queue: deque[_Item] = deque()
        self._arrived = asyncio.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dagrag-search")
        self._task: asyncio.Task | None = None
        self._last_size = 0  # the last batch's size: more than one means clients are waiting on each other

    @property
    def depth(self) -> int:
        """Questions waiting for a batch."""
        return len(self._queue)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="dagrag-batcher")

    async def stop(self) -> None:
        """Stop forming batches (what waits is failed); the running batch finishes first."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        while self._queue:
            item = self._queue.popleft()
            if not item.future.done():
                item.future.set_exception(RuntimeError("the server is stopping"))
        self._pool.shutdown(wait=True)

    async def submit(self, index: Any, questions: list[str], k: int) -> list[Any]:
        """Each question's result, in order, from ``index`` at depth ``k`` (batched with whatever else waits)."""
        if len(self._queue) + len(questions) > self.max_queue:
            raise QueueFull(f"{len(self._queue)} questions are waiting (serve.max_queue={self.max_queue})")
        loop = asyncio.get_running_loop()
        items = [_Item(q, k, index, loop.create_future()) for q in questions]
        self._queue.extend(items)
        self._arrived.set()
        try:
            return list(await asyncio.gather(*(i.future for i in items)))
        except asyncio.CancelledError:  # the client went away: its questions that still wait are dropped
            for item in items:
                item.future.cancel()
            raise

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._arrived.wait()
            deadline = loop.time() + self.max_wait_s
            # wait for more while requests are being read, or while the last batch was shared (under load, the
            # clients it answered are about to send their next questions: one batch rather than two half ones)
            while len(self._queue) < self.max_batch and loop.time() < deadline and (
                    self.arriving() > 0 or self._last_size > 1):
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
                except asyncio.TimeoutError:
                    break
            batch: list[_Item] = []
            while self._queue and len(batch) < self.max_batch:
                item = self._queue.popleft()
                if not item.future.cancelled():
                    batch.append(item)
            if not self._queue:
                self._arrived.clear()
            self._last_size = len(batch)
            if batch:
                await self._answer(loop, batch)

    async def _answer(self, loop: asyncio.AbstractEventLoop, batch: list[_Item]) -> None:
        """Run one batch: one ``search`` per (index, k) group, results set on each question's future."""
        groups: dict[tuple[int, int], list[_Item]] = {}
        for item in batch:
            groups.setdefault((id(item.index), item.k), []).append(item)
        started = time.perf_counter()
        waits = [started - i.queued_at for i in batch]
        for members in groups.values():
            try:
                results = await loop.run_in_executor(
                    self._pool, self.search, members[0].index, [m.question for m in members], members[0].k)
            except Exception as err:  # noqa: BLE001 - the requests of this group fail; the service goes on
                for m in members:
                    if not m.future.done():
                        m.future.set_exception(err)
                continue
            for m, result in zip(members, results):
                if not m.future.done():
                    m.future.set_result(result)
        self.on_batch(BatchStats(len(batch), len(groups), waits, time.perf_counter() - started))
