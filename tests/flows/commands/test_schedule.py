"""Scheduled builds against a real ``prefect server start``: register, trigger through the API, check the catalog.

The server and ``python -m flows.commands.schedule`` run as two processes on a free loopback port, as the README sets
them up. If the server cannot be started here, the test is skipped with the reason (never passed).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flows.runtime.api_server import api_request, tied_popen
from flows.commands.schedule import ConfigError, ScheduleEntry, load_schedule
from tasks.data.sample import generate_sample
from tasks.core.store import Store
from tests.flows.interrupts import ctrl_c_reaches_children

REPO = Path(__file__).resolve().parents[3]
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def test_schedule_config_is_checked():
    ok = load_schedule({"entries": [{"name": "a", "command": "index", "cron": "0 2 * * *", "overrides": ["method=bm25"]}]})
    assert ok.entries[0] == ScheduleEntry("a", "index", "0 2 * * *", ("method=bm25",))
    with pytest.raises(ConfigError, match="not a valid cron"):
        ScheduleEntry("a", "index", "61 * * * *")
    with pytest.raises(ConfigError, match="command must be one of"):
        ScheduleEntry("a", "benchmark", "0 2 * * *")
    with pytest.raises(ConfigError, match="unique"):
        load_schedule({"entries": [{"name": "a", "command": "index", "cron": "0 2 * * *"}] * 2})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A child in its own process group (so stopping it stops its children), killed if this test process dies, that
    SIGINT stops as Ctrl-C would."""
    with ctrl_c_reaches_children():
        return tied_popen(argv, env=env, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                          start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def wait_for(what: str, check, timeout: float, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            got = check()
        except httpx.HTTPError:
            got = None
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout} s\n{log.read_text()[-3000:]}")


class RetryingClient(httpx.Client):
    """Every call retried on 503 (the server's SQLite file was busy), as Prefect's own client does."""

    def request(self, *args, **kwargs) -> httpx.Response:
        return api_request(super(), *args, **kwargs)


def write_corpus(root: Path, n: int) -> None:
    corpus, questions = generate_sample(30, 4, seed=1)
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.json").write_text(json.dumps(corpus[:n]))
    (root / "questions.json").write_text(json.dumps(questions))


@pytest.fixture
def prefect_server(tmp_path):
    """``prefect server start`` on a free loopback port, its own PREFECT_HOME; the API URL."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_UI_ENABLED": "false", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_RUNNER_POLL_FREQUENCY": "2", "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_KEY", None)
    log = tmp_path / "server.log"
    server = start([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
                    "--analytics-off"], env, log)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{api}/health", timeout=2).json() is True:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"could not start `prefect server start` on port {port}: "
                            f"{log.read_text()[-500:] or 'no output'}")
            time.sleep(1)
        yield api, env
    finally:
        stop(server)


def test_scheduled_index_runs_cached_then_only_new_rows(tmp_path, prefect_server):
    api, env = prefect_server
    data, artifacts = tmp_path / "data", tmp_path / "artifacts"
    write_corpus(data / "tiny", 26)
    sched_dir = tmp_path / "sched"
    sched_dir.mkdir()
    (sched_dir / "test_schedule.yaml").write_text(f"""
defaults:
  - override hydra/job_logging: stdout
  - _self_
name: test
overrides: [artifacts_dir={artifacts}, data_dir={data}, dataset=hipporag, dataset.name=tiny]
entries:
  - {{name: tiny-dense, command: index, cron: "0 3 1 1 *", overrides: [method=dense]}}
  - {{name: tiny-bm25-eval, command: evaluate, cron: "0 4 1 1 *", overrides: [method=bm25]}}
hydra:
  output_subdir: null
  run: {{dir: .}}
""")
    log = tmp_path / "serve.log"
    serve = start([sys.executable, "-m", "flows.commands.schedule", "--config-dir", str(sched_dir),
                   "--config-name", "test_schedule"], env, log)
    http = RetryingClient(base_url=api, timeout=10)
    try:
        def deployments():
            found = http.post("/deployments/filter", json={"deployments": {"name": {"any_": [
                "tiny-dense", "tiny-bm25-eval"]}}}).json()
            return {d["name"]: d for d in found} if len(found) == 2 else None

        deps = wait_for("the deployments are registered", deployments, 180, serve, log)
        dep = deps["tiny-dense"]
        schedules = http.get(f"/deployments/{dep['id']}/schedules").json()
        assert [s["schedule"]["cron"] for s in schedules] == ["0 3 1 1 *"]
        assert set(dep["tags"]) == {"method:dense", "dataset:tiny"}

        def run_once(dep: dict = dep) -> tuple[dict, Store]:
            run = http.post(f"/deployments/{dep['id']}/create_flow_run", json={}).json()
            assert "id" in run, run

            def finished():
                state = http.get(f"/flow_runs/{run['id']}").json()["state"]
                return state if state and state["type"] in TERMINAL else None

            state = wait_for(f"flow run {run['id']} finishes", finished, 300, serve, log)
            assert state["type"] == "COMPLETED", (state, log.read_text()[-3000:])
            return run, Store(artifacts)

        first, store = run_once()
        ev = store.events(first["id"]).set_index("stage")
        assert set(ev["status"]) == {"computed"} and ev.loc["embed", "rows_computed"] == 26

        second, store = run_once()  # the corpus did not change: all cached, and the stage artifact says so
        assert set(store.events(second["id"])["status"]) == {"cached"}
        def stage_artifact():  # published by the on-completion hook, which runs after the state turns COMPLETED
            arts = http.post("/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [second["id"]]}}})
            return {a["key"]: a for a in arts.json()}.get("index-stages-dense-tiny")

        stages = wait_for("the run's stage artifact", stage_artifact, 60, serve, log)["data"]
        assert "all 2 stages cached: nothing computed" in stages
        assert http.get(f"/flow_runs/{second['id']}").json()["name"] == "index dense/tiny"

        write_corpus(data / "tiny", 30)  # the corpus grew by 4 passages: only those are embedded
        third, store = run_once()
        ev = store.events(third["id"]).set_index("stage")
        assert ev.loc["embed", "status"] == "computed" and ev.loc["embed", "rows_computed"] == 4

        evaluated, store = run_once(deps["tiny-bm25-eval"])  # an evaluate deployment: metrics in the catalog
        record = store.query("SELECT kind, method FROM metrics WHERE run_id = ?", [evaluated["id"]])
        assert record.to_dict("records") == [{"kind": "evaluate", "method": "bm25"}]
        assert list((artifacts / "runs").glob("*/*/scheduled-bm25-tiny/metrics.json"))
        assert set(store.query("SELECT status FROM runs")["status"]) == {"completed"}  # the flows' end hooks ran

        # Ctrl-C between runs: the serving process stops with one line, no traceback. (During a run the run's own
        # process gets the signal too, and Prefect's exit drain in it may print its interrupt: so wait until the
        # last run's process has exited; it finishes draining after its flow run is COMPLETED.)
        import psutil

        def no_run_process() -> bool:  # a run is a multiprocessing child (spawn_main); other children stay
            runs = []
            for child in psutil.Process(serve.pid).children(recursive=True):
                try:
                    runs += [child] if any("spawn_main" in part for part in child.cmdline()) else []
                except psutil.Error:
                    pass
            return not runs

        wait_for("the last run's process exits", no_run_process, 60, serve, log)
        os.killpg(serve.pid, signal.SIGINT)
        serve.wait(60)
        text = log.read_text()
        assert "stopped" in text.splitlines()[-1] and "Traceback" not in text, text[-3000:]
        assert "HTTP Request:" not in text and "faiss" not in text  # httpx's and faiss's chatter stays off
    finally:
        http.close()
        stop(serve)
