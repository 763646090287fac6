"""What the LangChain and LlamaIndex retrievers search: an opened index (in process) or a served one (remote),
with one synchronous and one asynchronous ``retrieve``.

The async path queues on :class:`~flows.serving.batcher.MicroBatcher`, the batcher ``dagrag serve`` uses:
concurrent ``ainvoke``/``aretrieve`` calls on one event loop are searched as one batch, exactly as concurrent HTTP
requests are on the server. Remote, one batch is one request (64 concurrent calls cost one round trip, not 64).
"""
from __future__ import annotations

import asyncio
import weakref
from collections import deque
from typing import Any, Sequence

from flows.serving.batcher import MicroBatcher
from flows.serving.index import Index, Ranked
from flows.serving.remote import Remote


class Source:
    """An :class:`Index` or a :class:`Remote`, searched ``k`` deep (None: the method's ``top_k``)."""

    def __init__(self, target: Index | Remote, k: int | None = None, max_batch: int = 64,
                 max_wait_ms: float = 5.0) -> None:
        if not isinstance(target, (Index, Remote)):
            raise TypeError(f"a dagrag retriever wraps an opened index (flows.serving.open_index) or a served one "
                            f"(flows.serving.remote), not a {type(target).__name__}")
        self.target, self.k = target, k
        self.max_batch, self.max_wait_ms = max_batch, max_wait_ms
        self.batch_sizes: deque[int] = deque(maxlen=1024)  # the async batches' sizes, newest last
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, MicroBatcher] = \
            weakref.WeakKeyDictionary()

    def retrieve(self, questions: Sequence[str]) -> list[Ranked]:
        return self.target.retrieve(list(questions), self.k)

    async def aretrieve(self, questions: Sequence[str], k: int | None = None) -> list[Ranked]:
        """Through this loop's batcher, ``k`` deep (None: this source's ``k``)."""
        return await self._batcher().submit(self.target, list(questions), self.k if k is None else k)

    def _batcher(self) -> MicroBatcher:
        """This event loop's batcher (started on first use; a loop that ended takes its batcher with it)."""
        loop = asyncio.get_running_loop()
        batcher = self._batchers.get(loop)
        if batcher is None or batcher._task is None or batcher._task.done():
            batcher = MicroBatcher(lambda index, questions, k: index.retrieve(questions, k), self.max_batch,
                                   self.max_wait_ms, max_queue=1 << 30,
                                   on_batch=lambda stats: self.batch_sizes.append(stats.size))
            batcher.start()
            self._batchers[loop] = batcher
            weakref.finalize(loop, batcher._pool.shutdown, False)  # its worker thread ends with the loop ...
            weakref.finalize(self, _stop, loop, batcher._task)     # ... and its task with this source
        return batcher


def _stop(loop: asyncio.AbstractEventLoop, task: asyncio.Task) -> None:
    """Cancel a batcher's task (from any thread) once nothing can queue on it; a loop holds only weak references
    to its tasks, so one left pending would be destroyed with a warning."""
    if not loop.is_closed():
        loop.call_soon_threadsafe(task.cancel)


def metadata(passage: Any, ranked: Ranked, skip: Sequence[str]) -> dict[str, Any]:
    """A passage's fields (``Passage.to_dict()``: doc id, title, lineage, …) but ``skip``, and its question's trace:
    the metadata a library's document carries."""
    meta: dict[str, Any] = {k: v for k, v in passage.to_dict().items() if k not in skip}
    meta["trace"] = ranked.trace
    return meta
