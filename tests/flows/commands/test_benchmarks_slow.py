"""Benchmark-sized checks on ../shared/datasets (``make test-slow``): reference figures must reproduce."""
from __future__ import annotations

from pathlib import Path

import pytest

from flows.commands.evaluate import evaluate_flow
from tests.flows.conftest import make_config

DATA = Path(__file__).resolve().parents[3] / "shared" / "datasets"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (DATA / "hotpotqa-100").exists(), reason="../shared/datasets not present")]
HOTPOT = ["dataset=hipporag", "dataset.name=hotpotqa-100", f"data_dir={DATA}"]


@pytest.mark.parametrize("method,expected", [
    ("dense", {"recall@2": 62.5, "recall@5": 78.5, "recall@10": 85.0}),   # datasets README
    ("bm25", {"recall@5": 76.0, "recall@10": 88.0}),                      # datasets README
    ("hybrid", {"recall@2": 61.5, "recall@5": 81.0, "recall@10": 89.0}),  # datasets README (RRF, k 60, top 100 each)
    ("zoomrag", {"recall@2": 59.5, "recall@5": 78.0, "recall@10": 88.5}),  # notes/zoomrag-calibration.md
])
def test_hotpotqa_reference_figures(tmp_path, method, expected):
    out = evaluate_flow(make_config(tmp_path, f"method={method}", *HOTPOT), str(tmp_path / "run"))
    for key, value in expected.items():
        assert out[key] == pytest.approx(value, abs=1.0), key
