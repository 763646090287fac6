"""notebooks/compare.ipynb runs top to bottom with a real kernel on a small catalog (so it never rots)."""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

from flows.commands.report import report_flow
from tests.flows.conftest import make_config
from tests.flows.small_catalog import SWEEP, build_small_catalog

NOTEBOOK = Path(__file__).resolve().parents[3] / "notebooks" / "compare.ipynb"


def _text(cell) -> str:
    return "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) +
                   str(o.get("data", {}).get("text/markdown", "")) for o in cell.get("outputs", []))


def test_compare_notebook_executes_on_a_small_catalog(tmp_path, monkeypatch):
    build_small_catalog(tmp_path / "artifacts")
    report_flow(make_config(tmp_path))  # the figures the notebook shows
    monkeypatch.setenv("DAGRAG_CATALOG", str(tmp_path / "artifacts" / "catalog.duckdb"))
    monkeypatch.setenv("PYTHONPATH", str(NOTEBOOK.parents[1]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [_text(c) for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    metrics, costs, sweep = outputs[2], outputs[3], outputs[4]
    assert "zoomrag" in metrics and "wiki-mini" in metrics and "70.0" in metrics  # latest zoomrag, hotpot-mini
    assert "embed" in costs and "ingest" in costs
    assert SWEEP in sweep and "test 45.00" in sweep  # the best trial's test score, not its dev score
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images  # the report's accuracy–latency figure
