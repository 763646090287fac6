"""Prefect's API for a command: a long-lived server when ``PREFECT_API_URL`` names one, else Prefect's
temporary server, started by this process and tied to its life.

Prefect starts its temporary API server (``SubprocessASGIServer``: ``python -m uvicorn`` on a random port
8000–8999) as a child process and stops it from an ``atexit`` hook. A SIGKILL, an OOM kill, a SIGTERM
(Python runs no ``atexit`` hook on it) or a crash of the interpreter skips that hook, and the server lived
on as an orphan. :func:`ensure_api` starts the same server earlier, from the main thread, with
``PR_SET_PDEATHSIG`` set in the child between ``fork`` and ``exec``: the kernel then sends the server
SIGKILL the moment this process dies, however it dies. (The "parent" of ``PR_SET_PDEATHSIG`` is the thread
that forked, hence the main thread.) Prefect's own clients, in any thread, then find this instance in
Prefect's singleton registry and use it, so nothing else changes: the same server, the same start-up time,
Prefect's normal stop at a clean exit.

Linux only; elsewhere the server is Prefect's unchanged.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any, Callable
from unittest import mock

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


def tied_popen(*args: Any, **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` whose child is killed when the calling thread's process dies (Linux, main thread;
    anywhere else a plain ``Popen``: a child tied to a short-lived worker thread would die with the thread)."""
    prctl = _libc_prctl()
    if prctl is not None and threading.current_thread() is threading.main_thread():
        if kwargs.get("preexec_fn") is not None:
            raise ValueError("tied_popen sets preexec_fn itself")
        kwargs["preexec_fn"] = _die_with(os.getpid(), prctl)
    return subprocess.Popen(*args, **kwargs)


@functools.cache
def _tied_server_class() -> type:
    """``SubprocessASGIServer`` whose uvicorn child is started by :func:`tied_popen` (built on first use, so
    importing this module does not import Prefect's server)."""
    import prefect.server.api.server as server_module

    class TiedServer(server_module.SubprocessASGIServer):
        """Prefect's temporary API server, killed by the kernel when this process dies."""

        def _run_uvicorn_command(self) -> subprocess.Popen:
            # Prefect's own command line and environment; only the module's Popen is swapped, for this call
            shim = SimpleNamespace(Popen=tied_popen, TimeoutExpired=subprocess.TimeoutExpired)
            with mock.patch.object(server_module, "subprocess", shim):
                return super()._run_uvicorn_command()

    return TiedServer


def ensure_api() -> str | None:
    """Make sure this process has a Prefect API before a flow runs; returns its URL.

    - ``PREFECT_API_URL`` set (a long-lived ``prefect server start``): that URL, nothing is started.
    - A temporary server already running in this process (for example ``prefect_test_harness``): its URL.
    - Otherwise Prefect's temporary server is started now, tied to this process (see the module docstring),
      and registered as the server every Prefect client in this process uses.
    - Ephemeral mode disallowed and no URL: None (Prefect raises its own error when a flow starts).
    """
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

    url = PREFECT_API_URL.value()
    if url:
        return url
    if not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        return None
    current = SubprocessASGIServer._instances.get(None)
    if current is not None and current.running:
        return current.api_url
    if current is not None:  # registered but not running: replace it with a tied one
        SubprocessASGIServer._instances.pop(None, None)
    server = _tied_server_class()()  # registers itself under the default key (Prefect's singleton registry)
    server.start()
    return server.api_url
