"""What the retrievers cost beyond ``open_index().retrieve``: ms per question at batch 1 and 64, medians.

    PYTHONPATH=. .venv/bin/python -m flows.integrations.overhead method=bm25 dataset=sample [overrides]

Batch 1 is one ``invoke``/``retrieve`` call; batch 64 is 64 questions at once: ``retrieve`` of the list for the
index and the remote client, ``abatch`` (LangChain) and concurrent ``aretrieve`` (LlamaIndex), which reach one
batched search through the micro-batcher (in process) or the server's. The remote rows ask a ``dagrag serve`` with
the same overrides, started here as its own process on a free loopback port. Prints one JSON line per row. Beyond the papers: integrations.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from typing import Any, Callable


def median_ms(call: Callable[[], Any], n_questions: int, repeats: int) -> float:
    call()  # warm: first-call imports, caches, the batcher's start
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000 / n_questions


def main(argv: list[str]) -> int:
    import re
    import subprocess

    from flows.integrations.langchain import DagragRetriever as LangChain
    from flows.integrations.llamaindex import DagragRetriever as LlamaIndex
    from flows.serving import open_index, remote
    from tasks.data.sample import generate_sample

    index = open_index(*argv)
    pool = [q["question"] for q in generate_sample(300, 64, 0)[1]]
    one, many = pool[:1], (pool * 64)[:64]
    server = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", *argv, "serve.port=0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    client = remote(re.search(r"at (http://\S+)", server.stdout.readline()).group(1))
    loop = asyncio.new_event_loop()

    def gather(call: Callable[[str], Any], questions: list[str]) -> Any:
        async def every() -> list[Any]:
            return await asyncio.gather(*(call(q) for q in questions))

        return loop.run_until_complete(every())

    for where, target in (("in-process", index), ("remote", client)):
        lc, li = LangChain.of(target), LlamaIndex(target)
        rows = {"retrieve": (lambda: target.retrieve(one), lambda: target.retrieve(many)),
                "langchain": (lambda: lc.invoke(one[0]), lambda: loop.run_until_complete(lc.abatch(many))),
                "llamaindex": (lambda: li.retrieve(one[0]), lambda: gather(li.aretrieve, many))}
        for name, (single, batch) in rows.items():
            print(json.dumps({"row": f"{where} {name}", "ms_per_question_batch1": round(median_ms(single, 1, 200), 3),
                              "ms_per_question_batch64": round(median_ms(batch, 64, 30), 3)}), flush=True)
    loop.run_until_complete(loop.shutdown_asyncgens())
    for task in asyncio.all_tasks(loop):  # the batchers' tasks
        task.cancel()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    server.terminate()
    server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
