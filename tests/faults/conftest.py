"""Fault tests: damage real files of a real store, then run the real flow or command: it must never trust a damaged file.

Each case must end one of two ways: the damage is found and the work computed again, to the metrics of a clean
run; or the command stops with one line that names the file and the fix. Never a silent wrong result, never a
crash loop. A clean store is built once per module and copied for each case (the catalog follows a copied store).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.flows.conftest import make_config, prefect_isolated  # noqa: F401  (the session's Prefect server)

SMALL = ("dataset=sample", "dataset.n_passages=60", "dataset.n_questions=12")
RECALL = ("recall@2", "recall@5", "recall@10")


def recall(metrics: dict) -> dict:
    """The metrics a damaged store must give again."""
    return {k: metrics[k] for k in RECALL}


def stage_file(artifacts: Path, stage: str, name: str) -> Path:
    """The one output file ``name`` of ``stage`` in the store."""
    (found,) = artifacts.glob(f"*/{stage}/{name}-*")
    return found


def row_part(artifacts: Path, stage: str) -> Path:
    """The one part of ``stage``'s row cache (the small sample's rows are computed in one part)."""
    (found,) = artifacts.glob(f"_rows/{stage}/*/part-*.parquet")
    return found


def truncate(path: Path, keep: float = 0.5) -> None:
    os.truncate(path, int(path.stat().st_size * keep))


def flip(path: Path, n: int = 256, at: float = 0.5) -> None:
    """Invert ``n`` bytes in place at ``at`` of the file's length (its size stays the same)."""
    with open(path, "r+b") as fh:
        fh.seek(int(path.stat().st_size * at))
        data = fh.read(n)
        fh.seek(-len(data), os.SEEK_CUR)
        fh.write(bytes(b ^ 0xFF for b in data))


def quarantined(artifacts: Path) -> list[str]:
    """Names of the files in the store's quarantine."""
    return sorted(p.name for p in (artifacts / "_quarantine").rglob("*") if p.is_file())


def built_store(tmp_path_factory: pytest.TempPathFactory, *overrides: str) -> tuple[Path, dict]:
    """A clean store built by one evaluate run, and its metrics."""
    from flows.commands.evaluate import evaluate_flow

    root = tmp_path_factory.mktemp("clean")
    metrics = evaluate_flow(make_config(root, *overrides), str(root / "run"))
    return root / "artifacts", metrics


def copy_store(clean: Path, tmp_path: Path) -> Path:
    """A copy of a clean store at ``tmp_path/artifacts`` (where :func:`make_config` points)."""
    shutil.copytree(clean, tmp_path / "artifacts", ignore=shutil.ignore_patterns("runs"))
    return tmp_path / "artifacts"
