"""The micro-batcher alone: batches group by (index, k), results return in order to their requests, the queue
is bounded, and a lone request does not wait."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from flows.serving.batcher import MicroBatcher, QueueFull


def recording_search(calls: list, gate: threading.Event | None = None):
    def search(index, questions, k):
        if gate is not None:
            gate.wait(5)
        calls.append((index, tuple(questions), k))
        return [f"{index}:{q}:{k}" for q in questions]
    return search


def test_batches_group_by_index_and_k_and_answer_in_order():
    calls: list = []
    gate = threading.Event()

    async def main():
        batcher = MicroBatcher(recording_search(calls, gate), max_batch=64, max_wait_ms=50, max_queue=100)
        batcher.start()
        first = asyncio.create_task(batcher.submit("A", ["warm"], 3))  # holds the worker until the gate opens
        await asyncio.sleep(0.05)
        jobs = [batcher.submit("A", [f"a{i}", f"b{i}"], 3) for i in range(5)] + \
               [batcher.submit("A", [f"c{i}"], 5) for i in range(3)] + [batcher.submit("B", ["d0", "d1"], 3)]
        tasks = [asyncio.create_task(j) for j in jobs]
        await asyncio.sleep(0.05)
        gate.set()
        out = await asyncio.gather(first, *tasks)
        await batcher.stop()
        return out

    out = asyncio.run(main())
    assert out[0] == ["A:warm:3"]
    assert out[1:6] == [[f"A:a{i}:3", f"A:b{i}:3"] for i in range(5)]
    assert out[6:9] == [[f"A:c{i}:5"] for i in range(3)]
    assert out[9] == ["B:d0:3", "B:d1:3"]
    # after the first call, the 15 waiting questions form one batch: one search per (index, k), in queue order
    assert calls[1:] == [("A", tuple(q for i in range(5) for q in (f"a{i}", f"b{i}")), 3),
                         ("A", ("c0", "c1", "c2"), 5), ("B", ("d0", "d1"), 3)]


def test_queue_bound_refuses_past_max_queue():
    gate = threading.Event()

    async def main():
        batcher = MicroBatcher(recording_search([], gate), max_batch=2, max_wait_ms=0, max_queue=4)
        batcher.start()
        running = asyncio.create_task(batcher.submit("A", ["x", "y"], 1))
        await asyncio.sleep(0.05)  # taken by the worker, blocked on the gate
        waiting = asyncio.create_task(batcher.submit("A", ["q1", "q2", "q3"], 1))
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull, match="max_queue=4"):
            await batcher.submit("A", ["q4", "q5"], 1)
        gate.set()
        done = await asyncio.gather(running, waiting)
        await batcher.stop()
        return done

    assert asyncio.run(main()) == [["A:x:1", "A:y:1"], ["A:q1:1", "A:q2:1", "A:q3:1"]]


def test_a_lone_request_does_not_wait_but_arriving_ones_are_awaited():
    async def one(arriving: int) -> float:
        batcher = MicroBatcher(recording_search([]), max_batch=64, max_wait_ms=300, max_queue=10,
                               arriving=lambda: arriving)
        batcher.start()
        t0 = time.perf_counter()
        await batcher.submit("A", ["q"], 1)
        seconds = time.perf_counter() - t0
        await batcher.stop()
        return seconds

    assert asyncio.run(one(0)) < 0.15       # nothing else arriving: no wait
    assert asyncio.run(one(1)) >= 0.25      # one more on its way: it waits up to max_wait_ms for it
