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


@contextmanager
def timed(what: str) -> Iterator[None]:
    """Log ``what: 1.2 s`` after the block, and ``what …`` when it starts if it runs longer than ``NOTICE_S``."""
    t0 = time.perf_counter()
    with notice_if_slow("%s …", what):
        yield
    log.info("%s: %.1f s", what, time.perf_counter() - t0)
