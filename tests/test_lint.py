"""The code passes ``ruff check`` (the rules in pyproject.toml's ``[tool.ruff]``): no unused or undefined name, no
import that is not at the top without a reason, no syntax a later Python refuses."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_finds_nothing():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "flows", "tasks", "tests"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "No module named ruff" not in out.stderr, "ruff is not installed: .venv/bin/pip install -e '.[test]'"
    assert out.returncode == 0, out.stdout + out.stderr
