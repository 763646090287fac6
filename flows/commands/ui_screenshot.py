"""``python -m flows.commands.ui_screenshot [overrides]`` (``make ui-screenshot``): look at a run in the Prefect UI as a
person would, without a terminal.

It starts ``prefect server start`` (UI on) on a free loopback port, runs ``dagrag evaluate`` against it twice
(``method=bm25`` on the sample dataset unless overridden; the second run is all cached), then opens the
second flow run's page in headless
Chromium and writes screenshots under ``artifacts/``: the flow run (``ui-flow-run.png``: name, tags, state,
task graph, logs), and its stage and metrics artifacts (``ui-artifact-stages.png``, ``ui-artifact-metrics.png``). (An
artifact key's history page, ``/artifacts/key/<key>``, renders blank in headless Chromium, so it is not shot.) The server is
stopped at the end. Needs the ``chromium`` binary (Debian: ``apt-get install -y chromium``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def browser() -> str | None:
    """The headless-capable Chromium on PATH, if any."""
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(api: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("prefect server start exited")
        try:
            if httpx.get(f"{api}/health", timeout=2).json() is True:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1)
    raise RuntimeError(f"prefect server did not answer within {timeout} s")


def screenshot(chrome: str, url: str, out: Path, size: str = "1600,1300") -> None:
    """Headless Chromium: load ``url``, let its scripts fetch and render for a while, write a PNG."""
    with tempfile.TemporaryDirectory(prefix="dagrag-chromium-") as profile:
        subprocess.run([chrome, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={size}", "--virtual-time-budget=30000",
                        f"--screenshot={out}", url], check=True, capture_output=True, timeout=180)


def artifacts_of(api: str, flow_run_id: str) -> list[dict]:
    """The keyed artifacts of one flow run, from the REST API."""
    import httpx

    from flows.runtime.api_server import api_request

    with httpx.Client(timeout=10) as client:
        found = api_request(client, "POST", f"{api}/artifacts/filter",
                            json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}).json()
    return [a for a in found if a.get("key")]


def main(argv: list[str]) -> int:
    from flows.runtime.api_server import tied_popen

    chrome = browser()
    if chrome is None:
        print("error: no chromium on PATH (Debian: apt-get install -y chromium)", file=sys.stderr)
        return 2
    out_dir = REPO / "artifacts"
    out_dir.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dagrag-ui-"))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_UI_ENABLED": "true", "PREFECT_UI_API_URL": api, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server = tied_popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                         str(port), "--analytics-off"], env=env, cwd=REPO, stdout=(work / "server.log").open("wb"),
                        stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(api, server)
        overrides = argv or ["method=bm25"]
        for _ in range(2):  # twice: the second run is all cached, and each artifact key has a history
            run = subprocess.run([sys.executable, "-m", "flows.commands.evaluate", *overrides,
                                  f"artifacts_dir={work / 'artifacts'}"], env=env, cwd=REPO, capture_output=True,
                                 text=True, timeout=1800)
            if run.returncode != 0:
                print(run.stdout[-2000:], run.stderr[-2000:], file=sys.stderr)
                return run.returncode
        metrics = json.loads(run.stdout.strip().splitlines()[-1].split(": ", 1)[1])
        base = f"http://127.0.0.1:{port}"
        shots = {"ui-flow-run.png": f"{base}/runs/flow-run/{metrics['run_id']}"}
        for art in artifacts_of(api, metrics["run_id"]):  # the stage and metrics artifacts
            shots[f"ui-artifact-{art['key'].split('-')[1]}.png"] = f"{base}/artifacts/artifact/{art['id']}"
        for name, url in shots.items():
            screenshot(chrome, url, out_dir / name)
            print(f"{out_dir / name}  ({url})")
        return 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
