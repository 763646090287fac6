"""A killed command leaves no process behind : not Prefect's temporary API server, not anything.

The command runs as a user runs it (``python -m flows.cli evaluate …``, what ``.venv/bin/dagrag`` calls) in a
subprocess with no ``PREFECT_API_URL``, so it starts its own temporary server. Every descendant it ever has
is recorded while it runs; it is killed at a chosen moment; then every recorded process must be gone.
``flows.runtime.api_server.tied_popen`` is also tested alone, with a plain ``Popen`` as the control that shows the
check does see an orphan.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from flows.runtime.api_server import tied_popen
from tests.flows.interrupts import ctrl_c_reaches_children

REPO = Path(__file__).resolve().parents[3]
GRACE_S = 15.0          # how long a killed process's descendants may take to go (they go in milliseconds)
START_LIMIT_S = 240.0   # how long a command may take to reach the moment the test kills it at


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _survivors(procs: list[psutil.Process], grace_s: float = GRACE_S) -> list[psutil.Process]:
    """The processes still alive once ``grace_s`` has passed (returns as soon as none is)."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        alive = [p for p in procs if _alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in procs if _alive(p)]


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid}: {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            out.append(str(p.pid))
    return out


def _kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.mark.parametrize("tied", [True, False], ids=["tied_popen", "plain_popen_control"])
def test_tied_popen_child_dies_with_its_parent(tied):
    """A parent SIGKILLed after ``tied_popen``: its child goes too. With a plain Popen the child survives
    (the control: the check below sees an orphan when there is one)."""
    starter = "tied_popen" if tied else "subprocess.Popen"
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        from flows.runtime.api_server import tied_popen
        child = {starter}([sys.executable, "-c", "import time; time.sleep(120)"])
        print(child.pid, flush=True)
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        assert _alive(child)
    finally:
        parent.kill()
        parent.wait()
    try:
        if tied:
            assert not _survivors([child])
        else:
            assert _survivors([child], grace_s=1.0) == [child]
    finally:
        _kill_all([child])


def test_tied_popen_in_a_worker_thread_does_not_die_with_the_thread():
    """PR_SET_PDEATHSIG follows the forking *thread*: from a worker thread tied_popen must be a plain Popen,
    or the child would die when that thread ends while the process lives on."""
    box = {}
    worker = threading.Thread(target=lambda: box.setdefault(
        "child", tied_popen([sys.executable, "-c", "import time; time.sleep(60)"])))
    worker.start()
    worker.join()
    child = box["child"]
    try:
        time.sleep(0.5)  # a SIGKILL on thread exit would have landed by now
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_tied_popen_refuses_a_second_preexec_fn():
    with pytest.raises(ValueError):
        tied_popen(["true"], preexec_fn=lambda: None)


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("prefect-home"))


@pytest.mark.parametrize("moment, sig", [
    ("server_starting", signal.SIGKILL),   # the server child exists, its start-up is not finished
    ("indexing", signal.SIGKILL),          # the flow run began: ingest, then loading and running the embedder
    ("indexing", signal.SIGTERM),          # Python runs no atexit hook on SIGTERM
])
def test_killed_command_leaves_no_process(moment, sig, tmp_path, prefect_home):
    log_path = tmp_path / "out.log"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = prefect_home
    argv = [sys.executable, "-m", "flows.cli", "evaluate", "method=dense", "dataset.n_passages=60",
            "dataset.n_questions=10", f"artifacts_dir={tmp_path / 'artifacts'}"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    me = psutil.Process(proc.pid)
    seen: dict[int, psutil.Process] = {}
    servers: set[int] = set()  # Prefect's temporary API server (python -m uvicorn … prefect.server…)

    def record() -> None:
        try:
            for p in me.children(recursive=True):
                seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass
        # a child seen between its fork and its exec still shows the parent's command line: look again each time
        for pid, p in seen.items():
            if pid not in servers:
                try:
                    if "uvicorn" in p.cmdline():
                        servers.add(pid)
                except psutil.Error:
                    pass

    def reached() -> bool:
        began = "Beginning flow run" in log_path.read_text()
        return bool(servers) or began if moment == "server_starting" else began

    deadline = time.monotonic() + START_LIMIT_S
    try:
        while not reached():
            record()
            assert proc.poll() is None, f"the command ended (rc {proc.returncode}) before {moment}:\n" \
                                        f"{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"never reached {moment}"
            time.sleep(0.02)
        record()
        assert proc.poll() is None, f"the command ended before it could be killed at {moment}"
        proc.send_signal(sig)
        proc.wait(timeout=60)
        survivors = _survivors(list(seen.values()))
        assert not survivors, f"orphans after {sig.name} at {moment}: {_describe(survivors)}"
        # with no PREFECT_API_URL the command starts Prefect's temporary server: the check above covered it
        assert servers, f"no temporary server was seen: {_describe(list(seen.values()))}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill_all(list(seen.values()))


def test_ensure_api_starts_nothing_when_an_api_is_configured():
    """With an API configured (here the test session's server, as with ``PREFECT_API_URL`` and a long-lived
    ``prefect server start``), :func:`ensure_api` returns its URL and starts no process."""
    from prefect.settings import PREFECT_API_URL

    from flows.runtime.api_server import ensure_api

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    assert PREFECT_API_URL.value()
    assert ensure_api() == PREFECT_API_URL.value()
    assert {p.pid for p in me.children(recursive=True)} <= before


def _run_watching_children(argv: list[str], env: dict[str, str]):
    """Run a command to its end, recording every descendant it has meanwhile and which of its children are
    uvicorn servers: (process, (stdout, stderr), {pid: process}, {server pids})."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # files: a full pipe would block
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err, text=True)
        me, seen, servers = psutil.Process(proc.pid), {}, set()
        while proc.poll() is None:
            try:
                for p in me.children(recursive=True):
                    seen.setdefault(p.pid, p)
                    # the command's own children only: the server runs `file` (platform.architecture), and that
                    # child shows the server's command line until its exec (seen as a second server under load)
                    if p.ppid() == proc.pid and "uvicorn" in p.cmdline():
                        servers.add(p.pid)
            except psutil.Error:
                pass
            time.sleep(0.02)
        out.seek(0)
        err.seek(0)
        return proc, (out.read(), err.read()), seen, servers


def test_temporary_server_launches_answers_and_stops(tmp_path, monkeypatch):
    """The early-launched server is Prefect's real API: it answers /health and Prefect's own client, and
    ``stop`` ends the process."""
    import httpx

    from flows.runtime.api_server import TemporaryServer

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    server = TemporaryServer()
    server.launch()
    try:
        url = server.wait(120)
        assert url == server.api_url and server.ready
        assert httpx.get(f"{url}/health", timeout=5).json() is True
        assert httpx.get(f"{url}/admin/version", timeout=5).status_code == 200
        child = psutil.Process(server.process.pid)
        assert "uvicorn" in child.cmdline() and "prefect.server.api.server:create_app" in child.cmdline()
    finally:
        server.stop()
    assert not _survivors([child], grace_s=5.0) and server.process is None
    server.stop()  # twice is fine


def test_dagrag_command_that_fails_its_checks_stops_its_early_server(tmp_path):
    """``dagrag evaluate`` launches the temporary server before its checks; a user error stops it again:
    exit 2, the one-line error, and no process left behind (observed while it ran)."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    argv = [sys.executable, "-m", "flows.cli", "evaluate", "method=bm25", "dataset=hipporag",
            "dataset.name=missing", f"data_dir={tmp_path}", f"artifacts_dir={tmp_path / 'artifacts'}"]
    proc, (out, err), seen, servers = _run_watching_children(argv, env)
    assert proc.returncode == 2 and err.strip().splitlines()[-1].startswith("error: "), err
    assert servers, "no early server was launched"  # the control: there was something to stop
    assert not _survivors(list(seen.values()), grace_s=2.0)


def test_dagrag_command_runs_on_its_own_early_server_and_leaves_nothing(tmp_path):
    """With no ``PREFECT_API_URL``, ``dagrag evaluate`` runs its flow on the server it launched first thing:
    the run completes, the flow's API calls reached that server (it is the only one), and no process is left."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    argv = [sys.executable, "-m", "flows.cli", "evaluate", "method=bm25", "dataset.n_passages=60",
            "dataset.n_questions=10", f"artifacts_dir={tmp_path / 'artifacts'}"]
    proc, (out, err), seen, servers = _run_watching_children(argv, env)
    out += err
    assert proc.returncode == 0, out[-3000:]
    # any line, not the last: stderr's progress bars may close after the metrics line under load
    assert any(line.startswith("metrics: ") for line in out.splitlines()) and "Finished in state Completed" in out
    assert len(servers) == 1, f"expected one temporary server, saw {len(servers)}"
    assert (tmp_path / "prefect-home" / "prefect.db").exists()  # the server recorded the run in its database
    assert not _survivors(list(seen.values()), grace_s=5.0)


def test_api_request_retries_503_then_returns_the_answer():
    """A real HTTP server that answers 503 (a busy SQLite file) twice, then 200; a 500 is not retried."""
    import http.server
    import threading

    import httpx

    from flows.runtime.api_server import api_request

    calls: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (the stdlib's name)
            calls.append(self.path)
            busy = self.path == "/busy" and len(calls) <= 2
            status = 503 if busy else 500 if self.path == "/broken" else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with httpx.Client(timeout=5) as client:
            assert api_request(client, "POST", f"{base}/busy").status_code == 200
            assert calls == ["/busy"] * 3
            assert api_request(client, "POST", f"{base}/broken").status_code == 500
            assert calls[3:] == ["/broken"]
            calls.clear()
            assert api_request(client, "POST", f"{base}/busy", patience_s=0).status_code == 503
            assert calls == ["/busy"]
    finally:
        server.shutdown()


_EARLY_LAUNCH = textwrap.dedent("""
    import sys, psutil
    import flows.runtime.api_server as api
    api.launch_api()
    assert "prefect" not in sys.modules, "launching imported Prefect"
    server = psutil.Process(api._server.process.pid)
    assert "uvicorn" in server.cmdline()
    url = api.ensure_api()
    print("URL", url)
    print("RUNNING" if server.is_running() else "STOPPED")  # stop_api reaps the child before it returns
    api.stop_api()
""")


@pytest.mark.parametrize("profile_names_api", [False, True])
def test_early_server_is_launched_before_prefect_loads_and_stopped_if_a_profile_names_an_api(tmp_path,
                                                                                          profile_names_api):
    """``launch_api`` decides from the environment alone, so the server's start-up overlaps Prefect's import
    too; :func:`ensure_api` then reads Prefect's settings: an API named in the active profile (not in the
    environment) is used and the early server stopped; with none, the early server is the API."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL" and k != "PREFECT_PROFILE"}
    env["PREFECT_HOME"] = str(home)
    if profile_names_api:
        (home / "profiles.toml").write_text('active = "remote"\n\n[profiles.remote]\n'
                                            'PREFECT_API_URL = "http://127.0.0.1:9/api"\n')
    done = subprocess.run([sys.executable, "-c", _EARLY_LAUNCH], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=START_LIMIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split()
    if profile_names_api:
        assert lines == ["URL", "http://127.0.0.1:9/api", "STOPPED"]
    else:
        assert lines[:1] == ["URL"] and lines[1].startswith("http://127.0.0.1:") and lines[2] == "RUNNING"


def test_flow_runs_on_a_command_s_own_temporary_server_send_no_heartbeats(monkeypatch):
    """That server stops with the command, so nothing could watch heartbeats; Prefect's heartbeat thread sleeps
    in 1-s steps that every flow run waits out when it ends. On an API named elsewhere Prefect's setting stands."""
    from prefect import flow
    from prefect.settings import get_current_settings, temporary_settings

    import flows.runtime.api_server as api

    seen = []

    @flow
    def probe() -> None:
        seen.append(get_current_settings().flows.heartbeat_frequency)

    with temporary_settings(updates={"flows.heartbeat_frequency": 180}):  # Prefect's default (this session: None)
        monkeypatch.setattr(api, "_server", object())  # as after ensure_api() launched one
        with api.flow_run_settings():
            probe()
        monkeypatch.setattr(api, "_server", None)  # PREFECT_API_URL, a profile's API, or the test harness's
        with api.flow_run_settings():
            probe()
        url = str(get_current_settings().api.url)
        monkeypatch.setenv("PREFECT_API_URL", url)  # a child of `dagrag growth` on its parent's temporary server
        monkeypatch.setenv(api.TEMPORARY_API_ENV, url)
        with api.flow_run_settings():
            probe()
        monkeypatch.setenv(api.TEMPORARY_API_ENV, "http://127.0.0.1:9/api")  # another server was temporary
        with api.flow_run_settings():
            probe()
    assert seen == [None, 180, None, 180]


def test_temporary_server_runs_in_its_own_session_with_its_stderr_in_a_file(tmp_path, monkeypatch):
    """Ctrl-C in a terminal signals the whole foreground process group: the server must not be in it, or the
    flow run loses its API and Prefect retries it for minutes. Its stderr (a shutdown traceback when it is stopped
    while still starting) goes to a file, not to the command's stderr."""
    from flows.runtime.api_server import TemporaryServer

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    server = TemporaryServer()
    server.launch()
    try:
        pid = server.process.pid
        assert os.getsid(pid) == pid != os.getsid(0)
        assert os.readlink(f"/proc/{pid}/fd/2") != os.readlink("/proc/self/fd/2")
        server.wait(120)
    finally:
        server.stop()
    assert server.log is None  # closed with the server


def test_ctrl_c_ends_a_running_command_at_once_with_one_line(tmp_path):
    """SIGINT to the command's process group, as a terminal's Ctrl-C sends it, while the flow embeds: the command
    ends within seconds (not minutes) with exit status 130, one ``interrupted:`` line and no traceback, and
    leaves no process behind."""
    log_path = tmp_path / "out.log"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    argv = [sys.executable, "-m", "flows.cli", "evaluate", "method=dense", "dataset.n_passages=4000",
            "dataset.n_questions=10", f"artifacts_dir={tmp_path / 'artifacts'}"]
    with open(log_path, "w") as log, ctrl_c_reaches_children():
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    me, seen = psutil.Process(proc.pid), {}
    deadline = time.monotonic() + START_LIMIT_S
    try:
        while "embed          computing" not in log_path.read_text():
            for p in me.children(recursive=True):
                seen.setdefault(p.pid, p)
            assert proc.poll() is None, f"the command ended (rc {proc.returncode}):\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "never reached the embeddings"
            time.sleep(0.05)
        seen.update({p.pid: p for p in me.children(recursive=True)})
        assert any("uvicorn" in p.cmdline() for p in seen.values())  # there was a server to keep alive
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130, log_path.read_text()[-3000:]
        out = log_path.read_text()
        assert out.strip().splitlines()[-1].startswith("interrupted: ") and "Traceback" not in out, out[-3000:]
        assert not _survivors(list(seen.values()))
        from tasks.core.store import Store

        runs = Store(tmp_path / "artifacts").query("SELECT status, ended_at FROM runs")
        assert runs["status"].tolist() == ["crashed"] and runs["ended_at"].notna().all()  # the catalog says so
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _kill_all(list(seen.values()))
