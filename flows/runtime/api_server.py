"""Prefect's API for a command: a long-lived server when ``PREFECT_API_URL`` names one, else a temporary
server started by this process, tied to its life, and started early so that its start-up overlaps the command's.

The temporary server is Prefect's own (the ``python -m uvicorn … prefect.server.api.server:create_app`` command
line and environment of Prefect's ``SubprocessASGIServer``), with four differences:

* **Tied.** It is started with ``PR_SET_PDEATHSIG`` set in the child between ``fork`` and ``exec``: the kernel
  sends it SIGKILL the moment this process dies, however it dies (SIGKILL, an OOM kill, SIGTERM, on which
  Python runs no ``atexit`` hook, or a crash). Prefect's own server lived on as an orphan then. (The "parent"
  of ``PR_SET_PDEATHSIG`` is the thread that forked, hence the main thread.)
* **Early.** ``dagrag COMMAND`` launches it before the command's imports and config checks, Prefect's import
  included (:func:`launch_api` reads only the environment), and :func:`ensure_api` waits for it only when a
  flow is about to run. Its start-up (about 4.5 s on 2 cores) then overlaps the command's own (about 4 s).
* **Apart.** It runs in a session of its own, so a terminal's Ctrl-C (sent to the whole foreground process group)
  interrupts only the command, which then ends its flow run on a live server; its stderr goes to a file, quoted
  only when it fails to start.
* **Not imported here.** This process talks to it over HTTP, as to any server (``PREFECT_API_URL`` is set to
  it once it answers), so it never imports Prefect's server package (about 3 s).

A command that fails its checks stops the server it launched. Linux only for the tie; elsewhere the server is
a plain child process, stopped at a clean exit.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any, Callable, Iterator

log = logging.getLogger("dagrag")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with(parent_pid: int, prctl: Callable[..., int]) -> Callable[[], None]:
    """A ``preexec_fn``: in the forked child, ask for SIGKILL when the forking thread dies; exit at once if
    the parent already died between ``fork`` and this call (the child was re-parented)."""

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def _libc_prctl() -> Callable[..., int] | None:
    """``prctl(2)`` from libc, resolved in the parent (nothing is loaded after ``fork``); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def api_request(client: Any, method: str, url: str, patience_s: float = 60.0, **kwargs: Any) -> Any:
    """``client.request(method, url, **kwargs)``, retried while the server answers 503, as Prefect's own client
    does: a Prefect server answers 503 when its SQLite file is busy (``is_client_retryable_exception`` in
    ``prefect/server/api/server.py``), which happens on a loaded box. ``client`` is an ``httpx.Client``."""
    deadline = time.monotonic() + patience_s
    while True:
        response = client.request(method, url, **kwargs)
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        time.sleep(1.0)


def tied_popen(*args: Any, **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` whose child is killed when the calling thread's process dies (Linux, main thread;
    anywhere else a plain ``Popen``: a child tied to a short-lived worker thread would die with the thread)."""
    prctl = _libc_prctl()
    if prctl is not None and threading.current_thread() is threading.main_thread():
        if kwargs.get("preexec_fn") is not None:
            raise ValueError("tied_popen sets preexec_fn itself")
        kwargs["preexec_fn"] = _die_with(os.getpid(), prctl)
    return subprocess.Popen(*args, **kwargs)


class TemporaryServer:
    """Prefect's temporary API server in a tied child process (see the module docstring)."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        self.ready = False
        self.log: IO[bytes] | None = None  # the child's stderr

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def launch(self) -> None:
        """Start the child now; do not wait for it."""
        self.port = _free_port()
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        if "prefect.settings" in sys.modules:  # settings this process may hold beyond its environment and files
            from prefect.settings import get_current_settings

            env.update(get_current_settings().to_environment_variables(exclude_unset=True))
        env.pop("PREFECT_API_URL", None)
        app_dir = os.path.dirname(os.path.dirname(importlib.util.find_spec("prefect").origin))
        self._close_log()
        # its own session: Ctrl-C in the terminal interrupts this command, which then ends its flow run on a live
        # server, instead of killing the server too (the flow then retried it for minutes). Its stderr goes to a
        # file, shown only if it fails to start: stopped while still starting, it prints a shutdown traceback
        self.log = tempfile.TemporaryFile()
        self.process = tied_popen([sys.executable, "-m", "uvicorn", "--app-dir", app_dir, "--factory",
                                   "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port",
                                   str(self.port), "--log-level", "error", "--lifespan", "on"], env=env,
                                  stderr=self.log, start_new_session=True)
        atexit.register(self.stop)
        log.debug("temporary Prefect server launched on %s", self.api_url)

    def wait(self, timeout_s: float) -> str:
        """Block until the server answers ``/health`` (relaunching on a port taken meanwhile); its API URL."""
        import httpx

        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self.process.poll() if self.process is not None else None
                if code == 3:  # uvicorn could not bind: the port was taken after we picked it
                    self.launch()
                elif code is not None:
                    raise RuntimeError(f"Prefect's temporary server exited with status {code} while starting "
                                       f"({self.log_tail()}); start one with `prefect server start` and export "
                                       f"PREFECT_API_URL")
                try:
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        self.ready = True
                        return self.api_url
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"Prefect's temporary server did not answer within {timeout_s:.0f} s "
                                       f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")
                time.sleep(0.05)

    def stop(self) -> None:
        """Terminate the child (SIGTERM, then SIGKILL after 5 s); safe to call twice."""
        proc, self.process, self.ready = self.process, None, False
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._close_log()

    def log_tail(self, lines: int = 3) -> str:
        """The last lines the child wrote to stderr, joined by " | " ("no output" if none)."""
        if self.log is None:
            return "no output"
        self.log.seek(0)
        tail = [ln.strip() for ln in self.log.read().decode(errors="replace").splitlines() if ln.strip()][-lines:]
        return " | ".join(tail) or "no output"

    def _close_log(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


def _free_port() -> int:
    """A loopback port free now (the kernel's pick); a race with another process is handled by ``wait``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_server: TemporaryServer | None = None
_FALSE = {"0", "false", "f", "no", "n", "off"}  # what pydantic reads as a false boolean
# set beside PREFECT_API_URL when that URL is a temporary server a dagrag process launched: the child commands
# of `dagrag growth` and `dagrag scale` inherit both and know the server stops with their parent
TEMPORARY_API_ENV = "DAGRAG_TEMPORARY_API_URL"


def _harness_url() -> str | None:
    """The URL of a temporary server Prefect itself runs in this process (``prefect_test_harness``), if any."""
    module = sys.modules.get("prefect.server.api.server")
    current = getattr(module, "SubprocessASGIServer", None)
    current = current._instances.get(None) if current is not None else None
    return current.api_url if current is not None and current.running else None


def launch_api() -> None:
    """Start the temporary server now, without waiting, unless this process's environment names an API
    (``PREFECT_API_URL``) or turns ephemeral mode off, or a server runs already. From the main thread, before
    the command's own start-up, and before anything imports Prefect (about 1.7 s, which the server's start-up
    now overlaps too): an API or setting named elsewhere (a Prefect profile, ``prefect.toml``) is found by
    :func:`ensure_api`, which stops this server again."""
    global _server
    if _server is not None or os.environ.get("PREFECT_API_URL") or _harness_url() \
            or os.environ.get("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", "").strip().lower() in _FALSE:
        return
    _server = TemporaryServer()
    _server.launch()


@contextlib.contextmanager
def flow_run_settings() -> Iterator[None]:
    """Prefect settings for the command's flow runs. On a temporary server (the one this process launched, or
    the one its parent command launched and named in ``DAGRAG_TEMPORARY_API_URL``), no flow-run heartbeats:
    Prefect's heartbeat thread sleeps in 1-s steps and every flow run waits for its current step when it ends
    (0.5 s on average, up to 1 s, per run: a cached evaluate took 1.1, 2.2 or 3.2 s, never between), and that
    server stops with the command, so nothing could watch them. A server named by ``PREFECT_API_URL`` alone
    (where Prefect can mark a run whose heartbeats stop as crashed) keeps Prefect's setting."""
    inherited = os.environ.get(TEMPORARY_API_ENV)
    if _server is None and not (inherited and inherited == os.environ.get("PREFECT_API_URL")):
        yield
        return
    from prefect.settings import temporary_settings

    with temporary_settings(updates={"flows.heartbeat_frequency": None}):
        yield


def stop_api() -> None:
    """Stop the temporary server this process launched (a command that failed its checks)."""
    global _server
    if _server is not None:
        _server.stop()
        _server = None


def ensure_api() -> str | None:
    """Make sure this process has a Prefect API before a flow runs; returns its URL.

    - ``PREFECT_API_URL`` set (a long-lived ``prefect server start``): that URL, nothing is started; a server
      :func:`launch_api` started early because the setting was not in the environment is stopped.
    - A temporary server Prefect runs in this process (for example ``prefect_test_harness``): its URL.
    - Otherwise the temporary server (launched now unless :func:`launch_api` did earlier) is waited for, and
      ``PREFECT_API_URL`` is set to it for this process and its children (Dask workers included), and
      ``DAGRAG_TEMPORARY_API_URL`` too, which tells a child command that the server stops with this process.
    - Ephemeral mode disallowed and no URL: None (Prefect raises its own error when a flow starts).
    """
    from prefect.context import refresh_global_settings_context
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_ALLOW_EPHEMERAL_MODE,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    )

    url = PREFECT_API_URL.value() or _harness_url()
    if url or not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        if _server is not None and url != _server.api_url:
            stop_api()  # launched early from the environment alone; Prefect's settings name another API
        return url or None
    launch_api()
    if _server is None:
        return None
    url = _server.wait(float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()))
    os.environ["PREFECT_API_URL"] = os.environ[TEMPORARY_API_ENV] = url
    refresh_global_settings_context()
    return url
