"""``dagrag loadtest [overrides]``: served throughput and latency, batching on and off, at several concurrencies.

For each setup of ``loadtest.setups`` (a name and the overrides that built its index, on top of the command's
own ``dataset=…``, ``artifacts_dir=…``; the ``loadtest/`` config group, :class:`flows.runtime.command_params.LoadtestParams`), and for each ``loadtest.max_batch`` (the server's ``serve.max_batch``:
64 batches, 1 does not), one ``dagrag serve`` process is started on a free loopback port; a bounded asyncio
``httpx`` client then sends the dataset's questions, one per request, from 1, 8, 64 and 256 concurrent clients
(``loadtest.concurrency``), each level at most ``loadtest.requests`` requests and ``loadtest.duration_s``
seconds. Beside it, in this process, the same index's in-process batched ``search`` is timed at batch 1 and at
``loadtest.ceiling_batch``: the ceiling the server's queue can approach.

Rows: setup, max_batch, clients, questions/s, p50/p95/p99 ms, mean batch size and queue wait (the server's
own /metrics), failures. They go to the catalog (metrics kind ``loadtest``), to
``<artifacts_dir>/reports/loadtest-<dataset>/loadtest.md`` with a throughput–concurrency figure, and to
``dagrag report``. Traffic goes to 127.0.0.1 only and every level stops by itself.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from flows.runtime.command_params import LoadtestParams

REPO = Path(__file__).resolve().parents[2]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


class Connection:
    """One keep-alive HTTP/1.1 connection to the server, on asyncio streams: a load generator's client must cost
    the box far less than the server it measures (httpx's pool cost several ms a request here at 64 clients)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        length, close = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and value.strip().lower() == "close":
                close = True
        payload = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, payload

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        self.reader = self.writer = None


async def drive(url: str, questions: list[str], clients: int, requests: int, duration_s: float, k: int
                ) -> dict[str, Any]:
    """``clients`` concurrent loops, each on its own keep-alive connection sending one question per request,
    until ``requests`` are sent or ``duration_s`` has passed: questions/s and latency percentiles of the
    answered ones (a reply that is not 200 counts as a failure)."""
    from urllib.parse import urlsplit

    where = urlsplit(url)
    bodies = [json.dumps({"question": q, "k": k}).encode() for q in questions]
    latencies: list[float] = []
    failures = 0
    sent = 0
    deadline = time.perf_counter() + duration_s

    async def loop() -> None:
        nonlocal sent, failures
        conn = Connection(where.hostname, where.port)
        try:
            while sent < requests and time.perf_counter() < deadline:
                body = bodies[sent % len(bodies)]
                sent += 1
                t0 = time.perf_counter()
                try:
                    status, _ = await conn.post("/retrieve", body)
                except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                    status = 0
                    await conn.close()
                if status == 200:
                    latencies.append((time.perf_counter() - t0) * 1000)
                else:
                    failures += 1
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return {"clients": clients, "requests": len(latencies) + failures, "failures": failures,
            "questions_per_s": round(len(latencies) / elapsed, 2), "p50_ms": round(percentile(latencies, 50), 2),
            "p95_ms": round(percentile(latencies, 95), 2), "p99_ms": round(percentile(latencies, 99), 2)}


def server_counters(url: str) -> dict[str, float]:
    """The server's own counters from /metrics: batches, questions batched, and seconds of queue wait, search,
    each search part and serialisation, summed."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=30).text
    out = {}
    for name, key in (("dagrag_batch_size_count", "batches"), ("dagrag_batch_size_sum", "questions"),
                      ("dagrag_queue_wait_seconds_sum", "queue_wait"), ("dagrag_batch_seconds_sum", "search"),
                      ("dagrag_serialise_seconds_total", "serialise")):
        found = re.search(rf"^{name} (\S+)$", text, re.M)
        out[key] = float(found.group(1)) if found else 0.0
    for part, value in re.findall(r'^dagrag_search_part_seconds_total\{part="([^"]+)"\} (\S+)$', text, re.M):
        out[f"part:{part}"] = float(value)
    return out


def split_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Per question, in ms, between two reads of :func:`server_counters`: where a question's time went."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    n = delta.get("questions", 0.0)
    if not n:
        return {"mean_batch": None}
    out: dict[str, float | None] = {"mean_batch": round(n / delta["batches"], 2)}
    for key in ("queue_wait", "search", "serialise"):
        out[f"{key}_ms"] = round(1000 * delta[key] / n, 2)
    for key in sorted(k for k in delta if k.startswith("part:")):  # the method's own names, kept apart
        out[f"part_{key[5:]}_ms"] = round(1000 * delta[key] / n, 2)
    return out


def ceiling(index: Any, questions: list[str], batch: int, k: int, repeats: int) -> dict[str, float]:
    """In-process ``search``: questions/s at ``batch`` (median of ``repeats`` passes) and ms for one question."""
    index.search(questions[:batch], k)  # warm
    rates = []
    for r in range(repeats):
        chunk = [questions[(r * batch + i) % len(questions)] for i in range(batch)]
        t0 = time.perf_counter()
        index.search(chunk, k)
        rates.append(batch / (time.perf_counter() - t0))
    singles = []
    for i in range(max(repeats * 4, 20)):
        t0 = time.perf_counter()
        index.retrieve([questions[i % len(questions)]], k)
        singles.append((time.perf_counter() - t0) * 1000)
    return {"ceiling_batch": batch, "inprocess_qps": round(statistics.median(rates), 2),
            "inprocess_ms_one": round(statistics.median(singles), 2)}


def start_server(overrides: list[str], timeout_s: float = 300.0) -> tuple[subprocess.Popen, str, float]:
    """``dagrag serve overrides`` on a free loopback port: (process, URL, seconds until it printed its address)."""
    import tempfile
    import threading

    from flows.commands.ui_screenshot import free_port

    port = free_port()
    t0 = time.perf_counter()
    errors = tempfile.TemporaryFile(mode="w+")  # the server's log: never a pipe that fills and blocks it
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", *overrides, f"serve.port={port}"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=errors, text=True, start_new_session=True)
    while time.perf_counter() - t0 < timeout_s:
        line = proc.stdout.readline()
        if line.startswith("serving "):
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drained until it exits
            return proc, f"http://127.0.0.1:{port}", time.perf_counter() - t0
        if not line and proc.poll() is not None:
            errors.seek(0)
            raise RuntimeError(f"dagrag serve {' '.join(overrides)} exited {proc.returncode}: "
                               f"{errors.read().strip()[-300:]}")
    proc.kill()
    raise RuntimeError(f"dagrag serve {' '.join(overrides)} did not start in {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def run_setup(name: str, overrides: list[str], params: LoadtestParams, questions: list[str]) -> list[dict]:
    """Every (max_batch, clients) level of one setup; each ``max_batch`` a fresh ``dagrag serve`` process."""
    from flows.serving.index import open_index

    index = open_index(*overrides)
    top = ceiling(index, questions, params.ceiling_batch, params.k, params.ceiling_repeats)
    base = {"setup": name, "method": index.info.method, "dataset": index.info.dataset,
            "index_fingerprint": index.info.fingerprint, **top}
    del index
    rows = []
    for max_batch in params.max_batch:
        proc, url, start_s = start_server([*overrides, f"serve.max_batch={max_batch}", f"serve.max_k={params.k}"])
        try:
            asyncio.run(drive(url, questions, min(8, params.warmup), params.warmup, 60.0, params.k))
            for clients in params.concurrency:
                before = server_counters(url)
                row = asyncio.run(drive(url, questions, clients, params.requests, params.duration_s, params.k))
                rows.append({**base, "max_batch": max_batch, **row, "serve_start_s": round(start_s, 2),
                             **split_ms(before, server_counters(url))})
                print(f"{name} max_batch={max_batch} clients={clients}: {row['questions_per_s']:.1f} q/s, "
                      f"p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, mean batch {rows[-1]['mean_batch']}",
                      file=sys.stderr, flush=True)
        finally:
            stop_server(proc)
    return rows


# ----------------------------------------------------------------------------- table and figure

COLUMNS = ["setup", "max_batch", "clients", "questions_per_s", "p50_ms", "p95_ms", "p99_ms", "mean_batch",
           "queue_wait_ms", "search_ms", "serialise_ms", "failures", "ceiling_batch", "inprocess_qps", "inprocess_ms_one"]
SPLIT_NOTE = ("queue_wait_ms, search_ms, serialise_ms: per question, the server's own account of where its time "
              "went (search_ms is its batch's wall time shared among the batch; the method's parts are in the "
              "catalog rows as part_<name>_ms)")


def table(rows: pd.DataFrame) -> str:
    from tasks.eval.report import markdown_table

    return markdown_table(rows[[c for c in COLUMNS if c in rows.columns]])


def figure(rows: pd.DataFrame, caption: str) -> bytes:
    """Throughput against concurrency, one panel line per setup and batching mode (log-2 x axis)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=120)
    for (setup, max_batch), g in rows.groupby(["setup", "max_batch"], sort=False):
        g = g.sort_values("clients")
        ax.plot(g["clients"], g["questions_per_s"], marker="o", linestyle="-" if max_batch > 1 else "--",
                label=f"{setup}, max_batch={max_batch}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("questions / s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("dagrag serve: throughput against concurrency", fontsize=10)
    fig.text(0.01, 0.005, caption, fontsize=6, color="#555")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def latest_rows(store: Any) -> pd.DataFrame:
    """The rows of the latest loadtest run per dataset in the catalog (empty when none)."""
    runs = store.query("SELECT run_id, dataset, created_at, metrics FROM metrics WHERE kind = 'loadtest' "
                       "ORDER BY created_at")
    if runs.empty:
        return pd.DataFrame()
    latest = runs.groupby("dataset").tail(1)
    rows = [dict(r, dataset=d) for d, m in zip(latest["dataset"], latest["metrics"]) for r in json.loads(m)["rows"]]
    return pd.DataFrame(rows)


def report_section(store: Any, out_dir: Path) -> list[str]:
    """``dagrag report``'s serving section: the latest loadtest's table and figure (nothing when none ran)."""
    rows = latest_rows(store)
    if rows.empty:
        return []
    from tasks.core.files import write_bytes

    write_bytes(figure(rows, "latest dagrag loadtest per dataset"), out_dir / "serving_throughput.png")
    return ["## Serving (dagrag loadtest)", "", table(rows), "",
            "![throughput against concurrency](serving_throughput.png)", "",
            "*questions/s and latency of `dagrag serve` from a loopback client, one question per request; "
            "max_batch=1 turns micro-batching off. inprocess_*: the same index's batched `search` in one process "
            "(the ceiling) and one question's in-process `retrieve`.*", ""]


# ----------------------------------------------------------------------------- the command

def main(argv: list[str] | None = None) -> int:
    from flows.runtime.config import load_config
    from flows.runtime.output import write_json
    from flows.runtime.provenance import git_sha
    from flows.runtime.exits import USER_ERRORS, fail
    from flows.serving.index import compose
    from tasks.core.files import write_bytes
    from tasks.data.ingest import load_dataset
    from tasks.core.store import Store

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore", "faiss.loader"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = sys.argv[1:] if argv is None else list(argv)
    if {"-h", "--help"} & set(args):
        print(__doc__)
        return 0
    if "--cfg" in args:
        from flows.commands.serve import print_config

        return print_config(args)
    try:
        base = load_config(compose(args))  # loadtest.* is the loadtest group's, checked like any other group
        params: LoadtestParams = base.loadtest
        questions = load_dataset(base.dataset, base.data_dir)[1]["question"].tolist()
        if not questions:
            raise ValueError("the dataset has no questions to send: pick one with questions (dataset.name=2wiki-dev)")
    except (*USER_ERRORS, ValueError) as err:
        fail(err)
    rows = []
    try:
        for name, overrides in params.setup_overrides().items():
            rows += run_setup(name, [*args, *overrides], params, questions)
    except USER_ERRORS as err:  # a setup's index is not built: its build command, in one line
        fail(err)
    frame = pd.DataFrame(rows)
    store = Store(base.artifacts_dir)
    run_id = f"loadtest-{time.strftime('%Y%m%d-%H%M%S')}"
    dataset = frame["dataset"].iloc[0]
    payload = {"rows": rows, "params": {k: v for k, v in params.__dict__.items()}, "git_sha": git_sha(),
               "command": "dagrag loadtest " + " ".join(args)}
    store.record_run(run_id, "loadtest", payload)
    store.record_metrics(run_id, "loadtest", "serve", dataset, payload, {})
    store.end_run(run_id, "completed")
    out = store.root / "reports" / f"loadtest-{dataset}"
    write_bytes(figure(frame, f"{payload['command']} @ {payload['git_sha'][:10]}"), out / "throughput.png")
    md = [f"# dagrag loadtest on {dataset}", "", f"`{payload['command']}` at {payload['git_sha'][:10]}", "",
          table(frame), "", SPLIT_NOTE, "", "![throughput against concurrency](throughput.png)", ""]
    write_bytes("\n".join(md).encode(), out / "loadtest.md")
    write_json(out / "loadtest.json", payload)
    print(table(frame))
    print("loadtest: " + json.dumps({"report": str(out / "loadtest.md"), "run_id": run_id}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
