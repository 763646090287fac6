"""What this process may use of the machine."""
from __future__ import annotations

import os


def cpu_threads() -> int:
    """The CPUs this process may run on (its affinity mask; what torch uses by default on this box)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
