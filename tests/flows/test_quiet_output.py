"""A real command's output: progress where work takes time, and none of the known noise (the bm25s DEBUG line,
torch's TF32 warning, transformers' weight-loading bar, a row count summed over several tables)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bm25_and_dense_runs_are_quiet(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    out = subprocess.run([sys.executable, "-m", "flows.evaluate", "-m", "method=bm25,dense", "dataset.n_passages=80",
                          "dataset.n_questions=16", f"artifacts_dir={tmp_path / 'artifacts'}"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    for noise in ["[bm25s][DEBUG]", "TF32", "UserWarning", "Loading weights"]:
        assert noise not in text, noise
    ingest = next(line for line in out.stdout.splitlines() if "ingest         computed" in line)
    assert "rows: documents 80, questions 16, gold " in ingest
    assert "documents 80, questions 16, gold " in out.stdout.split("index stages (this run)")[1]  # the stage table
    for step in ["loading the bm25 retriever: ", "loading the dense retriever: ", "loading embedder "]:
        assert step in out.stdout, step
