"""Real servers for the serving tests: uvicorn in a thread of this process, or ``dagrag serve`` as a process."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx

from flows.commands.ui_screenshot import free_port

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def uvicorn_thread(service, port: int | None = None) -> Iterator[str]:
    """A real uvicorn server over ``service`` on a loopback port, in a thread; yields its base URL."""
    import uvicorn

    from flows.serving.app import create_app

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


class ServeProcess:
    """``dagrag serve`` (or ``dagrag mcp``) started as a user starts it (``python -m flows.cli serve …``), on a free
    port."""

    def __init__(self, overrides: list[str], env: dict[str, str] | None = None, command: str = "serve") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", command, *overrides, f"serve.port={self.port}"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})}, start_new_session=True)
        self.lines: list[str] = []
        self.errors: list[str] = []  # its stderr, read all along (a full pipe would block the server)
        self._reader = threading.Thread(target=lambda: self.errors.extend(self.proc.stderr), daemon=True)
        self._reader.start()

    def wait_ready(self, timeout_s: float = 120.0) -> "ServeProcess":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reader.join(10)
                raise RuntimeError(f"dagrag serve exited {self.proc.returncode}: {''.join(self.errors)}")
            line = self.proc.stdout.readline()
            if line:
                self.lines.append(line)
                if re.match(r"serving (MCP for )?\S+ on ", line):
                    threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()
                    return self
        raise RuntimeError("dagrag serve did not print its address in time")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise
        self._reader.join(10)
        return self.proc.returncode, "".join(self.errors)

    def __enter__(self) -> "ServeProcess":
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def post(url: str, payload, **kwargs) -> httpx.Response:
    return httpx.post(url, json=payload, timeout=60, **kwargs)


def build_bm25(root: Path, n_passages: int = 120, n_questions: int = 12) -> list[str]:
    """A bm25 index of a small sample corpus under ``root``, built by the index flow; its overrides."""
    from flows.runtime.pipeline import index_flow
    from tests.flows.conftest import make_config

    overrides = ["method=bm25", "dataset=sample", f"dataset.n_passages={n_passages}",
                 f"dataset.n_questions={n_questions}", f"artifacts_dir={root / 'artifacts'}"]
    index_flow(make_config(root, *overrides))
    return overrides


def sample_questions(overrides: list[str]) -> list[str]:
    """The sample corpus's own questions (from the ingested questions table)."""
    import pandas as pd

    root = Path(next(o for o in overrides if o.startswith("artifacts_dir=")).split("=", 1)[1])
    return pd.read_parquet(next(root.glob("sample-*/ingest/questions-*.parquet")))["question"].tolist()
