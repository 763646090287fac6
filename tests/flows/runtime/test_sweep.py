"""A sweep (``-m``): each job's ``metrics:`` line and catalog row carry its overrides, and the sweep ends with
one table of all its jobs (``flows.runtime.sweep``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from flows.runtime.sweep import sweep_table
from tasks.core.store import Store

REPO = Path(__file__).resolve().parents[3]


def test_the_table_shows_the_overrides_that_differ_between_jobs():
    jobs = [{"job": f"{i}-zoomrag", "overrides": {"method": "zoomrag", "method.alpha": a, "method.top_k_docs": k},
             "recall@2": r, "query_ms_mean": 1.0, "query_ms_p95": 2.0}
            for i, (a, k, r) in enumerate([("0.6", "5", 50.0), ("0.6", "10", 55.0), ("0.7", "5", 60.0)])]
    lines = sweep_table(jobs).splitlines()
    assert lines[0].split() == ["job", "method.alpha", "method.top_k_docs", "recall@2", "query_ms_mean",
                                "query_ms_p95"]
    assert [row.split() for row in lines[2:]] == [["0-zoomrag", "0.6", "5", "50.00", "1.00", "2.00"],
                                                   ["1-zoomrag", "0.6", "10", "55.00", "1.00", "2.00"],
                                                   ["2-zoomrag", "0.7", "5", "60.00", "1.00", "2.00"]]
    one = sweep_table(jobs[:1]).splitlines()[0].split()  # nothing differs: every override is shown
    assert one[:4] == ["job", "method", "method.alpha", "method.top_k_docs"]


def test_a_sweep_is_quiet_and_ends_with_one_table_of_its_jobs(tmp_path):
    """One real multirun (``-m method=bm25,dense``) shows both: each job's metrics line and catalog row carry its
    overrides and the sweep ends with their table; and none of the known noise is printed (the bm25s DEBUG line,
    torch's TF32 warning, transformers' weight-loading bar, a row count summed over several tables)."""
    artifacts = tmp_path / "artifacts"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    out = subprocess.run([sys.executable, "-m", "flows.commands.evaluate", "-m", "method=bm25,dense",
                          "dataset.n_passages=80", "dataset.n_questions=16", f"artifacts_dir={artifacts}"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    for noise in ["[bm25s][DEBUG]", "TF32", "UserWarning", "Loading weights"]:
        assert noise not in text, noise
    ingest = next(line for line in out.stdout.splitlines() if "ingest         computed" in line)
    assert "rows: documents 80, questions 16, gold " in ingest
    assert "documents 80, questions 16, gold " in out.stdout.split("index stages (this run)")[1]  # the stage table
    for step in ["loading the bm25 retriever: ", "loading the dense retriever: "]:
        assert step in out.stdout, step
    # the encoder's load is logged: from the model cache, or (a cold cache) PyTorch's load before the export
    assert "loading the ONNX Runtime encoder (fp32) from the model cache: " in out.stdout \
        or "loading embedder " in out.stdout

    lines = out.stdout.splitlines()
    metrics = [json.loads(line.split(": ", 1)[1]) for line in lines if line.startswith("metrics: ")]
    assert [m["overrides"]["method"] for m in metrics] == ["bm25", "dense"]
    assert all(m["overrides"]["dataset.n_passages"] == "80" for m in metrics)

    start = next(i for i, line in enumerate(lines) if line.startswith("sweep: 2 jobs in "))
    header, rows = lines[start + 1].split(), [line.split() for line in lines[start + 3:]]
    # one batch of 16 questions per job: no p95 to show (it was the mean again)
    assert header == ["job", "method", "recall@2", "recall@5", "recall@10", "query_ms_mean"]
    assert all(m["query_ms_p95"] is None for m in metrics)
    assert rows == [[f"{i}-{m['overrides']['method']}", m["overrides"]["method"], *(f"{m[k]:.2f}" for k in header[2:])]
                    for i, m in enumerate(metrics)]

    catalog = Store(artifacts).query("SELECT run_id, overrides FROM metrics WHERE kind = 'evaluate'")
    by_run = {r.run_id: json.loads(r.overrides) for r in catalog.itertuples()}
    assert {m["run_id"]: m["overrides"] for m in metrics} == by_run
