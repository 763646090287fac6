"""``flows.commands.scale``: one real benchmark process per (size, method), the table read back from the catalog."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb

from flows.commands.scale import markdown

REPO = Path(__file__).resolve().parents[3]


def run_scale(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = subprocess.run([sys.executable, "-m", "flows.commands.scale", f"artifacts_dir={tmp_path}", *overrides],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("scale: ")
    return out, json.loads(last[len("scale: "):])


def test_two_methods_at_one_size_give_a_table_and_catalog_rows(tmp_path):
    _, result = run_scale(tmp_path, "scale.sizes=[40]", "scale.methods=[bm25,dense]", "scale.batch_sizes=[1,4]",
                          "scale.n_questions=8", "dataset.n_questions=8")
    cells = {c["method"]: c for c in result["cells"]}
    assert set(cells) == {"bm25", "dense"} and all(c["passages"] == 40 for c in cells.values())
    for c in cells.values():
        assert c["index_seconds"] > 0 and c["disk_mb"] > 0
        assert c["index_peak_rss_mb"] > 100 and c["query_peak_rss_mb"] > 100
        assert c["ms_per_query_b1"] > 0 and c["ms_per_query_b4"] > 0
    # dense's index includes the passage embeddings: a stage bm25 does not have
    assert cells["dense"]["index_seconds"] > cells["bm25"]["index_seconds"]
    table = Path(result["table"]).read_text()
    assert table.count("\n") == 4 and "| 40 | dense |" in table
    with duckdb.connect(str(tmp_path / "catalog.duckdb"), read_only=True) as con:
        kinds = con.execute("SELECT method FROM metrics WHERE kind = 'scale' ORDER BY method").fetchall()
        benches = con.execute("SELECT metrics FROM metrics WHERE kind = 'benchmark'").fetchall()
    assert kinds == [("bm25",), ("dense",)]
    # the index was built by an index process: each timed process only loaded it, so its memory is its own
    assert [json.loads(m)["stages_computed"] for (m,) in benches] == [0, 0]
    for (m,) in benches:  # the process's high-water mark holds every timed batch's peak (and the index's load)
        bench = json.loads(m)
        assert bench["process_peak_rss_mb"] >= max(r["peak_rss_mb"] for r in bench["rows"])
        assert cells[bench["method"]]["query_peak_rss_mb"] == bench["process_peak_rss_mb"]


def test_a_cell_that_runs_out_of_time_is_a_row_saying_so(tmp_path):
    _, result = run_scale(tmp_path, "scale.sizes=[40]", "scale.methods=[dense]", "scale.timeout_s=1")
    (cell,) = result["cells"]
    assert cell["error"] == "index stopped after 1 s"
    assert "index stopped after 1 s" in Path(result["table"]).read_text()


def test_a_bad_cell_config_stops_before_any_cell_runs(tmp_path):
    out = subprocess.run([sys.executable, "-m", "flows.commands.scale", f"artifacts_dir={tmp_path}", "scale.sizes=[5]"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 2 and "scale.sizes" in out.stderr
    assert not (tmp_path / "reports").exists()


def test_markdown_has_one_line_per_cell():
    rows = [{"passages": 1000, "method": "bm25", "index_seconds": 1.25, "index_peak_rss_mb": 400.0,
             "query_peak_rss_mb": 350.0, "ms_per_query_b1": 0.5, "ms_per_query_b256": 0.1, "disk_mb": 2.0},
            {"passages": 1000, "method": "zoomrag", "error": "failed (exit 1): MemoryError"}]
    text = markdown(rows, [1, 256])
    assert text.splitlines()[2] == "| 1000 | bm25 | 1.2 | 400.0 | 350.0 | 0.5 | 0.1 | 2.0 |"
    assert "| 1000 | zoomrag | failed (exit 1): MemoryError |" in text
