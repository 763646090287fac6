"""A dagrag command run as a child process, for the commands that measure other commands (growth, scale)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_child(command: str, argv: list[str], timeout_s: int) -> tuple[dict[str, Any] | None, str]:
    """Run ``dagrag command argv`` (as ``python -m flows.cli``, so the child starts and exits as a user's command
    does) from the repository root, tied to this process (it dies with it); (its ``command: {json}`` last line,
    "") or (None, why it failed: its exit status and last line, or the timeout)."""
    from flows.runtime.api_server import tied_popen

    proc = tied_popen([sys.executable, "-m", "flows.cli", command, *argv], stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s or None)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, f"stopped after {timeout_s} s"
    except BaseException:  # interrupted: the child goes with this call
        proc.kill()
        raise
    last = [ln for ln in stdout.splitlines() if ln.startswith(f"{command}: ")]
    if proc.returncode != 0 or not last:
        tail = (stderr or stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return None, f"failed (exit {proc.returncode}): {tail[0][:200]}"
    return json.loads(last[-1][len(command) + 2:]), ""
