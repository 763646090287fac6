"""What a long step shows on the terminal: a progress bar, or a log line when it starts and one when it ends.

A bar (:func:`progress_bar`) goes to stderr and appears only once its loop has run for ``DELAY_S``, so
a small run stays quiet at any size; it is cleared when the loop ends. A step with nothing to count
(loading a model or a retriever) is :func:`timed`: a line with its seconds when it ends. A step, and a
stage, says that it has started only when it is still at it after ``NOTICE_S`` (:func:`notice_if_slow`):
a long step is never silent, and a quick one logs a single line.

How work is shown, not what it computes: this module is not part of any stage's code identity
(:data:`tasks.core.code_identity.MACHINERY`), so changing a bar rebuilds nothing.
"""
from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from tqdm.auto import tqdm

log = logging.getLogger("dagrag")

DELAY_S = 2.0  # a loop shorter than this shows no bar
NOTICE_S = 1.0  # before any bar can appear, so the line does not land in the middle of one


def progress_bar(total: int, desc: str, unit: str = "it", disable: bool = False) -> tqdm:
    """A bar over ``total`` steps, shown after ``DELAY_S`` (``with progress_bar(...) as bar: bar.update(n)``)."""
    return tqdm(total=total, desc=desc, unit=unit, delay=DELAY_S, leave=False, disable=disable)


@contextmanager
def notice_if_slow(message: str, *args: object) -> Iterator[None]:
    """Log ``message % args`` if the block is still running after ``NOTICE_S``.

    The line is logged from a timer thread in this thread's context, so Prefect files it under the running task.
    """
    timer = threading.Timer(NOTICE_S, contextvars.copy_context().run, (log.info, message, *args))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


# seconds this process spent in each kind of timed block (its text), for a command's summary (flows.commands.update)
_timed_seconds: dict[str, float] = {}
_timed_lock = threading.Lock()


@contextmanager
def timed(what: str) -> Iterator[None]:
    """Log ``what: 1.2 s`` after the block, and ``what …`` when it starts if it runs longer than ``NOTICE_S``;
    the seconds are added to :func:`timed_seconds`."""
    t0 = time.perf_counter()
    with notice_if_slow("%s …", what):
        yield
    seconds = time.perf_counter() - t0
    with _timed_lock:
        _timed_seconds[what] = _timed_seconds.get(what, 0.0) + seconds
    log.info("%s: %.1f s", what, seconds)


def timed_seconds() -> dict[str, float]:
    """Seconds this process has spent so far in each kind of :func:`timed` block (a copy), e.g. ``{"loading the
    ONNX Runtime encoder (fp32) from the model cache": 0.3}``."""
    with _timed_lock:
        return dict(_timed_seconds)


def timed_since(before: dict[str, float]) -> dict[str, float]:
    """The :func:`timed` seconds spent since ``before`` (an earlier :func:`timed_seconds`), rounded; the blocks
    that ran only."""
    now = timed_seconds()
    return {what: round(s - before.get(what, 0.0), 3) for what, s in now.items() if s > before.get(what, 0.0)}


def process_seconds() -> float:
    """Seconds since this process was created: its start-up, interpreter and imports included. On Linux from the
    kernel's start time in clock ticks since boot, read against the boot clock (10 ms resolution; psutil adds it
    to the boot time in whole seconds, which can be a second off); elsewhere psutil's."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # field 22, starttime (after the command name)
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, AttributeError, ValueError, IndexError):
        import psutil

        return max(time.time() - psutil.Process().create_time(), 0.0)
