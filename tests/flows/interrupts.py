"""Children that a test interrupts the way a terminal's Ctrl-C does."""
from __future__ import annotations

import contextlib
import signal
from typing import Iterator


@contextlib.contextmanager
def ctrl_c_reaches_children() -> Iterator[None]:
    """Children started inside this block get SIGINT's default disposition, as a command typed in a terminal has.

    A non-interactive shell starts a background job (``make test &``, ``nohup ...``) with SIGINT ignored, and an
    ignored signal stays ignored across fork and exec: Python then never raises KeyboardInterrupt, and a test of
    Ctrl-C would measure the launcher, not the command. A handled signal is reset to the default on exec, so
    handling it here for the length of the spawn gives the child the default.
    """
    old = signal.getsignal(signal.SIGINT)
    if old is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
