"""What a command writes out: its JSON files, and its machine-readable last line (``command: {json}``), printed
after Prefect's queued events and logs are delivered."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from tasks.core.files import write_bytes


def print_last_line(prefix: str, payload: dict[str, Any]) -> None:
    """Print ``prefix: {json}`` as the process's very last line (Prefect's shutdown chatter silenced)."""
    logging.getLogger("prefect").setLevel(logging.WARNING)
    deliver_prefect_queues()
    print(f"{prefix}: " + json.dumps(payload, default=str), flush=True)


def deliver_prefect_queues(timeout_s: float = 10.0) -> None:
    """Send Prefect's queued events and API logs now, before the last line: left to the exit, their workers' own
    loggers ("EventsWorker", outside Prefect's tree) warned after it about the items still queued. This flush is
    deliberate, so their "still processing" warnings are not shown (errors are). A later flow run in the process
    (a sweep's next job) starts new workers."""
    for module, service in (("prefect.events.worker", "EventsWorker"), ("prefect.logging.handlers", "APILogWorker")):
        loaded = sys.modules.get(module)
        if loaded is not None:
            logging.getLogger(service).setLevel(logging.ERROR)
            getattr(loaded, service).drain_all(timeout=timeout_s, at_exit=False)


def write_json(path: Path, payload: dict) -> None:
    """Write a JSON file atomically."""
    write_bytes(json.dumps(payload, indent=2, default=str).encode(), path)
