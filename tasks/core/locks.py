"""The lock on computing one stage: ``_locks/<stage>-<fp>.lock`` under ``artifacts_dir``, so that a second run
waits for a stage being computed and reuses it instead of computing it again."""
from __future__ import annotations

import fcntl
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from tasks.core.files import LOCKS, StoreError


def _read_pid(fd: int) -> int | None:
    """The pid a stage lock's holder wrote into it (None while it is being written)."""
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (ValueError, OSError):
        return None


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the file at ``path`` (not removed or replaced)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


@contextmanager
def stage_lock(root: Path, stage: str, fp: str, *, on_wait: Callable[[int | None], None] | None = None,
               timeout_s: float | None = None, poll_s: float = 0.1) -> Iterator[None]:
    """Hold the exclusive lock on computing ``(stage, fp)`` in the ``artifacts_dir`` ``root``.

    An ``flock`` on ``_locks/<stage>-<fp>.lock``, which holds the holder's pid. If another
    process (or thread) holds it, ``on_wait(holder_pid or None)`` is called once and this waits:
    forever with ``timeout_s=None`` (a stage may take hours), else up to ``timeout_s`` and then
    :class:`StoreError`. Released on exit, exceptions included; a killed holder's lock is
    released by the OS when its process dies, so a crash never blocks a later run (the stale
    file is taken over). The file is removed on release; a waiter that locked a removed file
    notices (its inode is no longer at the path) and locks the new one.
    """
    path = root / LOCKS / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', stage)}-{fp}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    told = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not told:
                        told = True
                        if on_wait is not None:
                            on_wait(_read_pid(fd))
                    if deadline is not None and time.monotonic() > deadline:
                        raise StoreError(f"{stage} [{fp}] has been computed by another run (pid "
                                         f"{_read_pid(fd)}) for over {timeout_s:.0f} s; lock: {path}") from None
                    time.sleep(poll_s)
            if _is_at(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the holder removed this file on release: lock the one now at the path
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)  # before unlocking, so no waiter trusts a removed file
        os.close(fd)  # releases the flock
