"""Shared fixtures for the test suite."""
from __future__ import annotations

import os

import pytest

# stage tasks called via ``.fn`` log outside any flow run: nothing to send to an API
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")

from tasks.core.stage import RunContext  # noqa: E402


@pytest.fixture
def ctx(tmp_path) -> RunContext:
    """A run context over a fresh, empty artifacts dir under ``tmp_path``."""
    return RunContext(str(tmp_path / "artifacts"), "ds", "run1")
